// cuda-epoch v7h: v7g's epoch kernel (its chain, v7f's workers and protocol) with two waits taken
// off its workers' step, both found in v7f's SASS (the design doc's "v7h" section). Written
// without a GPU, not yet run on one.
//
// 1. The x gather pipelined a step deeper: the sample indices of step t + 2 loaded during step t,
//    the pixels of step t + 1 issued from indices already in registers (epoch_v7h_math.cuh).
// 2. The reduce's tagged stores after the inbox credits (v7f_worker's LATE). v7f's reducing
//    threads store their word of P_u (STG.E.64.STRONG.GPU), pass a __syncthreads, and threads 0-7
//    then credit the 8 senders with mbarrier.arrive.release.cluster, which ptxas compiles to
//    MEMBAR.ALL.GPU + the arrive: the fence waits until the thread's own global store is
//    acknowledged by L2, a round trip on thread 0's path every step (v7f's "reduce" 0.62-0.67 µs
//    a step on an H200, 2026-11-28, against v7c's 0.28-0.29 with no credit). The credit orders
//    only the slot's shared-memory reads (done: their sums are in registers), so h credits first
//    and stores after: the same words, the same release, no store for the fence to wait on.
//
// The worker loop is v7f_worker's (epoch_v7f.cuh), its gather a policy (V7XGatherNow there: the
// kernels of v7f and v7g compile to the PTX they had). Everything else, the arithmetic included,
// is v7g's: h trains as g (and f) bit for bit, since only when the bytes are loaded changes.
// ptxas (nvcc 13.0, sm_90a): 119 / 127 registers (two launches, untimed / timed), 117 / 128 (one
// launch), no spill: g's counts (its chain's), the workers' 4 index registers below them.
#pragma once
#include "epoch_v7g.cuh"
#include "epoch_v7h_math.cuh"

namespace {

// v7h's gather: idx holds the sample indices of the step whose pixels `next` issues.
struct V7XGatherAhead {
  using Buf = uint8_t[V7_XF];
  int idx[V7_XF];
  __device__ __forceinline__ void prime(const V7Args& v, int f0, int tid, uint8_t (&xb)[V7_XF]) {
    v7h_fetch_idx(v.e, v.a.order, 0, tid, V7_T, idx);
    v7h_fetch_px(v.a.x, idx, f0, tid, V7_T, xb);
    if (v.e.steps > 1) v7h_fetch_idx(v.e, v.a.order, 1, tid, V7_T, idx);
  }
  // During step t − 1 (t = 1 … steps − 1): x_t's bytes from the indices loaded a step ago, then
  // the indices of step t + 1 (their latency: the rest of this step and the next one's start).
  __device__ __forceinline__ void next(const V7Args& v, int t, int f0, int tid,
                                       uint8_t (&xb)[V7_XF]) {
    v7h_fetch_px(v.a.x, idx, f0, tid, V7_T, xb);
    if (t + 1 < v.e.steps) v7h_fetch_idx(v.e, v.a.order, t + 1, tid, V7_T, idx);
  }
};

// v7g's kernel with v7h's gather in its workers.
template <bool TIMED = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel_h(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  v7c_epoch<TIMED, GRAMS>(v, sm, V7FWorker<TIMED, V7XGatherAhead, true>{}, V7GChain<TIMED>{});
#endif
}

}  // namespace
