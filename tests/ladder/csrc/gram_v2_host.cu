// The CPU side of tests/ladder/test_gram_v2.py: cuda-epoch v7's Gram kernel v2 (gram_v2.cuh's
// cta_grams, the kernel's own code) run on the host for its whole grid, CTA by CTA, each phase
// for all 512 threads or all 16 warps before the next (the order its barriers impose):
//   - cp.async: a copy is queued in its thread's current group and lands only when a wait lets
//     it (cp.async.wait_group N: every group but the newest N), so an MMA that reads a buffer
//     before its copies' wait reads what the buffer held before (shared memory starts as 0xA5
//     bytes, not zeros);
//   - ldmatrix.x4 and mma.m16n8k32 .u8: gram_host_warp.h's HostWarp, from the PTX ISA.
// What it cannot show: a race between threads (the phases run whole), or that the GPU's
// fragment layout is the ISA's (tests/ladder/test_gram_u8.py's GPU test checked that for v1).
// Planted bugs (`bug`, the test shows each one fails): 1 every copy lands one stage late (a
// wait_group that leaves the current stage's copies in flight: a stale buffer), 2 every copy's
// source one 16-byte unit further along k (a wrong k-chunk offset). The v8 instantiation's
// (gram_v8_epoch_host, L = 6 and the bias pixel): 3 the bias byte 0 instead of 255, 4 lag 4's rows
// those of X_{t−3} (a lag's rows one step off), 5 the zero-filled copies (rows past a partial
// batch, the k padding) leave shared memory's stale 0xA5 bytes.
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "gram_host_warp.h"
#include "gram_v2.cuh"

#if !defined(__CUDA_ARCH__)  // host code only
namespace {

namespace v2 = gram::v2;

struct Copy {
  uint8_t* dst;
  const uint8_t* src;
  bool valid;
};

template <class C>
struct HostCta {
  using WarpAcc = HostWarp::Reg<gram::Acc>[C::MT][C::NTL];
  int bug = 0;
  WarpAcc acc[C::WARPS];
  v2::SrcT<C> rows[C::THREADS];
  v2::SrcT<C>& src(int tid) { return rows[tid]; }
  std::vector<Copy> open;                // the current (uncommitted) group
  std::deque<std::vector<Copy>> groups;  // committed, not yet landed, oldest first

  template <class F>
  void threads(F&& f) {
    for (int tid = 0; tid < C::THREADS; ++tid) f(tid);
  }
  template <class F>
  void warps(F&& f) {
    HostWarp warp;
    for (int w = 0; w < C::WARPS; ++w) f(warp, w, acc[w]);
  }
  void copy16(uint8_t* dst, const uint8_t* src, bool valid) {
    open.push_back(Copy{dst, bug == 2 && valid ? src + C::UNIT : src, valid});
  }
  // The bias unit: a plain store, landing at once (as st.shared: no group).
  void put16(uint8_t* dst, bool valid) {
    std::memset(dst, 0, C::UNIT);
    if (valid) dst[0] = bug == 3 ? 0 : 255;
  }
  void commit() {
    groups.push_back(std::move(open));
    open.clear();
  }
  template <int N>
  void wait() {
    const size_t keep = N + (bug == 1 ? 1 : 0);
    while (groups.size() > keep) {
      for (const Copy& c : groups.front()) {
        if (c.valid)
          std::memcpy(c.dst, c.src, C::UNIT);
        else if (bug != 5)
          std::memset(c.dst, 0, C::UNIT);
      }
      groups.pop_front();
    }
  }
  void sync() {}
};

}  // namespace

// Every CTA of one epoch's v2 Gram launch (grid TILES × steps, as v7_gram_kernel_v2's): x [*][784],
// order [n], gram [steps][L][BMAX][BMAX] (v7_gram_offset), entries it does not write untouched.
// Returns the largest number of cp.async groups left in flight at a CTA's end (0 when correct).
extern "C" int gram_v2_epoch_host(const uint8_t* x, const int32_t* order, int n, int bs,
                                  float* gram, int bug) {
  const int steps = (n + bs - 1) / bs;
  const V7Epoch e{n, bs, steps, 0.f};
  std::vector<uint8_t> smem(v2::SMEM);
  int left = 0;
  for (int t = 0; t < steps; ++t)
    for (int tile = 0; tile < v2::TILES; ++tile) {
      const v2::Job job = v2::v7_job(e, x, order, gram, t, tile);
      if (t == 0 || job.n[0] <= 0) continue;  // as the kernel: no lag before the epoch, no rows
      std::memset(smem.data(), 0xA5, smem.size());
      auto cta = std::make_unique<HostCta<v2::V7>>();
      cta->bug = bug;
      v2::cta_grams(*cta, job, smem.data());
      if (static_cast<int>(cta->groups.size()) > left) left = static_cast<int>(cta->groups.size());
    }
  return left;
}

// Every CTA of one epoch's v8 Gram launch (grid TILES × steps, as v8_chain.cu's v8_gram_kernel:
// every CTA runs, t = 0 and row-less tiles included, since every block is written): x [*][784],
// order [n], grams [steps][BMAX][BMAX] (Γ̃_{t,1}), gramh [5][steps][BMAX][BMAX] (Γ̃_{t,j}, j ≥ 2).
// Returns the largest number of cp.async groups left in flight at a CTA's end (0 when correct).
extern "C" int gram_v8_epoch_host(const uint8_t* x, const int32_t* order, int n, int bs,
                                  float* grams, float* gramh, int bug) {
  const int steps = (n + bs - 1) / bs;
  std::vector<uint8_t> smem(v2::V8::SMEM);
  int left = 0;
  for (int t = 0; t < steps; ++t)
    for (int tile = 0; tile < v2::V8::TILES; ++tile) {
      v2::JobT<v2::V8> job = v2::v8_job(n, bs, steps, x, order, grams, gramh, t, tile);
      if (bug == 4 && t >= 3) {  // lag 4 (index 4) reads X_{t−3}'s rows
        job.rows[4] = order + size_t(t - 3) * bs;
        job.n[4] = n - (t - 3) * bs < bs ? n - (t - 3) * bs : bs;
      }
      std::memset(smem.data(), 0xA5, smem.size());
      auto cta = std::make_unique<HostCta<v2::V8>>();
      cta->bug = bug;
      v2::cta_grams(*cta, job, smem.data());
      if (static_cast<int>(cta->groups.size()) > left) left = static_cast<int>(cta->groups.size());
    }
  return left;
}
#endif
