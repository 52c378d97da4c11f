// The CPU side of tests/ladder/test_v8_helpers.py: csrc/v8_chain.cu's cluster variant on the host.
// The 8 CTAs (rank 0 the chain, ranks 1 … 6 the helpers, rank 7 idle) run their per-warp bodies
// (csrc/v8_chain.cuh, csrc/v8_helpers.cuh; mma through V8HostWarp, "acc rn" or "acc rz") in
// segments between the kernel's mbarrier waits, and a scheduler picks, at random (`seed` ≥ 0) or
// rank first (`seed` < 0), which runnable CTA moves next. The mbarriers are emulated (arrival
// count, tx-count, phase; try_wait.parity passes once the phase of that parity has completed), and
// every st.async is a store into the peer's arrays plus its complete_tx. Each ring slot also
// carries, per sender, the step it holds and whether its reader has consumed it, so an overwrite
// of an unread slot (-2) or a read of another step's data (-3) is caught where it happens (the
// rings start zeroed, so a planted bug that reads the wrong slot shows in the numbers); no CTA
// able to move before the end is a deadlock (-1). `numerics` 0 runs the protocol alone (fast).
//
// Segments (the kernel's order, v8_cluster_kernel):
//   chain step t: [gfree of G'_{t−1}] send G'_{t−1} to the six helpers | load P_t and labels,
//     product, K half 1 stored | [qfull of step t] Q added, softmax, G_t out, B_{t+1} written,
//     A_{t+1} loaded, Γ̃_{t+2} into the ring; qfull armed for t + NQ, a credit to every helper.
//   helper iteration u (t = u + j): [gfull of G'_u] product, K half 1 stored; gfull armed for
//     u + NSG, a credit to the chain | [qfree of step t] q_{t,j} into the chain's inbox, A_{u+1}
//     loaded, Γ̃ of u + 2 into the ring. (Iterations with t ≥ steps only take the slot and credit.)
// Planted bugs (`bug`): 1 a helper reads G' of the previous step (slot (u − 1) % NSG), 2 a helper's
// coefficient −c/n_t (not n_{t−j}: differs at the short last batch), 3 the chain not waiting for
// its G' credits, 4 the chain adding the Q of the previous step (slot (t − 1) % NQ), 5 a helper not
// waiting for its Q credits; 6 is no bug: it lets nsg + nq < L − 1 through, to see the deadlock.
#include <random>
#include <vector>

#pragma nv_diag_suppress 20011, 20014
#include "v8_helpers.cuh"
#include "v8_mma_host.h"

namespace {

using U = V8HostWarp::Reg<uint32_t>;
using F = V8HostWarp::Reg<float>;
using I = V8HostWarp::Reg<int>;

struct WarpRegs {
  U a[2][V8C_KSTEPS][4];
  F d[2][4], pq[2][4], pmy[2][4], loss{}, correct{};
  I y[2];
};

struct Mbar {
  int count = 1, pending = 1, phase = 0;
  long long tx = 0;
  void init(int n) { count = pending = n; }
  void settle() {
    if (pending == 0 && tx == 0) ++phase, pending = count;
  }
  void arrive() { --pending, settle(); }
  void expect_tx(int b) { tx += b, arrive(); }
  void complete_tx(int b) { tx -= b, settle(); }
  bool try_wait_parity(int parity) const { return (phase & 1) != parity; }
};

struct Tag {
  int step = -1;
  bool unread = false;
};

struct Cta {
  std::vector<std::vector<float>> ring{2, std::vector<float>(V8C_ROWS * V8C_GS, NAN)};
  std::vector<float> halves = std::vector<float>(V8C_HALVES, NAN);
  std::vector<WarpRegs> regs = std::vector<WarpRegs>(V8C_WARPS);
  std::vector<uint32_t> g;    // helper: the G' ring [NSG][V8C_BWORDS]; chain: B (V8C_BWORDS)
  std::vector<float> inbox;   // chain: [NQ][5][128][10]
  Mbar full[8 * V8H_PARTS], free[8];  // chain: qfull [NQ][5], gfree; helper: gfull, qfree
  Tag tag[8][V8H_CLUSTER];    // [slot][sender or receiver]
  int t = 0, pc = 0;
  bool done = false;
};

void fill_slot(std::vector<float>& slot, const float* gram_t, int r0, int nr) {
  for (int r = r0; r < r0 + nr; ++r)
    for (int k = 0; k < V8C_ROWS; ++k) slot[r * V8C_GS + k] = gram_t[r * V8C_ROWS + k];
}

}  // namespace

extern "C" {

int v8h_host_lag() { return V8H_LAG; }
int v8h_host_nsg() { return V8H_NSG; }
int v8h_host_nq() { return V8H_NQ; }

// gram1 [steps][128][128] (Γ̃_{t,1}), gramh [5][steps][128][128] (Γ̃_{t,j}, j = 2 … 6), p
// [steps][128][10] (P_t = X̃_t W̃_{t−6}/255), labels [steps][128]; n samples; c = lr/255². Writes
// g_out, z_out [steps][128][10] and stats = (summed loss, hits) when `numerics`. nsg, nq: the
// rings' slots (2 … 8, nsg + nq ≥ L − 1: v8_helpers.cuh). Returns 0, -1 (deadlock), -2 (an unread slot overwritten), -3 (a read of
// another step's data), -4 (bad arguments).
int v8_cluster_host(const float* gram1, const float* gramh, const float* p, const int* labels,
                    int n, float c, int rz, int bug, int seed, int nsg, int nq, int numerics,
                    float* g_out, float* z_out, float* stats) {
  if (n < 1 || nsg < 2 || nsg > 8 || nq < 2 || nq > 8) return -4;
  if (nsg + nq < V8H_LAG - 1 && bug != 6) return -4;  // 6: let them, to see the deadlock
  V8HostWarp warp;
  warp.round_toward_zero = rz != 0;
  const int steps = (n + V8C_ROWS - 1) / V8C_ROWS;
  const size_t gram_step = size_t(V8C_ROWS) * V8C_ROWS, io_step = size_t(V8C_ROWS) * V8C_C;
  auto gram_of = [&](int j, int t) {  // Γ̃_{t,j}
    return j == 1 ? gram1 + t * gram_step : gramh + ((j - 2) * size_t(steps) + t) * gram_step;
  };
  std::vector<Cta> cta(V8H_CLUSTER);
  Cta& ch = cta[0];
  ch.g.assign(V8C_BWORDS, 0u);
  ch.inbox.assign(size_t(nq) * V8H_QSLOT_FLOATS, 0.f);
  for (int j = 2; j <= V8H_LAG; ++j)  // the prologue's arms: each part's first NQ steps
    for (int t = j; t < j + nq && t < steps; ++t) ch.full[v8h_qbar(t, j, nq)].expect_tx(V8H_PART_BYTES);
  for (int s = 0; s < nsg; ++s) ch.free[s].init(V8H_HELPERS);
  for (int h = 1; h <= V8H_HELPERS; ++h) {
    Cta& x = cta[h];
    x.g.assign(size_t(nsg) * V8C_BWORDS, 0u);
    for (int s = 0; s < nsg && s <= steps - 2; ++s) x.full[s].expect_tx(V8H_G_BYTES);
  }
  cta[7].done = true;  // idle
  if (steps < 2)
    for (int h = 1; h <= V8H_HELPERS; ++h) cta[h].done = true;

  // Prologue (the kernel's): the Γ̃ rings' first two slots and A of the first step.
  auto load_a = [&](Cta& x, int h, int ring_slot) {
    for (int w = 0; w < V8C_WARPS; ++w)
      if (h == 0 || v8h_active(h, w))
        v8c_load_a(warp, x.ring[ring_slot].data(), w, V8C_A_SCALE, x.regs[w].a);
  };
  if (numerics) {
    fill_slot(ch.ring[0], gram_of(1, 0), 0, V8C_ROWS);
    if (steps > 1) fill_slot(ch.ring[1], gram_of(1, 1), 0, V8C_ROWS);
    load_a(ch, 0, 0);
    for (int h = 1; h <= V8H_HELPERS; ++h) {
      const int j = v8h_lag(h);
      for (int u = 0; u < 2; ++u)
        if (u + j < steps) fill_slot(cta[h].ring[u], gram_of(j, u + j), v8h_row0(h), v8h_nrows(h));
      if (j < steps) load_a(cta[h], h, 0);
    }
  }

  auto chain_moves = [&](int pc, int t) {
    if (pc == 0) {
      const int u = t - 1;
      return u < nsg || u > steps - 2 || bug == 3 ||
             ch.free[u % nsg].try_wait_parity(v8h_free_parity(u, nsg));
    }
    if (pc != 2) return true;
    for (int j = 2; j <= V8H_LAG && j <= t; ++j)
      if (!ch.full[v8h_qbar(t, j, nq)].try_wait_parity(v8h_q_parity(t, j, nq))) return false;
    return true;
  };
  auto helper_moves = [&](const Cta& x, int h) {
    const int u = x.t, t = u + v8h_lag(h);
    if (x.pc == 0) return x.full[u % nsg].try_wait_parity(v8h_full_parity(u, nsg));
    return u < nq || bug == 5 || x.free[t % nq].try_wait_parity(v8h_free_parity(u, nq));
  };

  std::mt19937 rng(seed < 0 ? 0 : seed);
  for (;;) {
    std::vector<int> can;
    for (int q = 0; q < V8H_CLUSTER; ++q)
      if (!cta[q].done && (q == 0 ? chain_moves(cta[q].pc, cta[q].t) : helper_moves(cta[q], q)))
        can.push_back(q);
    if (can.empty()) {
      for (const Cta& x : cta)
        if (!x.done) return -1;
      break;
    }
    const int q = seed < 0 ? can[0] : can[rng() % can.size()];
    Cta& x = cta[q];
    const int t = x.t;
    if (q == 0 && x.pc == 0) {  // G'_{t−1} (B_t, in the chain's B words) to every helper
      const int u = t - 1;
      if (u >= 0 && u <= steps - 2)
        for (int h = 1; h <= V8H_HELPERS; ++h) {
          Cta& y = cta[h];
          Tag& tg = y.tag[u % nsg][0];
          if (tg.unread) return -2;
          tg = {u, true};
          std::copy(ch.g.begin(), ch.g.end(), y.g.begin() + size_t(u % nsg) * V8C_BWORDS);
          y.full[u % nsg].complete_tx(V8H_G_BYTES);
        }
      x.pc = 1;
    } else if (q == 0 && x.pc == 1) {  // P_t, the product, K half 1
      const int rows = v8c_rows(n, t);
      if (numerics) {
        for (int w = 0; w < 8; ++w)
          v8c_load_inputs(warp, w, p + t * io_step, labels + t * V8C_ROWS, rows, x.regs[w].pq,
                          x.regs[w].y);
        for (int w = 0; w < V8C_WARPS; ++w)
          v8c_product(warp, x.regs[w].a, x.g.data(), w, x.regs[w].d);
        for (int w = 8; w < V8C_WARPS; ++w) v8c_store_half(warp, x.regs[w].d, x.halves.data(), w);
      }
      x.pc = 2;
    } else if (q == 0) {  // step t's Q parts landed: the softmax; re-arm, credits
      const int rows = v8c_rows(n, t), slot = (bug == 4 ? t + nq - 1 : t) % nq;
      for (int h = 1; h <= V8H_HELPERS && t >= 2; ++h) {
        if (v8h_lag(h) > t) continue;
        Tag& tg = x.tag[t % nq][h];  // the protocol's slot (bug 4 reads another's data)
        if (!tg.unread || tg.step != t) return -3;
        tg.unread = false;
      }
      if (numerics) {
        const float coef = -c / static_cast<float>(t ? v8c_rows(n, t - 1) : 1);
        for (int w = 0; w < 8; ++w) {
          WarpRegs& r = x.regs[w];
          v8h_add_q(warp, w, x.inbox.data() + size_t(slot) * V8H_QSLOT_FLOATS, t, rows, r.pq);
          v8c_softmax(warp, w, r.d, x.halves.data(), r.pq, r.y, rows, coef, g_out + t * io_step,
                      z_out + t * io_step, r.pmy, r.loss, r.correct);
          v8c_write_b(warp, w, r.pmy, x.g.data());
        }
        if (t + 1 < steps) load_a(x, 0, (t + 1) & 1);
        if (t + 2 < steps) fill_slot(x.ring[t & 1], gram_of(1, t + 2), 0, V8C_ROWS);
      }
      for (int h = 1; h <= V8H_HELPERS; ++h) {
        const int j = v8h_lag(h);
        if (j > t) continue;
        if (h != 1 && t + nq < steps) x.full[v8h_qbar(t, j, nq)].expect_tx(V8H_PART_BYTES);
        cta[h].free[t % nq].arrive();
      }
      x.t = t + 1, x.pc = 0;
      x.done = x.t == steps;
    } else if (x.pc == 0) {  // helper: G'_u landed: the product, then the slot back
      const int u = t, j = v8h_lag(q), tt = u + j, slot = (bug == 1 ? u + nsg - 1 : u) % nsg;
      Tag& tg = x.tag[u % nsg][0];  // the protocol's slot (bug 1 reads another's data)
      if (!tg.unread || tg.step != u) return -3;
      if (numerics && tt < steps) {
        for (int w = 0; w < V8C_WARPS; ++w)
          if (v8h_active(q, w))
            v8c_product(warp, x.regs[w].a, x.g.data() + size_t(slot) * V8C_BWORDS, w,
                        x.regs[w].d);
        for (int w = 8; w < V8C_WARPS; ++w)
          if (v8h_active(q, w)) v8c_store_half(warp, x.regs[w].d, x.halves.data(), w);
      }
      tg.unread = false;
      if (u + nsg <= steps - 2) x.full[u % nsg].expect_tx(V8H_G_BYTES);
      ch.free[u % nsg].arrive();
      if (tt < steps) {
        x.pc = 1;
      } else if (++x.t > steps - 2) {
        x.done = true;
      }
    } else {  // helper: q_{t,j} into the chain's inbox; the next A and Γ̃
      const int u = t, j = v8h_lag(q), tt = u + j, slot = tt % nq;
      Tag& tg = ch.tag[slot][q];
      if (tg.unread) return -2;
      tg = {tt, true};
      if (numerics) {
        const float coef = v8h_coef(c, n, tt, j, bug);
        float* in = ch.inbox.data() + size_t(slot) * V8H_QSLOT_FLOATS;
        for (int w = 0; w < 8; ++w)
          if (v8h_active(q, w))
            v8h_part(warp, w, x.regs[w].d, x.halves.data(), coef,
                     [&](int row, int col, float v0, float v1) {
                       in[v8h_part_at(j, row, col)] = v0;
                       in[v8h_part_at(j, row, col) + 1] = v1;
                     });
        if (tt + 1 < steps) load_a(x, q, (u + 1) & 1);
        if (tt + 2 < steps)
          fill_slot(x.ring[u & 1], gram_of(j, tt + 2), v8h_row0(q), v8h_nrows(q));
      }
      ch.full[v8h_qbar(tt, j, nq)].complete_tx(v8h_nrows(q) * V8C_C * 4);
      x.pc = 0;
      if (++x.t > steps - 2) x.done = true;
    }
  }
  if (numerics) {
    double loss = 0, hits = 0;
    for (int w = 0; w < 8; ++w)
      for (int lane = 0; lane < 32; ++lane) {
        loss += ch.regs[w].loss[lane];
        hits += ch.regs[w].correct[lane];
      }
    stats[0] = static_cast<float>(loss);
    stats[1] = static_cast<float>(hits);
  }
  return 0;
}

}  // extern "C"
