// cuda-epoch v7 in ONE launch: the device side (epoch_v7l_math.cuh: the layout, the generation
// and why nothing needs zeroing). Written without a GPU; on an H200 (2026-11-28, run 5, after run
// 4's shared-memory fault) every v7 GPU test passed in one launch, and v7c in one launch ran 1.960
// ms/epoch, the row's version since.
//   - v7l_arrive: every CTA's ticket, hence the launch's generation g, before anything else.
//   - v7l_producer: producer CTA p (CTAs 64 … 119): CTA 64 first zeroes v7's step counters and
//     clears v7b's ring and releases reset = g; then the Grams of items p, p + 56, … (Gram v2's
//     CTA code, gram_v2.cuh's cta_grams, reused), each followed by a __syncthreads and the
//     release of its ready flag = g.
//   - v7l_wait_reset: a chain or worker CTA waits (acquire, bounded: WAIT_V7_RESET) for reset
//     == g before its role starts, the verdict made uniform over the cluster (every CTA reads the
//     8 verdicts over DSMEM between two cluster barriers) so that no CTA is left at a cluster
//     barrier by a departed one.
//   - V7GramsGate: the chain's wait for Γ_{t,·} before it loads it (chain_load_gram), bounded
//     (WAIT_V7_GAMMA), per thread (every chain thread loads Γ): a thread that has not yet seen
//     step t's flag reads the flags of steps t … t + V7L_WINDOW − 1 with relaxed loads (one L2
//     round trip for all), then fence.acq_rel.gpu once (a strong read of the release's value and
//     a fence: PTX's acquire pattern) and knows every step of the leading ready run. The
//     producers run ~4× ahead of the chain (an estimate: below), so after the first steps a
//     thread pays one round trip and one fence every V7L_WINDOW steps, not one a step.
// Estimates (NOT measured; H200 figures of 2026-11-28): Gram v2's 938 CTAs took 219.6 µs on 132
// SMs in ~7.1 waves, ~31 µs a CTA; 56 producers make 28 steps' Grams in ~31 µs, ~1.1 µs a step,
// against the chain's ~4.2 µs a step (v7b's epoch kernel, ~1.97 ms / 469 steps), so the chain
// waits only at its first step (Γ_1: ~31 µs, one producer CTA's time). Measured (run 5): v7b's
// "wait Γ" 0.21 µs a step on average (~0.1 ms an epoch; its distribution over steps not taken).
#pragma once
#include "epoch_v4.cuh"
#include "epoch_v7_sync.cuh"
#include "epoch_v7l_math.cuh"
#include "gram_v2.cuh"

namespace {

// The producers run Gram v2's CTA code in the epoch kernel's dynamic shared memory, which in one
// launch must hold Gram v2's double-buffered staging (gram::v2::SMEM, 92,160 bytes): more than
// the chain's or the workers' 4 · V7_SMEM_FLOATS. (Launched with the latter, the producers
// overran it: an illegal address on an H200, 2026-11-28, run 4.)
constexpr int V7L_SMEM_BYTES =
    gram::v2::SMEM > 4 * V7_SMEM_FLOATS ? gram::v2::SMEM : 4 * V7_SMEM_FLOATS;
static_assert(V7L_SMEM_BYTES <= 227 * 1024, "fits a Hopper SM's shared memory");

enum V7LWait { WAIT_V7_GAMMA = 5, WAIT_V7_RESET = 6 };
constexpr int V7L_WINDOW = 8;  // steps' flags a chain thread reads at once
static_assert(gram::v2::TILES == V7L_TILES && gram::v2::ROWS == V7L_ROWS, "Gram v2's items");
static_assert(gram::v2::THREADS == V7_T, "the producers run Gram v2's CTA in the kernel's block");

__device__ __forceinline__ int ld_relaxed(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// What the chain's Γ wait needs, in shared memory (read only on its slow path: the chain's
// registers are all taken, 128 at 512 threads; in registers they spilled).
struct V7LState {
  int *ready, *reset;  // the flags
  int gen, steps, tile;
  int upto[V7_T];    // per thread: steps < upto seen ready, acquire done (the gate's state)
};
__shared__ V7LState v7l_state;

// The launch's generation (every thread of the CTA gets it; v7l_state filled). First thing in
// every CTA: a CTA that took no ticket would shift every later launch's.
__device__ __forceinline__ int v7l_arrive(const V7LScratch& l, int steps, int tile) {
  if (threadIdx.x == 0) {
    v7l_state.ready = l.ready;
    v7l_state.reset = l.reset;
    v7l_state.gen = v7l_generation(atomicAdd(l.arrive, 1u));
    v7l_state.steps = steps;
    v7l_state.tile = tile;
  }
  v7l_state.upto[threadIdx.x] = 0;
  __syncthreads();
  return v7l_state.gen;
}

// Poll until *flag == want (acquire), at most WAIT_BUDGET clocks (poll_at_least's protocol).
__device__ __noinline__ bool v7l_poll_equal(const int* flag, int want, int code) {
  const long long t0 = clock64();
  for (int n = 1;; ++n) {
    if (ld_acquire(flag) == want) return true;
    if ((n & 63) == 0 && *static_cast<volatile int*>(&g_signal_error) != 0) return false;
    if (clock64() - t0 > WAIT_BUDGET) {
      atomicCAS(&g_signal_error, 0, code);
      return false;
    }
  }
}

// A chain or worker CTA: wait for producer CTA 0's reset of this generation. False (for every
// CTA of the cluster alike): leave.
__device__ __forceinline__ bool v7l_wait_reset(const V7LScratch& l, int gen) {
  __shared__ int ok;
  if (threadIdx.x == 0) ok = v7l_poll_equal(l.reset, gen, WAIT_V7_RESET | blockIdx.x << 4);
  cluster_barrier();
  const int lane = threadIdx.x % 32;
  const bool mine = lane >= V7_CLUSTER || ld_dsmem(smem_addr(&ok), lane) != 0;
  const bool all = __all_sync(0xffffffffu, mine);
  cluster_barrier();  // every verdict read before any CTA leaves or reuses its shared memory
  return all;
}

// Steps t … of `tile` whose flags hold `gen`, from t on, read together: the first step not yet
// ready (> t: the acquire fence done), or t after a timeout (the flag set) or another's failure.
__device__ __noinline__ int v7l_poll_grams(int t) {
  const int* ready = v7l_state.ready;
  const int tile = v7l_state.tile, steps = v7l_state.steps, gen = v7l_state.gen;
  const int code = WAIT_V7_GAMMA | blockIdx.x << 4 | t << 12;
  const long long t0 = clock64();
  for (int n = 1;; ++n) {
    int f[V7L_WINDOW];
#pragma unroll
    for (int i = 0; i < V7L_WINDOW; ++i)
      f[i] = t + i < steps ? ld_relaxed(ready + v7l_item(t + i, tile)) : gen - 1;
    int upto = t;
#pragma unroll
    for (int i = 0; i < V7L_WINDOW; ++i)
      if (upto == t + i && f[i] == gen) upto = t + i + 1;
    if (upto > t) {
      fence_acq_rel_gpu();
      return upto;
    }
    if ((n & 63) == 0 && *static_cast<volatile int*>(&g_signal_error) != 0) return t;
    if (clock64() - t0 > WAIT_BUDGET) {
      atomicCAS(&g_signal_error, 0, code);
      return t;
    }
  }
}

// The chain's Γ wait (v7_chain calls gate(t) before chain_load_gram of step t). Two launches:
// V7GramsReady, every Γ written by the Gram kernel before the epoch kernel started (compiled
// away). One launch: V7GramsGate, per thread, its state in v7l_state (no register).
struct V7GramsReady {
  __device__ __forceinline__ bool operator()(int) { return true; }
};
struct V7GramsGate {
  __device__ __forceinline__ bool operator()(int t) {
    int& upto = v7l_state.upto[threadIdx.x];
    if (t < upto) return true;
    upto = v7l_poll_grams(t);
    return t < upto;
  }
};

// Producer CTA p (0 … V7L_PRODUCERS − 1): `reset` (CTA 0 only: v7's counters zeroed, v7b's ring
// cleared, by its threads) released as `reset` = gen, then its items in step order. The scratch
// holds the whole epoch's Grams: no flow control (epoch_v7l_math.cuh).
// One item: Gram v2's CTA (t, tile), not inlined into the producer's loop (inlined, the loop's
// counters spilled 8 bytes a thread at the 128-register cap).
__device__ __noinline__ void v7l_grams_item(const V7Epoch& e, const uint8_t* x,
                                            const int32_t* order, float* gram, int t, int tile,
                                            uint8_t* smem) {
  const gram::v2::Job job = gram::v2::v7_job(e, x, order, gram, t, tile);
  if (t == 0 || job.n[0] <= 0) return;  // no lag before the epoch; no rows (CTA-uniform)
  gram::v2::DeviceCta cta;
  gram::v2::cta_grams(cta, job, smem);
}

// Its flags and generation from v7l_state (in registers, the loop spilled 8 bytes a thread).
template <class Reset>
__device__ void v7l_producer(int p, const V7Epoch& e, const uint8_t* x, const int32_t* order,
                             float* gram, uint8_t* smem, Reset&& reset) {
  if (p == 0) {
    reset();
    __syncthreads();
    publish(v7l_state.reset, v7l_state.gen);
  }
  for (int i = p; i < v7l_items(e.steps); i += V7L_PRODUCERS) {
    v7l_grams_item(e, x, order, gram, i / V7L_TILES, i % V7L_TILES, smem);
    __syncthreads();  // every thread's stores of the item before the release
    publish(v7l_state.ready + i, v7l_state.gen);
  }
}

}  // namespace
