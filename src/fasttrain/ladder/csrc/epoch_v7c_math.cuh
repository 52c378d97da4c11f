// cuda-epoch v7c's per-thread bodies (epoch_v7c.cuh runs them on the GPU;
// tests/ladder/csrc/epoch_v7_math_host.cu runs them on the host for whole epochs). v7c is v7b
// (epoch_v7b_math.cuh: the tagged partials, the softmax on 16 lanes a row; the workers unchanged)
// with the chain CTA's 16 warps split by role (the plan at the end of the design doc's v7b
// section):
//   critical warps 0 … 7 (threads 0 … 255, v7b's softmax threads): the G wait, the partials' poll,
//     b_t, the Gram term j = 1 (thread (row i, lane l) = (tid / 16, tid % 16): columns l + 16u of
//     Γ_{t,1}, u = 0 … 7), the logits, the softmax, the send and the publish;
//   helper warps 8 … 15 (h = tid − 256, the same (row, lane) split): during step t, step t + 1's
//     terms j = 2 … L from G_{t−1} … G_{t+1−L} (all in the ring once G_{t−1}'s wait has passed),
//     their Γ loaded into registers an iteration ahead, and the next step's labels.
// Both halves sum their 16 lanes by xor shuffles (width 16, v7c_lane_sum: lane c of a row ends
// with class c, 15 shuffles a thread), so the j = 1 term lands in the register of the thread that forms Z's element
// (no lane-sum buffer, no barrier for it). The helpers' sums go to HQ[(t + 1) & 1][row][class]
// in shared memory; one 512-thread named barrier a step (the hand-off) gives them to the critical
// warps before the logits. Two buffers suffice: the helpers write HQ[(t + 1) & 1] only after the
// hand-off of step t, which the critical warps pass after their step t − 1 read HQ[(t − 1) & 1].
//
// Why this is not run 5's rejected split (4 warps, Γ copied into shared memory by cp.async: the
// Gram phase rose from 1.85 to 2.87 µs a step): there the 4 warps computed the terms j ≥ 2 ON the
// chain's path (the end of step t − 1, everyone waiting for them), with too few warps to hide the
// shared-memory loads' latency. Here 8 warps (half the CTA) have a whole step of the critical
// path (v7b: 4.13 µs on an H200) to do it beside it, their Γ already in registers (24 a thread,
// prefetched an iteration ahead), and each 128-bit load of a G row serves the warp's two rows
// (a half-warp a row, the same 16 rows of G: 2 wavefronts, not v7b's 4).
#pragma once
#include "epoch_v7b_math.cuh"

namespace {

constexpr int V7C_CRIT = V7_SMT;            // critical threads: warps 0 … 7
constexpr int V7C_HELP = V7_T - V7C_CRIT;   // helper threads: warps 8 … 15
constexpr int V7C_LANES = V7_SMW;           // 16 lanes split a row's Gram terms
constexpr int V7C_U = BMAX / V7C_LANES;     // 8 columns of Γ a lane and lag
constexpr int V7C_HJ = V7_LAG - 1;          // the helpers' lags: 2 … L
// Shared memory: v7c uses none of v7b's lane-sum buffer (RED) nor of v7a's logits (ZS).
constexpr int V7C_HQ = ChainSmem::RED;      // [2][RPC][16]: the helpers' sums by step parity
constexpr int V7C_STOP = ChainSmem::ZS;     // int: a critical wait failed, helpers leave
static_assert(V7C_HELP == V7C_CRIT && V7C_LANES * V7_RPC == V7C_CRIT, "one (row, lane) each");
static_assert(2 * V7_RPC * 16 <= ChainSmem::ZS - ChainSmem::RED, "HQ fits in RED");

// Thread h of a half (tid for the critical warps, tid − 256 for the helpers): Γ_{t,j} for j = j0
// … j0 + J − 1, columns l + 16u of its row (0 outside the window or the batches).
template <int J>
FT_V7 void v7c_load_gram(const V7Epoch& e, const float* gram, int t, int q, int h, int j0,
                         float (&gam)[J][V7C_U]) {
  const ChainLane16 ln = chain_lane16(h);
  const int row = q * V7_RPC + ln.i, w = v7_window(t);
  for (int jj = 0; jj < J; ++jj)
    for (int u = 0; u < V7C_U; ++u) {
      const int j = j0 + jj, m = ln.c + V7C_LANES * u;
      const bool in = j <= w && row < e.rows(t) && m < e.rows(t - j);
      gam[jj][u] = in ? gram[v7_gram_offset(t, j) + size_t(row) * BMAX + m] : 0.f;
    }
}
// acc[c] += Σ_{j = j0 … j0+J−1, j ≤ window(t)} Σ_u gam[j − j0][u] G_{t−j}[l + 16u][c], G's rows
// from the ring in three 128-bit loads each (as v7b's chain_gram_terms).
template <int J>
FT_V7 void v7c_terms(const V7Epoch& e, const float (&gam)[J][V7C_U], const float* ring, int t,
                     int h, int j0, float (&acc)[C]) {
  const ChainLane16 ln = chain_lane16(h);
  const int w = v7_window(t);
  for (int jj = 0; jj < J; ++jj) {
    const int j = j0 + jj;
    if (j > w) break;
    const float* g = ring + v7_slot(t - j) * ChainSmem::GSLOT;
    for (int u = 0; u < V7C_U; ++u) {
      const int m = ln.c + V7C_LANES * u;
      if (m >= e.rows(t - j)) break;
      float gm[12];
      for (int k = 0; k < 3; ++k)
        *reinterpret_cast<float4*>(gm + 4 * k) =
            *reinterpret_cast<const float4*>(g + m * V7_RS + 4 * k);
      for (int c = 0; c < C; ++c) acc[c] = fmaf(gam[jj][u], gm[c], acc[c]);
    }
  }
}
// The 16 lanes of each row of the warp summed class by class, ending with class c in lane c
// (0 on lanes c ≥ C): a reduce-scatter by recursive halving over classes padded to 16. At
// offset o = 8, 4, 2, 1 a lane keeps the half of its o-class window its lane bit o picks and
// sends its partner (lane ^ o) the other half: 8 + 4 + 2 + 1 = 15 shuffles a thread, every
// register index a constant (a pick of acc[lane % 16] after an all-reduce became an indexed
// load, a 40-byte stack frame: ptxas, nvcc 13.0, a build not kept).
template <class Warp>
FT_V7 typename Warp::template Reg<float> v7c_lane_sum(
    const Warp& warp, const typename Warp::template Reg<float> (&acc)[C]) {
  using F = typename Warp::template Reg<float>;
  F v[V7C_LANES];
  for (int c = 0; c < V7C_LANES; ++c) v[c] = c < C ? acc[c] : F{};
  for (int o = V7C_LANES / 2; o > 0; o /= 2)
    for (int c = 0; c < o; ++c) {
      F keep, send;
      warp.each([&](int lane) {
        const bool up = (lane & o) != 0;
        warp.at(keep, lane) = up ? warp.at(v[c + o], lane) : warp.at(v[c], lane);
        warp.at(send, lane) = up ? warp.at(v[c], lane) : warp.at(v[c + o], lane);
      });
      const F got = warp.shfl_xor(send, o, V7C_LANES);
      warp.each([&](int lane) { warp.at(v[c], lane) = warp.at(keep, lane) + warp.at(got, lane); });
    }
  return v[0];
}
// Z of (row i, class c), thread tid < V7C_CRIT: p + b_t[c] − c_g (j1 + hq[i][c]), j1 its lanes'
// term j = 1 (v7c_lane_sum), hq the helpers' buffer of step t's parity; 0 where v7b's is.
FT_V7 float chain_logit_c(const V7Epoch& e, int t, int q, int tid, float p, const float* bias,
                          float j1, const float* hq) {
  const ChainLane16 ln = chain_lane16(tid);
  if (!v7b_part_mine(e, t, q, tid)) return 0.f;
  const float cg = e.lr * (1.f / 255.f) * (1.f / 255.f);
  return p + bias[ln.c] - cg * (j1 + hq[ln.i * 16 + ln.c]);
}
// The helpers' buffer of step t (HQ + its parity's 16 rows).
FT_V7 int v7c_hq_at(int t) { return V7C_HQ + (t & 1) * V7_RPC * 16; }

}  // namespace
