// The host emulation's v7n (variant 12, epoch_v7n.cuh): v7k (its workers, their early counter
// reads) with no column sums in the chain's G exchange. The critical step's tail: each warp's
// softmax (v7m_softmax16, the loss's inputs kept), its rows' items (v7m_row_item) and warp 0's
// tokens (v7n_token_at) copied into every chain CTA's slot, then the loss (v7m_loss_add); no
// colsum, and no chain_bias at the next step's top. The bias: helper unit u ≥ 1 (iteration
// t = u − 1, ending at hand-off t + 1) runs only once G_t is complete in its CTA's slot (the
// device's helpers wait on the slot's mbarrier), and ends with b_{t+1} from G_t's rows
// (v7n_colsum, v7n_bias: k's sum in k's order); the critical step `steps` (the last wait) does
// b_steps the same way. Checked: every destination gets each row of the batch and each chain
// CTA's token exactly once, and the bytes that land in a slot from the 8 senders are the bytes
// it was armed with (v7n_g_bytes: a mismatch is a slot that never completes, or completes early,
// on the device).
// Planted bugs: 43 the receiver's column sums read the ring's rows past the batch (an older
// step's G) where the sender's gl held 0 (the short last batch's bias wrong), 44 the helpers'
// bias of G_t taken without waiting for its slot (a peer's rows still G_{t−NB}'s), 45 the slots
// armed without the tokens' bytes.
#pragma once

#include "epoch_v7n_math.cuh"

namespace {

constexpr int V7N_VARIANT = 12;

// b_{t+1} from G_t's rows in chain CTA q's ring slot (the helpers' end of iteration t; the
// critical warps' after the loop for t = steps − 1).
template <class Em>
void v7n_receiver_bias(Em& em, int q, int t) {
  auto& c = em.chain[q];
  float* sm = c.sm.data();
  if (c.holds[v7_slot(t)] != t && em.bug != 44) em.violated = true;  // (runnable said it was)
  for (int s = 0; s < V7N_SUMMERS; ++s)
    v7n_colsum(em.e, sm + ChainSmem::RING, t, s, sm + V7N_CS, em.bug == 43);
  for (int cl = 0; cl < C; ++cl) v7n_bias(em.e, sm + V7N_CS, cl, sm + ChainSmem::BIAS);
}

// Whether helper unit u of chain CTA q may run as far as v7n adds: G_{u−1} complete in its slot.
template <class Em>
bool v7n_helper_ready(const Em& em, int q) {
  const auto& c = em.chain[q];
  const int u = c.hnext;
  return u == 0 || em.bug == 44 || c.holds[v7_slot(u - 1)] == u - 1;
}

// The critical step t's tail of chain CTA q: Z, the softmax, the sends (rows and tokens), the
// loss.
template <class Em>
void v7n_chain_tail(Em& em, int q, int t, const float* p, const float* j1, const float* bias,
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
    v7m_softmax16(warp, e, t, q, w, z, labels, gl, pend[w]);
  }
  c.gl_step = t;
  const int slot = v7_slot(t);
  std::vector<V7MItem> items;
  for (int w = 0; w < V7C_CRIT / 32; ++w)
    for (int lane = 0; lane < 32; ++lane)
      for (int k = 0; k < V7M_ROW_ITEMS; ++k) items.push_back(v7m_row_item(w, lane, k));
  const float token[4] = {};
  for (int d = 0; d < V7_CHAIN; ++d) {  // the st.asyncs into d's slot (the harness's checks)
    auto& dst = em.chain[d];
    if (dst.armed[slot] != t) em.violated = true;
    if (t >= V7_NB && v7g_iterations_done(em, d) <= t - V7_NB + V7_LAG - 1) em.violated = true;
    float* ds = dst.sm.data() + ChainSmem::RING + slot * ChainSmem::GSLOT;
    int got[V7_RPC][4] = {};
    for (const V7MItem& it : items) {
      if (it.d != d || !v7m_item_sent(e, t, q, it)) continue;
      std::memcpy(ds + v7m_slot_at(q, it), gl + v7m_gl_at(it), 16);
      ++got[it.i][it.w4];
      dst.nbytes[slot] += 16;
    }
    std::memcpy(ds + v7n_token_at(q), token, 16);  // warp 0's lane d
    dst.nbytes[slot] += 16;
    for (int i = 0; i < V7_RPC; ++i)  // each sent float4 once
      for (int w4 = 0; w4 < 4; ++w4)
        if (got[i][w4] != (v7m_item_sent(e, t, q, {i, w4, d}) ? 1 : 0)) em.violated = true;
    if (++dst.got[slot] == V7_CHAIN) {  // every sender's bytes in: the armed count?
      if (dst.nbytes[slot] != v7n_g_bytes(e, t, em.bug != 45)) em.violated = true;
      dst.nbytes[slot] = 0;
      ++dst.phases[slot];
    }
    dst.holds[slot] = dst.got[slot] == V7_CHAIN ? t : -1;
  }
  v7m_host_loss_add(warp, pend, c.loss, c.correct);  // epoch_v7m_host.h's, as v7m's tail
}

}  // namespace
