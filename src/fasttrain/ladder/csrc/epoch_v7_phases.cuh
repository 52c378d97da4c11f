// cuda-epoch v7's phase-profiling build (cuda_epoch_v7_phase_profile, v7a's and v7b's): where a
// step's time goes in each role. v7b keeps the phases' names and order (its comments below), so
// one reader and one GPU test serve both. v4's PhaseClock times v4's loop; v7's chain and workers
// run loops of their own, so they have phases of their own (below, in the order a step runs them).
//
// Each CTA's thread 0 sums, per phase, the clocks from the previous mark to this one (clock(),
// 32-bit: a difference is exact modulo 2^32, i.e. for intervals under ~2 s, and a sum is at most
// the loop's span) over the whole epoch (the steps and what follows them: the chain's last G
// wait, the workers' last L updates and their final cluster barrier), and brackets its loop with
// the global timer (ns), so the host turns clocks into time at each CTA's own rate (its span /
// its clocks: SMs clock apart). v7c-v7g's helper warps (warps 8-15 of a chain CTA, off the
// chain's clock) are clocked by their first thread into rows 64-71 of their own. Only the TIMED
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
// v7c-v7g's helper warps (warps 8-15 of a chain CTA, epoch_v7c.cuh, epoch_v7g.cuh), clocked by
// their first thread (tid 256) in rows of their own: their iteration t makes step t + 1's terms
// j ≥ 2 during the critical warps' step t, off the chain's clock (its "Gram terms" holds only
// its wait for them at the hand-off). In the order v7g's iteration runs them; v7c's has no
// "wait partials" (it reads 0, epoch_phases.V7_UNTIMED).
enum V7HelperPhase {
  V7H_WAIT_G,     // the try_wait for G_{t−1} (passes at once: the critical warps waited for it)
  V7H_TERMS,      // Σ_{j=2..L} Γ_{t+1,j} G_{t+1−j}: the shared loads and FMAs
  V7H_WAIT_PART,  // v7g: the tags of P_{t+1}'s words (loaded before the terms), else the poll
  V7H_WAIT_GRAM,  // one launch: the producers' flag of Γ_{t+2} (two launches: ~0)
  V7H_LOAD_GRAM,  // the issue of Γ_{t+2}'s loads into registers (their wait: next iteration)
  V7H_SUM,        // the 16-lane sums (15 shuffles) into HQ (v7g: and P_{t+1} into PQ)
  V7H_LABELS,     // step t + 1's labels (v7c: order, then y, two dependent loads; v7g: a
                  // register loaded an iteration before)
  V7H_HAND,       // the hand-off barrier: waiting for the critical warps' step t + 1
  V7H_PHASES
};
constexpr int V7_PHASE_COLS_CW = V7C_PHASES > V7W_PHASES ? V7C_PHASES : V7W_PHASES;
constexpr int V7_PHASE_COLS = V7_PHASE_COLS_CW > V7H_PHASES ? V7_PHASE_COLS_CW : V7H_PHASES;
// Rows of the profile: the 64 chain and worker CTAs, then the 8 chain CTAs' helper warps.
constexpr int V7_PROFILED = V7_CTAS + V7_CHAIN;

// Per row (chain CTAs 0 … 7, the workers in launch order, then chain CTA q's helpers at row
// V7_CTAS + q): its phases' clocks (a role's own columns; the rest stay 0), and its loop's
// globaltimer span in ns; the last element the steps.
__device__ unsigned int g_v7_phase_clocks[V7_PROFILED][V7_PHASE_COLS];
__device__ long long g_v7_phase_ns[V7_PROFILED + 1];

// ROW0, LEAD: the clock of row ROW0 + blockIdx.x, written by thread LEAD (the chain's and the
// workers': 0, 0; the helpers': V7_CTAS, their first thread). Compile-time, so the critical
// warps' clock keeps the registers it had.
template <bool ON, int ROW0 = 0, int LEAD = 0>
struct V7PhaseClock {  // off: nothing
  __device__ void mark(int) {}
  __device__ void write(int) {}
};
template <int ROW0, int LEAD>
struct V7PhaseClock<true, ROW0, LEAD> {
  unsigned int last, sum[V7_PHASE_COLS];
  __device__ static long long now_ns() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  __device__ V7PhaseClock() {
    for (int k = 0; k < V7_PHASE_COLS; ++k) sum[k] = 0;
    if (threadIdx.x == LEAD) g_v7_phase_ns[ROW0 + blockIdx.x] = now_ns();  // until write()
    last = clock();
  }
  __device__ void mark(int phase) {
    const unsigned int now = clock();
    sum[phase] += now - last;
    last = now;
  }
  // After the role's last mark: the sums and the span, by thread LEAD (steps: CTA 0's).
  __device__ void write(int steps) {
    if (threadIdx.x != LEAD) return;
    const int row = ROW0 + blockIdx.x;
    for (int k = 0; k < V7_PHASE_COLS; ++k) g_v7_phase_clocks[row][k] = sum[k];
    g_v7_phase_ns[row] = now_ns() - g_v7_phase_ns[row];
    if (row == 0) g_v7_phase_ns[V7_PROFILED] = steps;
  }
};

}  // namespace
