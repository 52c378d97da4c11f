// cuda-epoch v7g: v7f's epoch kernel (its workers, their reduce-scatter, v7b's tagged partials,
// v7c's split of the chain CTA) with a new chain: the helper warps bring the critical warps P_t
// and the producers' flag with the terms j ≥ 2 (epoch_v7g_math.cuh: what moved, and why). Written
// without a GPU, not yet run on one.
//
// A step of the critical warps (0-7), t = 0 … steps − 1:
//   wait G_{t−1} (t ≥ 1; a failed wait sets the stop flag: no vote, no barrier)
//   b_t, the term j = 1 (Γ_{t,1} in registers since step t − 1), its lane sums
//   the hand-off (named barrier 2, 512 threads): PQ[t & 1], HQ[t & 1] and the labels of step t
//     from the helpers; stop read (set by either half: everyone leaves here)
//   Γ_{t+1,1}'s loads issued (the helpers passed its flag before this hand-off)
//   Z, softmax, colsum, G_t sent and published (v7c's: named barrier 1 between them; v7i's
//   helpers store and publish it instead: the Pub policy below, epoch_v7i.cuh).
// The helpers (8-15): a setup (step 0's partials into PQ[0]; the flag and loads of Γ_{1,j≥2}),
// then iterations t = 0 … steps − 2 (step t + 1's partials and terms, the flag and loads of
// Γ_{t+2}, step t + 1's labels), each ending at a hand-off: setup ↔ step 0, iteration t ↔ step
// t + 1 (v7c: iteration t ↔ step t + 1, and step 0 without one). Both halves run `steps`
// hand-offs, so neither waits for the other at a barrier the other never reaches, and a stop
// set before a hand-off is read by both after it.
// Buffers by step parity (PQ, HQ, ys): the helpers write parity (t + 1) & 1 after hand-off t,
// which the critical warps read only after hand-off t + 1; they read parity t & 1 between
// hand-offs t and t + 1, which the helpers write again only after hand-off t + 1.
// Ring slots: v7c's argument (the helpers' last read of G_{t−1} is in iteration t + L − 2); the
// host emulation checks both, and the partials' ring (epoch_v7g_math.cuh, 1).
#pragma once
#include "epoch_v7f.cuh"
#include "epoch_v7g_math.cuh"

namespace {

// Who stores G_t to global memory and publishes the step counter: v7c-v7h's critical warps
// (V7GCritPublish, after the sends: a barrier and thread 0's release) or v7i's helper warps
// (epoch_v7i.cuh's V7IHelperPublish). The hooks: `sent` (the critical warps, after colsum's
// barrier: the sends and what follows them), `top` (a helper iteration's start, after its hand-off),
// `before_hand` (a helper iteration's end), `last` (the helpers, after their loop).
struct V7GCritPublish {
  __device__ __forceinline__ void sent(const V7Args& v, int t, int q, int tid, const float* gl,
                                       uint32_t ring_u, uint32_t bar_u) const {
    chain_send_g<V7C_CRIT>(v, t, q, tid, gl, ring_u, bar_u);
    bar_sync<V7C_BAR_CRIT, V7C_CRIT>();
  }
  __device__ __forceinline__ void published(const V7Args& v, int t, int q) const {
    publish(v.s.gflag + q, t + 1);
  }
  __device__ __forceinline__ void top(const V7Args&, int, int, int) const {}
  __device__ __forceinline__ void before_hand(const V7Args&, int, int, int, const float*) const {}
  __device__ __forceinline__ void last(const V7Args&, int, int, const float*) const {}
};

// Helper warps (tid ≥ 256) of chain CTA q. gate(t): Γ_{t,·} may be read (V7GramsReady in two
// launches, V7GramsGate in one). TIMED: their phases (V7HelperPhase). Pub: V7GCritPublish's hooks.
template <bool TIMED, class Pub = V7GCritPublish, class Gate>
__device__ void v7g_helpers(int q, const V7Args& v, float* sm, Gate gate) {
  const V7Epoch& e = v.e;
  const int h = threadIdx.x - V7C_CRIT, steps = e.steps;
  const float* ring = sm + ChainSmem::RING;
  int* ys = reinterpret_cast<int*>(sm + ChainSmem::YS);
  volatile int* stop = reinterpret_cast<int*>(sm + V7C_STOP);
  const uint32_t bar_u = smem_addr(sm + ChainSmem::BAR);
  const ChainLane16 ln = chain_lane16(h);
  // P_s's words of my (row, class) → PQ[s & 1] (0 where I own none); false: the poll failed.
  // (The test hook, fault 2: chain CTA 0's helpers want step 2's words with a tag no step writes.)
  uint64_t words[V7_WCLUSTERS];
  auto issue = [&](int s) {
    if (v7b_part_mine(e, s, q, h))
      v7b_load_tagged(v7b_part_words(v.s.ptag, s, q, h), LdRelaxed64{}, words);
  };
  auto partials = [&](int s) {
    if (!v7b_part_mine(e, s, q, h)) return true;
    const int want = s == 2 && q == 0 && g_signal_fault == 2 ? V7_TAG_NEVER : s;
    float p;
    bool ok = v7b_sum_words(words, want, p);
    if (!ok) {
      const unsigned long long got = poll_tagged(v7b_part_words(v.s.ptag, s, q, h), want,
                                                 WAIT_V7_PARTIALS | blockIdx.x << 4 | s << 12);
      ok = got >> 32 != 0;
      p = __uint_as_float(static_cast<uint32_t>(got));
    }
    sm[v7g_pq_at(s) + ln.i * 16 + ln.c] = p;
    return ok;
  };

  V7GLabels lab{};
  if (h < V7_RPC) lab = v7g_labels_init(e, v.a.y, v.a.order, q, h);
  issue(0);
  float gam[V7C_HJ][V7C_U];
  if (steps > 1) {
    if (!gate(1)) *stop = 1;
    v7c_load_gram<V7C_HJ>(e, v.s.gram, 1, q, h, 2, gam);
  }
  if (!partials(0)) *stop = 1;
  bar_sync<V7C_BAR_HAND, V7_T>();  // ↔ the critical warps' step 0
  if (*stop) return;
  V7PhaseClock<TIMED, V7_CTAS, V7C_CRIT> clock;
  const Pub pub{};
  const float* gl = sm + ChainSmem::GL;
  for (int t = 0; t + 1 < steps; ++t) {
    pub.top(v, t, q, h);
    // G_{t−1}'s try_wait passes at once (the critical warps waited for it before this
    // iteration's hand-off); it is these threads' acquire of its st.async bytes.
    if (t > 0 && !bounded_wait(bar_u + 8 * v7_slot(t - 1), v7_parity(t - 1),
                               WAIT_G | blockIdx.x << 4 | t << 12))
      *stop = 1;
    clock.mark(V7H_WAIT_G);
    issue(t + 1);  // in flight through the terms
    float acc[C];
    for (int c = 0; c < C; ++c) acc[c] = 0.f;
    v7g_terms<V7C_HJ>(gam, ring, t + 1, h, 2, acc);
    clock.mark(V7H_TERMS);
    if (!partials(t + 1)) *stop = 1;
    clock.mark(V7H_WAIT_PART);
    if (t + 2 < steps) {
      if (!gate(t + 2)) *stop = 1;  // also Γ_{t+2,1}'s, for the critical warps (see the top)
      clock.mark(V7H_WAIT_GRAM);
      v7c_load_gram<V7C_HJ>(e, v.s.gram, t + 2, q, h, 2, gam);
    }
    clock.mark(V7H_LOAD_GRAM);
    const float s = v7c_lane_sum(V7DeviceWarp{}, acc);
    if (ln.c < C) sm[v7c_hq_at(t + 1) + ln.i * 16 + ln.c] = s;
    clock.mark(V7H_SUM);
    if (h < V7_RPC) v7g_labels_step(e, v.a.y, v.a.order, q, h, t, ys, lab);
    clock.mark(V7H_LABELS);
    pub.before_hand(v, t, q, h, gl);
    bar_sync<V7C_BAR_HAND, V7_T>();  // ↔ the critical warps' step t + 1
    clock.mark(V7H_HAND);
    if (*stop) return;
  }
  clock.write(steps);
  pub.last(v, steps, q, gl);
}

// Where the bias gradient comes from, a Tail's part of the protocol: g-m's senders sum their rows'
// columns and send the sums with the rows (the slot's bytes count them; b_t by chain_bias after
// the G wait, v7c_last_g after the loop). v7n's receivers sum the rows (epoch_v7n.cuh).
struct V7GSenderSums {
  static constexpr bool RECEIVER_BIAS = false;
  static __device__ __forceinline__ int bytes(const V7Epoch& e, int t) { return v7_g_bytes(e, t); }
  template <class Clock>
  static __device__ __forceinline__ bool last_g(const V7Epoch& e, int steps, int tid,
                                                uint32_t bar_u, const float* ring, float* bias,
                                                Clock& clock) {
    return v7c_last_g(e, steps, tid, bar_u, ring, bias, clock);
  }
};

// The critical warps' step after Z (v7g-v7j's): the softmax, colsum between two barriers, then
// Pub's sends and publish (v7m's: epoch_v7m.cuh's V7MTail; v7n's: epoch_v7n.cuh's V7NTail).
template <class Pub>
struct V7GTail : V7GSenderSums {
  template <class Clock>
  __device__ __forceinline__ void operator()(const V7Args& v, int t, int q, int tid, float z,
                                             const int* labels, float* gl, uint32_t ring_u,
                                             uint32_t bar_u, float& loss, float& correct,
                                             Clock& clock) const {
    chain_softmax16(V7DeviceWarp{}, v.e, t, q, tid / 32, z, labels, gl, loss, correct);
    bar_sync<V7C_BAR_CRIT, V7C_CRIT>();
    chain_colsum(tid, gl);
    bar_sync<V7C_BAR_CRIT, V7C_CRIT>();
    clock.mark(V7C_SOFTMAX);
    Pub{}.sent(v, t, q, tid, gl, ring_u, bar_u);
    clock.mark(V7C_SEND);
    Pub{}.published(v, t, q);
    clock.mark(V7C_PUBLISH);
  }
};

// ---- the chain (cluster 0, CTA q), v7g ---------------------------------------------------------
template <bool TIMED, class Pub = V7GCritPublish, class Tail = V7GTail<Pub>,
          class Gate = V7GramsReady>
__device__ void v7g_chain(int q, const V7Args& v, float* sm, Gate gate = {}) {
  using S = ChainSmem;
  const V7Epoch& e = v.e;
  const int tid = threadIdx.x, steps = e.steps;
  float *ring = sm + S::RING, *bias = sm + S::BIAS, *gl = sm + S::GL;
  int* ys = reinterpret_cast<int*>(sm + S::YS);
  volatile int* stop = reinterpret_cast<int*>(sm + V7C_STOP);
  const uint32_t ring_u = smem_addr(ring), bar_u = smem_addr(sm + S::BAR);
  for (int i = tid; i < V7_NB * S::GSLOT; i += V7_T) ring[i] = 0.f;  // finite: v7g_terms reads all
  for (int i = tid; i < 2 * V7_RPC * 16; i += V7_T) sm[V7C_HQ + i] = 0.f;  // steps 0, 1: none
  if (tid == 0) *stop = 0;
  if (tid < C) bias[tid] = v.a.b[tid];
  if (tid < V7_RPC) ys[tid] = v7g_label_of(v.a.y, v7g_order_at(e, v.a.order, q, tid, 0));
  if (tid == 0) {
    for (int p = 0; p < V7_NB; ++p) mbar_init(bar_u + 8 * p, 1);
    mbar_init_fence();
    for (int t = 0; t < V7_NB && t < steps; ++t) mbar_arm(bar_u + 8 * t, Tail::bytes(e, t));
  }
  __syncthreads();
  cluster_barrier();  // every chain CTA's mbarriers armed before anyone sends
  if (tid >= V7C_CRIT) {
    v7g_helpers<TIMED, Pub>(q, v, sm, gate);
    return;
  }

  float loss = 0.f, correct = 0.f;
  bool failed = false;
  V7PhaseClock<TIMED> clock;
  float gam[1][V7C_U];  // Γ_{t,1}: my 8 columns, loaded during step t − 1
  v7c_load_gram<1>(e, v.s.gram, 0, q, tid, 1, gam);  // step 0: no term (zeros, no load)
  for (int t = 0; t < steps; ++t) {
    if (t > 0) {
      const bool ok = bounded_wait(bar_u + 8 * v7_slot(t - 1), v7_parity(t - 1),
                                   WAIT_G | blockIdx.x << 4 | t << 12);
      if (!ok) *stop = 1;  // read after this step's hand-off, by both halves
      clock.mark(V7C_WAIT_G);
      if (ok && tid == 0 && t - 1 + V7_NB < steps)  // slot (t−1) % NB: v7b's re-arm
        mbar_arm(bar_u + 8 * v7_slot(t - 1), Tail::bytes(e, t - 1 + V7_NB));
      if constexpr (!Tail::RECEIVER_BIAS) chain_bias(e, ring, t - 1, tid, bias);
    }
    float acc[C];
    for (int c = 0; c < C; ++c) acc[c] = 0.f;
    v7g_terms<1>(gam, ring, t, tid, 1, acc);
    const float j1 = v7c_lane_sum(V7DeviceWarp{}, acc);
    clock.mark(V7C_GRAM);
    bar_sync<V7C_BAR_HAND, V7_T>();  // b_t written; PQ, HQ and the labels of step t here
    if (*stop) {
      failed = true;
      break;
    }
    clock.mark(V7C_WAIT_PART);
    if (t + 1 < steps) v7c_load_gram<1>(e, v.s.gram, t + 1, q, tid, 1, gam);
    const ChainLane16 ln = chain_lane16(tid);
    const float p = ln.c < C ? sm[v7g_pq_at(t) + ln.i * 16 + ln.c] : 0.f;
    const float z = chain_logit_c(e, t, q, tid, p, bias, j1, sm + v7c_hq_at(t));
    clock.mark(V7C_LOGITS);
    Tail{}(v, t, q, tid, z, ys + (t & 1) * V7_RPC, gl, ring_u, bar_u, loss, correct, clock);
  }
  if (!failed) failed = Tail::last_g(e, steps, tid, bar_u, ring, bias, clock);
  if (failed) return;
  clock.write(steps);
  chain_results(v, q, tid, bias, loss, correct);
}

// v7g's chain, as v7c_epoch's chain (Pub: who publishes G's global rows and the step count;
// Tail: the critical warps' step after Z).
template <bool TIMED, class Pub = V7GCritPublish, class Tail = V7GTail<Pub>>
struct V7GChain {
  template <class... Gate>
  __device__ __forceinline__ void operator()(int q, const V7Args& v, float* sm, Gate... gate) const {
    v7g_chain<TIMED, Pub, Tail>(q, v, sm, gate...);
  }
};

// v7c_epoch with v7g's chain and v7f's workers.
template <bool TIMED = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel_g(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  v7c_epoch<TIMED, GRAMS>(v, sm, V7FWorker<TIMED>{}, V7GChain<TIMED>{});
#endif
}

}  // namespace
