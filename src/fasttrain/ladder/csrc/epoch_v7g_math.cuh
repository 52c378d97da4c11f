// cuda-epoch v7g's per-thread bodies (epoch_v7g.cuh runs them on the GPU;
// tests/ladder/csrc/epoch_v7_math_host.cu runs them on the host for whole epochs). v7g is v7f (its
// workers, their protocol and v7c's split of the chain CTA into critical warps 0-7 and helper
// warps 8-15) with three things moved off the critical warps' path (the design doc's "v7g"
// section: the SASS counts behind each):
//
// 1. The worker partials. v7b-v7f's critical warps poll P_t's 7 tagged words at the start of step
//    t: one L2 round trip on the path every step (v7f: "wait partials" 0.63 µs a step on an H200,
//    2026-11-28), though the workers have written them steps earlier. In v7g the helper warps load
//    P_{t+1}'s words at the start of their iteration t (thread (row i, lane c): the same (row,
//    class) split as the critical warps'), sum them after their terms (the round trip under the
//    terms' ~0.5 µs; a word not yet tagged t + 1: v7b's bounded poll) and hand the sums over in
//    PQ[(t + 1) & 1] with the terms j ≥ 2 (HQ) at the hand-off. The ring's reuse is v7b's: slot
//    (t + 1) % V7_PR is rewritten with P_{t+1+V7_PR} only after G_{t+1} is published, which the
//    critical warps do after the hand-off that ends the helpers' read. Step 0's partials: the
//    helpers' setup, before a hand-off of its own (v7g's step 0 has one, v7c's had none).
// 2. The producers' flag (one launch). v7c's critical warps passed gate(t + 1) themselves before
//    they loaded Γ_{t+1,1} mid-step t (v7b measured that wait at 0.21 µs a step on average: a
//    relaxed poll of 8 flags and a fence.acq_rel.gpu every 8 steps, per thread). In v7g the
//    helpers' gate(t + 1) (their iteration t − 1, or their setup for t + 1 = 1) comes before the
//    hand-off of step t, and the critical warps issue Γ_{t+1,1}'s loads after that hand-off: one
//    thread's acquire, then a CTA-scope barrier, then the other threads' loads (CUTLASS's
//    GenericBarrier::wait pattern: thread 0 polls with ld.acquire.gpu, then __syncthreads).
// 3. The helpers' labels. v7c's loaded order[] and then y[] (two dependent L2 round trips) right
//    before the hand-off barrier. v7g's are pipelined in registers: in iteration t, thread h < 16
//    stores the label of step t + 1 (loaded in iteration t − 1), loads that of step t + 2 from the
//    order index loaded in iteration t − 1, and loads the order index of step t + 3.
// And the Gram terms (both halves) run without branches (v7g_terms): v7c_terms broke out of its
// loops at the batch's last row and the window's last lag, so ptxas issued each row's three
// shared loads only after the previous row's FMAs (24 serial LDS → FFMA blocks a helper thread,
// 8 a critical thread: ~45-50 clocks each, estimated). Here every Γ past the batch or the window
// is 0 (v7c_load_gram's), so those terms add 0 · G: G's rows in the ring are always finite (0 from
// the setup, or an earlier step's G), so the sums are v7c's (signed zeros aside).
#pragma once
#include "epoch_v7c_math.cuh"

namespace {

// Shared memory: PQ [2][RPC][16], the helpers' sums of P_t by step parity, after v7c's HQ in RED.
constexpr int V7G_PQ = V7C_HQ + 2 * V7_RPC * 16;
static_assert(V7G_PQ + 2 * V7_RPC * 16 <= ChainSmem::ZS, "PQ fits in RED after HQ");

FT_V7 int v7g_pq_at(int t) { return V7G_PQ + (t & 1) * V7_RPC * 16; }

// acc[c] += Σ_{j = j0 … j0+J−1} Σ_u gam[j − j0][u] G_{t−j}[l + 16u][c] with no branch: terms past
// the window (t − j < 0: slot 0 read, any finite G) or the batch have gam 0. G's row from the ring
// as two 128-bit loads and one 64-bit (classes 0 … 9).
template <int J>
FT_V7 void v7g_terms(const float (&gam)[J][V7C_U], const float* ring, int t, int h, int j0,
                     float (&acc)[C]) {
  const ChainLane16 ln = chain_lane16(h);
  for (int jj = 0; jj < J; ++jj) {
    const int s = t - j0 - jj;
    const float* g = ring + v7_slot(s < 0 ? 0 : s) * ChainSmem::GSLOT + ln.c * V7_RS;
    for (int u = 0; u < V7C_U; ++u) {
      const float* row = g + V7C_LANES * u * V7_RS;
      float gm[C];
      *reinterpret_cast<float4*>(gm) = *reinterpret_cast<const float4*>(row);
      *reinterpret_cast<float4*>(gm + 4) = *reinterpret_cast<const float4*>(row + 4);
      *reinterpret_cast<float2*>(gm + 8) = *reinterpret_cast<const float2*>(row + 8);
      for (int c = 0; c < C; ++c) acc[c] = fmaf(gam[jj][u], gm[c], acc[c]);
    }
  }
}

// The labels' pipeline (helper thread h < RPC: row q·16 + h). v7g_order_at: the sample index of
// the row at step s (−1: no such row or step); v7g_label_of: its label (0 for −1).
FT_V7 int v7g_order_at(const V7Epoch& e, const int* order, int q, int h, int s) {
  const int row = q * V7_RPC + h;
  return s < e.steps && row < e.rows(s) ? order[s * e.bs + row] : -1;
}
FT_V7 int v7g_label_of(const int* y, int idx) { return idx >= 0 ? y[idx] : 0; }
// Iteration t: ys[(t + 1) & 1][h] = lab (step t + 1's), then lab ← step t + 2's label from ord
// (its sample index, loaded an iteration ago), ord ← step t + 3's index. At the helpers' setup:
// lab = step 1's label, ord = step 2's index (v7g_labels_init).
struct V7GLabels {
  int lab, ord;
};
FT_V7 V7GLabels v7g_labels_init(const V7Epoch& e, const int* y, const int* order, int q, int h) {
  return {v7g_label_of(y, v7g_order_at(e, order, q, h, 1)), v7g_order_at(e, order, q, h, 2)};
}
FT_V7 void v7g_labels_step(const V7Epoch& e, const int* y, const int* order, int q, int h, int t,
                           int* ys, V7GLabels& l) {
  ys[((t + 1) & 1) * V7_RPC + h] = l.lab;
  l.lab = v7g_label_of(y, l.ord);
  l.ord = v7g_order_at(e, order, q, h, t + 3);
}

}  // namespace
