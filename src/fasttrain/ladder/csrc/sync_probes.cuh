// The hand-off probes' protocols (sync_probes.cu), written once for two machines: the GPU, where a
// `Cta` is a CTA of threads polling with PTX release/acquire, and the CPU test
// (tests/ladder/csrc/sync_probes_host.cu), where a `Cta` is one std::thread that runs its
// threads' shares one after another between barriers, with the same memory orders. The CPU run
// checks the bookkeeping (which side sends hand-off h, the counter's final value, the payload
// check, a timeout reported and not hung), not the GPU's timings or memory model.
//
// A Cta provides: leader() (true on the thread that polls and releases), each(n, f) (f(i) for this
// thread's share of i < n), sync() (a CTA barrier), release(p, v), acquire(p), add_release(p, v),
// add(p, v) (an atomic add on a shared output), now_ns(), relax() (a pause between polls),
// timeout_ns() and smid().
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define PROBE_HD __host__ __device__ __forceinline__
#else
#define PROBE_HD inline
#endif

namespace probes {

// The global timer is read once every this many polls: a read per poll would slow the spin.
constexpr int POLLS_PER_CLOCK = 64;
// The broadcast's producer waits this long after the acknowledgements of a round before releasing
// the next, so that every consumer is back polling: the figure is the flag's latency, not theirs.
constexpr long long BROADCAST_GAP_NS = 3000;

// out[] of the ping-pong.
enum PingPong { PP_NS, PP_COUNTER, PP_PAYLOAD_ERRORS, PP_SM_0, PP_SM_1, PP_STUCK_AT, PP_LEN };
// out[] of the broadcast: a header, then (first, last) consumer latency of each timed round.
enum Broadcast { BC_STUCK_AT, BC_TIMER_TICK_NS, BC_HEADER };

// Polls until *flag ≥ want (the counters only grow); false after the Cta's timeout.
template <class Cta>
PROBE_HD bool wait_at_least(const Cta& cta, const unsigned* flag, unsigned want) {
  long long start = 0;
  for (int polls = 0;; ++polls) {
    if (cta.acquire(flag) >= want) return true;
    if (polls % POLLS_PER_CLOCK == 0) {
      const long long now = cta.now_ns();
      if (polls == 0) start = now;
      else if (now - start > cta.timeout_ns()) return false;
    }
    cta.relax();
  }
}

// What hand-off h carries in word i: distinct from hand-off h − 2's, so a stale read is caught.
PROBE_HD unsigned payload_word(unsigned h, int i) {
  return h * 0x9E3779B1u + static_cast<unsigned>(i);
}

// CTA `me` (0 or 1) of the ping-pong. Hand-off h = 1, 2, … goes from CTA (h − 1) % 2 to the
// other; rounds + 1 round trips, the first a warm-up outside the clock. payload [2][words]: CTA c
// writes row c. A sender rewrites its row only after the acquire of the hand-off that followed
// the peer's reads of it, so no read races a write. `ok` is CTA-shared: the leader's verdict.
template <class Cta>
PROBE_HD void pingpong(const Cta& cta, int& ok, unsigned me, int rounds, int words,
                       unsigned* flag, unsigned* payload, long long* out) {
  unsigned* mine = payload + me * words;
  const unsigned* theirs = payload + (1 - me) * words;
  const unsigned last = 2u * (rounds + 1);
  long long errors = 0, t0 = 0;
  unsigned h = 1;
  for (; h <= last; ++h) {
    if ((h - 1) % 2 == me) {
      cta.each(words, [&](int i) { mine[i] = payload_word(h, i); });
      cta.sync();  // every thread's payload stores happen before the leader's release
      if (cta.leader()) cta.release(flag, h);
    } else {
      if (cta.leader()) ok = wait_at_least(cta, flag, h);
      cta.sync();  // the leader's acquire happens before every thread's payload loads
      if (!ok) break;
      cta.each(words, [&](int i) { errors += theirs[i] != payload_word(h, i); });
    }
    if (me == 0 && h == 2 && cta.leader()) t0 = cta.now_ns();  // the warm-up is done
  }
  if (errors) cta.add(out + PP_PAYLOAD_ERRORS, errors);
  if (!cta.leader()) return;
  out[PP_SM_0 + me] = cta.smid();
  if (h <= last) out[PP_STUCK_AT] = h;
  if (me == 0) {
    out[PP_NS] = cta.now_ns() - t0;  // CTA 0 received the last hand-off: the clock stops here
    out[PP_COUNTER] = cta.acquire(flag);
  }
}

// A consumer (c = 0 … consumers − 1) of the broadcast: polls `flag` for round r = 1, 2, …,
// stamps the time it sees it and acknowledges on `arrivals`. The leader only, as v7's workers
// poll with one thread.
template <class Cta>
PROBE_HD void broadcast_consumer(const Cta& cta, int c, int rounds, const unsigned* flag,
                                 unsigned* arrivals, long long* stamps, long long* out) {
  for (unsigned r = 1; r <= static_cast<unsigned>(rounds) + 1; ++r) {
    if (!wait_at_least(cta, flag, r)) {
      out[BC_STUCK_AT] = r;  // any stuck CTA's round will do: nonzero is the verdict
      return;
    }
    stamps[c] = cta.now_ns();
    cta.add_release(arrivals, 1);  // orders the stamp's store before the producer's acquire
  }
}

// The producer of the broadcast: the timer's step, then rounds + 1 rounds (the first a warm-up),
// each released BROADCAST_GAP_NS after the previous one's acknowledgements; the first and last
// consumer's latency of each timed round into out[BC_HEADER + 2 (r − 2)], + 1.
template <class Cta>
PROBE_HD void broadcast_producer(const Cta& cta, int consumers, int rounds, unsigned* flag,
                                 const unsigned* arrivals, const long long* stamps,
                                 long long* out) {
  // The latencies are differences of the timer's readings, so its step is their grain.
  long long tick = 1LL << 62, t = cta.now_ns();
  for (int k = 0; k < 4; ++k) {
    long long next;
    while ((next = cta.now_ns()) == t) {
    }
    if (k > 0) tick = tick < next - t ? tick : next - t;  // the first change may be partial
    t = next;
  }
  out[BC_TIMER_TICK_NS] = tick;
  for (unsigned r = 1; r <= static_cast<unsigned>(rounds) + 1; ++r) {
    const long long gap_start = cta.now_ns();
    while (cta.now_ns() - gap_start < BROADCAST_GAP_NS) {
    }
    const long long released = cta.now_ns();
    cta.release(flag, r);
    if (!wait_at_least(cta, arrivals, r * consumers)) {
      out[BC_STUCK_AT] = r;
      return;
    }
    long long first = 1LL << 62, latest = -(1LL << 62);
    for (int c = 0; c < consumers; ++c) {
      const long long seen = stamps[c] - released;
      first = seen < first ? seen : first;
      latest = seen > latest ? seen : latest;
    }
    if (r > 1) {
      out[BC_HEADER + 2 * (r - 2)] = first;
      out[BC_HEADER + 2 * (r - 2) + 1] = latest;
    }
  }
}

}  // namespace probes
