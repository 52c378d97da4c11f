// cuda-epoch v7n's per-thread bodies (epoch_v7n.cuh runs them on the GPU;
// tests/ladder/csrc/epoch_v7n_host.h runs them on the host for whole epochs). v7n is v7k (v7i's
// chain, v7j's workers, v7k's worker step) with the bias gradient taken off the G exchange (the
// design doc's "v7n" section: the SASS behind it):
//
// 1. No column sums are sent. In k a chain CTA's G_t leaves only after the slowest of its 8
//    critical warps' softmax, a 256-thread barrier, warp 0's 16 dependent LDS → FADD column sums,
//    a second barrier and 2-3 serial LDS → st.async blocks a thread; in m the rows leave at once
//    but the sums' row, after the same barrier and sums, is the last piece every peer's mbarrier
//    waits for. In n each critical warp sends its own two rows right after its softmax (m's
//    v7m_row_item) and nothing else waits for another warp.
// 2. The receiver sums the rows it holds. b_{t+1} = b_t − lr Σ_src Σ_i G_t[16 src + i] is the
//    same sum in the same order as k's (chain_colsum on the sender: i = 0 … 15, the rows past the
//    batch adding 0; chain_bias on the receiver: src = 0 … 7), so the same bits: v7n_colsum (80
//    threads, one (source CTA, class) each) then v7n_bias (10 threads). Helper warps 9-11 do it
//    at the end of their iteration t, after G_t has landed, for the critical step t + 1 (its
//    hand-off orders it before the logits); the critical warps, after their loop, for b_steps.
// 3. One 16-byte token a CTA and step to every chain CTA (warp 0's lanes 0-7, no barrier): a
//    slot completes only once every chain CTA has reached its step t's tail, as in k (whose sums
//    row did that). Without it a CTA with no rows in the batch (16- and 64-row batches, the
//    96-row last step's CTAs 6 and 7) would send nothing, and its peers could run ahead of it
//    and send G_{t+NB} into a slot it has not re-armed.
#pragma once
#include "epoch_v7g_math.cuh"
#include "epoch_v7m_math.cuh"

namespace {

// Shared memory: CS [V7_CHAIN][16], the receiver's column sums of G_t by source CTA, after PQ.
constexpr int V7N_CS = V7G_PQ + 2 * V7_RPC * 16;
static_assert(V7N_CS + V7_CHAIN * 16 <= ChainSmem::ZS, "CS fits in RED after PQ");
constexpr int V7N_SUMMERS = V7_CHAIN * C;  // threads of v7n_colsum: (source CTA, class)

// Bytes chain CTA q's slot receives for step t: every valid row of G_t and 8 tokens (16 bytes).
// tokens false: planted bug 45 (the tokens sent but not counted).
FT_V7 int v7n_g_bytes(const V7Epoch& e, int t, bool tokens = true) {
  return 4 * V7_GROW * e.rows(t) + (tokens ? 16 * V7_CHAIN : 0);
}
// Chain CTA q's token for chain CTA d: the 16 bytes at q's place after the 128 rows (k's sums').
FT_V7 int v7n_token_at(int q) { return BMAX * V7_RS + q * V7_GROW; }

// Thread s < V7N_SUMMERS (source CTA src = s / C, class c = s % C): Σ_{i = 0 … 15} of G_t's row
// 16 src + i, class c, from ring slot t % NB, in chain_colsum's order, 0 for rows past the batch
// (the sender's gl held 0 there; the ring holds an older step's row), into cs[src][c].
// stale: planted bug 43 (the rows past the batch read from the ring).
FT_V7 void v7n_colsum(const V7Epoch& e, const float* ring, int t, int s, float* cs,
                      bool stale = false) {
  if (s >= V7N_SUMMERS) return;
  const int src = s / C, c = s % C;
  const float* g = ring + v7_slot(t) * ChainSmem::GSLOT;
  float sum = 0.f;
  for (int i = 0; i < V7_RPC; ++i) {
    const int row = src * V7_RPC + i;
    sum += stale || row < e.rows(t) ? g[row * V7_RS + c] : 0.f;
  }
  cs[src * 16 + c] = sum;
}
// Thread c < C: b[c] −= lr Σ_src cs[src][c], chain_bias's order (src = 0 … 7).
FT_V7 void v7n_bias(const V7Epoch& e, const float* cs, int c, float* bias) {
  if (c >= C) return;
  float db = 0.f;
  for (int src = 0; src < V7_CHAIN; ++src) db += cs[src * 16 + c];
  bias[c] -= e.lr * db;
}

}  // namespace
