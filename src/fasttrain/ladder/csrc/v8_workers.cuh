// cuda-epoch v8's workers alone (docs/measurements/cuda-epoch-v8-design.md, "Build first" step 3):
// the per-thread and per-warp bodies of the 56 worker CTAs (7 clusters of 8), run on the GPU by
// v8_workers.cu and on the host, for every thread and warp, by tests/ladder/csrc/v8_workers_host.cu.
//
// The algebra, step t of an epoch, lag L = 6, s = max(t − L, 0), the bias folded in as a 785th
// pixel of value 255 (X̃ = [X, 255], W̃ = [W; b]):
//   before P_t: W̃ −= (lr/255)·(1/n_a)·2⁻¹²·X̃_aᵀ G'_a for every a < s not yet applied;
//   P_t = X̃_t W̃_s / 255 over the cluster's 112 features (cluster 6's rank 7 also the bias pixel).
// G'_a = (p − onehot)·2¹² is the chain's B operand (the design's 3xFP16 paragraph): two fp16
// arrays, hi and lo, [BMAX][16] a step, 0 past the batch's rows and at classes 10 … 15. Check of
// the scaling: G_a = (p − onehot)/n_a = (hi + lo)·2⁻¹²/n_a, and v7's update is W −= (lr/255) X_aᵀG_a,
// so the factor is (lr/255)·2⁻¹²/n_a; the bias row gets (lr/255)·255·Σ_i G_a = lr·1ᵀG_a, plain SGD's.
// A worker CTA (k, r), index q = 8k + r, owns features 14q … 14q + 13 in slots 0 … 13 of a row of
// V8_NF = 16 slots; slot 14 is the bias pixel (255) in CTA 55 only, 0 elsewhere; slot 15 is 0.
//
// Variants (V8Variant): simt reuses v7's worker bodies (epoch_v7_math.cuh: worker_fetch_x,
// worker_store_x, worker_update_sums/apply, worker_partial, worker_reduce) plus the bias slot's
// three small bodies below; mma and mma-scatter run the update and the partials as m16n8k16 f16
// products (csrc/v8_mma.cuh): X̃ is exact in fp16, W̃·2⁸ and G' are split into hi/lo fp16 pieces,
// each product accumulated from zero. mma reduces as v7 does (cluster barrier, DSMEM loads);
// mma-scatter sends each m16 tile of P_t to the rank that owns its rows (st.async into a ring of
// V8_NS inbox slots, an mbarrier with complete_tx per slot, credits back by remote arrives).
#pragma once
#include <cstdint>

#include "epoch_v7_math.cuh"
#include "v8_mma.cuh"

namespace {

enum V8Variant { V8_SIMT = 0, V8_MMA = 1, V8_SCATTER = 2, V8_VARIANTS = 3 };
constexpr int V8_LAG = 6;                  // L: the design's choice
constexpr int V8_NF = 16;                  // feature slots of a worker CTA (an mma's k or m)
constexpr int V8_BIAS = V7_FW;             // slot 14: the bias pixel in CTA V8_BIAS_CTA
constexpr int V8_BIAS_CTA = V7_WORKERS - 1;  // the CTA that holds feature 783
constexpr float V8_PIXEL = 255.f;
constexpr int V8_KT = K + 1;               // 785 rows of W̃
constexpr int V8_XR = V8_LAG + 2;          // x ring: x_t and the update's x_{t−L−1}
constexpr int V8_NS = 4;                   // mma-scatter: inbox slots (a ring with credits)
constexpr int V8_SLOT_FLOATS = V7_CLUSTER * V7_RPC * 16;  // [src][16 rows][16]: 8 KiB
constexpr int V8_SLOT_BYTES = 4 * V8_SLOT_FLOATS;
// W̃'s split scale. |ΔW̃| ≤ lr a step (|x̃| ≤ 255, Σ_i |p − y|_ic / n ≤ 1), so in an epoch of 469
// steps at lr = 0.1 from W̃_0 = 0, |W̃| ≤ 46.9 < 2⁷: W̃·2⁸ < 2¹⁵ stays below fp16's 65,504, and lo's
// quantum below 2⁻¹⁴ (subnormal) is 2⁻²⁴·2⁻⁸ = 2⁻³² of W̃, far below fp32's ulp of the entries that
// matter. The pieces hold 22 bits of every |W̃| ≥ 2⁻³ (the rest: 2⁻³² absolute).
constexpr float V8_WSCALE = 256.f;
constexpr float V8_GSCALE = 4096.f;        // G' = (p − y)·2¹², the chain's B operand

struct V8Shape {  // the variant-independent shape of one launch
  int n, bs, steps;
  float lr;
};
FT_V8 V7Epoch v8_epoch(const V8Shape& s) { return {s.n, s.bs, s.steps, s.lr}; }
FT_V8 int v8_applied_before(int t) { return t > V8_LAG ? t - V8_LAG : 0; }
FT_V8 int v8_f0(int q) { return q * V7_FW; }
FT_V8 bool v8_has_bias(int q) { return q == V8_BIAS_CTA; }

// ---- shared memory of a worker CTA, in floats --------------------------------------------------
struct V8Smem {
  static constexpr int XS = 0;                        // simt: float [XR][BMAX][16];
                                                      // mma: __half [XR][BMAX][16] (first half)
  static constexpr int W = XS + V8_XR * BMAX * 16;    // [16][16]: W̃'s slice, W̃[slot][c]
  static constexpr int GS = W + V8_NF * 16;           // simt: float G_a [BMAX][16]; mma: hi, lo
                                                      // __half [BMAX][16] each
  static constexpr int URED = GS + BMAX * 16;         // the update's partial sums (1,024 floats)
  static constexpr int PBUF = URED + 1024;            // [2][BMAX][16]: P_t by step parity
  static constexpr int INBOX = PBUF + 2 * BMAX * 16;  // scatter: [NS][8 src][16 rows][16]
  static constexpr int BAR = INBOX + V8_NS * V8_SLOT_FLOATS;  // full[NS], free[NS] mbarriers
  static constexpr int FLOATS = BAR + 4 * V8_NS;
};
static_assert(4 * V8Smem::FLOATS <= 227 * 1024, "fits a Hopper SM's shared memory");
static_assert(V8Smem::BAR % 2 == 0 && V8Smem::GS % 4 == 0, "aligned regions");
static_assert(2 * V7_FW * C + 2 * C <= V7_T && V8_NF * C <= V7_T, "one pass of the bodies");

// v7's bodies index their x ring as xs + (t % V7_XR)·BMAX·16 (V7_XR = 6 slots, for L = 4). At
// L = 6 the update's x_{t−7} must outlive 7 stores, so the ring here has V8_XR = 8 slots: this
// returns the base that v7's indexing maps onto slot t % V8_XR of mine, so v7's code is reused
// as it is (the pointer is only ever offset back into the ring).
FT_V8 float* v8_v7_view(float* xs, int t) {
  return xs + (t % V8_XR - t % V7_XR) * BMAX * 16;
}
FT_V8 const float* v8_v7_view(const float* xs, int t) {
  return xs + (t % V8_XR - t % V7_XR) * BMAX * 16;
}

// ---- simt: the bias slot's bodies (v7's cover slots 0 … 13) ------------------------------------
// G'_a's pieces, fetched into registers an update ahead (their latency hidden behind a step):
// thread tid holds 32-bit words tid and tid + T of hi (reg 0, 1) and of lo (reg 2, 3), T ≥ 512.
constexpr int V8_GW = BMAX * 16 / 2;  // 1,024 words of two halves a piece
FT_V8 void v8_fetch_g(const __half* gh, const __half* gl, int tid, int T, uint32_t (&reg)[4]) {
  const uint32_t* h = reinterpret_cast<const uint32_t*>(gh);
  const uint32_t* l = reinterpret_cast<const uint32_t*>(gl);
  for (int j = 0; j < 2; ++j) {
    const int i = tid + j * T;
    reg[j] = i < V8_GW ? h[i] : 0u;
    reg[2 + j] = i < V8_GW ? l[i] : 0u;
  }
}
// simt: G_a as v7's floats, (hi + lo)·2⁻¹²/n_a, into gs [BMAX][16].
FT_V8 void v8_put_g_simt(const V7Epoch& e, int a, const uint32_t (&reg)[4], int tid, int T,
                         float* gs) {
  const float inv = 1.f / (V8_GSCALE * static_cast<float>(e.rows(a)));
  for (int j = 0; j < 2; ++j) {
    const int i = tid + j * T;
    if (i >= V8_GW) break;
    for (int h = 0; h < 2; ++h)
      gs[2 * i + h] = (__half2float(v8_half(reg[j], h)) + __half2float(v8_half(reg[2 + j], h))) * inv;
  }
}
// mma: the pieces as they are, hi at gsh[0 …], lo at gsh[BMAX·16 …].
FT_V8 void v8_put_g_mma(const uint32_t (&reg)[4], int tid, int T, __half* gsh) {
  uint32_t* d = reinterpret_cast<uint32_t*>(gsh);
  for (int j = 0; j < 2; ++j) {
    const int i = tid + j * T;
    if (i >= V8_GW) break;
    d[i] = reg[j];
    d[V8_GW + i] = reg[2 + j];
  }
}
// The bias row's sums beside worker_update_sums': thread 2·FW·C + (h, c) sums rows i ≡ h of 255·G.
FT_V8 void v8_simt_bias_sums(const V7Epoch& e, int a, const float* gs, int tid, bool bias,
                             float* ured) {
  const int u = tid - 2 * V7_FW * C;
  if (!bias || u < 0 || u >= 2 * C) return;
  const int h = u / C, c = u % C;
  float acc = 0.f;
  for (int i = h; i < e.rows(a); i += 2) acc = fmaf(V8_PIXEL, gs[i * V7_GROW + c], acc);
  ured[tid] = acc;
}
// Beside worker_update_apply: thread FW·C + c updates W̃[bias][c].
FT_V8 void v8_simt_bias_apply(const V7Epoch& e, const float* ured, int tid, bool bias, float* w) {
  const int c = tid - V7_FW * C;
  if (!bias || c < 0 || c >= C) return;
  const float* u = ured + 2 * V7_FW * C;
  w[V8_BIAS * 16 + c] -= (e.lr * (1.f / 255.f)) * (u[c] + u[C + c]);
}
// After worker_partial, by the same thread (row i, class half h): + 255·W̃[bias][c].
FT_V8 void v8_simt_bias_partial(const V7Epoch& e, int t, const float* w, int tid, bool bias,
                                float* pb) {
  if (!bias || tid >= 2 * BMAX) return;
  const int i = tid / 2, h = tid % 2;
  if (i >= e.rows(t)) return;
  for (int c = 5 * h; c < 5 * h + 5; ++c)
    pb[i * V7_GROW + c] = fmaf(V8_PIXEL, w[V8_BIAS * 16 + c], pb[i * V7_GROW + c]);
}

// ---- mma: x as fp16, the update and the partials on the tensor cores ---------------------------
// x_t's bytes (worker_fetch_x's, 0 past the batch) as halves into slot t % XR, every row and
// slot written (the fragments read all 128 rows and 16 slots): slots 14, 15 by threads < BMAX.
// XR: the ring's slots (v7e's, L = 4: V7_XR).
template <int XR = V8_XR>
FT_V8 void v8_store_xh(const V7Epoch& e, int t, int tid, int T, const uint8_t (&buf)[V7_XF],
                       bool bias, __half* xh) {
  __half* dst = xh + (t % XR) * BMAX * 16;
  for (int k = 0; k < V7_XF; ++k) {
    const int it = tid + k * T, i = it / V7_FW, f = it % V7_FW;
    if (it < BMAX * V7_FW) dst[i * 16 + f] = __float2half_rn(float(buf[k]));
  }
  if (tid < BMAX) {
    dst[tid * 16 + V8_BIAS] = __float2half_rn(bias && tid < e.rows(t) ? V8_PIXEL : 0.f);
    dst[tid * 16 + V8_BIAS + 1] = __float2half_rn(0.f);
  }
}
// The update's product, warp u < 8: n-tile nt = u & 1 (classes 8nt …), rows 32·(u >> 1) … + 31
// (two k-steps): D[f][c] = Σ_i X̃_a[i][f]·(G'hi + G'lo)[i][c], four mma accumulated from zero
// (hi, lo of k-step 0, then of k-step 1), stored to ured[u >> 1][f][c]. xa: slot of x_a; gsh: the
// staged pieces (hi at 0, lo at BMAX·16).
template <class Warp>
FT_V8 void v8_mma_update_sums(const Warp& wp, int u, const __half* xa, const __half* gsh,
                              float* ured) {
  if (u >= 8) return;
  const int nt = u & 1, kq = u >> 1;
  typename Warp::template Reg<float> d[4];
  wp.each([&](int lane) {
    for (int i = 0; i < 4; ++i) wp.at(d[i], lane) = 0.f;
  });
  for (int ks = 0; ks < 2; ++ks) {
    const int i0 = 32 * kq + 16 * ks;
    typename Warp::template Reg<uint32_t> a[4], bh[2], bl[2];
    wp.each([&](int lane) {
      for (int r = 0; r < 4; ++r) {  // A = X̃ᵀ: (row f, col i) → x[i0 + i][f]
        const V8Rc e = v8_a_at(lane, r, 0);
        wp.at(a[r], lane) =
            v8_pack(xa[(i0 + e.col) * 16 + e.row], xa[(i0 + e.col + 1) * 16 + e.row]);
      }
      for (int r = 0; r < 2; ++r) {  // B = G': (k = row i, n = class)
        const V8Rc e = v8_b_at(lane, r, 0);
        const int at = (i0 + e.row) * 16 + 8 * nt + e.col;
        wp.at(bh[r], lane) = v8_pack(gsh[at], gsh[at + 16]);
        wp.at(bl[r], lane) = v8_pack(gsh[BMAX * 16 + at], gsh[BMAX * 16 + at + 16]);
      }
    });
    wp.mma(d, a, bh);
    wp.mma(d, a, bl);
  }
  wp.each([&](int lane) {
    for (int i = 0; i < 4; ++i) {
      const V8Rc e = v8_c_at(lane, i);
      ured[(kq * 16 + e.row) * 16 + 8 * nt + e.col] = wp.at(d[i], lane);
    }
  });
}
// W̃[f][c] −= (lr/255)·2⁻¹²/n_a · (the four row quarters' sums, in order), threads tid < 16·C.
FT_V8 void v8_mma_update_apply(const V7Epoch& e, int a, const float* ured, int tid, float* w) {
  if (tid >= V8_NF * C) return;
  const int f = tid / C, c = tid % C;
  const float s = ured[f * 16 + c] + ured[(16 + f) * 16 + c] + ured[(32 + f) * 16 + c] +
                  ured[(48 + f) * 16 + c];
  const float k = (e.lr * (1.f / 255.f)) / (V8_GSCALE * static_cast<float>(e.rows(a)));
  w[f * 16 + c] -= k * s;
}
// P_t's tile of warp w < 16: rows 16·(w & 7) … (the m-tile, which is rank (w & 7)'s share),
// classes 8·(w >> 3) …: D = X̃_t·(W̃·2⁸)hi + X̃_t·(W̃·2⁸)lo from zero, then out(row, c, v, v′) of
// D·2⁻⁸ at (row, c) and (row, c + 1), twice a lane (rows past the batch too: their x is 0).
template <class Warp, class Out>
FT_V8 void v8_mma_partial(const Warp& wp, int wi, const __half* xt, const float* w, Out out) {
  if (wi >= 16) return;
  const int mt = wi & 7, nt = wi >> 3;
  typename Warp::template Reg<float> d[4];
  typename Warp::template Reg<uint32_t> a[4], bh[2], bl[2];
  wp.each([&](int lane) {
    for (int i = 0; i < 4; ++i) wp.at(d[i], lane) = 0.f;
    for (int r = 0; r < 4; ++r) {  // A = X̃_t: (row i, col f), f even
      const V8Rc e = v8_a_at(lane, r, 0);
      wp.at(a[r], lane) = *reinterpret_cast<const uint32_t*>(xt + (16 * mt + e.row) * 16 + e.col);
    }
    for (int r = 0; r < 2; ++r) {  // B = W̃·2⁸: (k = slot f, n = class)
      const V8Rc e = v8_b_at(lane, r, 0);
      const int c = 8 * nt + e.col;
      v8_split_f16x2(w[e.row * 16 + c] * V8_WSCALE, w[(e.row + 1) * 16 + c] * V8_WSCALE,
                     wp.at(bh[r], lane), wp.at(bl[r], lane));
    }
  });
  wp.mma(d, a, bh);
  wp.mma(d, a, bl);
  wp.each([&](int lane) {
    for (int i = 0; i < 4; i += 2) {  // floats i, i + 1: one row, classes c and c + 1 (c even)
      const V8Rc e = v8_c_at(lane, i);
      out(16 * mt + e.row, 8 * nt + e.col, wp.at(d[i], lane) * (1.f / V8_WSCALE),
          wp.at(d[i + 1], lane) * (1.f / V8_WSCALE));
    }
  });
}
// mma-scatter: where (in floats from the inbox's start) sender `src`'s element (row, class) of
// the step in ring slot `slot` lands in its owner's (rank row / 16) inbox. The senders' st.asyncs
// and the owner's reduce both address the inbox through it (v7f's first GPU run summed slot t % NS
// while its senders, missing the slot's offset, all wrote slot 0).
FT_V8 int v8_inbox_at(int slot, int src, int row, int c) {
  return slot * V8_SLOT_FLOATS + (src * V7_RPC + row % V7_RPC) * 16 + c;
}
// The ring's slot of step t, and the parity a wait on its mbarriers passes with: full[slot]
// completes phase t / NS when step t's 8 KiB have landed; free[slot] (in the sender) completes
// phase m when the 8 receivers have read step slot + m·NS, so step t ≥ NS waits phase t/NS − 1.
// (ns: the ring's size, V8_NS in the kernel; the host's protocol test also runs 2 and 3, where the
// credits bind. At ns ≥ 4 they are a second guarantee: a sender's step t follows its reduce of
// t − 2, so every peer's step t − 2 sends, which each peer issues after its reduce of t − 4.)
FT_V8 int v8_ns_slot(int t, int ns = V8_NS) { return t % ns; }
FT_V8 int v8_full_parity(int t, int ns = V8_NS) { return (t / ns) & 1; }
FT_V8 int v8_free_parity(int t, int ns = V8_NS) { return (t / ns - 1) & 1; }

// ---- outputs -----------------------------------------------------------------------------------
// p: [steps][V7_WCLUSTERS][BMAX][C] floats (cluster k's P_t); w: [V8_KT][C] (W̃, row 784 = b).
FT_V8 size_t v8_p_at(int t, int k, int row, int c) {
  return ((size_t(t) * V7_WCLUSTERS + k) * BMAX + row) * C + c;
}
// W̃'s row of CTA q's slot f (−1: a slot that holds nothing).
FT_V8 int v8_w_row(int q, int f) {
  if (f < V7_FW) return v8_f0(q) + f;
  return f == V8_BIAS && v8_has_bias(q) ? K : -1;
}

}  // namespace
