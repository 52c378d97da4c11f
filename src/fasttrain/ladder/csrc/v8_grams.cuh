// cuda-epoch v8's lagged Grams on the GPU (docs/measurements/cuda-epoch-v8-design.md, "Two
// changes to v7's algebra"): Γ̃_{t,j} = X̃_t X̃_{t−j}ᵀ for j = 1 … 6, the bias a 785th pixel of 255
// (Γ̃ = Γ + 255² on valid row pairs, 0 elsewhere), for the v8 probes (csrc/v8_chain.cu's
// v8_grams_run, ladder/v8_grams.py) in their own layouts: Γ̃_{t,1} into "grams" [steps][128][128],
// Γ̃_{t,j≥2} into "gramh" [5][steps][128][128] (ladder/v8_chain.py's chain_inputs), so the chain
// and cluster kernels read them unchanged.
//
// The kernel is Gram v2's CTA (gram_v2.cuh, its V8 instantiation): grid (2, steps), CTA (tile, t)
// stages X_t's 64 rows and X_{t−1} … X_{t−6}'s 128 each (832 rows × 80 B, double-buffered:
// 133,120 B of shared memory, + 14,336 B for the threads' source-row table), 16 warps of 32 × 96
// tiles over the lags' concatenated columns, and writes every entry of its rows of the 6 blocks
// (zeros included: no memset of the 184 MB).
// Why 16 warps of 32 × 96 (96 s32 accumulators a thread) and not
//   - 24 warps of v7's 32 × 64: 768 threads leave 85 registers a thread, under v7's 64
//     accumulators + 20 fragment registers + addresses: a spill (an estimate from v7's count);
//   - 16 warps looping over the lags (v7's tile, two passes): the second pass has 8 roles for 16
//     warps and re-stages K: ~1.33× v7's MMA time and twice the L2 → SM bytes (an estimate);
//   - 32-row tiles (4 CTAs a step): each CTA re-stages the 768 lag rows for half the output.
// At 128 registers (512 threads, 1 CTA an SM) ptxas first spilled 16 bytes; two changes made it
// 0 (sm_90a, nvcc 13): the source rows in shared memory (gram_v2.cuh's DeviceCtaT) and the
// lags' output pointers as two and a stride (store_warp_full).
//
// Cost (ESTIMATES from v7's measured 211–237 µs an epoch, L = 4, H200): the same 938 CTAs, one
// an SM, ~7.1 waves; each CTA 1.5× v7's MMA (64 × 768 × 800 against 64 × 512 × 800), 1.44× its
// L2 → SM bytes (832 against 576 rows) and every block written (469 × 6 × 64 KB = 184 MB against
// 123 MB): ~1.45–1.5× v7, ~300–360 µs an epoch on an H200.
// WRITTEN WITHOUT A GPU (2026-11-28, branch gram6): compiled for sm_90a (the compile test holds
// its registers and spills), CPU-emulated bit for bit against chain_inputs
// (tests/ladder/test_gram_v2.py); NOT YET RUN ON A GPU.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "gram_v2.cuh"

namespace {

using V8Gram = gram::v2::V8;
constexpr int V8G_SMEM =
    V8Gram::SMEM + V8Gram::THREADS * int(sizeof(gram::v2::SrcT<V8Gram>));  // 147,456 B

__global__ void __launch_bounds__(V8Gram::THREADS, 1)
    v8_gram_kernel(const uint8_t* __restrict__ x, const int32_t* __restrict__ order, int n,
                   float* __restrict__ grams, float* __restrict__ gramh) {
  extern __shared__ __align__(128) uint8_t v8g_smem[];
  const int steps = (n + BMAX - 1) / BMAX;
  const gram::v2::JobT<V8Gram> job =
      gram::v2::v8_job(n, BMAX, steps, x, order, grams, gramh, blockIdx.y, blockIdx.x);
  gram::v2::DeviceCtaT<V8Gram> cta;
  cta.table = reinterpret_cast<gram::v2::SrcT<V8Gram>*>(v8g_smem + V8Gram::SMEM);
  gram::v2::cta_grams(cta, job, v8g_smem);
}

// One epoch's Grams (n ≥ 1 samples of x [*][784] uint8 in `order`, batches of 128): a launch
// of (2, ⌈n/128⌉) CTAs. Returns a cudaError_t (a failed launch's error cleared).
inline cudaError_t v8_gram_launch(const uint8_t* x, const int32_t* order, int n, float* grams,
                                  float* gramh, cudaStream_t stream) {
  cudaError_t e = cudaFuncSetAttribute(v8_gram_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, V8G_SMEM);
  if (e == cudaSuccess) {
    const dim3 grid(V8Gram::TILES, (n + BMAX - 1) / BMAX);
    v8_gram_kernel<<<grid, V8Gram::THREADS, V8G_SMEM, stream>>>(x, order, n, grams, gramh);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess) cudaGetLastError();
  return e;
}

}  // namespace
