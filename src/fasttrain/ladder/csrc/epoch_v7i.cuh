// cuda-epoch v7i: v7h's epoch kernel (v7g's chain, v7h's workers) with G_t's global store and the
// chain CTA's step counter done by the chain's helper warps, not its critical warps. Written
// without a GPU, not yet run on one (the design doc's "v7i" section: the SASS behind it).
//
// Why. In v7h's SASS (nvcc 13.0, sm_90a, v7_epoch_kernel_h<false, 1>) the critical warps end a
// step with: the sends (each thread 2-3 LDS.128 → STAS.128, threads 0-63 also an STG.E.128 of
// its row of G_t), BAR.SYNC 1 (256 threads), then thread 0's release of the counter,
// MEMBAR.ALL.CTA; MEMBAR.ALL.GPU; ERRBAR; CGAERRBAR; STG.E.STRONG.GPU: a fence that waits for the
// stores' acknowledgement, an L2 round trip, before warp 0 reaches the next step's wait for G
// (v7f on an H200, 2026-11-28, µs a step: send G 0.42, publish 0.40). The counter is for the
// workers only; the chain's own dependency is the st.async sends into every chain CTA's ring.
//
// What v7i does (V7IHelperPublish, the hooks of v7g_chain / v7g_helpers):
// - critical warps, step t: after colsum's barrier the sends to the rings only
//   (chain_send_g<.., false>), then bar.arrive on named barrier V7I_BAR_G (3, 512 threads:
//   non-blocking: gl holds G_t), and straight to step t + 1's wait: no bar.sync, no fence, no
//   global store.
// - helper warps, iteration t (it runs during the critical step t; step t + 1's hand-off ends
//   it): before that hand-off, bar.sync V7I_BAR_G (G_t in gl), then 64 threads (warps 14, 15)
//   load one float4 of G_t's rows each and store it to global memory; after the hand-off, at the
//   top of iteration t + 1, helper thread 0 (h = 0) releases the counter t + 1. The last step's
//   G_{steps−1}: after the loop (the release of steps − 1, then the store, a barrier of the 256
//   helper threads, V7I_BAR_LAST, and the release of steps).
//
// Memory order (PTX memory model):
// - G_t's rows to the workers. A worker thread reads gflag[q] ≥ t + 1 by ld.acquire.gpu, then
//   G_t's rows from global memory. The storing helper threads' STGs precede, in program order,
//   their arrival at the hand-off t + 1 (bar.sync: every participant's prior accesses are ordered
//   before every participant's later ones at CTA scope); helper thread 0's st.release.gpu of
//   t + 1 follows that barrier, and a release is cumulative: the stores it observed through the
//   barrier are ordered before it for any thread that acquires the value, at gpu scope (the
//   argument of `publish`, epoch_v7_sync.cuh: CUTLASS's GenericBarrier::arrive_inc pattern, a
//   CTA barrier then one thread's release). A later value of the counter (t + 2, …) is released by
//   the same thread after later barriers, so an acquire that reads it covers G_t as well.
// - gl (shared) between the halves. Its writes of step t (the softmax and colsum) precede the
//   critical warps' bar.arrive; the helpers' bar.sync on that barrier completes only after every
//   critical thread arrived, and the arrive/sync pair orders the shared accesses before it
//   (the PTX ISA's barrier{.cta}: arrive's prior accesses are performed relative to the barrier's
//   participants; CUTLASS's NamedBarrier producer/consumer pattern). The critical warps write gl
//   again in step t + 1's softmax, after hand-off t + 1, which the helpers reach only after their
//   loads of G_t (into registers: the STGs carry registers, not shared memory).
// - Barrier V7I_BAR_G's instances never overlap: the critical warps arrive for step t + 1 after
//   hand-off t + 1, which the helpers pass only after their bar.sync of step t completed.
// - A stop (a failed wait) read after a hand-off sends both halves out together: the critical
//   warps arrive for step t only after hand-off t, the helpers sync on it only before hand-off
//   t + 1 (or after their loop, which the critical step steps − 1 also reaches), so nobody waits
//   on V7I_BAR_G for a thread that left. A failed run publishes no further count: the workers'
//   bounded waits then fail too, as when v7h's chain fails before its publish.
//
// Arithmetic: the same G, the same stores (at other times), so v7i trains as v7h (and g, f) bit
// for bit; the host emulation (tests/ladder/csrc/epoch_v7i_host.h) checks that, and the order.
// ptxas (nvcc 13.0, sm_90a): 119 / 128 registers (two launches, untimed / timed), 121 / 128 (one
// launch), no spill; 5 named barriers (v7h: 3).
// Estimate (not measured; the design doc's "v7i"): the chain's step 0.25-0.55 µs shorter.
#pragma once
#include "epoch_v7h.cuh"
#include "epoch_v7i_math.cuh"

namespace {

constexpr int V7I_BAR_G = 3, V7I_BAR_LAST = 4;  // named barriers (epoch_v7c.cuh: 1, 2)

template <int ID, int THREADS>
__device__ __forceinline__ void bar_arrive() {
  asm volatile("bar.arrive %0, %1;" ::"n"(ID), "n"(THREADS) : "memory");
}

struct V7IHelperPublish {
  // Critical warps: the rings only (gl holds G_t: colsum's barrier passed), no barrier after.
  __device__ __forceinline__ void sent(const V7Args& v, int t, int q, int tid, const float* gl,
                                       uint32_t ring_u, uint32_t bar_u) const {
    chain_send_g<V7C_CRIT, false>(v, t, q, tid, gl, ring_u, bar_u);
  }
  // Then "G_t is in gl" to the helpers, without waiting (the phase "publish": this instruction).
  // After the sends, not before: the helpers store at their iteration's end, and the critical
  // warps reach the next hand-off only after the next G wait, so it costs nobody a wait.
  __device__ __forceinline__ void published(const V7Args&, int, int) const {
    bar_arrive<V7I_BAR_G, V7_T>();
  }
  // Helpers, top of iteration t ≥ 1 (after hand-off t): G_{t−1}'s rows were stored before it.
  __device__ __forceinline__ void top(const V7Args& v, int t, int q, int h) const {
    if (t > 0 && h == 0) st_release(v.s.gflag + q, t);
  }
  // Helpers, end of iteration t (before hand-off t + 1): G_t from gl to global memory.
  __device__ __forceinline__ void before_hand(const V7Args& v, int t, int q, int h,
                                              const float* gl) const {
    bar_sync<V7I_BAR_G, V7_T>();
    v7i_store_g(v.e, v.s.g, t, q, h, gl);
  }
  // Helpers, after their loop (every hand-off passed, no stop): G_{steps−2}'s count (stored in
  // the last iteration), then G_{steps−1}'s rows and count.
  __device__ __forceinline__ void last(const V7Args& v, int steps, int q, const float* gl) const {
    const int h = threadIdx.x - V7C_CRIT;
    if (steps > 1 && h == 0) st_release(v.s.gflag + q, steps - 1);
    bar_sync<V7I_BAR_G, V7_T>();
    v7i_store_g(v.e, v.s.g, steps - 1, q, h, gl);
    bar_sync<V7I_BAR_LAST, V7_T - V7C_CRIT>();
    if (h == 0) st_release(v.s.gflag + q, steps);
  }
};

// v7h's kernel with v7i's chain (v7g_chain with V7IHelperPublish).
template <bool TIMED = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel_i(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  v7c_epoch<TIMED, GRAMS>(v, sm, V7FWorker<TIMED, V7XGatherAhead, true>{},
                         V7GChain<TIMED, V7IHelperPublish>{});
#endif
}

}  // namespace
