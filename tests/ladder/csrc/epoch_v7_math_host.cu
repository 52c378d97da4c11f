// The CPU side of tests/ladder/test_cuda_epoch_v7_math.py: cuda-epoch v7a … v7g (epoch_v7.cuh,
// epoch_v7c.cuh, epoch_v7d.cuh, epoch_v7e.cuh, epoch_v7f.cuh, epoch_v7g.cuh, epoch_v7h.cuh,
// epoch_v7i.cuh, epoch_v7j.cuh, epoch_v7k.cuh, epoch_v7m.cuh, epoch_v7n.cuh, `variant` 0 … 12) on
// the host for whole epochs, every role's per-step code (epoch_v7_math.cuh's
// and epoch_v7b_math.cuh's per-thread bodies, run for every thread of every CTA) in an order its
// flags allow:
//   - the Gram kernel: every Γ_{t,j} (exact integer sums rounded once to float) at the kernel's
//     offsets, and the step counters zeroed;
//   - a chain CTA's step t runs once its ring slot holds G_{t−1} from all 8 chain CTAs and every
//     worker cluster has published its rows of P_t; it sends G_t into every chain CTA's slot t % NB
//     (checked: that slot must have been re-armed for step t, i.e. its owner has read G_{t−NB})
//     and publishes its counter;
//   - a worker cluster's step t runs once the G of every update it applies first is published
//     (all 8 chain counters); its 8 CTAs compute, then reduce over each other's buffers;
//   - v7b: a chain CTA's step t runs once its G slot is complete and every one of its tagged
//     partial words carries tag t; a worker writing step t's words into ring slot t % V7_PR
//     checks that the chain CTA reading them has read the slot's previous step (-3 if not); the
//     Gram launch clears the ring; the softmax's shuffles run through HostWarp16, which computes
//     shfl.sync.bfly's source lane by the PTX ISA's formula (width → segment mask and clamp);
//   - v7c (variant 2: v7b's partials and softmax, epoch_v7c_math.cuh's split of the chain CTA):
//     the critical warps' step t is the chain CTA's unit, its term j = 1 summed over the lanes by
//     v7c_lane_sum through HostWarp16; the helpers' iteration t (step t + 1's terms j ≥ 2 into
//     HQ[(t + 1) & 1]) is a unit of its own, runnable once the critical step t has run; the
//     critical step t ≥ 1 waits for iteration t − 1 (the hand-off). Checked: every G a helper reads
//     is complete in its slot, and a sender writes a slot only after the owner's helpers have
//     finished every iteration that reads the slot's previous G;
//   - v7d (variant 3: v7c's chain, workers fetching G ahead, epoch_v7d.cuh's V7GAhead): after
//     step t's partials a worker cluster copies the next update's G_a (a = the updates applied so
//     far) from global memory into its fetching threads' registers if all 8 chain counters say
//     G_a is published (a snapshot of global memory at that point); the update stages the held G
//     if it is G_a's, else fetches it then (its runnable check has waited for the counters). The
//     hardware's side of the ordering (acquire, __syncwarp, ld.cg) is the GPU tests';
//   - v7e (variant 4: v7d's protocol, its workers' update and partials on the tensor cores,
//     epoch_v7e_math.cuh + v8_workers.cuh's mma bodies): x as halves, G_a's fetched float4s
//     turned into G' hi/lo by the fetching threads, every warp's mma.sync through V8HostWarp
//     (exact products, one rounding: to nearest, or toward zero with `acc_rz`); its worker shared
//     memory starts as NaN, so a region read before it is written shows;
//   - v7f (variant 5: v7e with the probe's reduce-scatter, epoch_v7f.cuh): each warp's tile of
//     P_t written straight into its owner's inbox slot t % V8_NS (checked: that slot's previous
//     step reduced), the owners' reduce of step t − 1 at the end of step t (tagged words of step
//     t − 1, v7b's slot-reuse check), the last step's reduce a unit of its own that waits for no G,
//     then the drain. The ring's mbarriers and credits are the v8 probe's protocol test's;
//   - v7g (variant 6: v7f's workers, epoch_v7g.cuh's chain): its helpers' setup and iterations
//     as units of their own, its critical step reading P_t and the labels from what the helpers
//     handed over (epoch_v7g_host.h: the units, the order they run in, its planted bugs 20-22);
//   - v7h (variant 7: v7g with its workers' sample indices loaded a step before their pixels):
//     each worker thread's index registers kept across steps (epoch_v7h_host.h, bugs 23, 24);
//   - v7i (variant 8: v7h with G_t's global rows and the step counter by the chain's helpers):
//     the critical step publishes nothing; a helper unit ends with the previous step's rows and
//     count, and a tail unit does the last step's (epoch_v7i_host.h, bugs 25, 26);
//   - v7j (variant 9: v7i with its workers' fragments by ldmatrix from swizzled rows, W·2⁸'s
//     pieces split by the apply): V8HostWarp's ldmatrix from the PTX ISA's lane map, every
//     reader and writer through epoch_v7j_math.cuh (epoch_v7j_host.h, bugs 27-29);
//   - v7k (variant 10: v7j with two barriers fewer, which no unit can see, and the chain
//     counters read at the top of a worker step, tested after its partials): the counters as
//     the cluster's previous unit left them, the fallback reading them when tested
//     (epoch_v7k_host.h, bugs 30, 31);
//   - v7m (variant 11: v7j with its chain's critical tail cut: each warp sends its own rows, warp
//     0 the column sums, the loss after the sends): the critical step's tail through
//     epoch_v7m_math.cuh's bodies and send mapping (epoch_v7m_host.h, bugs 40-42);
//   - v7n (variant 12: v7k with no column sums in its chain's G exchange: each warp sends its
//     rows, warp 0 a token to every chain CTA, and the receivers' helpers sum the rows for the
//     bias once the slot holds G_t): epoch_v7n_math.cuh's bodies (epoch_v7n_host.h, bugs 43-45);
//   - the scheduler picks among the runnable units (v7c's helpers last, but for policy ≥ 1): policy 0 runs workers whenever it can (as far
//     ahead as the flags let them: a flag read too early shows), CHAIN_FIRST (-1) runs chain CTAs
//     whenever one can (a chain that reads what no worker has written yet shows), policy ≥ 1
//     picks at random.
//   - one launch (`grams` 1, epoch_v7l.cuh): no Gram launch. Each epoch takes its generation g
//     from the ticket count (V7L_CTAS tickets a launch); the 56 producer CTAs are units of their
//     own: producer 0's first unit zeroes the counters, clears v7b's ring and sets reset = g;
//     then producer p's units are the items p, p + 56, … (the Grams of (t, 64 rows), then its
//     ready flag = g). A chain or worker CTA starts (its setup) only once reset == g; a chain
//     CTA's step t (which loads Γ_{t+1}) runs only once the flag of its rows' item of step t + 1
//     is g. The policies run the producers last (only when nothing else can run), so a chain that
//     does not wait for a flag reads what no producer has written yet.
// Global buffers start as `fill` (NaN: never written; 0: memory that happens to hold zeros) and
// keep the previous epoch's values, as device memory would; the one-launch tail (tickets and
// flags) starts zeroed, as EpochKernel's torch.zeros.
// Planted bugs (the test shows each one fails the float64 check): 1 the workers' lag window one
// step too short (an update applied that the chain's Gram terms also count), 2 the bias of step
// s = max(t − L, 0) in Z_t (the bias correction left out), 3 a worker reading G_a when the chain
// counters say a steps (not a + 1) are published (a stale G); v7b only: 4 the chain's tag
// compared to the wrong step (any written step accepted: the slot's previous one, t − V7_PR), 5
// the softmax's shuffles of width 8 (not 16), 6 the Gram launch not clearing the ring (a short
// epoch's tags are the next epoch's too); v7c (and v7d) only: 7 the helpers' sums written into the
// buffer of the wrong step parity, 8 the helpers' lag off by one (step t's ring slots with step
// t + 1's Γ); v7d only: 9 the G fetched ahead for step a holding G_{a+1}'s rows (the prefetch a
// step off), 10 the G fetched ahead before its counters are checked (the check when the update
// comes: a snapshot taken before the chain published it is used); one launch only (v7prod's 7-9,
// renumbered at the merges): 11 the chain not waiting for Γ's flag, 12 a producer's flag published
// before the Gram's last row (written by its next unit), 13 the chain and workers not waiting for
// the reset (stale counters of the previous epoch); v7e only (14 is another branch's): 15 G'
// scaled by the batch size, not the step's rows (the last, short batch's update off by bs/n), 16
// G''s lo piece dropped (11 bits of G), 17 a worker's padded slot 14 holding 255 (the v8 probe's
// bias pixel) instead of 0; v7f only: 18 the deferred reduce's words tagged (and placed) as the
// current step's, not the reduced step's (step 0's never written: the chain waits forever), 19
// the deferred reduce of step u reading slot (u + 1) % NS (step u + 1's tiles, the probe's bug 5).
// v7g only: 20-22 (epoch_v7g_host.h, v7h's and v7i's too); v7h only: 23, 24 (epoch_v7h_host.h,
// v7i's too); v7i only: 25, 26 (epoch_v7i_host.h, v7j's too); v7j only: 27-29
// (epoch_v7j_host.h, v7k's and v7m's too); v7k only: 30, 31 (epoch_v7k_host.h; 31 in one launch);
// v7m only: 40-42 (epoch_v7m_host.h); v7n only: 43-45 (epoch_v7n_host.h).
#define FT_HOST_MATH
#include <cmath>
#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <vector>

#include "epoch_v7_math.cuh"
#include "epoch_v7b_math.cuh"
#include "epoch_v7c_math.cuh"
#include "epoch_v7d_math.cuh"
#include "epoch_v7e_math.cuh"
#include "epoch_v7g_math.cuh"
#include "epoch_v7i_math.cuh"
#include "epoch_v7l_math.cuh"
#include "v8_mma_host.h"

#if !defined(__CUDA_ARCH__)  // host code only
namespace {

constexpr int CHAIN_FIRST = -1;

// v7b's softmax lanes: V8HostWarp's 32 lanes in lockstep (its shfl_xor: __shfl_xor_sync by the PTX
// ISA's bfly rule), with `width` the planted bug 5's: every shuffle at 8, whatever the body asks.
struct HostWarp16 : V8HostWarp {
  int width = 0;  // 0: the body's
  explicit HostWarp16(int forced_width = 0) : width(forced_width) {}
  Reg<float> shfl_xor(const Reg<float>& v, int mask, int w) const {
    return V8HostWarp::shfl_xor(v, mask, width ? width : w);
  }
};

struct Chain {
  std::vector<float> sm = std::vector<float>(ChainSmem::FLOATS, 0.f);
  int next = 0;                            // the step it runs next (steps + 1: finished)
  int armed[V7_NB] = {}, got[V7_NB] = {};  // a slot's step and how many senders it has heard
  int phases[V7_NB] = {};  // phases its mbarrier has completed (one per step it served)
  std::vector<std::vector<float>> bias_at;  // b_t after each step's bias update (bug 2)
  std::vector<float> loss = std::vector<float>(V7_T, 0.f), correct = loss;
  // Every thread's registers across steps: Γ_{next,·} and the terms j ≥ 2 already added.
  std::vector<float> gam = std::vector<float>(size_t(V7_T) * V7_LAG * V7_U);
  std::vector<float> acc = std::vector<float>(size_t(V7_T) * C);
  float (&gam_of(int tid))[V7_LAG][V7_U] {
    return *reinterpret_cast<float(*)[V7_LAG][V7_U]>(&gam[size_t(tid) * V7_LAG * V7_U]);
  }
  float (&acc_of(int tid))[C] { return *reinterpret_cast<float(*)[C]>(&acc[size_t(tid) * C]); }
  // v7c: the critical threads' Γ_{next,1} and the helpers' Γ of their next iteration's step.
  std::vector<float> gam1 = std::vector<float>(size_t(V7C_CRIT) * V7C_U);
  std::vector<float> gamh = std::vector<float>(size_t(V7C_HELP) * V7C_HJ * V7C_U);
  float (&gam1_of(int tid))[1][V7C_U] {
    return *reinterpret_cast<float(*)[1][V7C_U]>(&gam1[size_t(tid) * V7C_U]);
  }
  float (&gamh_of(int h))[V7C_HJ][V7C_U] {
    return *reinterpret_cast<float(*)[V7C_HJ][V7C_U]>(&gamh[size_t(h) * V7C_HJ * V7C_U]);
  }
  int hnext = 0;          // v7c: the helpers' next iteration (step hnext + 1's terms j ≥ 2)
  int holds[V7_NB] = {};  // the step whose G a slot holds complete (-1: none, or being written)
  V7GLabels glab[V7_RPC] = {};  // v7g: the label pipeline's registers of helper threads 0 … 15
  int gl_step = -1;  // v7i: the step whose G gl holds (the critical step's softmax wrote it)
  int ipend = -1;    // v7i, bug 26: the step whose rows (igl) have not landed in global memory
  std::vector<float> igl = std::vector<float>((V7_RPC + 1) * 16);
  int nbytes[V7_NB] = {};  // v7n: the bytes landed in a slot from this step's senders so far
};
}  // namespace
#include "epoch_v7i_host.h"  // before v7g's, whose helper units end with v7i_publish
#include "epoch_v7m_host.h"  // before v7n's, whose tail ends with v7m_host_loss_add
#include "epoch_v7n_host.h"  // before v7g's too: v7n's helper units end with its bias
#include "epoch_v7g_host.h"
#include "epoch_v7h_host.h"
#include "epoch_v7j_host.h"
#include "epoch_v7k_host.h"
namespace {

struct Worker {  // v7e: its shared memory as V7ESmem lays it out
  std::vector<float> sm = std::vector<float>(
      std::max({WorkerSmem::FLOATS, V7ESmem::FLOATS, V7FSmem::FLOATS, V7JSmem::FLOATS}), 0.f);
  // v7d: the fetching threads' registers (V7GAhead::g), at G's float4 indices (v7d_vec).
  std::vector<float> pf = std::vector<float>(BMAX * V7_GROW, NAN);
  std::vector<int> xidx = std::vector<int>(V7_T * V7_XF, -2);  // v7h: the sample indices ahead
};

struct Emulation {
  V7Epoch e;
  V7Scratch s;
  const uint8_t* x;
  const int *y, *order;
  int bug, variant, grams = 0;
  bool rz = false;  // v7e: the mma's accumulation rounded toward zero (V8HostWarp's "acc rz")
  float fill = 0.f;  // what memory no step has written holds (v7g: its PQ before the helpers')
  bool fw() const { return variant >= 5; }  // v7f's workers (v7f … v7i)
  bool gc() const { return variant >= V7G_VARIANT; }  // v7g's chain (v7g … v7m)
  bool jw() const {  // v7j's workers (v7j, v7k, v7m, v7n)
    return variant == V7J_VARIANT || variant == V7K_VARIANT || variant == V7M_VARIANT ||
           variant == V7N_VARIANT;
  }
  bool ke() const { return variant == V7K_VARIANT || variant == V7N_VARIANT; }  // v7k's step
  Chain chain[V7_CHAIN];
  Worker workers[V7_WCLUSTERS][V7_CLUSTER];
  int wnext[V7_WCLUSTERS] = {}, wapplied[V7_WCLUSTERS] = {};
  int held[V7_WCLUSTERS] = {};  // v7d: the step whose G the cluster's fetching threads hold
  bool unread[V7_WCLUSTERS][V8_NS] = {};  // v7f: an inbox slot holds a step not yet reduced
  V7KEarly early[V7_WCLUSTERS];  // v7k: the counters as each cluster read them at its step's top
  bool violated = false;
  // One launch: its scratch tail, generation, who has started, each producer's next unit.
  V7LScratch l;
  int gen = 0;
  const float *b_in = nullptr, *w_in = nullptr;
  bool cstarted[V7_CHAIN] = {}, wstarted[V7_WCLUSTERS] = {}, reset_done = false;
  int pnext[V7L_PRODUCERS] = {}, plast[V7L_PRODUCERS] = {};  // plast: bug 12's row left, or -1

  bool reset_seen() const { return bug == 13 || *l.reset == gen; }
  bool gram_ready(int t, int q) const {  // the chain's gate (epoch_v7l.cuh's V7GramsGate)
    return grams == 0 || bug == 11 || t >= e.steps || l.ready[v7l_item(t, v7l_tile(q))] == gen;
  }
  // Rows [r0, r1) of item (t, tile)'s Γ_{t,j}, every j, as the kernel's job writes them.
  void gram_rows(int t, int tile, int r0, int r1) {
    for (int j = 1; j <= V7_LAG && j <= t; ++j)
      for (int a = tile * V7L_ROWS + r0; a < tile * V7L_ROWS + r1 && a < e.rows(t); ++a)
        for (int b = 0; b < e.rows(t - j); ++b) {
          const uint8_t* xa = x + size_t(order[t * e.bs + a]) * K;
          const uint8_t* xb = x + size_t(order[(t - j) * e.bs + b]) * K;
          int32_t sum = 0;
          for (int k = 0; k < K; ++k) sum += int32_t(xa[k]) * int32_t(xb[k]);
          s.gram[v7_gram_offset(t, j) + size_t(a) * BMAX + b] = static_cast<float>(sum);
        }
  }
  bool producer_runnable(int p) const {
    return (p == 0 && !reset_done) || plast[p] >= 0 || pnext[p] < v7l_items(e.steps);
  }
  void producer_step(int p) {
    if (p == 0 && !reset_done) {  // v7's counters zeroed, v7b's ring cleared, then reset = g
      for (int i = 0; i < V7_CHAIN * (1 + V7_WCLUSTERS); ++i) s.gflag[i] = 0;
      if (variant >= 1)
        for (size_t i = 0; i < V7_PTAG_WORDS; ++i) s.ptag[i] = V7_CLEAR_WORD;
      *l.reset = gen;
      reset_done = true;
      return;
    }
    if (plast[p] >= 0) {  // bug 12: the row its flag was published without
      const int i = plast[p];
      plast[p] = -1;
      gram_rows(i / V7L_TILES, i % V7L_TILES, V7L_ROWS - 1, V7L_ROWS);
      return;
    }
    const int i = pnext[p];
    pnext[p] += V7L_PRODUCERS;
    const int t = i / V7L_TILES, tile = i % V7L_TILES;
    const bool late = bug == 12 && t > 0 && tile * V7L_ROWS + V7L_ROWS <= e.rows(t);
    gram_rows(t, tile, 0, late ? V7L_ROWS - 1 : V7L_ROWS);
    if (late) plast[p] = i;
    l.ready[i] = gen;
  }

  int applied_before(int t) const {
    const int s0 = v7_applied_before(t);
    return bug == 1 && s0 < t ? s0 + 1 : s0;
  }
  bool g_published(int a) const {
    const int want = bug == 3 ? v7_g_ready(a) - 1 : v7_g_ready(a);
    for (int q = 0; q < V7_CHAIN; ++q)
      if (s.gflag[q] < want) return false;
    return true;
  }

  // v7b: chain CTA q's tagged words of step t, as its threads load them (bug 4: a word of any
  // step passes for step t's). False if one is not there yet; p[tid]: the sums.
  bool tagged_ready(int q, int t, float* p) const {
    for (int tid = 0; tid < V7_SMT; ++tid) {
      p[tid] = 0.f;
      if (!v7b_part_mine(e, t, q, tid)) continue;
      const auto load = [&](const uint64_t* w) {
        return bug == 4 && v7b_tag(*w) != V7_TAG_CLEAR ? v7b_word(v7b_value(*w), t) : *w;
      };
      if (!v7b_sum_tagged(v7b_part_words(s.ptag, t, q, tid), t, load, p[tid])) return false;
    }
    return true;
  }

  void grams_launch() {
    if (variant >= 1 && bug != 6)  // the Gram launch's v7b_clear
      for (size_t i = 0; i < V7_PTAG_WORDS; ++i) s.ptag[i] = V7_CLEAR_WORD;
    for (int i = 0; i < V7_CHAIN * (1 + V7_WCLUSTERS); ++i) s.gflag[i] = 0;  // both arrays
    for (int t = 0; t < e.steps; ++t)
      for (int j = 1; j <= V7_LAG && j <= t; ++j)
        for (int a = 0; a < e.rows(t); ++a)
          for (int b = 0; b < e.rows(t - j); ++b) {
            const uint8_t* xa = x + size_t(order[t * e.bs + a]) * K;
            const uint8_t* xb = x + size_t(order[(t - j) * e.bs + b]) * K;
            int32_t sum = 0;
            for (int k = 0; k < K; ++k) sum += int32_t(xa[k]) * int32_t(xb[k]);
            s.gram[v7_gram_offset(t, j) + size_t(a) * BMAX + b] = static_cast<float>(sum);
          }
  }

  void chain_setup(int q, const float* b) {
    Chain& c = chain[q];
    std::fill(c.sm.begin(), c.sm.end(), 0.f);
    for (int i = 0; i < C; ++i) c.sm[ChainSmem::BIAS + i] = b[i];
    c.next = 0;
    for (int p = 0; p < V7_NB; ++p) {
      c.armed[p] = p;
      c.got[p] = 0;
      c.phases[p] = 0;
      c.holds[p] = -1;
    }
    c.hnext = 0;
    c.bias_at.assign(e.steps + 1, std::vector<float>(C));
    for (int tid = 0; tid < V7_T; ++tid) {
      chain_load_gram(e, s.gram, 0, q, tid, c.gam_of(tid));
      for (float& a : c.acc_of(tid)) a = 0.f;
    }
    if (variant < 2) return;
    for (int tid = 0; tid < V7C_CRIT; ++tid) v7c_load_gram<1>(e, s.gram, 0, q, tid, 1, c.gam1_of(tid));
    if (gc()) return v7g_chain_setup(*this, q);  // Γ_1: the helpers' setup
    if (e.steps > 1 && grams == 0)  // one launch: in the helpers' first unit, after its gate
      for (int h = 0; h < V7C_HELP; ++h)
        v7c_load_gram<V7C_HJ>(e, s.gram, 1, q, h, 2, c.gamh_of(h));
  }
  // v7c: the helpers' iteration t = hnext (step t + 1's terms j ≥ 2) starts after the critical
  // warps' hand-off of step t (here: after their whole step t).
  // One launch: iteration t loads Γ_{t+2} (and iteration 0 Γ_1 first, the kernel's setup load):
  // it runs once their producers' flags are set (the helpers' gate).
  bool helper_runnable(int q) const {
    if (variant >= V7I_VARIANT && chain[q].hnext == e.steps) return v7i_tail_runnable(*this, q);
    if (variant == V7N_VARIANT && !v7n_helper_ready(*this, q)) return false;
    if (gc()) return v7g_helper_runnable(*this, q);
    const Chain& c = chain[q];
    if (variant < 2 || c.hnext + 1 >= e.steps || c.next <= c.hnext) return false;
    return gram_ready(c.hnext + 2, q) && (c.hnext > 0 || gram_ready(1, q));
  }
  void helper_step(int q) {
    if (variant >= V7I_VARIANT && chain[q].hnext == e.steps) return v7i_tail(*this, q);
    if (gc()) return v7g_helper_step(*this, q);
    Chain& c = chain[q];
    float* sm = c.sm.data();
    const float* ring = sm + ChainSmem::RING;
    const int t = c.hnext++;
    if (grams == 1 && t == 0)  // the setup's load of Γ_1, after its gate
      for (int h = 0; h < V7C_HELP; ++h) v7c_load_gram<V7C_HJ>(e, s.gram, 1, q, h, 2, c.gamh_of(h));
    for (int j = 2; j <= v7_window(t + 1); ++j)  // G_{t+1−j} complete in its slot
      if (c.holds[v7_slot(t + 1 - j)] != t + 1 - j) violated = true;
    HostWarp16 warp{bug == 5 ? 8 : 0};
    for (int w = 0; w < V7C_HELP / 32; ++w) {
      HostWarp16::Reg<float> acc[C];
      for (int lane = 0; lane < 32; ++lane) {
        float a[C] = {};
        // bug 8: the lag off by one (step t's ring slots with step t + 1's Γ)
        v7c_terms<V7C_HJ>(e, c.gamh_of(32 * w + lane), ring, bug == 8 ? t : t + 1, 32 * w + lane,
                          2, a);
        for (int k = 0; k < C; ++k) acc[k][lane] = a[k];
      }
      const HostWarp16::Reg<float> sum = v7c_lane_sum(warp, acc);
      for (int lane = 0; lane < 32; ++lane) {
        const ChainLane16 ln = chain_lane16(32 * w + lane);
        // bug 7: the sums into the wrong parity's buffer
        if (ln.c < C) sm[v7c_hq_at(bug == 7 ? t : t + 1) + ln.i * 16 + ln.c] = sum[lane];
      }
    }
    if (t + 2 < e.steps)
      for (int h = 0; h < V7C_HELP; ++h)
        v7c_load_gram<V7C_HJ>(e, s.gram, t + 2, q, h, 2, c.gamh_of(h));
  }
  bool chain_runnable(int q) const {
    if (grams == 1 && !cstarted[q]) return reset_seen();  // its setup, after the reset
    for (int d = 0; d < V7_CHAIN && grams == 1; ++d)  // the chain's cluster barrier after setup
      if (!cstarted[d]) return false;
    const Chain& c = chain[q];
    const int t = c.next;
    if (t > e.steps) return false;
    // step t loads Γ_{t+1} (v7g: after the hand-off that follows the helpers' check of its flag)
    if (!gc() && !gram_ready(t + 1, q)) return false;
    // The kernel's try_wait.parity(v7_parity(t − 1)) on slot v7_slot(t − 1): it passes once the
    // phase of that parity has completed, i.e. while the current phase's parity differs.
    if (t > 0 && (c.phases[v7_slot(t - 1)] & 1) == v7_parity(t - 1)) return false;
    if (t == e.steps) return true;  // the last wait: G_{steps−1}
    if (gc())  // the hand-off: the helpers' unit t (bug 22: none at step 0)
      return c.hnext >= t + 1 || (t == 0 && bug == 22);
    if (variant >= 2 && t >= 1 && c.hnext < t) return false;  // the hand-off: helpers' t − 1
    if (variant >= 1) {
      std::vector<float> p(V7_SMT);
      return tagged_ready(q, t, p.data());
    }
    for (int k = 0; k < V7_WCLUSTERS; ++k)
      if (s.pflag[k * V7_CLUSTER + q] < v7_part_ready(t)) return false;
    return true;
  }
  void chain_step(int q) {
    Chain& c = chain[q];
    float* sm = c.sm.data();
    float *ring = sm + ChainSmem::RING, *bias = sm + ChainSmem::BIAS, *red = sm + ChainSmem::RED,
          *zs = sm + ChainSmem::ZS, *gl = sm + ChainSmem::GL;
    const int t = c.next++;
    if (t > 0) {  // the wait on slot (t−1) % NB, then its re-arm and the bias update
      const int p = v7_slot(t - 1);
      if (c.got[p] != V7_CHAIN || c.armed[p] != t - 1) violated = true;  // passed too early
      c.got[p] = 0;
      c.armed[p] = t - 1 + V7_NB;
      if (variant != V7N_VARIANT)
        for (int tid = 0; tid < V7_T; ++tid) chain_bias(e, ring, t - 1, tid, bias);
      else if (t == e.steps)  // v7n: b_steps by the critical warps (before: the helpers')
        v7n_receiver_bias(*this, q, t - 1);
    }
    for (int i = 0; i < C; ++i) c.bias_at[t][i] = bias[i];
    if (t == e.steps) return;
    float p[V7_SMT];  // v7b: the thread's partials, read (with their tags) after the G wait
    int labels[V7_RPC] = {};
    if (gc())  // from the helpers, at the hand-off
      v7g_chain_inputs(*this, q, t, p, labels);
    else if (variant >= 1 && !tagged_ready(q, t, p))
      violated = true;  // ran before its words came
    float j1[V7C_CRIT] = {};  // v7c: the critical lanes' term j = 1, summed by shuffles
    if (variant >= 2) {
      HostWarp16 warp{bug == 5 ? 8 : 0};
      for (int w = 0; w < V7C_CRIT / 32; ++w) {
        HostWarp16::Reg<float> acc[C];
        for (int lane = 0; lane < 32; ++lane) {
          float a[C] = {};
          if (gc())
            v7g_terms<1>(c.gam1_of(32 * w + lane), ring, t, 32 * w + lane, 1, a);
          else
            v7c_terms<1>(e, c.gam1_of(32 * w + lane), ring, t, 32 * w + lane, 1, a);
          for (int k = 0; k < C; ++k) acc[k][lane] = a[k];
        }
        const HostWarp16::Reg<float> sum = v7c_lane_sum(warp, acc);
        for (int lane = 0; lane < 32; ++lane) j1[32 * w + lane] = sum[lane];
      }
      if (t + 1 < e.steps)
        for (int tid = 0; tid < V7C_CRIT; ++tid)
          v7c_load_gram<1>(e, s.gram, t + 1, q, tid, 1, c.gam1_of(tid));
    } else {
      for (int tid = 0; tid < V7_T; ++tid) {  // j = 1 (j ≥ 2 were added after step t − 1)
        chain_gram_terms(e, c.gam_of(tid), ring, t, tid, 1, 1, c.acc_of(tid));
        chain_gram_store(tid, c.acc_of(tid), red, variant == 1);
      }
    }
    const float* used_bias = bug == 2 ? c.bias_at[v7_applied_before(t)].data() : bias;
    for (int i = 0; i < V7_RPC && !gc(); ++i) {
      const int row = q * V7_RPC + i;
      if (row < e.rows(t)) labels[i] = y[order[t * e.bs + row]];
    }
    if (variant == V7M_VARIANT) return v7m_chain_tail(*this, q, t, p, j1, used_bias, labels);
    if (variant == V7N_VARIANT) return v7n_chain_tail(*this, q, t, p, j1, used_bias, labels);
    if (variant >= 1) {
      HostWarp16 warp{bug == 5 ? 8 : 0};
      for (int w = 0; w < V7_SMT / 32; ++w) {
        HostWarp16::Reg<float> z, loss, correct;
        for (int lane = 0; lane < 32; ++lane) {
          const int tid = 32 * w + lane;
          z[lane] = variant >= 2 ? chain_logit_c(e, t, q, tid, p[tid], used_bias, j1[tid],
                                                 sm + v7c_hq_at(t))
                                 : chain_logit16(e, t, q, tid, p[tid], used_bias, red);
          loss[lane] = c.loss[tid];
          correct[lane] = c.correct[tid];
        }
        chain_softmax16(warp, e, t, q, w, z, labels, gl, loss, correct);
        for (int lane = 0; lane < 32; ++lane) {
          c.loss[32 * w + lane] = loss[lane];
          c.correct[32 * w + lane] = correct[lane];
        }
      }
    } else {
      const float* part_t = v7_part_rows(s, t, 0);
      for (int tid = 0; tid < V7_T; ++tid)
        chain_logits(
            e, [&](int k, int i) { return part_t[size_t(k) * BMAX * V7_GROW + i]; }, t, q, tid,
            used_bias, red, zs);
      for (int tid = 0; tid < V7_T; ++tid)
        chain_softmax(e, t, q, tid, zs, labels, gl, c.loss[tid], c.correct[tid]);
    }
    for (int tid = 0; tid < V7_T; ++tid) chain_colsum(tid, gl);
    c.gl_step = t;
    const int slot = v7_slot(t);
    for (int d = 0; d < V7_CHAIN; ++d) {  // the st.asyncs into d's slot
      Chain& dst = chain[d];
      if (dst.armed[slot] != t) violated = true;  // d has not read G_{t−NB} yet
      // v7c: nor have d's helpers (iterations t − NB + 1 … t − 2 read G_{t−NB})
      if (variant >= 2 && t >= V7_NB && v7g_iterations_done(*this, d) <= t - V7_NB + V7_LAG - 1)
        violated = true;
      float* ds = dst.sm.data() + ChainSmem::RING + slot * ChainSmem::GSLOT;
      for (int i = 0; i < V7_RPC; ++i) {
        const int row = q * V7_RPC + i;
        if (row < e.rows(t)) std::memcpy(ds + row * V7_RS, gl + i * 16, 64);
      }
      std::memcpy(ds + BMAX * V7_RS + q * V7_GROW, gl + V7_RPC * 16, 64);
      if (++dst.got[slot] == V7_CHAIN) ++dst.phases[slot];  // armed, all bytes in: complete
      dst.holds[slot] = dst.got[slot] == V7_CHAIN ? t : -1;
    }
    if (variant >= V7I_VARIANT) return;  // G_t's rows and the count: the helpers' (v7i_publish)
    for (int i = 0; i < V7_RPC; ++i) {
      const int row = q * V7_RPC + i;
      if (row < e.rows(t)) std::memcpy(s.g + (size_t(t) * BMAX + row) * V7_GROW, gl + i * 16, 64);
    }
    s.gflag[q] = t + 1;
    if (variant >= 2) return;  // the terms j ≥ 2: the helpers'
    for (int tid = 0; tid < V7_T; ++tid) {  // step t + 1's Γ and its terms j ≥ 2
      for (float& a : c.acc_of(tid)) a = 0.f;
      if (t + 1 == e.steps) continue;
      chain_load_gram(e, s.gram, t + 1, q, tid, c.gam_of(tid));
      chain_gram_terms(e, c.gam_of(tid), ring, t + 1, tid, 2, V7_LAG, c.acc_of(tid));
    }
  }

  int w_at() const { return variant >= 4 ? V7ESmem::W : WorkerSmem::W; }
  // The worker's last unit: its drain and write-back (v7f: after a unit of its own, the deferred
  // reduce of the last step, which waits for no G: the chain needs those partials first).
  int wlast() const { return fw() ? e.steps + 1 : e.steps; }
  void worker_setup(int k, const float* w) {
    for (int r = 0; r < V7_CLUSTER; ++r) {
      std::vector<float>& sm = workers[k][r].sm;
      std::fill(sm.begin(), sm.end(), variant >= 4 ? NAN : 0.f);  // v7e/f: what it must write
      const int f0 = (k * V7_CLUSTER + r) * V7_FW;
      if (variant >= 4) {  // v7e_worker's setup: W's 16 x 16, the partial buffers zeroed
        for (int i = 0; i < V8_NF * 16; ++i) sm[V7ESmem::W + i] = 0.f;
        for (int i = 0; i < 2 * BMAX * V7_GROW && variant == 4; ++i) sm[V7ESmem::PBUF + i] = 0.f;
      }
      for (int f = 0; f < V7_FW; ++f)
        for (int c = 0; c < C; ++c) sm[w_at() + f * 16 + c] = w[c * K + f0 + f];
      if (jw()) v7j_host_setup(sm.data());  // W₀'s pieces
    }
    wnext[k] = wapplied[k] = 0;
    for (bool& u : unread[k]) u = false;
    held[k] = -1;
    store_x(k, 0);
    if (ke() && bug != 31) v7k_top(*this, k);  // bug 31: read before the reset
  }
  bool worker_runnable(int k) const {
    if (grams == 1 && !wstarted[k]) return reset_seen();  // its setup, after the reset
    const int t = wnext[k];
    if (t > wlast()) return false;
    if (fw() && t == e.steps) return true;  // v7f's last deferred reduce
    const int upto = t == wlast() ? e.steps : applied_before(t);
    for (int a = wapplied[k]; a < upto; ++a)
      if (!g_published(a)) return false;
    return true;
  }
  void store_x(int k, int t) {  // the kernel fetches a step ahead, and stores here
    for (int r = 0; r < V7_CLUSTER; ++r)
      for (int tid = 0; tid < V7_T; ++tid) {
        if (jw()) {  // by pixel pairs
          v7j_store_x(*this, k, r, tid, t);
          continue;
        }
        uint8_t buf[V7_XF];
        if (variant >= V7H_VARIANT)  // v7h's workers (v7h, v7i)
          v7h_gather(*this, k, r, tid, t, buf);
        else
          worker_fetch_x(e, x, order, t, (k * V7_CLUSTER + r) * V7_FW, tid, V7_T, buf);
        float* sm = workers[k][r].sm.data();
        if (variant >= 4)  // bug 17: the padded slot 14 holds 255 (the probe's bias pixel)
          v8_store_xh<V7_XR>(e, t, tid, V7_T, buf, bug == 17,
                             reinterpret_cast<__half*>(sm + V7ESmem::XH));
        else
          worker_store_x(e, t, tid, V7_T, buf, sm + WorkerSmem::XS);
      }
  }
  // v7d: every fetching thread's float4s of G_a from global memory (bug 9: G_{a+1}'s, a step
  // off), as V7GAhead::load; a snapshot of what global memory holds now (v7k's bug 30: `rows`,
  // G_a's rows as an earlier snapshot held them).
  void fetch(int k, int a, const float* rows = nullptr) {
    const int src = bug == 9 && a + 1 < e.steps ? a + 1 : a;
    if (rows == nullptr) rows = s.g + size_t(src) * BMAX * V7_GROW;
    for (int r = 0; r < V7_CLUSTER; ++r)
      for (int tid = V7D_PF0; tid < V7_T; ++tid)
        for (int kk = 0; kk < V7D_VEC; ++kk) {
          const int i = v7d_vec(tid, kk);
          if (v7d_vec_valid(e, a, i))
            std::memcpy(workers[k][r].pf.data() + 4 * i, rows + 4 * i, 16);
        }
    held[k] = a;
  }
  // v7d: V7GAhead::ahead during step t's partials: the loads only once all 8 counters say G_a is
  // published (bug 10: the loads first, the counters checked when the update comes, i.e. after).
  void ahead(int k, int a) {
    if (ke()) return v7k_ahead(*this, k, a);
    if (held[k] == a || (bug != 10 && !g_published(a))) return;
    fetch(k, a);
  }
  // v7e's update of CTA (k, r): V7GAheadH::stage (G_a's float4s as G' = G·n·2¹² in hi/lo
  // halves; bug 15: n the batch size, not the step's rows; bug 16: lo dropped), then the mma sums
  // by warps 0-7 and the apply.
  void update_mma(int k, int r, int a) {
    float* sm = workers[k][r].sm.data();
    if (jw()) return v7j_host_update(e, a, sm, workers[k][r].pf.data(), rz, bug);
    __half* gsh = reinterpret_cast<__half*>(sm + V7ESmem::GSH);
    for (int tid = V7D_PF0; tid < V7_T; ++tid)
      for (int kk = 0; kk < V7D_VEC; ++kk) {
        const int i = v7d_vec(tid, kk);
        const float* g = workers[k][r].pf.data() + 4 * i;
        v7e_put_g(i, make_float4(g[0], g[1], g[2], g[3]), v7d_vec_valid(e, a, i),
                  bug == 15 ? e.bs : e.rows(a), gsh);
      }
    if (bug == 16) std::fill(gsh + BMAX * 16, gsh + 2 * BMAX * 16, __float2half_rn(0.f));
    const V8HostWarp warp{rz};
    for (int u = 0; u < V7_T / 32; ++u)
      v8_mma_update_sums(warp, u, reinterpret_cast<const __half*>(sm + V7ESmem::XH) +
                                      (a % V7_XR) * BMAX * 16,
                         gsh, sm + V7ESmem::URED);
    for (int tid = 0; tid < V7_T; ++tid)
      v8_mma_update_apply(e, a, sm + V7ESmem::URED, tid, sm + V7ESmem::W);
  }
  void update(int k, int a) {
    if (variant >= 3 && held[k] != a) fetch(k, a);  // not fetched ahead: V7GAhead::wait's loads
    for (int r = 0; r < V7_CLUSTER; ++r) {
      float* sm = workers[k][r].sm.data();
      if (variant >= 4) {
        update_mma(k, r, a);
        continue;
      }
      if (variant == 3) {  // V7GAhead::stage
        for (int tid = V7D_PF0; tid < V7_T; ++tid)
          for (int kk = 0; kk < V7D_VEC; ++kk) {
            const int i = v7d_vec(tid, kk);
            if (v7d_vec_valid(e, a, i))
              std::memcpy(sm + WorkerSmem::GS + 4 * i, workers[k][r].pf.data() + 4 * i, 16);
          }
      } else {
        std::memcpy(sm + WorkerSmem::GS, s.g + size_t(a) * BMAX * V7_GROW,
                    4 * e.rows(a) * V7_GROW);
      }
      for (int tid = 0; tid < V7_T; ++tid)
        worker_update_sums(e, a, sm + WorkerSmem::XS, sm + WorkerSmem::GS, tid,
                           sm + WorkerSmem::URED);
      for (int tid = 0; tid < V7_T; ++tid)
        worker_update_apply(e, sm + WorkerSmem::URED, tid, sm + WorkerSmem::W);
    }
  }
  // v7f: rank r's reduce at step t (1 … steps) of the inbox slot of step u = v7f_reduced_at(t), as
  // tagged words of step u (bug 18: of step t, the slot taken for the current step's); then the
  // slot is free for the senders (checked: a send into a slot not yet reduced is a violation).
  void reduce_f(int k, int t) {
    const int u = v7f_reduced_at(t), slot = v8_ns_slot(bug == 19 ? u + 1 : u),
              tag = bug == 18 ? t : u;
    for (int r = 0; r < V7_CLUSTER; ++r) {
      if (tag >= V7_PR && chain[r].next <= tag - V7_PR) violated = true;  // v7b's ring slot
      const float* in = workers[k][r].sm.data() + V7FSmem::INBOX;
      for (int tid = 0; tid < V7_T; ++tid)
        worker_reduce(e, u, r, tid,
                      [&](int src, int i) {
                        return in[v8_inbox_at(slot, src, i / V7_GROW, i % V7_GROW)];
                      },
                      [&](int row, int c, float v) {
                        s.ptag[v7b_word_at(tag, k, row, c)] = v7b_word(v, tag);
                      });
    }
    unread[k][v8_ns_slot(u)] = false;
  }
  // v7f: P_t's tiles straight into their owners' inbox slot t % NS (as the st.asyncs would).
  void scatter_f(int k, int t) {
    const int slot = v8_ns_slot(t);
    if (unread[k][slot]) violated = true;  // the owners have not reduced its previous step
    unread[k][slot] = true;
    for (int r = 0; r < V7_CLUSTER; ++r) {
      float* sm = workers[k][r].sm.data();
      const auto send = [&](int row, int c, float v0, float v1) {
        float* in = workers[k][row / V7_RPC].sm.data() + V7FSmem::INBOX +
                    v8_inbox_at(slot, r, row, c);
        in[0] = v0;
        in[1] = v1;
      };
      if (jw()) {
        v7j_host_partials(t, sm, rz, bug, send);
        continue;
      }
      const __half* xt = reinterpret_cast<const __half*>(sm + V7ESmem::XH) + (t % V7_XR) * BMAX * 16;
      for (int wi = 0; wi < V7_T / 32; ++wi)
        v8_mma_partial(V8HostWarp{rz}, wi, xt, sm + V7ESmem::W, send);
    }
  }
  void worker_step(int k, float* w_out) {
    const int t = wnext[k]++;
    if (fw() && t == e.steps) {  // the last step's deferred reduce
      if (t >= 1) reduce_f(k, t);
      return;
    }
    if (t == wlast()) {  // the updates left, then the write-back
      for (; wapplied[k] < e.steps; ++wapplied[k]) update(k, wapplied[k]);
      for (int r = 0; r < V7_CLUSTER; ++r) {
        const int f0 = (k * V7_CLUSTER + r) * V7_FW;
        for (int f = 0; f < V7_FW; ++f)
          for (int c = 0; c < C; ++c)
            w_out[c * K + f0 + f] = workers[k][r].sm[w_at() + f * 16 + c];
      }
      return;
    }
    const int p = t & 1;
    for (; wapplied[k] < applied_before(t); ++wapplied[k]) update(k, wapplied[k]);
    if (fw()) {  // v7f: the sends, x_{t+1}, the next G, then step t − 1's reduce
      scatter_f(k, t);
      if (t + 1 < e.steps) store_x(k, t + 1);
      if (wapplied[k] < e.steps) ahead(k, wapplied[k]);
      if (t >= 1) reduce_f(k, t);
      return;
    }
    for (int r = 0; r < V7_CLUSTER; ++r) {
      float* sm = workers[k][r].sm.data();
      if (variant == 4) {  // v7e: P_t's m16 x n8 tiles, one a warp
        float* pb = sm + V7ESmem::PBUF + p * BMAX * V7_GROW;
        const __half* xt = reinterpret_cast<const __half*>(sm + V7ESmem::XH) + (t % V7_XR) * BMAX * 16;
        for (int wi = 0; wi < V7_T / 32; ++wi)
          v8_mma_partial(V8HostWarp{rz}, wi, xt, sm + V7ESmem::W,
                         [&](int row, int c, float v0, float v1) {
                           pb[row * V7_GROW + c] = v0;
                           pb[row * V7_GROW + c + 1] = v1;
                         });
        continue;
      }
      for (int tid = 0; tid < V7_T; ++tid)
        worker_partial(e, t, sm + WorkerSmem::XS, sm + WorkerSmem::W, tid,
                       sm + WorkerSmem::PBUF + p * BMAX * V7_GROW);
    }
    if (t + 1 < e.steps) store_x(k, t + 1);  // after the updates read x_{t−L−1}
    if (variant >= 3 && wapplied[k] < e.steps) ahead(k, wapplied[k]);  // the next update's G
    for (int r = 0; r < V7_CLUSTER; ++r) {  // after the cluster barrier
      const int pbuf = variant == 4 ? V7ESmem::PBUF : WorkerSmem::PBUF;
      const auto remote = [&](int src, int i) {
        return workers[k][src].sm[pbuf + p * BMAX * V7_GROW + i];
      };
      if (variant >= 1) {  // slot t % V7_PR: chain CTA r must have read step t − V7_PR
        if (t >= V7_PR && chain[r].next <= t - V7_PR) violated = true;
        for (int tid = 0; tid < V7_T; ++tid)
          worker_reduce(e, t, r, tid, remote, [&](int row, int c, float v) {
            s.ptag[v7b_word_at(t, k, row, c)] = v7b_word(v, t);
          });
        continue;  // no counter: the tags are the signal
      }
      float* out = v7_part_rows(s, t, k);
      for (int tid = 0; tid < V7_T; ++tid)
        worker_reduce(e, t, r, tid, remote,
                      [&](int row, int c, float v) { out[row * V7_GROW + c] = v; });
      s.pflag[k * V7_CLUSTER + r] = t + 1;
    }
  }

  // One epoch: 0, -2 (no unit can run: a deadlock) or -3 (a ring slot overwritten too early).
  int epoch(float* w, float* b, double* stats, int policy) {
    std::vector<float> w_copy(w, w + C * K);
    b_in = b;
    w_in = w_copy.data();
    if (grams == 0) {
      grams_launch();
      for (int q = 0; q < V7_CHAIN; ++q) chain_setup(q, b);
      for (int k = 0; k < V7_WCLUSTERS; ++k) worker_setup(k, w_in);
    } else {  // the launch's V7L_CTAS tickets; nobody has started
      gen = v7l_generation(*l.arrive);
      *l.arrive += V7L_CTAS;
      if (bug == 31)  // v7k: step 0's early reads before the reset (the counters not yet zeroed)
        for (int k = 0; k < V7_WCLUSTERS; ++k) v7k_top(*this, k);
      reset_done = false;
      for (int q = 0; q < V7_CHAIN; ++q) chain[q].next = 0;  // not started: not finished either
      for (int k = 0; k < V7_WCLUSTERS; ++k) wnext[k] = 0;
      for (bool& c : cstarted) c = false;
      for (bool& c : wstarted) c = false;
      for (int p = 0; p < V7L_PRODUCERS; ++p) {
        pnext[p] = p;
        plast[p] = -1;
      }
    }
    std::mt19937 rng(policy);
    constexpr int HELP = V7_WCLUSTERS + V7_CHAIN;  // unit numbers of v7c's helpers
    constexpr int PROD = HELP + V7_CHAIN;          // ... and of the producers
    for (;;) {
      // 0..6 worker clusters, 7..14 chain CTAs, 15..22 v7c's helpers, 23.. producers
      std::vector<int> run;
      const auto chain_units = [&] {
        for (int q = 0; q < V7_CHAIN; ++q)
          if (chain_runnable(q)) run.push_back(V7_WCLUSTERS + q);
      };
      if (policy == CHAIN_FIRST) chain_units();
      if (policy != CHAIN_FIRST || run.empty())
        for (int k = 0; k < V7_WCLUSTERS; ++k)
          if (worker_runnable(k)) run.push_back(k);
      if (policy > 0 || (policy == 0 && run.empty())) chain_units();
      // v7c's helpers as late as the others allow (the hand-off's test), at random for policy ≥ 1
      if (policy > 0 || run.empty())
        for (int q = 0; q < V7_CHAIN; ++q)
          if (helper_runnable(q)) run.push_back(HELP + q);
      if (grams == 1 && (policy > 0 || run.empty()))  // greedy orders: the producers last
        for (int p = 0; p < V7L_PRODUCERS; ++p)
          if (producer_runnable(p)) run.push_back(PROD + p);
      if (run.empty()) break;
      const int u = run[policy <= 0 ? 0 : rng() % run.size()];
      if (u >= PROD) {
        producer_step(u - PROD);
      } else if (u >= HELP) {
        helper_step(u - HELP);
      } else if (u < V7_WCLUSTERS) {
        if (grams == 1 && !wstarted[u]) {
          wstarted[u] = true;
          worker_setup(u, w_in);
        } else {
          worker_step(u, w);
          if (ke()) v7k_top(*this, u);  // the top of its next step
        }
      } else if (grams == 1 && !cstarted[u - V7_WCLUSTERS]) {
        cstarted[u - V7_WCLUSTERS] = true;
        chain_setup(u - V7_WCLUSTERS, b_in);
      } else {
        chain_step(u - V7_WCLUSTERS);
      }
      if (violated) return -3;
    }
    for (int k = 0; k < V7_WCLUSTERS; ++k)
      if (wnext[k] <= wlast()) return -2;
    for (int q = 0; q < V7_CHAIN; ++q) {
      if (chain[q].next <= e.steps) return -2;
      if (variant >= 2 && v7g_iterations_done(*this, q) != std::max(e.steps - 1, 0)) return -2;
      if (variant >= V7I_VARIANT && chain[q].hnext != e.steps + 1) return -2;  // its tail
      for (int tid = 0; tid < V7_T; ++tid) {
        stats[0] += chain[q].loss[tid];
        stats[1] += chain[q].correct[tid];
        chain[q].loss[tid] = chain[q].correct[tid] = 0.f;
      }
    }
    for (int i = 0; i < C; ++i) b[i] = chain[0].sm[ChainSmem::BIAS + i];
    return 0;
  }
};

}  // namespace

// `epochs` epochs of v7a (variant 0), v7b (1), v7c (2), v7d (3), v7e (4), v7f (5), v7g (6), v7h
// (7), v7i (8), v7j (9), v7k (10), v7m (11) or v7n (12) on (w [10][784], b [10]) in place, orders
// [epochs][n]; stats [2] += (loss sum, correct count); the global buffers start as `fill`.
// Returns 0, -1 (bad arguments), -2 (deadlock) or -3 (a ring slot overwritten before it was read,
// or a step run before its partials came).
// `grams`: 0 two launches (the Gram launch first), 1 one launch (the producers among the units).
// `acc_rz`: v7e's and v7f's mma accumulation rounded toward zero (else to nearest).
extern "C" int v7_epochs(int epochs, const uint8_t* x, const int* y, const int* orders, int n,
                         int bs, float lr, float* w, float* b, double* stats, int policy,
                         int bug, float fill, int variant, int grams, int acc_rz) {
  if (epochs < 1 || n < 1 || bs < 1 || bs > BMAX || bug < 0 || bug > 45 || bug == 14 ||
      variant < 0 || variant > 12 || grams < 0 || grams > 1 || (bug >= 15 && variant < 4) ||
      (bug >= 18 && variant < 5) || (bug >= 20 && bug <= 22 && variant < V7G_VARIANT) ||
      (bug >= 23 && bug <= 24 && variant < V7H_VARIANT) ||
      (bug >= 25 && bug <= 26 && variant < V7I_VARIANT) ||
      (bug >= 27 && bug <= 29 && variant < V7J_VARIANT) ||
      (bug >= 30 && bug <= 31 && variant != V7K_VARIANT) || (bug == 31 && grams != 1) ||
      (bug >= 32 && bug < 40) || (bug >= 40 && bug <= 42 && variant != V7M_VARIANT) ||
      (bug >= 43 && variant != V7N_VARIANT) ||
      (bug > 3 && bug < 7 && variant < 1) ||
      (bug > 6 && bug < 9 && variant < 2) || (bug > 8 && bug < 11 && variant != 3) ||
      (bug >= 11 && bug <= 13 && grams != 1))
    return -1;
  const int steps = (n + bs - 1) / bs;
  std::vector<float> scratch((v7l_scratch_bytes(steps) + 3) / 4, fill);
  const size_t tail = v7_scratch_bytes(steps) / 4;  // the one-launch tail: zeroed
  std::fill(scratch.begin() + tail, scratch.end(), 0.f);
  auto* em = new Emulation{};
  em->e = V7Epoch{n, bs, steps, lr};
  em->s = v7_scratch(scratch.data(), steps);
  em->l = v7l_scratch(scratch.data(), steps);
  em->grams = grams;
  em->x = x;
  em->y = y;
  em->bug = bug;
  em->variant = variant;
  em->rz = acc_rz != 0;
  em->fill = fill;
  int code = 0;
  for (long long& c : g_v7k_counts) c = 0;
  for (int ep = 0; ep < epochs && code == 0; ++ep) {
    em->order = orders + size_t(ep) * n;
    code = em->epoch(w, b, stats, policy);
  }
  delete em;
  return code;
}

// v7k: since the last v7_epochs call began, the early reads that passed, those that were stale,
// and the stale ones whose fallback loaded G (epoch_v7k_host.h).
extern "C" void v7k_counts(long long* out) {
  for (int i = 0; i < 3; ++i) out[i] = g_v7k_counts[i];
}

// The shape the header promises, for the test: L, chain CTAs × rows, worker CTAs × features, CTAs,
// and the scratch bytes of a 469-step epoch.
extern "C" long long v7_shape(int what) {
  switch (what) {
    case 0: return V7_LAG;
    case 1: return V7_CHAIN * V7_RPC;
    case 2: return V7_WORKERS * V7_FW;
    case 3: return V7_CTAS;
    case 4: return static_cast<long long>(v7_scratch_bytes(469));
    case 5: return 4LL * V7_SMEM_FLOATS;
  }
  return -1;
}
#endif
