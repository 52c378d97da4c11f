// cuda-epoch v7's phase-profiling build (cuda_epoch_v7_phase_profile, v7a's and v7b's): where a
// step's time goes in each role. v7b keeps the phases' names and order (its comments below), so
// one reader and one GPU test serve both. v4's PhaseClock times v4's loop; v7's chain and workers
// run loops of their own, so they have phases of their own (below, in the order a step runs them).
//
// Each CTA's thread 0 sums, per phase, the clocks from the previous mark to this one (clock(),
// 32-bit: a difference is exact modulo 2^32, i.e. for intervals under ~2 s, and a sum is at most
// the loop's span) over the whole epoch (the steps and what follows them: the chain's last G
// wait, the workers' last L updates and their final cluster barrier), and brackets its loop with
// the global timer (ns), so the host turns clocks into time at chain CTA 0's rate (its span /
// its clocks) and can check the other 63 CTAs' sums against their own spans. Only the TIMED
// instantiation of v7_epoch_kernel carries any of this: the row's kernel is unchanged
// (V7PhaseClock<false> is empty).
//
// ptxas (nvcc 13.0, sm_90a, -O3): the timed kernel 128 registers (the cap at 512 threads), 0
// spill, 0 stack, as the untimed one, whose SASS is instruction for instruction what it was
// before this build existed (3,376 instructions; the timed one 3,504). 64-bit sums with the start
// in a register, as v4's PhaseClock, compiled the same (a scratch build); the 32-bit sums take
// one add a mark. tests/ladder/test_cuda_epoch_v7_phases.py checks the figures of both builds.
#pragma once

namespace {

enum V7ChainPhase {
  V7C_WAIT_G,     // wait for G_{t−1} from the 8 chain CTAs (mbarrier)
  V7C_WAIT_PART,  // wait for the 7 worker clusters' counters of my rows (thread k polls k);
                  // v7b: poll my (row, class)'s 7 tagged words, the data with their tags
  V7C_GRAM,       // b_t from G_{t−1}'s column sums, the Gram term j = 1, the next step's Γ
                  // loads issued; after the publish, the next step's terms j ≥ 2
  V7C_LOGITS,     // the worker partials from L2 (ld.global.cg) + bias + Gram terms: Z_t;
                  // v7b: bias + the Gram terms' lane sums, in the register of Z's lane
  V7C_SOFTMAX,    // softmax, loss, G_t of my 16 rows, the next labels, G's column sum (v7b:
                  // 16 lanes a row, shuffles)
  V7C_SEND,       // G_t to the 8 chain CTAs (st.async) and to global memory
  V7C_PUBLISH,    // thread 0: release my G counter
  V7C_WAIT_GRAM,  // one launch (epoch_v7l.cuh): wait for the producers' flag of Γ_{t+1} (two
                  // launches: nothing, ~0)
  V7C_PHASES
};
enum V7WorkerPhase {
  V7W_LOAD_X,     // issue the byte loads of my 14 features of x_{t+1}; the step's barrier
  V7W_WAIT_G,     // wait for the 8 chain CTAs' G counters of the update's step
  V7W_UPDATE,     // load G_a from L2, the update's sums and its application to W's slice
  V7W_PARTIALS,   // P_t of my features; x_{t+1} into the x ring (waits for its loads)
  V7W_BARRIER,    // the cluster barrier after the partials, the cluster's ok bits (DSMEM)
  V7W_REDUCE,     // rank r sums rows 16r … of the 8 partials over DSMEM, writes them to global
                  // (v7b: as tagged words, st.relaxed.gpu.b64)
  V7W_PUBLISH,    // thread 0: release my partial counter (v7b: nothing, the tags are the signal)
  V7W_PHASES
};
constexpr int V7_PHASE_COLS = V7C_PHASES > V7W_PHASES ? V7C_PHASES : V7W_PHASES;

// Per CTA (chain 0 … 7, then the workers in launch order): its phases' clocks (a role's own
// columns; the rest stay 0), and its loop's globaltimer span in ns; the last element the steps.
__device__ unsigned int g_v7_phase_clocks[V7_CTAS][V7_PHASE_COLS];
__device__ long long g_v7_phase_ns[V7_CTAS + 1];

template <bool ON>
struct V7PhaseClock {  // off: nothing
  __device__ void mark(int) {}
  __device__ void write(int) {}
};
template <>
struct V7PhaseClock<true> {
  unsigned int last, sum[V7_PHASE_COLS];
  __device__ static long long now_ns() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  __device__ V7PhaseClock() {
    for (int k = 0; k < V7_PHASE_COLS; ++k) sum[k] = 0;
    if (threadIdx.x == 0) g_v7_phase_ns[blockIdx.x] = now_ns();  // the start, until write()
    last = clock();
  }
  __device__ void mark(int phase) {
    const unsigned int now = clock();
    sum[phase] += now - last;
    last = now;
  }
  // After the role's last mark: the sums and the span, by thread 0 (steps: CTA 0's).
  __device__ void write(int steps) {
    if (threadIdx.x != 0) return;
    for (int k = 0; k < V7_PHASE_COLS; ++k) g_v7_phase_clocks[blockIdx.x][k] = sum[k];
    g_v7_phase_ns[blockIdx.x] = now_ns() - g_v7_phase_ns[blockIdx.x];
    if (blockIdx.x == 0) g_v7_phase_ns[V7_CTAS] = steps;
  }
};

}  // namespace
