// cuda-epoch v7b's per-thread bodies (epoch_v7.cuh runs them when its V7B parameter is set;
// tests/ladder/csrc/epoch_v7_math_host.cu runs them on the host for whole epochs). Everything else
// is v7a's (epoch_v7_math.cuh). Two changes, both on the chain's critical path:
//
// 1. The worker partials as tagged words. v7a's chain polled each worker cluster's counter
//    (ld.acquire) and then read the partial rows (ld.global.cg): two dependent L2 round trips,
//    0.41 + 0.69 µs a step on an H200 (the phase profile, "v7a on an H200"). In v7b rank r of
//    worker cluster k writes each value of its rows of P_t as ONE 8-byte word {float value, int
//    step} (v7b_word: the value in the low half, the step in the high half), and the chain polls
//    the 7 words of its (row, class) until every tag is the step it wants: the data are the
//    signal. On the GPU the word is a naturally aligned 64-bit scalar (st.relaxed.gpu.b64 /
//    ld.relaxed.gpu.b64, epoch_v7.cuh): single-copy atomic, so a load that sees the tag sees the
//    value stored with it; no acquire is needed because nothing else is read on the strength of
//    the tag (a .v2.b32 store would not do: the PTX memory model treats a vector access as its
//    elements' accesses, in no given order).
//    The words live in a ring of V7_PR = L + 1 slots (v7b_pslot). Slot reuse is safe: a worker
//    CTA writes P_t only after its update with G_{t−L−1}, which it starts only after all 8 chain
//    counters say G_{t−L−1} is published; a chain CTA publishes G_{t−L−1} after its step t − L − 1
//    has read (into registers, before a __syncthreads and the st.release) every word of that step.
//    So the slot's previous step, t − V7_PR = t − L − 1, has been read by the only CTA that reads
//    it (chain CTA r reads rank r's rows) before it is overwritten. The host emulation checks it
//    on every write (a ring of L slots fails there). Across epochs the ring holds the last epoch's
//    words with tags that a short epoch would want again (2 steps: tags 0 and 1), so the Gram
//    launch clears every word to V7_CLEAR_WORD (tag −1, value NaN) first.
// 2. The softmax on 16 lanes a row (v4's layout): thread (row i, lane c) = (tid / 16, tid % 16),
//    256 threads, lanes 10 … 15 padding; max and sum by 4 xor-shuffles of width 16 each, one exp a
//    lane, G's element written by its lane, the loss and the hit by the label's lane. The thread
//    that summed (row i, class c)'s partials computes its logit in a register (chain_logit16), so
//    v7a's zs round trip through shared memory and its barrier are gone.
#pragma once
#include <cmath>

#include "epoch_v7_math.cuh"

namespace {

constexpr int V7_SMW = 16;               // lanes a row of v7b's softmax (10 classes used)
constexpr int V7_SMT = V7_SMW * V7_RPC;  // its threads: 256, warps 0 … 7 (two rows a warp)
constexpr int V7_TAG_CLEAR = -1;         // the Gram launch's tag: no step's
constexpr int V7_TAG_NEVER = 0x7fffffff;  // the fault hook's: a step no epoch reaches
constexpr uint64_t V7_CLEAR_WORD = 0xffffffff7fc00000ull;  // {NaN, V7_TAG_CLEAR}
constexpr size_t V7_PSTRIDE = size_t(BMAX) * C;  // words from cluster k's P_t to k + 1's
static_assert(V7_PR >= V7_LAG + 1, "a slot is rewritten only after the chain has read it");
static_assert(V7_SMT <= V7_T && V7_SMW >= C && 32 % V7_SMW == 0, "a half-warp a row");

FT_V7 uint32_t v7b_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
#endif
}
FT_V7 float v7b_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, 4);
  return v;
#endif
}
FT_V7 uint64_t v7b_word(float value, int tag) {
  return uint64_t(uint32_t(tag)) << 32 | v7b_bits(value);
}
FT_V7 int v7b_tag(uint64_t w) { return static_cast<int>(uint32_t(w >> 32)); }
FT_V7 float v7b_value(uint64_t w) { return v7b_float(uint32_t(w)); }
// The ring slot of step t's partials (see the top: why V7_PR = L + 1 slots suffice).
FT_V7 int v7b_pslot(int t) { return t % V7_PR; }
FT_V7 size_t v7b_word_at(int t, int k, int row, int c) {
  return ((size_t(v7b_pslot(t)) * V7_WCLUSTERS + k) * BMAX + row) * C + c;
}

// ---- chain CTA q, thread tid < V7_SMT = (row i, lane c) -----------------------------------------
struct ChainLane16 {
  int i, c;
};
FT_V7 ChainLane16 chain_lane16(int tid) { return {tid / V7_SMW, tid % V7_SMW}; }
// Whether thread tid waits for partials at step t: a class lane of a row in the batch.
FT_V7 bool v7b_part_mine(const V7Epoch& e, int t, int q, int tid) {
  const ChainLane16 ln = chain_lane16(tid);
  return tid < V7_SMT && ln.c < C && q * V7_RPC + ln.i < e.rows(t);
}
// Its word of worker cluster 0's P_t (cluster k's: + k · V7_PSTRIDE).
FT_V7 const uint64_t* v7b_part_words(const uint64_t* ring, int t, int q, int tid) {
  const ChainLane16 ln = chain_lane16(tid);
  return ring + v7b_word_at(t, 0, q * V7_RPC + ln.i, ln.c);
}
// A row's 7 words by ld, every load issued before any is used (one round trip).
template <class Load>
FT_V7 void v7b_load_tagged(const uint64_t* words, Load ld, uint64_t (&w)[V7_WCLUSTERS]) {
  for (int k = 0; k < V7_WCLUSTERS; ++k) w[k] = ld(words + size_t(k) * V7_PSTRIDE);
}
// Whether every tag of the 7 words is `want`, and p = their values summed in cluster order (v7a's
// chain_logits's order).
FT_V7 bool v7b_sum_words(const uint64_t (&w)[V7_WCLUSTERS], int want, float& p) {
  bool all = true;
  float s = 0.f;
  for (int k = 0; k < V7_WCLUSTERS; ++k) {
    all = all && v7b_tag(w[k]) == want;
    s += v7b_value(w[k]);
  }
  p = s;
  return all;
}
// Both at once: load the words, then sum them (v7b-v7f's chain; v7g's helpers issue the loads a
// phase ahead of the sum).
template <class Load>
FT_V7 bool v7b_sum_tagged(const uint64_t* words, int want, Load ld, float& p) {
  uint64_t w[V7_WCLUSTERS];
  v7b_load_tagged(words, ld, w);
  return v7b_sum_words(w, want, p);
}
// Z of (row i, class c) from its partial sum p: p + b_t[c] − c · the lanes' Gram terms (red by
// row); 0 on padding lanes and rows past the batch (finite: they still take part in the
// shuffles).
FT_V7 float chain_logit16(const V7Epoch& e, int t, int q, int tid, float p, const float* bias,
                          const float* red) {
  const ChainLane16 ln = chain_lane16(tid);
  if (!v7b_part_mine(e, t, q, tid)) return 0.f;
  float corr = 0.f;
  for (int l = 0; l < V7_LANES; ++l) corr += red[red_at(ln.c, ln.i, l, true)];
  const float cg = e.lr * (1.f / 255.f) * (1.f / 255.f);
  return p + bias[ln.c] - cg * corr;
}
// The softmax's terms of a warp's two rows (16 lanes a row, classes ≥ C padding): each lane's
// row max m, its exp(z − m) (0 on padding) and the row's sum se, by xor-shuffles within the row.
template <class Warp>
FT_V7 void chain_exp16(const Warp& warp, const typename Warp::template Reg<float>& z,
                       typename Warp::template Reg<float>& m,
                       typename Warp::template Reg<float>& ex,
                       typename Warp::template Reg<float>& se) {
  using F = typename Warp::template Reg<float>;
  warp.each([&](int lane) {
    const int c = lane % V7_SMW;
    warp.at(m, lane) = c < C ? warp.at(z, lane) : -INFINITY;
  });
  for (int o = V7_SMW / 2; o > 0; o /= 2) {
    const F other = warp.shfl_xor(m, o, V7_SMW);
    warp.each([&](int lane) { warp.at(m, lane) = fmaxf(warp.at(m, lane), warp.at(other, lane)); });
  }
  warp.each([&](int lane) {
    const int c = lane % V7_SMW;
    warp.at(ex, lane) = c < C ? expf(warp.at(z, lane) - warp.at(m, lane)) : 0.f;
  });
  se = ex;
  for (int o = V7_SMW / 2; o > 0; o /= 2) {
    const F other = warp.shfl_xor(se, o, V7_SMW);
    warp.each([&](int lane) { warp.at(se, lane) += warp.at(other, lane); });
  }
}
// Warp w < 8 (rows 2w, 2w + 1): the softmax of its rows from each lane's logit z, G's rows into
// gl (row i at gl + 16 i, 0 past the batch and on padding lanes), loss and hit added by the
// label's lane. Warp: the policy of the lanes in lockstep (Reg<T> a lane's value, at(), each(),
// shfl_xor(v, lane mask, width) as __shfl_xor_sync).
template <class Warp>
FT_V7 void chain_softmax16(const Warp& warp, const V7Epoch& e, int t, int q, int w,
                           const typename Warp::template Reg<float>& z, const int* labels,
                           float* gl, typename Warp::template Reg<float>& loss,
                           typename Warp::template Reg<float>& correct) {
  using F = typename Warp::template Reg<float>;
  const int nt = e.rows(t);
  F m, ex, se;
  chain_exp16(warp, z, m, ex, se);
  warp.each([&](int lane) {
    const int tid = 32 * w + lane;
    const ChainLane16 ln = chain_lane16(tid);
    float g = 0.f;
    if (v7b_part_mine(e, t, q, tid)) {
      const int y = labels[ln.i];
      const float zl = warp.at(z, lane), ml = warp.at(m, lane), sl = warp.at(se, lane);
      if (ln.c == y) {
        warp.at(loss, lane) += logf(sl) + ml - zl;
        warp.at(correct, lane) += zl == ml ? 1.f : 0.f;
      }
      g = (warp.at(ex, lane) / sl - (ln.c == y ? 1.f : 0.f)) * (1.f / static_cast<float>(nt));
    }
    gl[ln.i * 16 + ln.c] = g;
  });
}

}  // namespace
