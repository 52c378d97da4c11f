// The CPU side of tests/ladder/test_v8_workers.py: v8's 56 worker CTAs (csrc/v8_workers.cuh's
// bodies, the same code v8_workers.cu runs) for a whole epoch with G' given, every thread of every
// CTA and every warp (V8HostWarp: the 32 lanes, mma.sync emulated with exact products and one
// rounding, "acc rn" or "acc rz") in the kernel's order between its barriers:
//   step t, each CTA: x_{t+1}'s bytes fetched; the updates a < v8_applied_before(t); P_t (simt:
//   v7's worker_partial + the bias slot; mma: into the step parity's buffer; mma-scatter: each
//   element written straight into the owning rank's inbox slot t % NS, as st.async would);
//   x_{t+1} stored; then every rank's reduce (v7's worker_reduce) into P's output (mma-scatter:
//   the reduce of step t − 1's slot, as the kernel defers it; the last step's after the loop).
// The epoch runs the ranks one after another, so the ring's credits and the cluster barrier are
// satisfied by construction: it checks the arithmetic and the indexing. The ring's protocol is
// v8w_host_scatter_protocol's (below): random schedules over emulated mbarriers.
// Planted bugs (`bug`, the test shows each fails the float64 check): 1 the update's G' lo piece
// left out (mma) / lo left out of the staged G (simt), 2 the partials' W̃ scale undone twice
// (× 2⁻¹⁶, mma), 3 the bias slot left out (all variants), 4 the scatter's inbox row off by one,
// 5 the scatter's deferred reduce of step u reading slot (u + 1) % NS (step u + 1's partials).
#define FT_HOST_MATH
#include <array>
#include <cstring>
#include <random>
#include <vector>

#include "v8_mma_host.h"
#include "v8_workers.cuh"

namespace {

struct HostCta {
  std::vector<float> sm = std::vector<float>(V8Smem::FLOATS, 0.f);
  std::vector<uint8_t> xb = std::vector<uint8_t>(size_t(V7_T) * V7_XF, 0);
  float* at(int off) { return sm.data() + off; }
  __half* xh() { return reinterpret_cast<__half*>(at(V8Smem::XS)); }
  uint8_t (&buf(int tid))[V7_XF] { return *reinterpret_cast<uint8_t(*)[V7_XF]>(&xb[tid * V7_XF]); }
};

}  // namespace

// mma-scatter's ring protocol alone, for one cluster of 8 CTAs: the kernel's order of arms, waits,
// sends and credits (v8_workers.cu), run by a random scheduler over emulated mbarriers (arrival
// count, tx-count, phase; try_wait.parity passes once the phase of that parity has completed,
// i.e. while the current phase's parity differs). Each slot holds, per sender, the step it
// carries and whether its owner has read it. Returns 0, -1 (no CTA can move: a deadlock), -2 (a
// send over a slot its owner has not read), -3 (a read of a slot holding another step's rows),
// -4 (ns outside 2 … V8_NS). ns: the ring's slots (the kernel's V8_NS; at 2 the credits bind).
// Planted bugs: 6 the sender not waiting for its credits, 7 the credit wait's parity one phase
// late ((t / NS) & 1), 8 the owner's wait's parity one phase early.
namespace {
struct HostMbar {
  int count, pending, phase = 0;
  long long tx = 0;
  explicit HostMbar(int n = 1) : count(n), pending(n) {}
  void settle() {
    if (pending == 0 && tx == 0) {
      ++phase;
      pending = count;
    }
  }
  void arrive() { --pending, settle(); }
  void expect_tx(int b) { tx += b, arrive(); }
  void complete_tx(int b) { tx -= b, settle(); }
  bool try_wait_parity(int parity) const { return (phase & 1) != parity; }
};
}  // namespace

extern "C" int v8w_host_scatter_protocol(int ns, int steps, int seed, int bug) {
  if (ns < 2 || ns > V8_NS) return -4;
  constexpr int R = V7_CLUSTER;
  struct Cta {
    HostMbar full[V8_NS], free[V8_NS];
    int tag[V8_NS][R];
    bool unread[V8_NS][R];
    int t = 0, pc = 0;  // pc: 0 arm, 1 credit wait, 2 send, 3 slot wait, 4 read; t == steps: drain
    bool done = false;
  };
  std::vector<Cta> c(R);
  for (Cta& x : c)
    for (int s = 0; s < V8_NS; ++s) {
      x.free[s] = HostMbar(R);
      for (int src = 0; src < R; ++src) x.tag[s][src] = -1, x.unread[s][src] = false;
    }
  std::mt19937 rng(seed);
  for (;;) {
    std::vector<int> can;
    for (int q = 0; q < R; ++q) {
      Cta& x = c[q];
      if (x.done) continue;
      const int t = x.t;
      bool ok = true;
      if (x.pc == 1 && t >= ns && bug != 6) {
        const int par = bug == 7 ? (t / ns) & 1 : v8_free_parity(t, ns);
        ok = x.free[v8_ns_slot(t, ns)].try_wait_parity(par);
      }
      if (x.pc == 3 && t >= 1) {
        const int par = bug == 8 ? ((t - 1) / ns + 1) & 1 : v8_full_parity(t - 1, ns);
        ok = x.full[v8_ns_slot(t - 1, ns)].try_wait_parity(par);
      }
      if (ok) can.push_back(q);
    }
    if (can.empty()) {
      for (const Cta& x : c)
        if (!x.done) return -1;
      return 0;
    }
    const int q = can[rng() % can.size()];
    Cta& x = c[q];
    const int t = x.t;
    switch (x.pc) {
      case 0:  // step t's arm (the drain, t == steps, has none)
        if (t < steps) x.full[v8_ns_slot(t, ns)].expect_tx(V8_SLOT_BYTES);
        x.pc = t < steps ? 1 : 3;
        break;
      case 1:
        x.pc = 2;
        break;
      case 2:  // the sends: my 16-row tile of P_t to each owner
        for (int d = 0; d < R; ++d) {
          Cta& y = c[d];
          const int s = v8_ns_slot(t, ns);
          if (y.unread[s][q]) return -2;
          y.tag[s][q] = t, y.unread[s][q] = true;
          y.full[s].complete_tx(V8_SLOT_BYTES / R);
        }
        x.pc = 3;
        break;
      case 3:
        x.pc = t >= 1 ? 4 : 0;
        if (t == 0) x.t = 1;
        break;
      case 4: {  // the reduce of step t − 1, then my credits to the 8 senders
        const int s = v8_ns_slot(t - 1, ns);
        for (int src = 0; src < R; ++src) {
          if (!x.unread[s][src] || x.tag[s][src] != t - 1) return -3;
          x.unread[s][src] = false;
        }
        for (int src = 0; src < R; ++src) c[src].free[s].arrive();
        if (t == steps) x.done = true;
        x.t = t + 1, x.pc = 0;
        break;
      }
    }
  }
}

extern "C" {

int v8w_host_lag() { return V8_LAG; }
int v8w_host_ns() { return V8_NS; }

// x: [n][784] uint8; order: [n]; gh, gl: [steps][BMAX][16] fp16 bits; w0, w_out: [785][10];
// p_out: [steps][7][BMAX][10] (rows past a batch untouched). Returns 0, or -1 on bad arguments.
int v8w_host_epoch(int variant, int rz, int bug, int n, int bs, float lr, const uint8_t* x,
                   const int* order, const uint16_t* gh16, const uint16_t* gl16, const float* w0,
                   float* p_out, float* w_out) {
  if (variant < 0 || variant >= V8_VARIANTS || bs < 1 || bs > BMAX || n < 1) return -1;
  const V8Shape shape{n, bs, (n + bs - 1) / bs, lr};
  const V7Epoch e = v8_epoch(shape);
  const int steps = e.steps, T = V7_T;
  const __half* gh = reinterpret_cast<const __half*>(gh16);
  const __half* gl = reinterpret_cast<const __half*>(gl16);
  std::vector<__half> zeros(BMAX * 16, __float2half_rn(0.f));
  const V8HostWarp wp{rz != 0};
  std::vector<HostCta> ctas(V7_WORKERS);
  for (int q = 0; q < V7_WORKERS; ++q) {
    float* w = ctas[q].at(V8Smem::W);
    for (int f = 0; f < V8_NF; ++f)
      for (int c = 0; c < C; ++c) {
        const int row = v8_w_row(q, f);
        w[f * 16 + c] = row < 0 || (bug == 3 && row == K) ? 0.f : w0[row * C + c];
      }
  }
  const bool simt = variant == V8_SIMT;

  auto update = [&](int q, int a) {
    HostCta& cta = ctas[q];
    float *xs = cta.at(V8Smem::XS), *w = cta.at(V8Smem::W), *gs = cta.at(V8Smem::GS),
          *ured = cta.at(V8Smem::URED);
    const bool bias = v8_has_bias(q) && bug != 3;
    const __half *gha = gh + size_t(a) * BMAX * 16, *gla = gl + size_t(a) * BMAX * 16;
    if (bug == 1) gla = zeros.data();
    std::vector<std::array<uint32_t, 4>> reg(T);
    for (int tid = 0; tid < T; ++tid)
      v8_fetch_g(gha, gla, tid, T, *reinterpret_cast<uint32_t(*)[4]>(reg[tid].data()));
    auto held = [&](int tid) -> const uint32_t(&)[4] {
      return *reinterpret_cast<const uint32_t(*)[4]>(reg[tid].data());
    };
    if (simt) {
      for (int tid = 0; tid < T; ++tid) v8_put_g_simt(e, a, held(tid), tid, T, gs);
      for (int tid = 0; tid < T; ++tid) {
        worker_update_sums(e, a, v8_v7_view(xs, a), gs, tid, ured);
        v8_simt_bias_sums(e, a, gs, tid, bias, ured);
      }
      for (int tid = 0; tid < T; ++tid) {
        worker_update_apply(e, ured, tid, w);
        v8_simt_bias_apply(e, ured, tid, bias, w);
      }
    } else {
      __half* gsh = reinterpret_cast<__half*>(gs);
      for (int tid = 0; tid < T; ++tid) v8_put_g_mma(held(tid), tid, T, gsh);
      for (int u = 0; u < T / 32; ++u)
        v8_mma_update_sums(wp, u, cta.xh() + (a % V8_XR) * BMAX * 16, gsh, ured);
      for (int tid = 0; tid < T; ++tid) v8_mma_update_apply(e, a, ured, tid, w);
    }
  };
  auto store_x = [&](int q, int t) {
    HostCta& cta = ctas[q];
    const bool bias = v8_has_bias(q) && bug != 3;
    for (int tid = 0; tid < T; ++tid) {
      if (simt)
        worker_store_x(e, t, tid, T, cta.buf(tid), v8_v7_view(cta.at(V8Smem::XS), t));
      else
        v8_store_xh(e, t, tid, T, cta.buf(tid), bias, cta.xh());
    }
  };
  auto fetch_x = [&](int q, int t) {
    for (int tid = 0; tid < T; ++tid)
      worker_fetch_x(e, x, order, t, v8_f0(q), tid, T, ctas[q].buf(tid));
  };

  for (int q = 0; q < V7_WORKERS; ++q) {
    fetch_x(q, 0);
    store_x(q, 0);
  }
  // mma-scatter: every rank's rows of P_u from its inbox slot u % NS, run during step u + 1 (after
  // that step's sends: the slot of u must have survived them), as the kernel does.
  auto reduce_slot = [&](int u) {
    for (int q = 0; q < V7_WORKERS; ++q) {
      const int k = q / V7_CLUSTER, r = q % V7_CLUSTER;
      const float* in = ctas[q].at(V8Smem::INBOX);
      const int slot = v8_ns_slot(bug == 5 ? u + 1 : u);
      for (int tid = 0; tid < T; ++tid)
        worker_reduce(
            e, u, r, tid,
            [&](int src, int i) { return in[v8_inbox_at(slot, src, i / V7_GROW, i % V7_GROW)]; },
            [&](int row, int c, float v) { p_out[v8_p_at(u, k, row, c)] = v; });
    }
  };
  int applied = 0;  // every CTA applies the same updates at the same steps
  for (int t = 0; t < steps; ++t) {
    const int p = t & 1, before = v8_applied_before(t);
    for (int q = 0; q < V7_WORKERS; ++q) {
      HostCta& cta = ctas[q];
      const int k = q / V7_CLUSTER, r = q % V7_CLUSTER;
      const bool bias = v8_has_bias(q) && bug != 3;
      if (t + 1 < steps) fetch_x(q, t + 1);
      for (int a = applied; a < before; ++a) update(q, a);
      float* pb = cta.at(V8Smem::PBUF) + p * BMAX * V7_GROW;
      const float* w = cta.at(V8Smem::W);
      if (simt) {
        const float* xs = v8_v7_view(cta.at(V8Smem::XS), t);
        for (int tid = 0; tid < T; ++tid) {
          worker_partial(e, t, xs, w, tid, pb);
          v8_simt_bias_partial(e, t, w, tid, bias, pb);
        }
      } else {
        const __half* xt = cta.xh() + (t % V8_XR) * BMAX * 16;
        for (int wi = 0; wi < T / 32; ++wi) {
          if (variant == V8_MMA) {
            v8_mma_partial(wp, wi, xt, w, [&](int row, int c, float v0, float v1) {
              const float s = bug == 2 ? 1.f / V8_WSCALE : 1.f;
              pb[row * V7_GROW + c] = v0 * s;
              pb[row * V7_GROW + c + 1] = v1 * s;
            });
          } else {
            v8_mma_partial(wp, wi, xt, w, [&](int row, int c, float v0, float v1) {
              HostCta& dst = ctas[k * V7_CLUSTER + row / V7_RPC];
              const int slot = v8_ns_slot(t),
                        at = v8_inbox_at(slot, r, row + (bug == 4 ? 1 : 0), c);
              float* in = dst.at(V8Smem::INBOX);
              in[at] = v0;  // st.async.v2: 8 bytes, c even
              in[at + 1] = v1;
            });
          }
        }
      }
      if (t + 1 < steps) store_x(q, t + 1);
    }
    applied = before;
    if (variant != V8_SCATTER) {
      for (int q = 0; q < V7_WORKERS; ++q) {
        const int k = q / V7_CLUSTER, r = q % V7_CLUSTER;
        for (int tid = 0; tid < T; ++tid)
          worker_reduce(
              e, t, r, tid,
              [&](int src, int i) {
                return ctas[k * V7_CLUSTER + src].at(V8Smem::PBUF)[p * BMAX * V7_GROW + i];
              },
              [&](int row, int c, float v) { p_out[v8_p_at(t, k, row, c)] = v; });
      }
    } else if (t >= 1) {
      reduce_slot(t - 1);
    }
  }
  if (variant == V8_SCATTER && steps >= 1) reduce_slot(steps - 1);
  for (int q = 0; q < V7_WORKERS; ++q)
    for (int a = applied; a < steps; ++a) update(q, a);
  for (int q = 0; q < V7_WORKERS; ++q) {
    const float* w = ctas[q].at(V8Smem::W);
    for (int f = 0; f < V8_NF; ++f) {
      const int row = v8_w_row(q, f);
      if (row >= 0)
        for (int c = 0; c < C; ++c) w_out[row * C + c] = w[f * 16 + c];
    }
  }
  return 0;
}

}  // extern "C"
