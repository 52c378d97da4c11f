// cuda-epoch v8's chain cluster (csrc/v8_cluster.cuh): its sm_90 PTX — mapa, mbarriers with
// tx-counts, bounded parity waits, st.async, the cluster barrier — as the patterns already in the
// tree (epoch_v4.cuh, v8_workers.cu) but self-contained, so v8_chain.cu needs no v4 headers.
#pragma once
#include <cstdint>

namespace {

// The cluster's PTX (mapa, mbarriers with tx-counts, st.async, cluster barriers) is sm_90's: below
// it the wrappers are empty, so the chain-alone variants still build there, and v8_cluster_run
// refuses to launch (cudaErrorNotSupported).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define V8K_SM90 1
#else
#define V8K_SM90 0
#endif

__device__ int g_v8k_error;
constexpr long long V8K_BUDGET = 1LL << 27;

__device__ __forceinline__ uint32_t v8k_mapa(uint32_t addr, int rank) {
  uint32_t out = addr;
#if V8K_SM90
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
#endif
  return out;
}
__device__ __forceinline__ void v8k_init(uint32_t bar, int count) {
#if V8K_SM90
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void v8k_init_fence() {  // the inits, visible to the cluster
#if V8K_SM90
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void v8k_arm(uint32_t bar, int bytes) {
#if V8K_SM90
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void v8k_remote_arrive(uint32_t bar, int rank) {
#if V8K_SM90
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(
                   v8k_mapa(bar, rank))
               : "memory");
#endif
}
// A parity test of this CTA's mbarrier, its acquire at cluster scope (peers' st.async and arrives
// complete on it) or, CTA = true, at CTA scope (v8_chain.cu's v3: its bulk copies complete on the
// CTA's own barrier and its readers are the CTA's; the cluster-scope acquire costs a CCTL.IVALL,
// an L1 invalidation, on success in SASS, nvcc 13.0 sm_90a, the CTA-scope one does not).
#define V8K_TRY_WAIT_ASM(scope)                                                  \
  "{\n .reg .pred p;\n"                                                          \
  " mbarrier.try_wait.parity.acquire." scope ".shared::cta.b64 p, [%1], %2;\n"   \
  " selp.u32 %0, 1, 0, p;\n}"
template <bool CTA = false>
__device__ __forceinline__ bool v8k_try_wait(uint32_t bar, int parity) {
  uint32_t done = 1;
#if V8K_SM90
  if constexpr (CTA)
    asm volatile(V8K_TRY_WAIT_ASM("cta") : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  else
    asm volatile(V8K_TRY_WAIT_ASM("cluster") : "=r"(done) : "r"(bar), "r"(parity) : "memory");
#endif
  return done != 0;
}
__device__ __noinline__ bool v8k_wait_slow(uint32_t bar, int parity, int code) {
  const long long t0 = clock64();
  for (int n = 1;; ++n) {
    if (v8k_try_wait(bar, parity)) return true;
    if ((n & 63) == 0 && *static_cast<volatile int*>(&g_v8k_error) != 0) return false;
    if (clock64() - t0 > V8K_BUDGET) {
      atomicCAS(&g_v8k_error, 0, code);
      return false;
    }
  }
}
__device__ __forceinline__ bool v8k_wait(uint32_t bar, int parity, int code) {
  return v8k_try_wait(bar, parity) || v8k_wait_slow(bar, parity, code);
}
// st.async into a cluster peer's shared memory (cluster addresses), complete_tx on its mbarrier.
__device__ __forceinline__ void v8k_st16(uint32_t dst, uint4 v, uint32_t bar) {
#if V8K_SM90
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
      ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
      : "memory");
#endif
}
__device__ __forceinline__ void v8k_st8(uint32_t dst, float a, float b, uint32_t bar) {
#if V8K_SM90
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(
          dst),
      "f"(a), "f"(b), "r"(bar)
      : "memory");
#endif
}
__device__ __forceinline__ void v8k_cluster_barrier() {
#if V8K_SM90
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
#endif
}
// The chain's v3 (v8_chain.cu): `bytes` (a multiple of 16; both addresses 16-byte aligned) from
// global memory into this CTA's shared memory by the async proxy's bulk copy (the TMA unit, no
// tensor map), completing `bytes` of tx on this CTA's mbarrier `bar`; and the proxy fence that
// orders this thread's (and, after a barrier, the CTA's) generic-proxy accesses of shared memory
// before later async-proxy ones, e.g. the ring slot's ld.shared reads before the bulk copy that
// refills it (PTX ISA: fence.proxy.async is bidirectional; .shared::cta restricts it to this
// CTA's shared memory).
__device__ __forceinline__ void v8k_bulk_g2s(uint32_t dst, const void* src, int bytes,
                                             uint32_t bar) {
#if V8K_SM90
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}
__device__ __forceinline__ void v8k_fence_proxy_async() {
#if V8K_SM90
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
__device__ __forceinline__ int v8k_rank() {
  uint32_t r = 0;
#if V8K_SM90
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return static_cast<int>(r);
}

}  // namespace
