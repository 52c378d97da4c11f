// The host emulation's v7j (variant 9, epoch_v7j.cuh): v7i with its workers' fragments loaded by
// ldmatrix (V8HostWarp::ldsm4 / ldsm4t: the PTX ISA's lane map, element by element) from
// swizzled rows, W·2⁸'s fp16 pieces written by the apply (and the setup) instead of split in
// the partials, and x gathered and stored by pixel pairs. Every reader and writer goes through epoch_v7j_math.cuh's bodies, the device's:
// x's store, G′'s staging, the update's sums and apply, the partials. The worker's shared memory
// starts as NaN (as v7e's), so pieces read before the setup wrote them show.
// Planted bugs: 27 the partials' A (x_t) read unswizzled while the store swizzles (features f and
// f ^ 8 swapped in rows 4 … 7 mod 8), 28 the update's B (G′) loaded without .trans (the fragment
// holds G′'s transpose's elements), 29 W's pieces not rewritten by the apply (the partials keep
// multiplying by W₀: the drift grows with the steps).
#pragma once

#include "epoch_v7j_math.cuh"

namespace {

constexpr int V7J_VARIANT = 9;

// Thread tid of worker CTA (k, r): its pixel pairs of x_t (t = 0: the prime) through its index
// registers kept across steps (the first V7J_XP of Worker::xidx's, as v7h_gather's), as
// V7XGatherPairs loads them, then their store into x_t's ring slot.
template <class Em>
void v7j_store_x(Em& em, int k, int r, int tid, int t) {
  int(&idx)[V7J_XP] =
      *reinterpret_cast<int(*)[V7J_XP]>(&em.workers[k][r].xidx[size_t(tid) * V7_XF]);
  const int f0 = (k * V7_CLUSTER + r) * V7_FW;
  uint16_t px[V7J_XP];
  if (t == 0) v7j_fetch_idx(em.e, em.order, 0, tid, V7_T, idx);
  v7j_fetch_px(em.x, idx, f0, tid, V7_T, px);
  if (t + 1 < em.e.steps) v7j_fetch_idx(em.e, em.order, t + 1, tid, V7_T, idx);
  v7j_store_xh(t, tid, V7_T, px,
               reinterpret_cast<__half*>(em.workers[k][r].sm.data() + V7ESmem::XH));
}

// The setup's W₀ pieces (after W₀'s fp32 entries).
inline void v7j_host_setup(float* sm) {
  for (int tid = 0; tid < V7_T; ++tid)
    v7j_put_w_all(tid, sm + V7ESmem::W, reinterpret_cast<__half*>(sm + V7JSmem::WP));
}

// The update of one worker CTA with G_a's float4s `pf` (the fetching threads' registers): the
// staging, the sums by warps 0-7, the apply (bug 29: W only).
inline void v7j_host_update(const V7Epoch& e, int a, float* sm, const float* pf, bool rz,
                            int bug) {
  __half* gsh = reinterpret_cast<__half*>(sm + V7ESmem::GSH);
  for (int tid = V7D_PF0; tid < V7_T; ++tid)
    for (int kk = 0; kk < V7D_VEC; ++kk) {
      const int i = v7d_vec(tid, kk);
      const float* g = pf + 4 * i;
      v7j_put_g(i, make_float4(g[0], g[1], g[2], g[3]), v7d_vec_valid(e, a, i), e.rows(a), gsh);
    }
  const V8HostWarp warp{rz};
  const __half* xa = reinterpret_cast<const __half*>(sm + V7ESmem::XH) + (a % V7_XR) * BMAX * 16;
  for (int u = 0; u < V7_T / 32; ++u)
    v7j_update_sums(warp, u, xa, gsh, sm + V7ESmem::URED, bug != 28);
  __half* wp = reinterpret_cast<__half*>(sm + V7JSmem::WP);
  for (int tid = 0; tid < V7_T; ++tid) {
    if (bug == 29)
      v8_mma_update_apply(e, a, sm + V7ESmem::URED, tid, sm + V7ESmem::W);
    else
      v7j_apply(e, a, sm + V7ESmem::URED, tid, sm + V7ESmem::W, wp);
  }
}

// P_t's tiles of one worker CTA, out(row, c, v0, v1) as v7j_partial's (bug 27: x unswizzled).
template <class Out>
void v7j_host_partials(int t, float* sm, bool rz, int bug, Out out) {
  const __half* xt = reinterpret_cast<const __half*>(sm + V7ESmem::XH) + (t % V7_XR) * BMAX * 16;
  const __half* wp = reinterpret_cast<const __half*>(sm + V7JSmem::WP);
  for (int wi = 0; wi < V7_T / 32; ++wi) v7j_partial(V8HostWarp{rz}, wi, xt, wp, out, bug != 27);
}

}  // namespace
