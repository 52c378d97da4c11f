// cuda-epoch v7c: v7b's epoch kernel with the chain CTA's terms j ≥ 2 on helper warps
// (epoch_v7c_math.cuh: the split, its per-thread bodies and why it is not run 5's rejected one).
// The workers are v7b's (v7_worker<TIMED, true>); the Gram launch is v7b's (it clears the tagged
// ring). Written without a GPU, not yet run on one. In one launch (GRAMS = V7_GRAMS_LAUNCH,
// epoch_v7l.cuh) both halves of the chain CTA wait for the producers' flag of the Γ they load
// (the critical warps Γ_{t+1,1} during step t, the helpers Γ_{t+2,j≥2} during their iteration t)
// through the Gate, as v7_chain; a helper's failed wait is a stop, as its failed G wait.
//
// Synchronisation inside a chain CTA (the two halves never use __syncthreads after the setup):
//   named barrier V7C_BAR_CRIT (1), 256 threads: the critical warps' own barriers (v7b's
//     __syncthreads of the loop, and the failure votes as bar.red.or);
//   named barrier V7C_BAR_HAND (2), 512 threads: the hand-off, once a step t ≥ 1 of the critical
//     warps (before the logits) and at the end of every helper iteration t = 0 … steps − 2
//     (iteration t pairs with step t + 1's). Before it the helpers have written HQ[(t + 1) & 1]
//     and the labels of step t + 1; after it the helpers start step t + 2's terms, so they read
//     G_{t}, G_{t−1}, G_{t−2}: step t + 1's hand-off follows the critical warps' wait for G_t.
//   The stop flag (V7C_STOP): a critical failure before the hand-off writes it and still meets
//     the helpers at the hand-off (if they have an iteration left: steps ≥ 2); everyone reads it
//     after every hand-off, so the helpers leave with a failed wait and nobody waits for them.
// Ring slots: a chain CTA re-arms slot (t − 1) % NB at step t, as v7b; the slot's next data
// (G_{t+NB−1}) need my G_{t+NB−2}, sent after step t + NB − 2's hand-off, i.e. after the helpers'
// last read of G_{t−1} (iteration t + L − 2 = t + NB − 3). The host emulation checks both.
#pragma once
#include "epoch_v7.cuh"
#include "epoch_v7c_math.cuh"

namespace {

constexpr int V7C_BAR_CRIT = 1, V7C_BAR_HAND = 2;  // named barriers (0: __syncthreads)

// Named barriers with immediate ids (a register id makes ptxas reserve all 16 barriers).
template <int ID, int THREADS>
__device__ __forceinline__ void bar_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(THREADS) : "memory");
}
// __syncthreads_or over the THREADS of named barrier ID.
template <int ID, int THREADS>
__device__ __forceinline__ bool bar_or(bool pred) {
  int r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.s32 p, %1, 0;\n"
      " bar.red.or.pred q, %2, %3, p;\n selp.s32 %0, 1, 0, q;\n}"
      : "=r"(r)
      : "r"(static_cast<int>(pred)), "n"(ID), "n"(THREADS)
      : "memory");
  return r != 0;
}

// Helper warps (tid ≥ 256) of chain CTA q: iterations t = 0 … steps − 2, step t + 1's terms j ≥ 2.
// gate(t): Γ_{t,·} may be read (v7_chain's Gate: V7GramsReady in two launches). TIMED: their
// phases (epoch_v7_phases.cuh's V7HelperPhase, rows of their own, by their first thread).
template <bool TIMED, class Gate>
__device__ void v7c_helpers(int q, const V7Args& v, float* sm, Gate gate) {
  const V7Epoch& e = v.e;
  const int h = threadIdx.x - V7C_CRIT, steps = e.steps;
  const float* ring = sm + ChainSmem::RING;
  int* ys = reinterpret_cast<int*>(sm + ChainSmem::YS);
  volatile int* stop = reinterpret_cast<int*>(sm + V7C_STOP);
  const uint32_t bar_u = smem_addr(sm + ChainSmem::BAR);
  const ChainLane16 ln = chain_lane16(h);
  float gam[V7C_HJ][V7C_U];
  if (steps > 1) {
    if (!gate(1)) *stop = 1;  // read by everyone after the first hand-off
    v7c_load_gram<V7C_HJ>(e, v.s.gram, 1, q, h, 2, gam);
  }
  V7PhaseClock<TIMED, V7_CTAS, V7C_CRIT> clock;
  for (int t = 0; t + 1 < steps; ++t) {
    // G_{t−1} is in the ring (the critical warps passed its wait before this iteration's start):
    // the try_wait passes at once; it is the acquire of the st.async bytes for these threads.
    if (t > 0 && !bounded_wait(bar_u + 8 * v7_slot(t - 1), v7_parity(t - 1),
                               WAIT_G | blockIdx.x << 4 | t << 12))
      *stop = 1;
    clock.mark(V7H_WAIT_G);
    float acc[C];
    for (int c = 0; c < C; ++c) acc[c] = 0.f;
    v7c_terms<V7C_HJ>(e, gam, ring, t + 1, h, 2, acc);
    clock.mark(V7H_TERMS);
    if (t + 2 < steps) {
      if (!gate(t + 2)) *stop = 1;  // one launch: the producers' flag of Γ_{t+2}
      clock.mark(V7H_WAIT_GRAM);
      v7c_load_gram<V7C_HJ>(e, v.s.gram, t + 2, q, h, 2, gam);
    }
    clock.mark(V7H_LOAD_GRAM);
    const float s = v7c_lane_sum(V7DeviceWarp{}, acc);
    if (ln.c < C) sm[v7c_hq_at(t + 1) + ln.i * 16 + ln.c] = s;
    clock.mark(V7H_SUM);
    if (h < V7_RPC) {
      const int row = q * V7_RPC + h;
      ys[((t + 1) & 1) * V7_RPC + h] = row < e.rows(t + 1) ? v.a.y[v.a.order[(t + 1) * e.bs + row]]
                                                           : 0;
    }
    clock.mark(V7H_LABELS);
    bar_sync<V7C_BAR_HAND, V7_T>();
    clock.mark(V7H_HAND);
    if (*stop) return;
  }
  clock.write(steps);
}

// After a critical chain's loop (v7c's, v7g's): the wait for G_{steps−1} (the last bias update,
// and no st.async left in flight to me) by the critical warps, then that update; whether the wait
// failed on any of them.
template <class Clock>
__device__ __forceinline__ bool v7c_last_g(const V7Epoch& e, int steps, int tid, uint32_t bar_u,
                                           const float* ring, float* bias, Clock& clock) {
  const int t = steps;
  const bool ok = bounded_wait(bar_u + 8 * v7_slot(t - 1), v7_parity(t - 1),
                               WAIT_G | blockIdx.x << 4 | t << 12);
  const bool failed = bar_or<V7C_BAR_CRIT, V7C_CRIT>(!ok);
  clock.mark(V7C_WAIT_G);
  if (!failed) chain_bias(e, ring, t - 1, tid, bias);
  clock.mark(V7C_GRAM);
  return failed;
}

// ---- the chain (cluster 0, CTA q), v7c ---------------------------------------------------------
template <bool TIMED, class Gate = V7GramsReady>
__device__ void v7c_chain(int q, const V7Args& v, float* sm, Gate gate = {}) {
  using S = ChainSmem;
  const V7Epoch& e = v.e;
  const int tid = threadIdx.x, steps = e.steps;
  float *ring = sm + S::RING, *bias = sm + S::BIAS, *gl = sm + S::GL;
  int* ys = reinterpret_cast<int*>(sm + S::YS);
  volatile int* stop = reinterpret_cast<int*>(sm + V7C_STOP);
  const uint32_t ring_u = smem_addr(ring), bar_u = smem_addr(sm + S::BAR);
  for (int i = tid; i < V7_NB * S::GSLOT; i += V7_T) ring[i] = 0.f;  // pads: finite
  for (int i = tid; i < 2 * V7_RPC * 16; i += V7_T) sm[V7C_HQ + i] = 0.f;  // steps 0, 1: none
  if (tid == 0) *stop = 0;
  if (tid < C) bias[tid] = v.a.b[tid];
  if (tid < V7_RPC) {
    const int row = q * V7_RPC + tid;
    ys[tid] = row < e.rows(0) ? v.a.y[v.a.order[row]] : 0;
  }
  if (tid == 0) {
    for (int p = 0; p < V7_NB; ++p) mbar_init(bar_u + 8 * p, 1);
    mbar_init_fence();
    for (int t = 0; t < V7_NB && t < steps; ++t) mbar_arm(bar_u + 8 * t, v7_g_bytes(e, t));
  }
  __syncthreads();
  cluster_barrier();  // every chain CTA's mbarriers armed before anyone sends
  if (tid >= V7C_CRIT) {
    v7c_helpers<TIMED>(q, v, sm, gate);
    return;
  }

  float loss = 0.f, correct = 0.f;
  bool failed = false, gram_ok = true;
  V7PhaseClock<TIMED> clock;
  float gam[1][V7C_U];  // Γ_{t,1}: my 8 columns, loaded during step t − 1
  v7c_load_gram<1>(e, v.s.gram, 0, q, tid, 1, gam);
  for (int t = 0; t < steps; ++t) {
    bool ok = true;
    if (t > 0)
      ok = bounded_wait(bar_u + 8 * v7_slot(t - 1), v7_parity(t - 1),
                        WAIT_G | blockIdx.x << 4 | t << 12);
    clock.mark(V7C_WAIT_G);
    const bool fault = t == 2 && q == 0 && g_signal_fault == 2;  // the test hook, as v7b's
    float p = 0.f;
    if (ok && v7b_part_mine(e, t, q, tid)) {
      const uint64_t* words = v7b_part_words(v.s.ptag, t, q, tid);
      const int want = fault ? V7_TAG_NEVER : t;
      if (!v7b_sum_tagged(words, want, LdRelaxed64{}, p)) {
        const unsigned long long got =
            poll_tagged(words, want, WAIT_V7_PARTIALS | blockIdx.x << 4 | t << 12);
        ok = got >> 32 != 0;
        p = __uint_as_float(static_cast<uint32_t>(got));
      }
    }
    // gram_ok: step t − 1's gate. The helpers leave at their next hand-off.
    if (bar_or<V7C_BAR_CRIT, V7C_CRIT>(!ok || !gram_ok)) {
      if (tid == 0) *stop = 1;
      if (steps > 1) bar_sync<V7C_BAR_HAND, V7_T>();
      failed = true;
      break;
    }
    clock.mark(V7C_WAIT_PART);
    if (t > 0) {
      if (tid == 0 && t - 1 + V7_NB < steps)  // slot (t−1) % NB read from here on: see the top
        mbar_arm(bar_u + 8 * v7_slot(t - 1), v7_g_bytes(e, t - 1 + V7_NB));
      chain_bias(e, ring, t - 1, tid, bias);
    }
    float acc[C];
    for (int c = 0; c < C; ++c) acc[c] = 0.f;
    v7c_terms<1>(e, gam, ring, t, tid, 1, acc);
    // One launch: the producers' flag of Γ_{t+1} (its wait in the phase "Gram terms": a mark of
    // its own pushed the timed build 12 bytes into local memory).
    if (t + 1 < steps) gram_ok = gate(t + 1);
    if (t + 1 < steps) v7c_load_gram<1>(e, v.s.gram, t + 1, q, tid, 1, gam);
    const float j1 = v7c_lane_sum(V7DeviceWarp{}, acc);
    // b_t written; step t's HQ and labels from the helpers (their iteration t − 1).
    if (t > 0)
      bar_sync<V7C_BAR_HAND, V7_T>();
    else
      bar_sync<V7C_BAR_CRIT, V7C_CRIT>();
    // Not at t = 0 (no hand-off yet): a helper's failed gate(1) may already have set the flag,
    // and the helpers reach their first hand-off; step 1 reads it after that hand-off.
    if (t > 0 && *stop) {  // a helper's wait failed (they leave after this hand-off too)
      failed = true;
      break;
    }
    clock.mark(V7C_GRAM);
    const float z = chain_logit_c(e, t, q, tid, p, bias, j1, sm + v7c_hq_at(t));
    clock.mark(V7C_LOGITS);
    chain_softmax16(V7DeviceWarp{}, e, t, q, tid / 32, z, ys + (t & 1) * V7_RPC, gl, loss,
                    correct);
    bar_sync<V7C_BAR_CRIT, V7C_CRIT>();
    chain_colsum(tid, gl);
    bar_sync<V7C_BAR_CRIT, V7C_CRIT>();
    clock.mark(V7C_SOFTMAX);
    // G_t to every chain CTA's slot t % NB and to global memory, as v7b, by 256 threads.
    chain_send_g<V7C_CRIT>(v, t, q, tid, gl, ring_u, bar_u);
    bar_sync<V7C_BAR_CRIT, V7C_CRIT>();
    clock.mark(V7C_SEND);
    publish(v.s.gflag + q, t + 1);
    clock.mark(V7C_PUBLISH);
  }
  if (!failed) failed = v7c_last_g(e, steps, tid, bar_u, ring, bias, clock);
  if (failed) return;
  clock.write(steps);
  chain_results(v, q, tid, bias, loss, correct);
}

// v7c's chain, as v7c_epoch's chain: v7c_chain with the producers' gate when there is one.
template <bool TIMED>
struct V7CChain {
  template <class... Gate>
  __device__ __forceinline__ void operator()(int q, const V7Args& v, float* sm, Gate... gate) const {
    v7c_chain<TIMED>(q, v, sm, gate...);
  }
};

// v7c's epoch kernel body, shared with v7d-v7i (epoch_v7d.cuh … epoch_v7i.cuh): `chain(rank, v,
// sm[, gate])` runs a chain CTA (v7c-v7f: v7c's; v7g-v7i: v7g's, V7GChain) and `worker(k, rank,
// v, sm)` a worker CTA of cluster k (v7c: v7_worker with V7GDirect, G read at the update; v7d:
// V7GAhead, G fetched a step ahead; v7e-v7i: their tensor-core workers). GRAMS: as
// v7_epoch_kernel's (its one-launch prologue and producers, v7b's ring cleared).
template <bool TIMED, int GRAMS, class Worker, class Chain = V7CChain<TIMED>>
__device__ __forceinline__ void v7c_epoch(const V7Args& v, float* sm, Worker worker,
                                          Chain chain = {}) {
  if (!v7_prologue<GRAMS>(v, sm)) return;
  const int cluster = blockIdx.x / V7_CLUSTER, rank = blockIdx.x % V7_CLUSTER;
  if (cluster == 0) {
    if constexpr (GRAMS == V7_GRAMS_LAUNCH)
      chain(rank, v, sm, V7GramsGate{});
    else
      chain(rank, v, sm);
  } else {
    worker(cluster - 1, rank, v, sm);
  }
}
// v7_worker with GF (how G reaches the update), as v7c_epoch's worker.
template <bool TIMED, class GF>
struct V7WorkerOf {
  __device__ __forceinline__ void operator()(int k, int r, const V7Args& v, float* sm) const {
    v7_worker<TIMED, true, GF>(k, r, v, sm);
  }
};

template <bool TIMED = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel_c(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  v7c_epoch<TIMED, GRAMS>(v, sm, V7WorkerOf<TIMED, V7GDirect>{});
#endif
}

}  // namespace
