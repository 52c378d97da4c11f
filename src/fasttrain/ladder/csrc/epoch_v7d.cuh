// cuda-epoch v7d: v7c's epoch kernel (its chain: v7c_chain) with workers that fetch the next
// update's G a step ahead (V7GAhead, plugged into v7b's worker loop, v7_worker's GF). Written
// without a GPU, not yet run on one.
//
// Why (H200, 2026-11-28, run 2: v7c's worker phases, µs a step): wait G 0.77 and update 1.17 of a
// ~3.85 µs step. In v7b/v7c a worker's update with G_a starts with threads 0-7 polling the chain
// counters (ld.acquire: one L2 round trip when G_a is already there, the usual case with the
// workers L = 4 steps behind), a CTA barrier, then G_a's 5 KiB loaded from L2 (a second round
// trip), a barrier, and only then the sums: two round trips nothing overlaps. v7d moves both into
// the step before: during step t's partials (warps 0-7 compute them; warps 8-15 are idle there)
// warps 8-15 check, without blocking, whether the next update's G_a is published, and if it is
// load their two float4s of it into registers (V7D_VEC, epoch_v7d_math.cuh); the loads stay in
// flight through the cluster barrier and the reduce and are consumed when the update stores them
// into gs. If G_a was not published yet (or this is the epoch's first update, or an update after
// the loop), the update polls and loads as v7b's does (bounded: the fault hook still times out).
//
// Memory ordering (the chain: G_a's rows to global memory, __syncthreads, st.release.gpu of its
// counter, epoch_v7_sync.cuh's publish). In each fetching warp, lanes 0-7 read the 8 counters with
// ld.acquire.gpu; the warp votes (__all_sync); then __syncwarp, which orders memory among the
// warp's lanes (CUDA C++ Programming Guide, __syncwarp: "guarantees memory ordering among threads
// participating in the barrier"), so every lane's ld.global.cg of G_a comes after an acquire that
// saw the release: it cannot return the rows from before the chain's writes. The loads are issued
// only after the flags were seen: a counter seen late just means no prefetch (the update then
// waits), never a stale G; the loads are never issued first and checked after. What a held G
// belongs to is a step number (held), compared with the update's a, so a held G cannot be used
// for another step. The host emulation checks the step bookkeeping and the check-before-load
// order as far as it can (a prefetch is a snapshot of global memory taken at the prefetch point:
// planted bug 10 takes it before the flags are checked); the hardware ordering itself (acquire,
// __syncwarp, ld.cg) only the GPU tests cover.
#pragma once
#include "epoch_v7c.cuh"
#include "epoch_v7d_math.cuh"

namespace {

// The next update's G, fetched ahead by threads tid ≥ V7D_PF0 (each its V7D_VEC float4s).
struct V7GAhead {
  float4 g[V7D_VEC];
  int held = -1;  // the step whose G is in g (or in flight to it); -1: none

  // My float4s of G_a from L2, after my warp's acquire of all 8 counters (see the top).
  __device__ __forceinline__ void load(const V7Args& v, int a, int tid) {
    const float4* src = reinterpret_cast<const float4*>(v.s.g + size_t(a) * BMAX * V7_GROW);
    for (int k = 0; k < V7D_VEC; ++k) {
      const int i = v7d_vec(tid, k);
      if (v7d_vec_valid(v.e, a, i)) g[k] = __ldcg(src + i);
    }
    held = a;
  }
  // During a step, not blocking: G_a's loads issued if all 8 chain CTAs have published it.
  __device__ __forceinline__ void ahead(const V7Args& v, int a, int tid) {
    if (tid < V7D_PF0 || held == a) return;  // warp-uniform
    const int lane = tid & 31;
    const bool seen = lane >= V7_CHAIN || ld_acquire(v.s.gflag + lane) >= v7_g_ready(a);
    const bool all = __all_sync(0xffffffffu, seen);
    __syncwarp();  // the acquires before every lane's loads
    if (all) load(v, a, tid);
  }
  // At the update with G_a: nothing to wait for if it was fetched ahead; otherwise v7b's bounded
  // poll (by lanes 0-7 of each fetching warp) and the loads. False: the wait failed.
  __device__ __forceinline__ bool wait(const V7Args& v, int a, int tid) {
    if (tid < V7D_PF0 || held == a) return true;  // warp-uniform
    const int lane = tid & 31;
    const bool ok = lane >= V7_CHAIN || poll_at_least(v.s.gflag + lane, v7_g_ready(a),
                                                      WAIT_V7_G | blockIdx.x << 4 | a << 12);
    const bool all = __all_sync(0xffffffffu, ok);
    __syncwarp();
    if (all) load(v, a, tid);
    return all;
  }
  // After the CTA's barrier that follows every wait: my float4s into gs for the update's sums
  // (the previous update's sums read gs before two barriers ago).
  __device__ __forceinline__ void stage(const V7Args& v, int a, int tid, float* gs) {
    if (tid < V7D_PF0) return;
    for (int k = 0; k < V7D_VEC; ++k) {
      const int i = v7d_vec(tid, k);
      if (v7d_vec_valid(v.e, a, i)) reinterpret_cast<float4*>(gs)[i] = g[k];
    }
  }
};

// v7c's kernel (its chain; in one launch, GRAMS = V7_GRAMS_LAUNCH, its producers, ticket, ring
// clear and reset wait) with the workers' G fetched ahead.
template <bool TIMED = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel_d(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  v7c_epoch<TIMED, GRAMS>(v, sm, V7WorkerOf<TIMED, V7GAhead>{});
#endif
}

}  // namespace
