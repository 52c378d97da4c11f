// cuda-epoch v7's device-side hand-offs (epoch_v7.cuh's roles use them; moved out of it as they
// were): the step counters' release/acquire, v7b's tagged 64-bit words, the bounded polls of both
// (WAIT_BUDGET clocks, as v4's waits: a timeout records its code in g_signal_error), v7b's warp
// policy of the lanes (__shfl_xor_sync), DSMEM loads and the cluster barrier.
#pragma once
#include "epoch_v4.cuh"
#include "epoch_v7b_math.cuh"
#include "v8_cluster_ptx.cuh"  // v8k_remote_arrive, v8k_st8: v7f's and the v8 probes' credits and sends
#include "v8_mma.cuh"

namespace {

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// v7b's tagged words: one naturally aligned 64-bit scalar access each (single-copy atomic),
// relaxed at gpu scope (morally strong against each other, served by L2: L1 is not coherent).
struct LdRelaxed64 {
  __device__ __forceinline__ uint64_t operator()(const uint64_t* p) const {
    uint64_t v;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
  }
};
__device__ __forceinline__ void st_relaxed64(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Poll until *flag ≥ want, at most WAIT_BUDGET clocks (v4's bounded_wait for a global counter).
__device__ __noinline__ bool poll_at_least(const int* flag, int want, int code) {
  const long long t0 = clock64();
  for (int n = 1;; ++n) {
    if (ld_acquire(flag) >= want) return true;
    if ((n & 63) == 0 && *static_cast<volatile int*>(&g_signal_error) != 0) return false;
    if (clock64() - t0 > WAIT_BUDGET) {
      atomicCAS(&g_signal_error, 0, code);
      return false;
    }
  }
}
// v7b: poll my 7 tagged words until every tag is `want`, at most WAIT_BUDGET clocks (after a
// first try inline, in the caller). Returns 1 << 32 | the bits of their sum, or 0 (timed out, or
// another wait did: the flag is set).
__device__ __noinline__ unsigned long long poll_tagged(const uint64_t* words, int want, int code) {
  const long long t0 = clock64();
  for (int n = 1;; ++n) {
    float p;
    if (v7b_sum_tagged(words, want, LdRelaxed64{}, p)) return 1ull << 32 | __float_as_uint(p);
    if ((n & 63) == 0 && *static_cast<volatile int*>(&g_signal_error) != 0) return 0;
    if (clock64() - t0 > WAIT_BUDGET) {
      atomicCAS(&g_signal_error, 0, code);
      return 0;
    }
  }
}
// v7b's softmax lanes on the GPU: a lane is the thread itself (the host harness's policy runs 32).
using V7DeviceWarp = V8DeviceWarp;  // csrc/v8_mma.cuh's: at, each, shfl_xor (and the mma)
// After a __syncthreads that follows every thread's writes: publish `steps` (thread 0). The
// release is cumulative: the CTA's writes ordered before it by the barrier are visible to an
// acquire that reads the count (the pattern of CUTLASS's GenericBarrier::arrive_inc, a fence and
// a relaxed add after __syncthreads; st.release is that fence and a store). v7a had a
// __threadfence() before it too: a second fence, 0.67–0.74 µs a step with the store on an H200.
__device__ __forceinline__ void publish(int* flag, int steps) {
  if (threadIdx.x == 0) st_release(flag, steps);
}
// A 4-byte word of cluster CTA `rank`'s shared memory at my address `addr` (DSMEM).
__device__ __forceinline__ uint32_t ld_dsmem(uint32_t addr, int rank) {
  uint32_t v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(mapa(addr, rank)) : "memory");
#endif
  return v;
}
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
#endif
}

}  // namespace
