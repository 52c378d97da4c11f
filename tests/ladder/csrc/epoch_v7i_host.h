// The host emulation's v7i (variant 8, epoch_v7i.cuh): v7h with G_t's global rows and the chain
// CTA's step counter written by the helper warps. The critical step stores nothing to global
// memory and publishes nothing; the helpers' unit u (1 ≤ u < steps: iteration u − 1, ending at
// the hand-off of step u) ends with G_{u−1}'s rows stored from gl (the critical step u − 1's,
// which the device's helpers wait for on barrier V7I_BAR_G) and then the count u (the device's
// helper thread 0 releases it right after that hand-off: the next thing a worker can observe),
// through the kernel's v7i_store_g. One more helper unit, u = steps, is the device's tail after
// the loop: G_{steps−1}'s rows, then the count steps; it runs once the critical step steps − 1
// has. gl must still hold G_{u−1} when unit u stores it (checked: the critical step u runs only
// after unit u, the hand-off, so it always does unless the order is broken).
// Planted bugs: 25 the count one step ahead (u + 1 after G_{u−1}'s rows: the workers read G_u
// from global memory before anyone stored it), 26 the release not ordered after the stores
// (the count u published, G_{u−1}'s rows landing only at the helpers' next unit: a worker that
// runs in between reads what the buffer held before).
#pragma once

#include "epoch_v7i_math.cuh"

namespace {

constexpr int V7I_VARIANT = 8;

// Chain CTA q's rows of G_s from gl (a copy of it for bug 26) to global memory, all 64 storers.
template <class Em>
void v7i_store_rows(Em& em, int s, int q, const float* gl) {
  for (int h = 0; h < V7C_HELP; ++h) v7i_store_g(em.e, em.s.g, s, q, h, gl);
}

// Bug 26's stores that have not landed yet (at the helpers' next unit, or the epoch's end).
template <class Em>
void v7i_land(Em& em, int q) {
  auto& c = em.chain[q];
  if (c.ipend < 0) return;
  v7i_store_rows(em, c.ipend, q, c.igl.data());
  c.ipend = -1;
}

// The end of helper unit u ≥ 1 of chain CTA q: G_{u−1} stored, then the count u.
template <class Em>
void v7i_publish(Em& em, int q, int u) {
  auto& c = em.chain[q];
  const float* gl = c.sm.data() + ChainSmem::GL;
  if (c.gl_step != u - 1) em.violated = true;  // gl no longer (or not yet) G_{u−1}
  v7i_land(em, q);
  if (em.bug == 26) {
    std::copy(gl, gl + (V7_RPC + 1) * 16, c.igl.begin());
    c.ipend = u - 1;
  } else {
    v7i_store_rows(em, u - 1, q, gl);
  }
  em.s.gflag[q] = em.bug == 25 ? u + 1 : u;
}

// The helpers' units: v7g's 0 … steps − 1 and v7i's tail, steps.
template <class Em>
bool v7i_tail_runnable(const Em& em, int q) {
  const auto& c = em.chain[q];
  return c.hnext == em.e.steps && c.next >= em.e.steps;
}
template <class Em>
void v7i_tail(Em& em, int q) {
  const int u = em.chain[q].hnext++;
  v7i_publish(em, q, u);
  v7i_land(em, q);  // nothing runs after the tail in this unit's CTA: bug 26's rows land here
}

}  // namespace
