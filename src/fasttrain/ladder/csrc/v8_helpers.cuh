// cuda-epoch v8's chain cluster (docs/measurements/cuda-epoch-v8-design.md, "How many lags the
// chain does itself" and "Build first" step 4): the helpers' per-warp bodies and the cluster's
// ring protocol, written once for the GPU (csrc/v8_cluster.cuh's v8_cluster_kernel, built in
// v8_chain.cu) and for the host
// (tests/ladder/csrc/v8_helpers_host.cu, v8_cluster_host: the 8 CTAs under a random scheduler over
// emulated mbarriers), on top of csrc/v8_chain.cuh's chain bodies.
//
// One cluster of 8 CTAs of 512 threads, lag L = 6, step t (n_t rows):
//   rank 0, the chain: Z_t = (P_t + Q_t) + (−c/n_{t−1})·S_t as v8_chain.cuh's, with P_t from a
//     precomputed array (what the workers would send) and Q_t = Σ_{j=2..min(t,L)} q_{t,j} from its
//     inbox, added oldest first (j = min(t, L) … 2) into P_t: split_precision.chain_epoch's order;
//   ranks 1, 2: j = 2, rows 0 … 63 and 64 … 127 (warps whose m16 tile is theirs: 8 of 16);
//   ranks 3 … 6: j = 3 … 6, all 128 rows (the chain's 16-warp product);
//   (a step's tensor work: the chain's 16 warps × 24 mma at j ≥ 3, half at j = 2, so no helper's
//   exceeds the chain's; its Γ̃ stream 64 KB a step, 32 KB at j = 2, by cp.async a step ahead)
//   rank 7: idle (it holds no data; the design's P + Q summer is not needed while P_t comes from
//     an array and the chain adds the five parts itself: 5 FADD a value, behind the product).
// q_{t,j} = fl32(fl32(−c/n_{t−j})·S_{t,j}), S_{t,j} = (Γ̃_{t,j}·2⁻¹²)·G'_{t−j} in 3xFP16 from zero,
// G'_u = (p − y)_u·2¹² in hi/lo fp16: the chain's B fragments of step u + 1 (8 KB).
//
// The rings (all mbarriers; "full" armed by their owner with expect_tx, completed by st.async):
//   G' ring in each helper, V8H_NSG slots: the chain sends G'_u (u = 0 … steps − 2, to all six
//     helpers, also those that no longer need it: fixed counts) into slot u % NSG at the start of
//     step u + 1, 16 bytes a thread, completing the helper's gfull[slot]; the helper arms gfull for
//     u + NSG and credits the chain's gfree[slot] (count 6) once its product has read the slot;
//     the chain waits gfree for u ≥ NSG.
//   Q inbox in the chain, V8H_NQ slots of 5 parts [j − 2][128][10]: helper j writes q_{t,j} (t =
//     u + j ≤ steps − 1) into slot t % NQ (8 bytes a st.async), completing the chain's
//     qfull[slot][j − 2] (one mbarrier a slot and part, 5 KB: the j = 2 pair 2.5 KB each). The
//     chain arms qfull[t % NQ][j − 2] for the steps t ≥ j only (the prologue for t < j + NQ, then
//     at the end of step t − NQ), so the phase of step t is u / NQ (u = t − j) and no helper's
//     bytes can land in another step's phase; once its softmax warps have read step t it credits
//     the helpers with j ≤ t (qfree[slot], count 1), and helper j waits for the credit of its own
//     write u − NQ before writing u ≥ NQ. (One mbarrier a slot for all parts, credited every step,
//     failed the random schedules: helper 6 is up to 5 steps ahead of the chain, so its bytes and
//     its parity waits aliased into the phases of earlier steps.)
//   Parities: full completes phase i with the i-th use of its slot (i = u / NS); free completes
//     phase i when the i-th use is consumed, so use i ≥ 1 waits phase i − 1 (v8h_free_parity).
#pragma once
#include "v8_chain.cuh"

namespace {

constexpr int V8H_LAG = 6, V8H_CLUSTER = 8, V8H_HELPERS = 6;
constexpr int V8H_NSG = 4;  // G' slots a helper (32 KB)
constexpr int V8H_NQ = 2;   // Q inbox slots in the chain (2 × 25 KB)
// The rings must hold NSG + NQ ≥ L − 1 steps between them: the chain's send of G'_{t−1} waits for
// helper j's credit of G'_{t−1−NSG}, given after its write of q_{t−2−NSG+j}, which waits for the
// chain to have read step t − 2 − NSG + j − NQ; that must be ≤ t − 1 for j = L, or the cluster
// deadlocks (the harness's random schedules found it at NSG = NQ = 2).
static_assert(V8H_NSG + V8H_NQ >= V8H_LAG - 1, "the rings deadlock the cluster");
constexpr int V8H_PARTS = V8H_LAG - 1;                  // j = 2 … 6
constexpr int V8H_PART_FLOATS = V8C_ROWS * V8C_C;       // [128][10]: 5 KB
constexpr int V8H_QSLOT_FLOATS = V8H_PARTS * V8H_PART_FLOATS;
constexpr int V8H_PART_BYTES = 4 * V8H_PART_FLOATS;
constexpr int V8H_G_BYTES = 4 * V8C_BWORDS;             // one G' slot: 8 KB

FT_V8 int v8h_full_parity(int t, int ns) { return (t / ns) & 1; }
FT_V8 int v8h_free_parity(int t, int ns) { return (t / ns - 1) & 1; }
// Helper rank h (1 … 6): its lag j, first row and rows.
FT_V8 int v8h_lag(int h) { return h <= 2 ? 2 : h; }
FT_V8 int v8h_row0(int h) { return h == 2 ? 64 : 0; }
FT_V8 int v8h_nrows(int h) { return h <= 2 ? 64 : V8C_ROWS; }
// Whether warp w of helper h has a product (its m16 tile among the helper's rows).
FT_V8 bool v8h_active(int h, int w) {
  const int m0 = 16 * (w & 7);
  return m0 >= v8h_row0(h) && m0 < v8h_row0(h) + v8h_nrows(h);
}
// The chain's qfull mbarrier of step t's part j (index into [NQ][5]), and its wait's parity.
FT_V8 int v8h_qbar(int t, int j, int nq) { return (t % nq) * V8H_PARTS + j - 2; }
FT_V8 int v8h_q_parity(int t, int j, int nq) { return v8h_full_parity(t - j, nq); }
FT_V8 int v8h_part_at(int j, int row, int col) {
  return (j - 2) * V8H_PART_FLOATS + row * V8C_C + col;
}
// −c/n_{t−j}: the rows of G'_{t−j}. `bug` 2 is the harness's planted bug (n_t instead).
FT_V8 float v8h_coef(float c, int n, int t, int j, int bug = 0) {
  return -c / static_cast<float>(v8c_rows(n, bug == 2 ? t : t - j));
}

// Helper warps 0 … 7 (active), after the K halves' barrier: q = coef·(d + half 1), each pair of
// classes (2q', 2q' + 1 < 10) of rows 16w + g and + 8 handed to put(row, col, v0, v1) (the kernel:
// one 8-byte st.async into the chain's inbox; the harness: a store and its complete_tx).
template <class Warp, class Put>
FT_V8 void v8h_part(const Warp& warp, int w, const V8Reg<Warp, float> (&d)[2][4],
                    const float* halves, float coef, Put&& put) {
  warp.each([&](int lane) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {
        const V8Rc e = v8_c_at(lane, 2 * rh);
        if (8 * nt + e.col >= V8C_C) continue;
        float v[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = 2 * rh + h;
          const float s = warp.at(d[nt][i], lane) + halves[v8c_half_at(w, nt, i, lane)];
#if defined(__CUDA_ARCH__)
          v[h] = __fmul_rn(coef, s);
#else
          v[h] = coef * s;
#endif
        }
        put(16 * (w & 7) + e.row, 8 * nt + e.col, v[0], v[1]);
      }
  });
}

// Chain warps 0 … 7, after step t's parts landed in `slot` ([5][128][10]): P_t += q_{t,j} for
// j = min(t, L) … 2, one fp32 add each, in the batch's rows and classes only.
template <class Warp>
FT_V8 void v8h_add_q(const Warp& warp, int w, const float* slot, int t, int rows,
                     V8Reg<Warp, float> (&p)[2][4]) {
  const int jmax = t < V8H_LAG ? t : V8H_LAG;
  warp.each([&](int lane) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const V8Rc e = v8_c_at(lane, i);
        const int row = 16 * w + e.row, col = 8 * nt + e.col;
        if (row >= rows || col >= V8C_C) continue;
        float acc = warp.at(p[nt][i], lane);
        for (int j = jmax; j >= 2; --j) acc += slot[v8h_part_at(j, row, col)];
        warp.at(p[nt][i], lane) = acc;
      }
  });
}

}  // namespace
