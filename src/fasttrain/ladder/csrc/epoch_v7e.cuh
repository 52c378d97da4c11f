// cuda-epoch v7e: v7c's chain (v7c_chain, unchanged) with workers whose update and partials run on
// the tensor cores: the v8 workers probe's bodies (v8_workers.cuh, "mma": m16n8k16 f16 → f32, W
// and G' split hi/lo fp16) in v7's protocol (epoch_v7e_math.cuh: L = 4, the bias on the chain,
// G_a from v7's global G, converted by the worker). Written without a GPU, not yet run on one.
//
// Why (H200, 2026-11-28, v7c in one launch, profiled step 3.90 µs): the chain waits 0.84 µs a step
// for the workers' partials, and the workers' own step is ~3.1 (update 1.19, partials 0.80, cluster
// barrier 0.58, load x 0.30, reduce 0.28). The probe's estimate (NOT measured) for its mma step is
// 0.9-1.7 µs; the chain's own work is ~2.8 µs a step, so if the estimate holds the chain becomes the
// bound: ~2.8-3.0 µs a step, ~1.3-1.5 ms an epoch of 469 steps (an estimate, against v7c's 1.967).
//
// The worker loop is a copy of v7d's (v7_worker<TIMED, true, V7GAhead>: the cluster barrier, the
// ok bits, the DSMEM reduce into the tagged words of v7b's ring, v7d's G fetched a step ahead; a
// body policy in v7_worker would have changed v7a-v7d's compiled kernels, whose measurements stand
// on them), its per-thread bodies swapped for the probe's:
//   x_t as halves (v8_store_xh<V7_XR>, slots 14, 15 zero), the update's sums by warps 0-7 (two
//   k-steps × hi, lo from zero, v8_mma_update_sums) and its apply (v8_mma_update_apply: the scale
//   (lr/255)·2⁻¹²/n_a), P_t by all 16 warps (v8_mma_partial: an m16 × n8 tile each, W·2⁸ split
//   hi/lo in registers), G_a's float4s turned into the B operand's pieces by the fetching threads
//   (V7GAheadH::stage, v7e_put_g) after the wait's barrier.
// The phases are v7's (epoch_v7_phases.cuh: V7W_*), so one reader serves every variant.
#pragma once
#include "epoch_v7d.cuh"
#include "epoch_v7e_math.cuh"

namespace {

// v7d's fetch-ahead, staged as the B operand's fp16 pieces (gs: the halves' region).
struct V7GAheadH : V7GAhead {
  __device__ __forceinline__ void stage(const V7Args& v, int a, int tid, float* gs) {
    if (tid < V7D_PF0) return;
    for (int k = 0; k < V7D_VEC; ++k) {
      const int i = v7d_vec(tid, k);
      v7e_put_g(i, g[k], v7d_vec_valid(v.e, a, i), v.e.rows(a), reinterpret_cast<__half*>(gs));
    }
  }
};

template <bool TIMED>
__device__ void v7e_worker(int k, int r, const V7Args& v, float* sm) {
  using S = V7ESmem;
  const V7Epoch& e = v.e;
  const int tid = threadIdx.x, wi = tid >> 5, steps = e.steps, f0 = (k * V7_CLUSTER + r) * V7_FW;
  __half* xh = reinterpret_cast<__half*>(sm + S::XH);
  float *w = sm + S::W, *gs = sm + S::GSH, *ured = sm + S::URED, *pbuf = sm + S::PBUF;
  const __half* gsh = reinterpret_cast<const __half*>(gs);
  int* okb = reinterpret_cast<int*>(sm + S::OK);
  for (int i = tid; i < 2 * BMAX * V7_GROW; i += V7_T) pbuf[i] = 0.f;
  if (tid < V8_NF * 16) {  // slots 14, 15 and classes 10 … 15: 0
    const int f = tid / 16, c = tid % 16;
    w[tid] = f < V7_FW && c < C ? v.a.w[c * K + f0 + f] : 0.f;
  }
  __syncthreads();
  cluster_barrier();  // every CTA of the cluster runs before anyone reads its shared memory
  V7PhaseClock<TIMED> clock;

  V7GAheadH gf;
  auto update = [&](int a) {  // as v7_worker's, on the tensor cores
    if (__syncthreads_or(!gf.wait(v, a, tid))) return false;
    clock.mark(V7W_WAIT_G);
    gf.stage(v, a, tid, gs);
    __syncthreads();
    v8_mma_update_sums(V8DeviceWarp{}, wi, xh + (a % V7_XR) * BMAX * 16, gsh, ured);
    __syncthreads();
    v8_mma_update_apply(e, a, ured, tid, w);
    __syncthreads();
    clock.mark(V7W_UPDATE);
    return true;
  };

  int applied = 0;
  bool failed = false;
  uint8_t xb[V7_XF];  // x_{t+1}'s bytes, loaded during step t
  worker_fetch_x(e, v.a.x, v.a.order, 0, f0, tid, V7_T, xb);
  v8_store_xh<V7_XR>(e, 0, tid, V7_T, xb, false, xh);
  for (int t = 0; t < steps; ++t) {
    const int p = t & 1;
    if (t + 1 < steps) worker_fetch_x(e, v.a.x, v.a.order, t + 1, f0, tid, V7_T, xb);
    clock.mark(V7W_LOAD_X);
    bool ok = true;
    for (; ok && applied < v7_applied_before(t); ++applied) ok = update(applied);
    __syncthreads();  // x_t in place (stored at the end of step t − 1)
    clock.mark(V7W_LOAD_X);
    float* pb = pbuf + p * BMAX * V7_GROW;
    if (ok)
      v8_mma_partial(V8DeviceWarp{}, wi, xh + (t % V7_XR) * BMAX * 16, w,
                     [&](int row, int c, float v0, float v1) {
                       *reinterpret_cast<float2*>(pb + row * V7_GROW + c) = make_float2(v0, v1);
                     });
    // x_{t+1} into slot (t + 1) % XR, whose x_{t−L−1} this step's last update read.
    if (t + 1 < steps) v8_store_xh<V7_XR>(e, t + 1, tid, V7_T, xb, false, xh);
    if (ok && applied < steps) gf.ahead(v, applied, tid);  // warps 8-15: the next update's G
    clock.mark(V7W_PARTIALS);
    if (tid == 0) okb[p] = ok;
    cluster_barrier();
    const int lane = tid % 32;
    const bool mine = lane >= V7_CLUSTER || ld_dsmem(smem_addr(okb + p), lane) != 0;
    const bool all = __all_sync(0xffffffffu, mine);
    clock.mark(V7W_BARRIER);
    if (!all) {  // uniform over the cluster: leave together, nobody reads a departed CTA
      cluster_barrier();
      return;
    }
    const uint32_t pb_u = smem_addr(pb);
    uint64_t* ring = v.s.ptag;
    worker_reduce(
        e, t, r, tid, [&](int src, int i) { return __uint_as_float(ld_dsmem(pb_u + 4 * i, src)); },
        [&](int row, int c, float val) {
          st_relaxed64(ring + v7b_word_at(t, k, row, c), v7b_word(val, t));
        });
    clock.mark(V7W_REDUCE);
    clock.mark(V7W_PUBLISH);
  }
  for (; !failed && applied < steps; ++applied) failed = !update(applied);
  cluster_barrier();  // the last step's partial buffers read by every rank
  clock.mark(V7W_BARRIER);
  if (failed) return;
  clock.write(steps);
  if (tid < V7_FW * C) v.a.w[(tid % C) * K + f0 + tid / C] = w[(tid / C) * 16 + tid % C];
}

// v7c's kernel (its chain; in one launch its producers, ticket, ring clear and reset wait) with
// v7e's workers.
template <bool TIMED>
struct V7EWorker {
  __device__ __forceinline__ void operator()(int k, int r, const V7Args& v, float* sm) const {
    v7e_worker<TIMED>(k, r, v, sm);
  }
};
template <bool TIMED = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel_e(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  v7c_epoch<TIMED, GRAMS>(v, sm, V7EWorker<TIMED>{});
#endif
}

}  // namespace
