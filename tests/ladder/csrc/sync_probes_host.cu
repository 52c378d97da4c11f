// The CPU side of tests/ladder/test_sync_probes.py: the hand-off probes' protocols
// (sync_probes.cuh) run by std::threads, one a CTA, each running its CTA's threads' shares one
// after another (so a CTA barrier is nothing to do), the flags released and acquired with the
// compiler's atomics in the same orders as the GPU's st.release / ld.acquire. It checks the
// protocols' bookkeeping; the GPU's latencies and memory model are the GPU tests' (marked gpu).
#include <chrono>
#include <thread>
#include <vector>

#include "sync_probes.cuh"

#if !defined(__CUDA_ARCH__)  // host code only
namespace {

struct HostCta {
  long long timeout;
  int id;
  bool leader() const { return true; }  // the one thread runs every thread's part
  template <class F>
  void each(int n, F&& f) const {
    for (int i = 0; i < n; ++i) f(i);
  }
  void sync() const {}
  void release(unsigned* p, unsigned v) const { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
  unsigned acquire(const unsigned* p) const { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
  void add_release(unsigned* p, unsigned v) const { __atomic_fetch_add(p, v, __ATOMIC_RELEASE); }
  void add(long long* p, long long v) const { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
  long long now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void relax() const { std::this_thread::yield(); }  // two cores, shared: let the peer run
  long long timeout_ns() const { return timeout; }
  long long smid() const { return id; }  // a CTA's "SM": its thread's index
};

}  // namespace

// The ping-pong's CTAs 0 … ctas − 1 (2 for the probe; 1 leaves CTA 0 without its peer), each a
// thread. out [PP_LEN] is zeroed by the caller, as the entry point's memset does.
extern "C" void pingpong_host(int ctas, int rounds, int words, long long timeout_ns,
                              unsigned* flag, unsigned* payload, long long* out) {
  std::vector<std::thread> threads;
  for (int me = 0; me < ctas; ++me)
    threads.emplace_back([=] {
      int ok = 0;
      probes::pingpong(HostCta{timeout_ns, me}, ok, me, rounds, words, flag, payload, out);
    });
  for (auto& t : threads) t.join();
}

// The broadcast: a producer and `consumers` consumers, each a thread.
extern "C" void broadcast_host(int consumers, int rounds, long long timeout_ns, unsigned* flag,
                               unsigned* arrivals, long long* stamps, long long* out) {
  std::vector<std::thread> threads;
  threads.emplace_back([=] {
    probes::broadcast_producer(HostCta{timeout_ns, 0}, consumers, rounds, flag, arrivals,
                               stamps, out);
  });
  for (int c = 0; c < consumers; ++c)
    threads.emplace_back([=] {
      probes::broadcast_consumer(HostCta{timeout_ns, c + 1}, c, rounds, flag, arrivals, stamps,
                                 out);
    });
  for (auto& t : threads) t.join();
}
#endif
