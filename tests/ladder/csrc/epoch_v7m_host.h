// The host emulation's v7m (variant 11, epoch_v7m.cuh; 10 is v7k's): v7j with
// its chain's critical warps' step after Z cut. The critical step's tail runs through the
// kernel's bodies (epoch_v7m_math.cuh): v7m_softmax16 a warp (the loss's inputs kept), warp 0's
// column sums (chain_colsum), every warp's items (v7m_row_item, v7m_sum_item) copied into every
// chain CTA's slot at v7m_slot_at, then the loss (v7m_loss_add). Checked: every destination gets
// each row of the batch and the column sums exactly once (a send mapping that misses a row, or
// sends one twice, is a violation: the device's mbarrier would count the wrong bytes). The
// barriers' order (warps 1-7 arrive before warp 0 sums) is not something a unit can break; bug
// 41 shows what it guards.
// Planted bugs: 40 the row bit dropped from v7m_row_item (row 2w + 1 never sent, 2w twice), 41
// the column sums taken before warps 1-7's rows are in gl (the arrive/sync pair missing: gl's
// rows of those warps still hold step t − 1's G), 42 1/bs in place of 1/n_t (the last, short
// batch's G off by bs/n_t).
#pragma once

#include "epoch_v7m_math.cuh"

namespace {

constexpr int V7M_VARIANT = 11;

// The critical warps' v7m_loss_add after their sends (v7m's and v7n's tails): each warp's
// pending loss terms into its threads' running loss and correct counts.
template <class Vec>
void v7m_host_loss_add(HostWarp16& warp, V7MLoss<HostWarp16>* pend, Vec& loss_of,
                       Vec& correct_of) {
  for (int w = 0; w < V7C_CRIT / 32; ++w) {
    HostWarp16::Reg<float> loss, correct;
    for (int lane = 0; lane < 32; ++lane) {
      loss[lane] = loss_of[32 * w + lane];
      correct[lane] = correct_of[32 * w + lane];
    }
    v7m_loss_add(warp, pend[w], loss, correct);
    for (int lane = 0; lane < 32; ++lane) {
      loss_of[32 * w + lane] = loss[lane];
      correct_of[32 * w + lane] = correct[lane];
    }
  }
}

// The critical step t's tail of chain CTA q from its threads' partials p, j1 terms and the bias:
// Z, the softmax, the column sums, the sends, the loss.
template <class Em>
void v7m_chain_tail(Em& em, int q, int t, const float* p, const float* j1, const float* bias,
                    const int* labels) {
  auto& c = em.chain[q];
  float* sm = c.sm.data();
  float* gl = sm + ChainSmem::GL;
  const V7Epoch& e = em.e;
  HostWarp16 warp;
  V7MLoss<HostWarp16> pend[V7C_CRIT / 32];
  for (int w = 0; w < V7C_CRIT / 32; ++w) {
    HostWarp16::Reg<float> z;
    for (int lane = 0; lane < 32; ++lane) {
      const int tid = 32 * w + lane;
      z[lane] = chain_logit_c(e, t, q, tid, p[tid], bias, j1[tid], sm + v7c_hq_at(t));
    }
    v7m_softmax16(warp, e, t, q, w, z, labels, gl, pend[w], em.bug == 42);
    if (em.bug == 41 && w == 0)
      for (int tid = 0; tid < 32; ++tid) chain_colsum(tid, gl);
  }
  if (em.bug != 41)
    for (int tid = 0; tid < 32; ++tid) chain_colsum(tid, gl);
  c.gl_step = t;
  const int slot = v7_slot(t);
  std::vector<V7MItem> items;
  for (int w = 0; w < V7C_CRIT / 32; ++w)
    for (int lane = 0; lane < 32; ++lane)
      for (int k = 0; k < V7M_ROW_ITEMS; ++k) items.push_back(v7m_row_item(w, lane, k, em.bug != 40));
  for (int lane = 0; lane < 32; ++lane) items.push_back(v7m_sum_item(lane));
  for (int d = 0; d < V7_CHAIN; ++d) {  // the st.asyncs into d's slot (the harness's checks)
    auto& dst = em.chain[d];
    if (dst.armed[slot] != t) em.violated = true;
    if (t >= V7_NB && v7g_iterations_done(em, d) <= t - V7_NB + V7_LAG - 1) em.violated = true;
    float* ds = dst.sm.data() + ChainSmem::RING + slot * ChainSmem::GSLOT;
    int got[V7_RPC + 1][4] = {};
    for (const V7MItem& it : items) {
      if (it.d != d || !v7m_item_sent(e, t, q, it)) continue;
      std::memcpy(ds + v7m_slot_at(q, it), gl + v7m_gl_at(it), 16);
      ++got[it.i][it.w4];
    }
    for (int i = 0; i <= V7_RPC; ++i)  // each sent float4 once: the slot's byte count
      for (int w4 = 0; w4 < 4; ++w4)
        if (got[i][w4] != (v7m_item_sent(e, t, q, {i, w4, d}) ? 1 : 0)) em.violated = true;
    if (++dst.got[slot] == V7_CHAIN) ++dst.phases[slot];
    dst.holds[slot] = dst.got[slot] == V7_CHAIN ? t : -1;
  }
  v7m_host_loss_add(warp, pend, c.loss, c.correct);
}

}  // namespace
