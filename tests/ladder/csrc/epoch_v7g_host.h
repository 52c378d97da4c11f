// v7g's chain CTA on the host (variant 6 of tests/ladder/csrc/epoch_v7_math_host.cu, which
// includes this file and calls these templates with its Emulation): the helper warps' units and
// what v7g's critical step does differently from v7c's. The workers are v7f's (the harness's).
//
// The helpers' units of chain CTA q (Chain::hnext counts those done): unit 0 is their setup (step
// 0's partials into PQ[0], step 1's labels into their registers, Γ_{1,j≥2} after its flag), unit
// u ≥ 1 is iteration t = u − 1 (step t + 1's partials and terms j ≥ 2 into PQ and HQ of parity
// (t + 1) & 1, the labels' pipeline, Γ_{t+2,j≥2} after its flag). Unit u ends at the hand-off of
// step u, so the critical step t runs only once unit t is done (hnext ≥ t + 1), and iteration t
// only once the critical step t has run. A unit runs only once every tagged word it sums carries
// its step (the kernel polls until then) and, in one launch, once the producers' flag it passes
// is set; the critical step checks no tag and no flag (the helpers' cover both).
// Planted bugs (variants 6 and 7: v7h's chain is v7g's): 20 P_{t+1}'s sums into PQ of the wrong
// parity (t & 1, which the critical warps have read already), 21 the labels' pipeline a stage short (step t + 2's label
// stored for step t + 1), 22 step 0 run without its hand-off (PQ[0] read before the helpers'
// setup wrote it: shared memory holds `fill`, the scratch's, there). v7c's 7 and 8 apply too.
#pragma once

#include "epoch_v7g_math.cuh"

namespace {

constexpr int V7G_VARIANT = 6;
constexpr int V7G_LABEL_JUNK = 12345;  // ys before the helpers write it: no class matches

// Iterations of the helpers done (v7c: hnext; v7g: hnext less the setup unit).
template <class Em>
int v7g_iterations_done(const Em& em, int q) {
  const int n = em.chain[q].hnext;
  // v7g's chain (v7g, v7h, v7i; v7i's tail unit, after the last iteration, is not one)
  return em.gc() ? std::min(n - 1, std::max(em.e.steps - 1, 0)) : n;
}

template <class Em>
bool v7g_helper_runnable(const Em& em, int q) {
  const auto& c = em.chain[q];
  const int u = c.hnext;
  if (u >= em.e.steps || (em.grams == 1 && !em.cstarted[q])) return false;
  std::vector<float> p(V7_SMT);
  if (u == 0) return em.tagged_ready(q, 0, p.data()) && (em.e.steps < 2 || em.gram_ready(1, q));
  const int t = u - 1;
  return c.next > t && em.gram_ready(t + 2, q) && em.tagged_ready(q, t + 1, p.data());
}

// Step s's sums of its tagged words into PQ of step `into`'s parity.
template <class Em>
void v7g_partials(Em& em, int q, int s, int into) {
  float* sm = em.chain[q].sm.data();
  std::vector<float> p(V7_SMT);
  if (!em.tagged_ready(q, s, p.data())) em.violated = true;  // (runnable said they were)
  for (int h = 0; h < V7C_HELP; ++h) {
    const ChainLane16 ln = chain_lane16(h);
    if (v7b_part_mine(em.e, s, q, h)) sm[v7g_pq_at(into) + ln.i * 16 + ln.c] = p[h];
  }
}

template <class Em>
void v7g_helper_step(Em& em, int q) {
  auto& c = em.chain[q];
  float* sm = c.sm.data();
  const float* ring = sm + ChainSmem::RING;
  int* ys = reinterpret_cast<int*>(sm + ChainSmem::YS);
  const V7Epoch& e = em.e;
  const int u = c.hnext++;
  if (u == 0) {  // the setup: its first hand-off is the critical step 0's
    for (int h = 0; h < V7_RPC; ++h) c.glab[h] = v7g_labels_init(e, em.y, em.order, q, h);
    v7g_partials(em, q, 0, em.bug == 20 ? 1 : 0);
    if (e.steps > 1)
      for (int h = 0; h < V7C_HELP; ++h)
        v7c_load_gram<V7C_HJ>(e, em.s.gram, 1, q, h, 2, c.gamh_of(h));
    return;
  }
  const int t = u - 1;
  for (int j = 2; j <= v7_window(t + 1); ++j)  // G_{t+1−j} complete in its slot
    if (c.holds[v7_slot(t + 1 - j)] != t + 1 - j) em.violated = true;
  HostWarp16 warp{em.bug == 5 ? 8 : 0};
  for (int w = 0; w < V7C_HELP / 32; ++w) {
    HostWarp16::Reg<float> acc[C];
    for (int lane = 0; lane < 32; ++lane) {
      float a[C] = {};
      // bug 8: the lag off by one (step t's ring slots with step t + 1's Γ)
      v7g_terms<V7C_HJ>(c.gamh_of(32 * w + lane), ring, em.bug == 8 ? t : t + 1, 32 * w + lane,
                        2, a);
      for (int k = 0; k < C; ++k) acc[k][lane] = a[k];
    }
    const HostWarp16::Reg<float> sum = v7c_lane_sum(warp, acc);
    for (int lane = 0; lane < 32; ++lane) {
      const ChainLane16 ln = chain_lane16(32 * w + lane);
      if (ln.c < C) sm[v7c_hq_at(em.bug == 7 ? t : t + 1) + ln.i * 16 + ln.c] = sum[lane];
    }
  }
  v7g_partials(em, q, t + 1, em.bug == 20 ? t : t + 1);
  for (int h = 0; h < V7_RPC; ++h) {
    v7g_labels_step(e, em.y, em.order, q, h, t, ys, c.glab[h]);
    if (em.bug == 21) ys[((t + 1) & 1) * V7_RPC + h] = c.glab[h].lab;  // step t + 2's
  }
  if (t + 2 < e.steps)
    for (int h = 0; h < V7C_HELP; ++h)
      v7c_load_gram<V7C_HJ>(e, em.s.gram, t + 2, q, h, 2, c.gamh_of(h));
  if (em.variant >= V7I_VARIANT) v7i_publish(em, q, u);  // G_t's rows, then the count t + 1
  if (em.variant == V7N_VARIANT) v7n_receiver_bias(em, q, t);  // b_{t+1}, before hand-off t + 1
}

// The critical setup's part that differs from v7c's: step 0's labels into ys[0], ys[1] junk
// until the helpers write it, PQ as shared memory the helpers have not written (`fill`).
template <class Em>
void v7g_chain_setup(Em& em, int q) {
  float* sm = em.chain[q].sm.data();
  int* ys = reinterpret_cast<int*>(sm + ChainSmem::YS);
  for (int h = 0; h < V7_RPC; ++h) {
    ys[h] = v7g_label_of(em.y, v7g_order_at(em.e, em.order, q, h, 0));
    ys[V7_RPC + h] = V7G_LABEL_JUNK;
  }
  std::fill(sm + V7G_PQ, sm + V7G_PQ + 2 * V7_RPC * 16, em.fill);
}

// The critical step t's inputs from the hand-off: p of each critical thread from PQ[t & 1] and
// the labels from ys[t & 1]; its Gram term j = 1 without branches (v7g_terms).
template <class Em>
void v7g_chain_inputs(Em& em, int q, int t, float* p, int* labels) {
  const float* sm = em.chain[q].sm.data();
  const int* ys = reinterpret_cast<const int*>(sm + ChainSmem::YS);
  for (int tid = 0; tid < V7C_CRIT; ++tid) {
    const ChainLane16 ln = chain_lane16(tid);
    p[tid] = ln.c < C ? sm[v7g_pq_at(t) + ln.i * 16 + ln.c] : 0.f;
  }
  for (int i = 0; i < V7_RPC; ++i) labels[i] = ys[(t & 1) * V7_RPC + i];
}

}  // namespace
