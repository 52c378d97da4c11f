// cuda-epoch v7m: v7j's epoch kernel (v7g's chain with v7i's publish, v7j's workers) with the
// chain's critical warps' step after the softmax cut: each warp sends its own rows of G_t at once,
// warp 0 alone waits for the others' rows (for the column sums), and the loss is added after the
// sends. Written without a GPU, not yet run on one (the design doc's "v7m" section: the SASS
// behind it; epoch_v7m_math.cuh: the bodies, and why it trains as v7j bit for bit).
//
// A critical warp w's step t after Z (V7MTail, v7g_chain's Tail):
//   the softmax of its rows 2w, 2w + 1 into gl (G_t), 1/n_t first, the loss's inputs kept
//   __syncwarp (its rows in gl for its lanes' loads)
//   w > 0: bar.arrive 1 (256 threads: its rows in gl, for warp 0's column sums)
//   its rows to the 8 chain CTAs' ring slot t % NB (st.async: 64 float4s, two a lane)
//   w = 0: bar.sync 1 (every warp's rows in gl), the column sums into gl's row 16, __syncwarp,
//          their row to the 8 chain CTAs (one float4 a lane)
//   bar.arrive 3 (v7i's: gl holds G_t, for the helpers' global store), the loss and the hit.
//
// Why the order is right:
// - gl's rows: each warp writes its own rows, and reads them back (its sends) after __syncwarp;
//   warp 0 reads every warp's rows after bar.sync 1, whose other 224 participants arrive after
//   their writes (bar.arrive/bar.sync: the arriving threads' prior shared accesses are ordered
//   before the waiting threads' later ones; CUTLASS's NamedBarrier producer/consumer pattern, as
//   v7i's barrier 3). gl is written again in step t + 1's softmax, after the hand-off t + 1, which
//   warp 0 reaches only after its column sums (and the helpers after their global store).
// - Barrier 1's instances never overlap: warps 1-7 arrive for step t + 1 only after the hand-off
//   t + 1, which warp 0 reaches only after its bar.sync of step t completed. After the loop,
//   v7c_last_g's bar.red.or on barrier 1 (all 256) follows each warp's wait for G_{steps−1}, which
//   completes only once every chain CTA's column sums arrived, this CTA's included: warp 0 has
//   passed its last bar.sync 1 by then.
// - The ring: the same items at the same offsets as chain_send_g's (v7m_slot_at), the same bytes
//   a slot (v7_g_bytes), completing on the same mbarriers; their order among themselves never
//   mattered (the receivers wait for the byte count).
// - A stop is read after a hand-off by every critical warp together, as in v7g-v7j.
// ptxas (nvcc 13.0, sm_90a): 119 / 128 registers (two launches, untimed / timed), 121 / 125 (one
// launch), no spill: j's. Estimate (not measured; the design doc's "v7m"): the chain's critical
// step 0.1-0.25 µs shorter, if its critical warps bind.
#pragma once
#include "epoch_v7j.cuh"
#include "epoch_v7m_math.cuh"

namespace {

// Item `it` of G_t (val: its float4 of gl) to chain CTA it.d's ring slot t % NB.
__device__ __forceinline__ void v7m_send(int t, int q, const V7MItem& it, float4 val,
                                         uint32_t ring_u, uint32_t bar_u) {
  const int slot = v7_slot(t);
  st_async4(mapa(ring_u + 4 * (slot * ChainSmem::GSLOT + v7m_slot_at(q, it)), it.d), val,
            mapa(bar_u + 8 * slot, it.d));
}

struct V7MTail : V7GSenderSums {
  template <class Clock>
  __device__ __forceinline__ void operator()(const V7Args& v, int t, int q, int tid, float z,
                                             const int* labels, float* gl, uint32_t ring_u,
                                             uint32_t bar_u, float& loss, float& correct,
                                             Clock& clock) const {
    const int w = tid / 32, lane = tid & 31;
    V7MLoss<V7DeviceWarp> pend;
    v7m_softmax16(V7DeviceWarp{}, v.e, t, q, w, z, labels, gl, pend);
    __syncwarp();
    if (w > 0) bar_arrive<V7C_BAR_CRIT, V7C_CRIT>();
    clock.mark(V7C_SOFTMAX);
    const V7MItem row = v7m_row_item(w, lane, 0);  // a lane's items carry one float4
    if (v7m_item_sent(v.e, t, q, row)) {
      const float4 val = *reinterpret_cast<const float4*>(gl + v7m_gl_at(row));
      for (int k = 0; k < V7M_ROW_ITEMS; ++k)
        v7m_send(t, q, v7m_row_item(w, lane, k), val, ring_u, bar_u);
    }
    if (w == 0) {
      bar_sync<V7C_BAR_CRIT, V7C_CRIT>();
      chain_colsum(tid, gl);
      __syncwarp();
      const V7MItem sum = v7m_sum_item(lane);
      v7m_send(t, q, sum, *reinterpret_cast<const float4*>(gl + v7m_gl_at(sum)), ring_u, bar_u);
    }
    clock.mark(V7C_SEND);
    bar_arrive<V7I_BAR_G, V7_T>();
    clock.mark(V7C_PUBLISH);
    v7m_loss_add(V7DeviceWarp{}, pend, loss, correct);
  }
};

// v7j's kernel with v7m's critical tail.
template <bool TIMED = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel_m(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  v7c_epoch<TIMED, GRAMS>(v, sm, V7FWorker<TIMED, V7XGatherPairs, true, V7JMma>{},
                         V7GChain<TIMED, V7IHelperPublish, V7MTail>{});
#endif
}

}  // namespace
