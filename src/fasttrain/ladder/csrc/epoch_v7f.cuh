// cuda-epoch v7f: v7e with the v8 workers probe's reduce-scatter ("mma-scatter", v8_workers.cu) in
// place of v7's cluster barrier + DSMEM reduce. Written without a GPU, not yet run on one.
//
// Each warp's m16 × n8 tile of P_t goes by 8-byte st.async into the inbox slot t % V8_NS of the
// rank that owns its 16 rows (an mbarrier full[slot] a slot, armed by its owner for 8 KiB with
// complete_tx); no cluster barrier in the loop. The owner sums step t − 1's slot during step t
// (v7f_reduced_at: the st.asyncs' latency off the step's path), writes those rows as v7b's tagged
// words for step t − 1, then credits each sender's free[slot] (8 arrivals), which a sender waits
// on before it writes that slot again (the probe's protocol, checked under random schedules over
// emulated mbarriers by tests/ladder/test_v8_workers.py; the slack it needs in v7 and the tagged
// ring's reuse: epoch_v7e_math.cuh, v7f_reduced_at).
//
// A failed wait (a G wait: the chain stopped, or the ring's own, bounded) does not end the loop: a
// CTA that leaves early would leave its peers' st.asyncs and credits without a destination. The
// failed CTA stops applying updates (no more G waits) but keeps the ring going to the end of the
// epoch (its tiles, its reduces, its credits: peers wait for them), passes the final cluster
// barrier with everyone, and writes nothing back. The ring's waits ignore the error flag (they
// wait for peers that always keep going) but are bounded (WAIT_V7_RING on a timeout).
// Phases (epoch_v7_phases.cuh's V7W_*): "partials" includes the credit wait and the sends,
// "cluster barrier" is the wait for step t − 1's tiles (full[slot]), "reduce" their sums, the
// tagged stores and the credits.
#pragma once
#include "epoch_v7e.cuh"

namespace {

constexpr int WAIT_V7_RING = 7;  // v7f: a worker's inbox tiles or its credits (cuda_epoch.py's 7)

// The ring's wait: at most WAIT_BUDGET clocks, the error flag NOT read (see the top).
__device__ __noinline__ bool v7f_ring_wait_slow(uint32_t bar, int parity, int code) {
  const long long t0 = clock64();
  while (!mbar_try_wait(bar, parity))
    if (clock64() - t0 > WAIT_BUDGET) {
      atomicCAS(&g_signal_error, 0, code);
      return false;
    }
  return true;
}
__device__ __forceinline__ bool v7f_ring_wait(uint32_t bar, int parity, int code) {
  return mbar_try_wait(bar, parity) || v7f_ring_wait_slow(bar, parity, code);
}

// v7a-v7g's gather of x_{t+1} during step t (worker_fetch_x: order[] and then the pixels, both in
// the step). v7h's (epoch_v7h.cuh) loads the order[] indices a step earlier.
struct V7XGatherNow {
  using Buf = uint8_t[V7_XF];  // a thread's bytes of x_{t+1}
  __device__ __forceinline__ void prime(const V7Args& v, int f0, int tid, uint8_t (&xb)[V7_XF]) {
    worker_fetch_x(v.e, v.a.x, v.a.order, 0, f0, tid, V7_T, xb);
  }
  __device__ __forceinline__ void next(const V7Args& v, int t, int f0, int tid,
                                       uint8_t (&xb)[V7_XF]) {
    worker_fetch_x(v.e, v.a.x, v.a.order, t, f0, tid, V7_T, xb);
  }
};

// v7e-v7i's mma bodies (v8_workers.cuh), a policy of v7f_worker: x's store, G_a's staging, the
// update's sums and apply, the partials. v7j's (epoch_v7j.cuh: ldmatrix loads, W's pieces
// split once by the apply) are the other.
struct V7FMma {
  __device__ __forceinline__ void setup(int, const float*, float*) const {}
  __device__ __forceinline__ void store_x(const V7Epoch& e, int t, int tid,
                                          const uint8_t (&xb)[V7_XF], __half* xh) const {
    v8_store_xh<V7_XR>(e, t, tid, V7_T, xb, false, xh);
  }
  __device__ __forceinline__ void stage(V7GAheadH& gf, const V7Args& v, int a, int tid,
                                        float* gs) const {
    gf.stage(v, a, tid, gs);
  }
  __device__ __forceinline__ void sums(int wi, const __half* xa, const __half* gsh,
                                       float* ured) const {
    v8_mma_update_sums(V8DeviceWarp{}, wi, xa, gsh, ured);
  }
  __device__ __forceinline__ void apply(const V7Epoch& e, int a, const float* ured, int tid,
                                        float* w, float*) const {
    v8_mma_update_apply(e, a, ured, tid, w);
  }
  template <class Out>
  __device__ __forceinline__ void partial(int wi, const __half* xt, const float* w, float*,
                                          Out out) const {
    v8_mma_partial(V8DeviceWarp{}, wi, xt, w, out);
  }
};

// v7e-v7j's step, a policy of v7f_worker: G′ staged after the vote's barrier, then a barrier of
// its own; the "x_t in place" barrier every step; v7d's fetch-ahead (V7GAheadH: the counters read
// by ld.acquire when the partials are done). v7k's (epoch_v7k.cuh) is the other.
struct V7FStep {
  static constexpr bool FEWER_BARRIERS = false;  // v7k: G′ staged before the vote (j3)
  static constexpr bool EARLY = false;           // v7k: GAhead::top at the step's top (j5)
  using GAhead = V7GAheadH;
};

// LATE (v7h): a reducing thread's tagged word stored after the slot's credits, not before: the
// credit's release (mbarrier.arrive.release.cluster: a MEMBAR.ALL.GPU in the SASS) then waits for
// no global store of this thread (epoch_v7h.cuh: why). M: the mma bodies (V7FMma, or v7j's). P:
// the step's barriers and fetch-ahead (V7FStep, or v7k's).
template <bool TIMED, class XG = V7XGatherNow, bool LATE = false, class M = V7FMma,
          class P = V7FStep>
__device__ void v7f_worker(int k, int r, const V7Args& v, float* sm) {
  using S = V7FSmem;
  const V7Epoch& e = v.e;
  const int tid = threadIdx.x, wi = tid >> 5, steps = e.steps, f0 = (k * V7_CLUSTER + r) * V7_FW;
  __half* xh = reinterpret_cast<__half*>(sm + V7ESmem::XH);
  float *w = sm + V7ESmem::W, *gs = sm + V7ESmem::GSH, *ured = sm + V7ESmem::URED;
  const __half* gsh = reinterpret_cast<const __half*>(gs);
  const float* inbox = sm + S::INBOX;
  const uint32_t in_u = smem_addr(sm + S::INBOX), full_u = smem_addr(sm + S::BAR),
                 free_u = full_u + 8 * V8_NS;
  if (tid < V8_NF * 16) {  // slots 14, 15 and classes 10 … 15: 0
    const int f = tid / 16, c = tid % 16;
    w[tid] = f < V7_FW && c < C ? v.a.w[c * K + f0 + f] : 0.f;
  }
  const M mm{};
  mm.setup(tid, w, sm);  // v7j: W₀'s pieces (each thread its own entry of w)
  if (tid < V8_NS) {
    mbar_init(full_u + 8 * tid, 1);           // its owner's arm
    mbar_init(free_u + 8 * tid, V7_CLUSTER);  // the 8 receivers' credits
    mbar_init_fence();
  }
  __syncthreads();
  cluster_barrier();  // every CTA's mbarriers ready before anyone sends or credits
  V7PhaseClock<TIMED> clock;

  typename P::GAhead gf;
  auto update = [&](int a) {  // v7e's
    if constexpr (P::FEWER_BARRIERS) {  // v7k (j3): one barrier orders the staging and votes
      const bool ok = gf.wait(v, a, tid);  // warp-uniform
      if (ok) mm.stage(gf, v, a, tid, gs);
      if (__syncthreads_or(!ok)) return false;
      clock.mark(V7W_WAIT_G);
    } else {
      if (__syncthreads_or(!gf.wait(v, a, tid))) return false;
      clock.mark(V7W_WAIT_G);
      mm.stage(gf, v, a, tid, gs);
      __syncthreads();
    }
    mm.sums(wi, xh + (a % V7_XR) * BMAX * 16, gsh, ured);
    __syncthreads();
    mm.apply(e, a, ured, tid, w, sm);
    __syncthreads();
    clock.mark(V7W_UPDATE);
    return true;
  };
  // My rows of P_u from inbox slot u % NS (all 8 senders' tiles landed) as tagged words for step
  // u, then a credit to each sender's free[slot].
  uint64_t* ring = v.s.ptag;
  auto reduce_slot = [&](int u) {
    const int slot = v8_ns_slot(u);
    v7f_ring_wait(full_u + 8 * slot, v8_full_parity(u), WAIT_V7_RING | blockIdx.x << 4 | u << 12);
    clock.mark(V7W_BARRIER);
    uint64_t* dst = nullptr;  // LATE: my word, stored after the credits
    uint64_t word = 0;
    worker_reduce(e, u, r, tid,
                  [&](int src, int i) { return inbox[v8_inbox_at(slot, src, i / V7_GROW, i % V7_GROW)]; },
                  [&](int row, int c, float val) {
                    if constexpr (LATE) {
                      dst = ring + v7b_word_at(u, k, row, c);
                      word = v7b_word(val, u);
                    } else {
                      st_relaxed64(ring + v7b_word_at(u, k, row, c), v7b_word(val, u));
                    }
                  });
    __syncthreads();  // every read of the slot done: credit the 8 senders
    if (tid < V7_CLUSTER) v8k_remote_arrive(free_u + 8 * slot, tid);
    if constexpr (LATE)
      if (dst != nullptr) st_relaxed64(dst, word);
    clock.mark(V7W_REDUCE);
  };

  int applied = 0;
  bool failed = false;
  typename XG::Buf xb;  // x_{t+1}'s bytes, loaded during step t
  XG xg;
  xg.prime(v, f0, tid, xb);
  mm.store_x(e, 0, tid, xb, xh);
  for (int t = 0; t < steps; ++t) {
    const int slot = v8_ns_slot(t);
    if constexpr (P::EARLY) gf.top(v, tid);  // v7k (j5): tested after the partials
    if (tid == 0) mbar_arm(full_u + 8 * slot, V8_SLOT_BYTES);
    if (t + 1 < steps) xg.next(v, t + 1, f0, tid, xb);
    clock.mark(V7W_LOAD_X);
    if constexpr (P::FEWER_BARRIERS) {
      const int before = applied;
      for (; !failed && applied < v7_applied_before(t); ++applied) failed = !update(applied);
      if (applied == before) __syncthreads();  // x_t in place; else an update's barriers did it
    } else {
      for (; !failed && applied < v7_applied_before(t); ++applied) failed = !update(applied);
      __syncthreads();  // x_t in place (stored at the end of step t − 1)
    }
    clock.mark(V7W_LOAD_X);
    if (t >= V8_NS)  // the 8 receivers have read this slot's previous step
      v7f_ring_wait(free_u + 8 * slot, v8_free_parity(t), WAIT_V7_RING | blockIdx.x << 4 | t << 12);
    mm.partial(wi, xh + (t % V7_XR) * BMAX * 16, w, sm,
               [&](int row, int c, float v0, float v1) {
                 const int dst = row / V7_RPC;
                 v8k_st8(mapa(in_u + 4 * v8_inbox_at(slot, r, row, c), dst), v0, v1,
                         mapa(full_u + 8 * slot, dst));
               });
    if (t + 1 < steps) mm.store_x(e, t + 1, tid, xb, xh);
    if (!failed && applied < steps) gf.ahead(v, applied, tid);
    clock.mark(V7W_PARTIALS);
    if (t >= 1) reduce_slot(v7f_reduced_at(t));
    clock.mark(V7W_PUBLISH);
  }
  if (steps >= 1) reduce_slot(v7f_reduced_at(steps));
  for (; !failed && applied < steps; ++applied) failed = !update(applied);
  cluster_barrier();  // nobody leaves while a peer may still send or credit to it
  clock.mark(V7W_BARRIER);
  if (failed) return;
  clock.write(steps);
  if (tid < V7_FW * C) v.a.w[(tid % C) * K + f0 + tid / C] = w[(tid / C) * 16 + tid % C];
}

// v7c's kernel (its chain; in one launch its producers, ticket, ring clear and reset wait) with
// v7f's workers.
template <bool TIMED, class XG = V7XGatherNow, bool LATE = false, class M = V7FMma,
          class P = V7FStep>
struct V7FWorker {
  __device__ __forceinline__ void operator()(int k, int r, const V7Args& v, float* sm) const {
    v7f_worker<TIMED, XG, LATE, M, P>(k, r, v, sm);
  }
};
template <bool TIMED = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel_f(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  v7c_epoch<TIMED, GRAMS>(v, sm, V7FWorker<TIMED>{});
#endif
}

}  // namespace
