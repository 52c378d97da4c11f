// The host emulation's v7k (variant 10, epoch_v7k.cuh): v7j's workers (every body, bugs 27-29
// too) with the chain counters read early (j5). Its barriers (j3) are invisible here: a worker
// cluster's step is one unit, so no unit can see a barrier missing inside it; the GPU tests are
// j3's check.
// The early read: a worker cluster's lanes read the 8 counters at the top of step t, i.e. when
// its unit t − 1 ended (its setup, for step 0); other units (the chain's, the helpers' that
// publish counts) may run before its unit t, whose fetch-ahead (after the partials) tests that
// value: reached, it loads G_a (a snapshot of global memory now, as v7d's); stale (not reached),
// it falls back to v7j's acquire, i.e. the counters as they are now. The counts of each kind are
// kept for the test (v7k_counts), which checks that its schedules make stale reads and take the
// fallback.
// Planted bugs: 30 the G loads issued with the early read (a snapshot of global memory at the
// step's top) and kept when the fallback's later read says the count is reached (loads checked
// after they were issued: a G_a published in between is not in them); 31 (one launch) step 0's
// early read issued before the worker's wait for the reset, so it sees the previous epoch's
// counts (or, in the first epoch, what the scratch held) and trusts them.
#pragma once

#include <vector>

namespace {

constexpr int V7K_VARIANT = 10;

long long g_v7k_counts[3] = {};  // early reads that passed, stale ones, stale then the fallback's load

// A worker cluster's early reads (and bug 30's loads issued with them).
struct V7KEarly {
  int count[V7_CHAIN] = {};
  int a = -1;                // bug 30: the step whose G_a the top's loads took
  std::vector<float> g = std::vector<float>(BMAX * V7_GROW);
};

// The top of cluster k's next step: the counters now (and bug 30's loads of the G it will want).
template <class Em>
void v7k_top(Em& em, int k) {
  V7KEarly& r = em.early[k];
  for (int q = 0; q < V7_CHAIN; ++q) r.count[q] = em.s.gflag[q];
  const int t = em.wnext[k], a = t < em.e.steps ? em.applied_before(t) : em.e.steps;
  r.a = -1;
  if (em.bug == 30 && a < em.e.steps) {
    std::memcpy(r.g.data(), em.s.g + size_t(a) * BMAX * V7_GROW, 4 * BMAX * V7_GROW);
    r.a = a;
  }
}

// V7KGAhead::ahead: the early value tested, else v7j's acquire now (the emulation's g_published).
template <class Em>
void v7k_ahead(Em& em, int k, int a) {
  if (em.held[k] == a) return;
  bool early = true;
  for (int q = 0; q < V7_CHAIN; ++q) early = early && em.early[k].count[q] >= v7_g_ready(a);
  if (early) {
    ++g_v7k_counts[0];
    return em.fetch(k, a);
  }
  ++g_v7k_counts[1];
  if (!em.g_published(a)) return;  // not reached now either: the update will wait
  ++g_v7k_counts[2];
  if (em.bug == 30 && em.early[k].a == a) return em.fetch(k, a, em.early[k].g.data());
  em.fetch(k, a);
}

}  // namespace
