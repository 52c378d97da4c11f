// The host emulation's v7h (variant 7, epoch_v7h.cuh): v7g with its workers' x gather a step
// deeper. Each worker thread's 4 sample indices are registers kept across steps (Worker::xidx):
// the prime (a worker's setup: step 0's indices and pixels, then step 1's indices) and, when a
// step stores x_{t}, t ≥ 1, its pixels from the indices loaded a step before and the indices of
// step t + 1, as V7XGatherAhead does, through the same FT_V7 bodies (epoch_v7h_math.cuh). Its
// planted bugs: 23 the indices loaded for the step just gathered, not the next one (the pipeline a
// stage short: x_{t+1} holds step t's rows), 24 the prime without step 1's indices (x_1 holds
// step 0's rows).
#pragma once

#include "epoch_v7h_math.cuh"

namespace {

constexpr int V7H_VARIANT = 7;

// Thread tid of worker CTA (k, r): its bytes of x_t into buf (t = 0: the prime).
template <class Em>
void v7h_gather(Em& em, int k, int r, int tid, int t, uint8_t (&buf)[V7_XF]) {
  int(&idx)[V7_XF] = *reinterpret_cast<int(*)[V7_XF]>(&em.workers[k][r].xidx[size_t(tid) * V7_XF]);
  const int f0 = (k * V7_CLUSTER + r) * V7_FW;
  if (t == 0) v7h_fetch_idx(em.e, em.order, 0, tid, V7_T, idx);
  v7h_fetch_px(em.x, idx, f0, tid, V7_T, buf);
  if (t + 1 < em.e.steps && !(t == 0 && em.bug == 24))
    v7h_fetch_idx(em.e, em.order, em.bug == 23 ? t : t + 1, tid, V7_T, idx);
}

}  // namespace
