// cuda-epoch v7k: v7j's epoch kernel (v7i's chain, v7j's workers) with two CTA-wide barriers
// fewer a worker step (the design's j3) and the chain counters read a step early (j5). Written
// without a GPU, not yet run on one (the design doc's "v7k" section).
//
// j3: a worker step of v7j has six CTA-wide barriers when it applies an update: the vote
// (__syncthreads_or of the G wait), after G′'s staging, after the sums, after the apply, "x_t in
// place", and the reduce's (before its credits). v7k drops two (V7KStep::FEWER_BARRIERS):
// - The staging barrier. The fetching threads (warps 8-15) stage G′ BEFORE the vote, and the
//   vote's barrier orders it. The pairs that barrier ordered: (a) the staging's writes of gs →
//   the sums' ldmatrix reads of gs (warps 0-7): the staging precedes the vote's bar.red in
//   program order, the sums follow it, and bar.red, like bar.sync, orders every participant's
//   prior shared accesses before every participant's later ones. (b) the previous update's sums'
//   reads of gs → this staging's writes: ordered by that update's apply barrier (and its
//   sums barrier), both still there. Nothing else runs between the vote and the old staging
//   barrier (a clock mark: registers). A warp whose wait failed stages nothing (its verdict is
//   warp-uniform); the vote then ends the update, and after a failure no update reads gs.
// - The "x_t in place" barrier, when this step called an update. The pairs it ordered: (a) the
//   store of x_t into ring slot t % XR (every thread, at the end of step t − 1) → the partials'
//   ldmatrix reads of that slot (step t): any update of step t passes its vote's barrier, which
//   follows the store and precedes the partials in program order (a failed update too: it
//   returns after the vote); (b) the apply's writes of W and W's pieces → the partials' reads:
//   the apply's own barrier, kept; (c) the previous readers of slot (t + 1) % XR → step t's store
//   of x_{t+1}: the partials of step t + 1 − XR (many barriers ago) and an update's sums of step
//   a ≡ t + 1 (mod XR), whose sums barrier precedes the store. Without an update in step t (the
//   first L + 1 steps, after a failure) the barrier stays: nothing else orders (a).
// So 6 → 4 barriers a step with an update (the PTX: two bar.sync 0 fewer, the update's staging
// barrier in both of its inlined copies; the x_t barrier is still there once, behind the test).
// The host emulation runs a CTA's step as one unit, so it cannot see a missing barrier: only the
// GPU tests (float64 in both modes, the slices, the fault) check j3.
//
// j5: in v7j the fetch-ahead (V7GAhead::ahead, after the partials) reads the 8 chain counters by
// ld.acquire.gpu and compares them at once: an L2 round trip that thread 0's "reduce" waits for
// (the reduce's barrier). V7KGAhead: lanes 0-7 of warps 8-15 issue ld.relaxed.gpu of counter
// `lane` at the TOP of the step (top(), its value in one register), test it after the partials
// (~1 µs later, when the load has landed), and if all 8 counts are reached, fence.acquire.gpu,
// __syncwarp, then the G loads. A stale early value (a count reached after the read was issued)
// falls back to v7j's path (V7GAhead::ahead: ld.acquire now, loads if reached, else the update
// waits as always).
// Memory order (PTX memory model; NVIDIA's atomics ABI, PTX writers' guide: `ld.relaxed.<scope>;
// fence.acquire.<scope>` is a valid mapping of an acquire load, the mappings proven in "A Formal
// Analysis of the NVIDIA PTX Memory Consistency Model"):
// - The release. Count c of chain CTA q is written only by its publishing helper thread, by
//   st.release.gpu after a CTA barrier that follows G_0 … G_{c−1}'s row stores (epoch_v7i.cuh).
// - The acquire pattern. ld.relaxed.gpu is a strong read at gpu scope (morally strong with the
//   release: both .gpu, the same address); followed in program order by fence.acquire.gpu (or
//   fence.acq_rel/.sc) it forms an acquire pattern, and a release pattern synchronizes with an
//   acquire pattern whose read observes the release's write. So if the early read returned a
//   value ≥ v7_g_ready(a), the release of that value (and, through its barrier, G_a's rows)
//   happens before everything the reading thread does after the fence: its G loads, and, by
//   __syncwarp (memory ordering among the warp's lanes, v7d's argument), its warp's other lanes'.
//   When the read was issued does not matter: the model orders by what it observed, and the loads
//   are issued after the fence. Only the test must precede the loads (v7d's rule: never load,
//   then check).
// - Another epoch's counts. The counters are zeroed before any worker reads them (two launches:
//   by the Gram kernel; one launch: by producer 0 before its release of `reset`, which every
//   worker acquires before its role starts and so before its first early read); by coherence a
//   later read cannot return a value the zeroing overwrote. An early read issued before that
//   acquire could (the planted bug 31 of the host emulation).
// - Why fence.acquire and not fence.acq_rel: the same acquire, but nvcc 13.0 compiles
//   fence.acq_rel.gpu to MEMBAR.ALL.GPU; ERRBAR; CGAERRBAR; CCTL.IVALL (it waits for the thread's
//   outstanding memory operations: the partials' st.asyncs were just issued) and fence.acquire.gpu
//   to CCTL.IVALL alone, what ld.acquire adds to a strong load (sm_90a, checked on a small kernel).
// The host emulation (tests/ladder/csrc/epoch_v7k_host.h) models the early read: its value is
// the counters when the worker's previous unit ended (the step's top), tested when the unit's
// partials are done, the fallback reading them then; its schedules make stale early reads and
// the fallback happen, and its planted bugs (30: loads issued with the early read and kept when
// the fallback passes; 31: step 0's early read before the reset) fail.
//
// Arithmetic: the same G in the same registers, the same sums: v7k trains as v7j bit for bit.
// ptxas (nvcc 13.0, sm_90a): 119 / 128 registers (two launches, untimed / timed), 121 / 127 (one
// launch), no spill (j: 119 / 128, 121 / 125); BAR.SYNC 22 → 20 (two launches), 33 → 31 (one).
// Estimate (not measured; the design doc): j3 ~−0.03-0.05 µs, j5 ~−0.1-0.18 µs a worker step,
// j5's only if the early reads are fresh (the design doc: about one worker step of slack).
#pragma once
#include "epoch_v7j.cuh"

namespace {

// With a strong read before it (ld_relaxed, epoch_v7l.cuh), an acquire pattern (see the top).
__device__ __forceinline__ void v7k_fence_acquire_gpu() {
  asm volatile("fence.acquire.gpu;" ::: "memory");
}

// v7d's fetch-ahead with the counters read at the top of the step (see the top).
struct V7KGAhead : V7GAheadH {
  int early = 0;  // lanes 0-7 of warps 8-15: chain counter `lane` as read at the step's top
  __device__ __forceinline__ void top(const V7Args& v, int tid) {
    if (tid >= V7D_PF0 && (tid & 31) < V7_CHAIN) early = ld_relaxed(v.s.gflag + (tid & 31));
  }
  __device__ __forceinline__ void ahead(const V7Args& v, int a, int tid) {
    if (tid < V7D_PF0 || held == a) return;  // warp-uniform
    const int lane = tid & 31;
    if (__all_sync(0xffffffffu, lane >= V7_CHAIN || early >= v7_g_ready(a))) {
      v7k_fence_acquire_gpu();  // lanes 0-7: their early reads become acquires
      __syncwarp();             // ... before every lane's loads
      load(v, a, tid);
      return;
    }
    V7GAheadH::ahead(v, a, tid);  // stale: v7j's acquire now
  }
};

// v7k's step: G′ staged before the vote, x_t's barrier only without an update (j3), the
// counters read early (j5).
struct V7KStep {
  static constexpr bool FEWER_BARRIERS = true;
  static constexpr bool EARLY = true;
  using GAhead = V7KGAhead;
};

// v7j's kernel with v7k's step.
template <bool TIMED = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel_k(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  v7c_epoch<TIMED, GRAMS>(v, sm, V7FWorker<TIMED, V7XGatherPairs, true, V7JMma, V7KStep>{},
                         V7GChain<TIMED, V7IHelperPublish>{});
#endif
}

}  // namespace
