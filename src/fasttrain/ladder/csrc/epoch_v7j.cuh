// cuda-epoch v7j: v7i's epoch kernel (v7g's chain with v7i's publish, v7h's workers) with the
// workers' mma fragments loaded by ldmatrix and W·2⁸'s fp16 split done once per apply. Written
// without a GPU, not yet run on one (the design doc's "v7j" section: the SASS behind it).
//
// Why. In v7i's SASS (nvcc 13.0, sm_90a, v7_epoch_kernel_i<false, 1>) a worker warp of the
// update builds A = X_aᵀ and B = G′ hi, lo from 32 LDS.U16 + 16 PRMT, 512 shared-memory
// wavefronts a step over the CTA (x's rows i and i + 4 share a bank); the partials' 16 warps load
// W's fp32 4-way conflicted and split it into hi/lo in every lane (384 wavefronts, 16 instructions
// on the path to the first HMMA). The measured v7f phases (H200, 2026-11-28): update ~0.62-0.66
// µs a step, partials ~0.57; by that count the shared-memory pipe binds both.
//
// What v7j does (epoch_v7j_math.cuh: the bodies, the layout, the fragments' maps):
// - j1: the update's A by one ldmatrix.x4.trans a k-step, its B (hi and lo) by one more; x's ring
//   and G′ swizzled (a row's 16-byte halves swapped for rows 4 … 7 mod 8): 512 → 128 wavefronts.
// - j2: W·2⁸'s hi/lo pieces written once by the apply's thread of each entry (and W₀'s by the
//   setup), swizzled [16][16] fp16 arrays (1 KiB); the partials load A by ldmatrix.x4 and B by
//   ldmatrix.x4.trans: 384 → 128 wavefronts, no split on their path.
// - j4: x_{t+1} gathered by pixel pairs (V7XGatherPairs: v7h's pipeline, 2 indices and 2 16-bit
//   loads a thread where v7h has 4 and 4) and stored as halves by an exact fp16 subtraction
//   (0x6400 | b) − 1024, one 32-bit store a pair (v7h: I2F.U16 + F2FP and a 16-bit store a byte).
// The rest is v7i's: the protocol, the barriers (6 a step; the design's j3 and j5 are not built),
// the order of every mma chain. The same fp16 values reach the same fragments (the host
// emulation's ldmatrix is the PTX ISA's lane map; scripts/v7_worker_smem.py checks the maps), so
// v7j trains as v7i bit for bit: tests/ladder/test_cuda_epoch_v7_math.py (variant 9).
// Estimate (not measured; the design doc): the workers' update + partials −0.26 to −0.38 µs a
// step by the wavefront count (j1 + j2), taken as −0.1 to −0.35 given how such counts have held.
// ptxas (nvcc 13.0, sm_90a): 119 / 128 registers (two launches, untimed / timed), 121 / 125 (one
// launch), no spill (i: 119 / 128, 121 / 128).
#pragma once
#include "epoch_v7i.cuh"
#include "epoch_v7j_math.cuh"

namespace {

// j4: v7h's gather pipeline by pixel pairs (epoch_v7j_math.cuh): 2 index registers, a 16-bit
// load a pair.
struct V7XGatherPairs {
  using Buf = uint16_t[V7J_XP];
  int idx[V7J_XP];
  __device__ __forceinline__ void prime(const V7Args& v, int f0, int tid, Buf& px) {
    v7j_fetch_idx(v.e, v.a.order, 0, tid, V7_T, idx);
    v7j_fetch_px(v.a.x, idx, f0, tid, V7_T, px);
    if (v.e.steps > 1) v7j_fetch_idx(v.e, v.a.order, 1, tid, V7_T, idx);
  }
  // During step t − 1: x_t's pairs from the indices loaded a step ago, then step t + 1's indices.
  __device__ __forceinline__ void next(const V7Args& v, int t, int f0, int tid, Buf& px) {
    v7j_fetch_px(v.a.x, idx, f0, tid, V7_T, px);
    if (t + 1 < v.e.steps) v7j_fetch_idx(v.e, v.a.order, t + 1, tid, V7_T, idx);
  }
};

// v7j's mma bodies, v7f_worker's policy M (V7FMma's interface; x's store takes
// V7XGatherPairs' pairs).
struct V7JMma {
  __device__ __forceinline__ static __half* pieces(float* sm) {
    return reinterpret_cast<__half*>(sm + V7JSmem::WP);
  }
  // After the setup's W₀: thread tid < 256 wrote w[tid], and splits it (the barrier follows).
  __device__ __forceinline__ void setup(int tid, const float* w, float* sm) const {
    v7j_put_w_all(tid, w, pieces(sm));
  }
  __device__ __forceinline__ void store_x(const V7Epoch&, int t, int tid,
                                          const uint16_t (&px)[V7J_XP], __half* xh) const {
    v7j_store_xh(t, tid, V7_T, px, xh);
  }
  // V7GAheadH::stage with the swizzled pieces.
  __device__ __forceinline__ void stage(V7GAheadH& gf, const V7Args& v, int a, int tid,
                                        float* gs) const {
    if (tid < V7D_PF0) return;
    for (int k = 0; k < V7D_VEC; ++k) {
      const int i = v7d_vec(tid, k);
      v7j_put_g(i, gf.g[k], v7d_vec_valid(v.e, a, i), v.e.rows(a), reinterpret_cast<__half*>(gs));
    }
  }
  __device__ __forceinline__ void sums(int wi, const __half* xa, const __half* gsh,
                                       float* ured) const {
    v7j_update_sums(V8DeviceWarp{}, wi, xa, gsh, ured);
  }
  // W's entry and its pieces by the same thread; the apply's barrier orders them before the
  // partials' ldmatrix (and the partials' reads before the next apply: the reduce's and the
  // vote's barriers).
  __device__ __forceinline__ void apply(const V7Epoch& e, int a, const float* ured, int tid,
                                        float* w, float* sm) const {
    v7j_apply(e, a, ured, tid, w, pieces(sm));
  }
  template <class Out>
  __device__ __forceinline__ void partial(int wi, const __half* xt, const float*, float* sm,
                                          Out out) const {
    v7j_partial(V8DeviceWarp{}, wi, xt, pieces(sm), out);
  }
};

// v7i's kernel with v7j's worker bodies.
template <bool TIMED = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel_j(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  v7c_epoch<TIMED, GRAMS>(v, sm, V7FWorker<TIMED, V7XGatherPairs, true, V7JMma>{},
                         V7GChain<TIMED, V7IHelperPublish>{});
#endif
}

}  // namespace
