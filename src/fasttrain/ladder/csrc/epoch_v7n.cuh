// cuda-epoch v7n: v7k's epoch kernel (v7i's chain, v7j's workers, v7k's worker step) with the
// bias gradient off the chain's G exchange: no column sums are sent, each critical warp sends its
// own rows right after its softmax (v7m's items) with no barrier in the critical tail, and the
// receiving chain CTA sums the rows it holds (epoch_v7n_math.cuh: what moved and why it is the
// same arithmetic). Written without a GPU, not yet run on one (the design doc's "v7n" section).
//
// A critical warp w's step t after Z (V7NTail, v7g_chain's Tail):
//   the softmax of its rows 2w, 2w + 1 into gl (v7m_softmax16: the loss's inputs kept)
//   __syncwarp (its rows in gl for its lanes' loads)
//   its rows to the 8 chain CTAs' ring slot t % NB (st.async, v7m_row_item: 2 a lane)
//   w = 0, lanes 0-7: the token (16 bytes) to chain CTA `lane`
//   bar.arrive 3 (v7i's: gl holds G_t, for the helpers' global store), the loss and the hit.
// No barrier 1, no column sums, no chain_bias before the term j = 1 (v7g_chain skips it:
// Tail::RECEIVER_BIAS). Helper warps 9-11 (V7NHelperPublish::before_hand), end of iteration t,
// after v7i's barrier 3 and store: wait for G_t's slot (every thread: its acquire of the
// st.async bytes), v7n_colsum (80 threads), bar.sync 5 (their 96), v7n_bias (10 threads), then
// the hand-off t + 1. After the loop the critical warps do the same for b_steps (V7NTail::last_g).
//
// Why the order is right:
// - gl's rows: each warp writes and reads back only its own rows (__syncwarp), as v7m's warps
//   1-7 do; the helpers' store reads gl after barrier 3 (v7i's); gl is next written after the
//   hand-off t + 1, which the helpers reach after their store.
// - The bias. The critical warps read b_t in the logits of step t, before their bar.arrive 3;
//   the helpers write b_{t+1} after their bar.sync 3 of iteration t (arrive/sync: the arriving
//   threads' prior accesses before the waiting threads' later ones) and before hand-off t + 1,
//   after which the critical warps read it. v7n_colsum's reads of the ring follow the helper
//   thread's own wait on the slot's mbarrier (the acquire of the st.async bytes, as the critical
//   warps' wait is theirs); its writes of CS precede bar.sync 5, v7n_bias's reads follow it, and
//   CS is next written an iteration later, after two more hand-offs.
// - The ring slot t % NB: the helpers read G_t there in iteration t, long before any chain CTA
//   can send G_{t+NB} (which needs this CTA's token of step t + NB − 1, sent after the hand-off
//   t + NB − 1 that ends the helpers' iteration t + NB − 2).
// - The tokens keep k's pacing: a slot completes only when all 8 CTAs reached step t's tail (the
//   receivers' re-arm and reads before it, k's argument), whatever rows the batch gives them.
// - The bytes: v7n_g_bytes (rows + 8 tokens) armed for every step, the same items landing.
// - A failed wait: the helpers' wait for G_t reports the same code as the critical warps' wait
//   for it (step t + 1), sets the stop flag, and everyone leaves after hand-off t + 1.
// Arithmetic: the same G, the same column sums in the same order, the same bias update, the loss
// terms as v7m adds them: v7n trains as v7k bit for bit (the host emulation, variant 12).
#pragma once
#include "epoch_v7k.cuh"
#include "epoch_v7m.cuh"
#include "epoch_v7n_math.cuh"

namespace {

constexpr int V7N_BAR_BIAS = 5;  // named barrier of the summing helpers (1-4: v7c's, v7i's)
constexpr int V7N_H0 = 32;       // the summing helpers: warps 9-11 (helper threads 32 … 127)
constexpr int V7N_HN = 96;

// Helper warps 9-11's part of iteration t, after barrier 3: b_{t+1} from G_t's rows in the ring.
// A failed wait sets the stop flag (read after the coming hand-off by everyone).
__device__ __forceinline__ void v7n_helper_bias(const V7Epoch& e, int t, int h, float* sm) {
  const int s = h - V7N_H0;
  if (s < 0 || s >= V7N_HN) return;  // warp-uniform
  const uint32_t bar_u = smem_addr(sm + ChainSmem::BAR);
  const bool ok = bounded_wait(bar_u + 8 * v7_slot(t), v7_parity(t),
                               WAIT_G | blockIdx.x << 4 | (t + 1) << 12);
  if (!ok) *reinterpret_cast<volatile int*>(sm + V7C_STOP) = 1;
  if (ok) v7n_colsum(e, sm + ChainSmem::RING, t, s, sm + V7N_CS);
  bar_sync<V7N_BAR_BIAS, V7N_HN>();
  if (ok) v7n_bias(e, sm + V7N_CS, s, sm + ChainSmem::BIAS);
}

// v7i's helper publish, and the bias at the iteration's end.
struct V7NHelperPublish : V7IHelperPublish {
  __device__ __forceinline__ void before_hand(const V7Args& v, int t, int q, int h,
                                              const float* gl) const {
    V7IHelperPublish::before_hand(v, t, q, h, gl);
    // gl is sm + GL in every chain CTA (v7g_helpers' argument): the CTA's shared memory.
    v7n_helper_bias(v.e, t, h, const_cast<float*>(gl) - ChainSmem::GL);
  }
};

// Item `it`'s float4 of G_t (or the token) to chain CTA d's ring slot t % NB.
__device__ __forceinline__ void v7n_send(int t, int at, int d, float4 val, uint32_t ring_u,
                                         uint32_t bar_u) {
  const int slot = v7_slot(t);
  st_async4(mapa(ring_u + 4 * (slot * ChainSmem::GSLOT + at), d), val,
            mapa(bar_u + 8 * slot, d));
}

struct V7NTail {
  static constexpr bool RECEIVER_BIAS = true;
  static __device__ __forceinline__ int bytes(const V7Epoch& e, int t) { return v7n_g_bytes(e, t); }
  // After the loop (critical warps): the wait for G_{steps−1}, then b_steps from its rows.
  template <class Clock>
  static __device__ __forceinline__ bool last_g(const V7Epoch& e, int steps, int tid,
                                                uint32_t bar_u, const float* ring, float* bias,
                                                Clock& clock) {
    const int t = steps - 1;
    const bool ok = bounded_wait(bar_u + 8 * v7_slot(t), v7_parity(t),
                                 WAIT_G | blockIdx.x << 4 | steps << 12);
    const bool failed = bar_or<V7C_BAR_CRIT, V7C_CRIT>(!ok);
    clock.mark(V7C_WAIT_G);
    if (!failed) {
      float* cs = bias - ChainSmem::BIAS + V7N_CS;  // bias is sm + BIAS (v7g_chain's)
      v7n_colsum(e, ring, t, tid, cs);
      bar_sync<V7C_BAR_CRIT, V7C_CRIT>();
      v7n_bias(e, cs, tid, bias);
    }
    clock.mark(V7C_GRAM);
    return failed;
  }
  template <class Clock>
  __device__ __forceinline__ void operator()(const V7Args& v, int t, int q, int tid, float z,
                                             const int* labels, float* gl, uint32_t ring_u,
                                             uint32_t bar_u, float& loss, float& correct,
                                             Clock& clock) const {
    const int w = tid / 32, lane = tid & 31;
    V7MLoss<V7DeviceWarp> pend;
    v7m_softmax16(V7DeviceWarp{}, v.e, t, q, w, z, labels, gl, pend);
    __syncwarp();
    clock.mark(V7C_SOFTMAX);
    const V7MItem row = v7m_row_item(w, lane, 0);  // a lane's items carry one float4
    if (v7m_item_sent(v.e, t, q, row)) {
      const float4 val = *reinterpret_cast<const float4*>(gl + v7m_gl_at(row));
      for (int k = 0; k < V7M_ROW_ITEMS; ++k) {
        const V7MItem it = v7m_row_item(w, lane, k);
        v7n_send(t, v7m_slot_at(q, it), it.d, val, ring_u, bar_u);
      }
    }
    if (w == 0 && lane < V7_CHAIN)
      v7n_send(t, v7n_token_at(q), lane, make_float4(0.f, 0.f, 0.f, 0.f), ring_u, bar_u);
    clock.mark(V7C_SEND);
    bar_arrive<V7I_BAR_G, V7_T>();
    clock.mark(V7C_PUBLISH);
    v7m_loss_add(V7DeviceWarp{}, pend, loss, correct);
  }
};

// v7k's kernel with v7n's chain tail and helpers.
template <bool TIMED = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel_n(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  v7c_epoch<TIMED, GRAMS>(v, sm, V7FWorker<TIMED, V7XGatherPairs, true, V7JMma, V7KStep>{},
                         V7GChain<TIMED, V7NHelperPublish, V7NTail>{});
#endif
}

}  // namespace
