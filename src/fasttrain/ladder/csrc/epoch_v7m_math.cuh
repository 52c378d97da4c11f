// cuda-epoch v7m's per-thread bodies (epoch_v7m.cuh runs them on the GPU;
// tests/ladder/csrc/epoch_v7m_host.h runs them on the host for whole epochs). v7m is v7j (v7i's
// chain, v7j's workers) with the critical warps' step after the softmax cut (the design doc's
// "v7m" section: the SASS behind it). In v7i's SASS (nvcc 13.0, sm_90a, v7_epoch_kernel_i<false,
// 1>) that tail is: the softmax, the label lane's loss (logf inline: ~25 dependent instructions
// in a branch the other 15 lanes of its half-warp wait for), BAR.SYNC 1, warp 0's column sums (16
// LDS, 16 dependent FADD), BAR.SYNC 1, then 2-3 serial LDS.128 → STAS.128 blocks a thread for 544
// float4s over 256 threads. v7m:
//
// 1. Each warp sends its own two rows as soon as its softmax has written them (v7m_row_item: 64
//    float4 items, one shared load and two st.async a lane); no CTA barrier before the sends.
// 2. The column sums: warps 1-7 bar.arrive on the critical warps' barrier (1) once their rows are
//    in gl (before their sends), warp 0 bar.syncs after its own sends, sums (chain_colsum: the
//    same order, so the same bits) and sends the sums' row (v7m_sum_item: one float4 a lane).
//    Barrier 1 goes from two bar.sync a step for every critical warp to one arrive (warps 1-7)
//    and one sync (warp 0).
// 3. The loss and the hit (statistics: nothing waits for them) are added after the sends, from
//    the three values the label lane keeps (V7MLoss), by chain_softmax16's expressions.
// 4. 1/n_t first in the softmax, independent of the row's data (the same value, so the same G).
//
// G, the column sums and the bias are computed by the same expressions in the same order as
// v7i's (chain_softmax16, chain_colsum, chain_bias), the items land in the same ring offsets, the
// loss's terms are the same values added in the same order a thread: v7m trains as v7j bit for
// bit (tests/ladder/test_cuda_epoch_v7_math.py, variant 11).
#pragma once
#include <cmath>

#include "epoch_v7c_math.cuh"

namespace {

// A float4 item of chain CTA q's G_t: row i of gl (V7_RPC: the column sums' row), its float4 w4,
// to chain CTA d's ring slot.
struct V7MItem {
  int i, w4, d;
};
constexpr int V7M_ROW_ITEMS = 2;  // a lane's items of its warp's rows (64 a warp)
// Warp w's rows 2w, 2w + 1: lane l's k-th item is float4 l & 3 of row 2w + ((l >> 2) & 1), to
// chain CTA (l >> 3) + 4k: both of a lane's items carry the same float4 (one shared load).
// row_bit false: planted bug 40 (row 2w + 1 never sent, 2w twice).
FT_V7 V7MItem v7m_row_item(int w, int lane, int k, bool row_bit = true) {
  return {2 * w + (row_bit ? (lane >> 2) & 1 : 0), lane & 3, (lane >> 3) + 4 * k};
}
// Warp 0's lane l: float4 l & 3 of the column sums to chain CTA l >> 2.
FT_V7 V7MItem v7m_sum_item(int lane) { return {V7_RPC, lane & 3, lane >> 2}; }
// Whether the item is sent at step t (v7_g_bytes counts the batch's rows and the sums).
FT_V7 bool v7m_item_sent(const V7Epoch& e, int t, int q, const V7MItem& it) {
  return it.i == V7_RPC || q * V7_RPC + it.i < e.rows(t);
}
// Its offset in floats: in gl, and in a ring slot (chain_send_g's: row q·16 + i at stride V7_RS,
// the sums at chain CTA q's place after the 128 rows).
FT_V7 int v7m_gl_at(const V7MItem& it) { return it.i * 16 + 4 * it.w4; }
FT_V7 int v7m_slot_at(int q, const V7MItem& it) {
  return (it.i < V7_RPC ? (q * V7_RPC + it.i) * V7_RS : BMAX * V7_RS + q * V7_GROW) + 4 * it.w4;
}

// What a lane keeps from the softmax for its loss (on: the label lane of a row in the batch).
template <class Warp>
struct V7MLoss {
  typename Warp::template Reg<float> sl, ml, zl, on;
};
// chain_softmax16 without the loss (kept in `pend` for v7m_loss_add) and with 1/n_t first.
// inv_bs: planted bug 42 (1/bs where the last batch has fewer rows).
template <class Warp>
FT_V7 void v7m_softmax16(const Warp& warp, const V7Epoch& e, int t, int q, int w,
                         const typename Warp::template Reg<float>& z, const int* labels,
                         float* gl, V7MLoss<Warp>& pend, bool inv_bs = false) {
  using F = typename Warp::template Reg<float>;
  const int nt = e.rows(t);
  const float inv_n = 1.f / static_cast<float>(inv_bs ? e.bs : nt);
  F m, ex, se;
  chain_exp16(warp, z, m, ex, se);
  warp.each([&](int lane) {
    const int tid = 32 * w + lane;
    const ChainLane16 ln = chain_lane16(tid);
    float g = 0.f;
    warp.at(pend.on, lane) = 0.f;
    if (v7b_part_mine(e, t, q, tid)) {
      const int y = labels[ln.i];
      const float sl = warp.at(se, lane);
      if (ln.c == y) {
        warp.at(pend.sl, lane) = sl;
        warp.at(pend.ml, lane) = warp.at(m, lane);
        warp.at(pend.zl, lane) = warp.at(z, lane);
        warp.at(pend.on, lane) = 1.f;
      }
      g = (warp.at(ex, lane) / sl - (ln.c == y ? 1.f : 0.f)) * inv_n;
    }
    gl[ln.i * 16 + ln.c] = g;
  });
}
// The label lanes' loss and hit (chain_softmax16's expressions), after the sends.
template <class Warp>
FT_V7 void v7m_loss_add(const Warp& warp, const V7MLoss<Warp>& pend,
                        typename Warp::template Reg<float>& loss,
                        typename Warp::template Reg<float>& correct) {
  warp.each([&](int lane) {
    if (warp.at(pend.on, lane) != 0.f) {
      const float sl = warp.at(pend.sl, lane), ml = warp.at(pend.ml, lane),
                  zl = warp.at(pend.zl, lane);
      warp.at(loss, lane) += logf(sl) + ml - zl;
      warp.at(correct, lane) += zl == ml ? 1.f : 0.f;
    }
  });
}

}  // namespace
