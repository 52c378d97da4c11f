// cuda-epoch: a whole epoch of MNIST logistic-regression SGD (469 dependent steps) in ONE kernel
// launch, with no host involvement between steps.
//
// Design (Hopper): NC CTAs (NC = 7 or 14) split the 784 features; CTA r owns features
// [r*F, (r+1)*F), F = 784/NC, and keeps its slice of W ([10][F], fp32) in shared memory for the
// whole epoch. One step:
//   L  partial logits of the batch over my features; row b's partial is PUSHED into the inbox of
//      the CTA that owns row b (b % NC), through distributed shared memory (fire-and-forget
//      stores: nobody waits on a remote load)                                      barrier A
//   S  owners reduce their rows' NC partials, add the bias, softmax, loss/accuracy; each owner
//      pushes its rows of g = lr * (softmax - onehot) / nb into EVERY CTA's g      barrier B
//   G  every CTA has the full g [nb][10]: gradient and update of its own W slice (and of its
//      copy of the bias, identical in every CTA); nothing else leaves the CTA.
// The next batch's uint8 pixels (my F columns of its 128 rows) are gathered with cp.async while
// the current step computes, and the order indices two steps ahead likewise.
// Single inboxes suffice: a CTA writes step s+1's partials only after barrier B(s), which every
// owner reaches only after reducing step s's; it writes step s+1's g only after barrier A(s+1),
// which every CTA reaches only after its step-s gradient has read g.
//
// Fallback for GPUs without clusters (before sm_90): the same kernel over a cooperative grid of
// NC CTAs, inboxes in global memory (read with __ldcg: L1 is not coherent across SMs), grid.sync()
// for the barriers.
//
// fp32 arithmetic throughout; pixels are kept as 0..255 floats and the 1/255 scale is folded
// into the logits and the gradient (as in triton-fused).
//
// Versions (selectable: cuda_epoch_train's `version`; benchmarks/sync_cost.py times each):
//   v1 pull (each CTA read all NC partials of all 128 rows from the others' shared memory: 10x the
//      DSMEM traffic and stalls on remote loads).
//   v2 push with two barriers per step, 288 threads. H100, 14 CTAs: 3.89 ms/epoch = 8.3 µs/step
//      (7 CTAs: 9.8), of which ~2 x 0.5 µs is the barriers proper; the rest is serial work:
//      the bias gradient (10 threads each walking 128 rows of g after their share of G), G's
//      64-row dependent chains with x re-read once per class, scalar DSMEM stores to 14 CTAs
//      per warp instruction (L) and 14 scalar stores per g value (S), the barrier's release
//      waiting for those stores, and the next batch's widening on the critical path.
//   v3 (train_epoch_v3) the same two barriers and math, 512 threads: L split over feature halves
//      (half the chain), contiguous row ownership and 16-float records so pushes are float4s to
//      one or two CTAs per warp; barrier A split into arrive/wait with the next batch's
//      widening in between (its bytes are fetched two steps ahead, its order four); S sends
//      float4s; G keeps 5 classes x 4 features in registers (x read twice, not 10 times) over
//      RG row groups summed in shared memory; the bias gradient from the owners' partial sums
//      (NC adds, not 128). Expected 2.5-3.5 µs/step from counting its FMAs and barriers;
//      measured (H100, 2026-11-26, 14 CTAs) 2.73 ms/epoch = 5.82 µs/step.
//   v4 (train_epoch_v4, epoch_v4.cuh; the default on clusters) v3's step and fp32 math with
//      both cluster barriers replaced by point-to-point signals: partials go to their owner with
//      st.async completing bytes on the owner's mbarrier, g rows and bias partials to every CTA
//      likewise; each CTA waits only on its own mbarriers (try_wait.parity.acquire.cluster),
//      double-buffered inboxes and mbarriers by step parity (invariant in epoch_v4.cuh). Every
//      wait is bounded (~2^27 clocks); a timeout ends the launch and the host reports it
//      (cuda_epoch_signal_status). Clusters only: no cooperative-grid v4. Expected budget, H100,
//      14 CTAs, ~1.75 GHz: L 0.45 µs (16 warps x ~49 shared-memory wavefronts: 7 two-wavefront x
//      loads + 35 broadcast W loads) + hop 1 ~0.3 µs (DSMEM store latency + mbarrier wake, vs
//      0.55 µs for a barrier that also waits for the slowest CTA; the widening of the next batch
//      runs inside it) + S 0.2 µs (14 loads, 8 shuffles, exp/log per lane) + the g sends 0.1 µs
//      (616 float4 st.async over 512 threads) + hop 2 ~0.3 µs + G 0.45 µs (8 rows x 3 loads x
//      16 warps, 160 FMA a thread) + the row-group sum 0.1 µs + 4 CTA barriers 0.1 µs = ~2.0 µs
//      (range 1.6-2.4) = ~0.95 ms/epoch: ~0.5-1 µs a step under v3. The ≤1.07 µs target also
//      needs L and G shortened (they are shared-memory-latency bound, not FMA bound).
//      Measured (H100, 2026-11-26, 14 CTAs): 2.27 ms/epoch = 4.85 µs/step, weights equal to v3's:
//      2.4x the budget above. Where the time goes is measured by cuda_epoch_phase_profile (a
//      separate build of the kernel whose thread 0 sums clock64() per phase; its figures come
//      out of benchmarks/sync_cost.py).
//   v5 (StepV5, epoch_v5.cuh; H100 2026-11-27: 2.45 ms/epoch on 14 CTAs against v4's 2.30, so
//      the row stays on v4) v4's loop and signals (both now one driver,
//      train_epoch_signalled, over a step policy; v4's SASS is unchanged by it) with L and G on
//      tensor cores (WMMA 16x16x16 bf16 -> fp32, epoch_v5_math.cuh): the pixels are exact in
//      bf16, W and g are split into three bf16 parts each (24 significant bits, fp32's), so three
//      MMAs a tile give fp32-accurate sums. L: 8 warps, one 16-row tile each (12 MMAs at 14 CTAs),
//      sending their rows as soon as the tile is stored; G: 16 warps of (feature tile, row
//      quarter) (6 MMAs each) and an update that sums the quarters and re-splits W. Owners send g
//      already split (96 bytes a row instead of 64). Counted for 14 CTAs: L ~290 HMMA-issue clocks
//      and ~500 shared-memory wavefronts (v4: ~560 FMA-issue clocks a sub-partition and ~780
//      wavefronts), G ~290 and ~500 (v4: ~560 and ~450): the compute phases should take ~0.5 µs
//      less a step; how much of v4's 4.85 µs they are is what the phase profile measures.
//      Its tile indexing is checked on the CPU against float64 (tests/ladder/
//      test_cuda_epoch_v5_math.py, through a host stand-in of the WMMA API).
//   v6 (StepV6, epoch_v6.cuh; written without a GPU; on an H200, 14 CTAs, 2.05 ms/epoch against
//      v4's 2.30, so the row's version since) v4's loop, signals, inbox formats and softmax, with W in
//      REGISTERS for the whole epoch (35 a thread, replicated over L's row groups, every replica
//      applying the same fp32 update) and both products register-tiled (epoch_v6_math.cuh): L is
//      4 rows x 5 classes x 7 strided features a thread at 14 CTAs (140 FMA in 20 chains of 7,
//      28 conflict-free LDS.32 of x, no W load; v4: 42 LDS.128 for the same 140 FMA), its
//      feature lanes' sums combined by a 19-SHFL reduce-scatter after which each lane sends v4's
//      float4 or float; G keeps v4's partials and sums the row groups over 280 threads (8 LDS.128
//      and 2 SHFL each, v4: 140 threads x 16 serial LDS.128) into DW, which every thread reads
//      (9 LDS.128) into its registers. SASS, 14 CTAs: L 140 FFMA, 28 LDS, 19 SHFL (v4's: 42
//      LDS.128 and 5 SHFL for its 140 FMA); whole kernel, static: 261 shared loads (34 LDS.128)
//      against v4's 484 (84); 128 registers (the 512-thread cap), no spill. Its tiles run on the CPU for
//      whole cluster epochs against float64 (tests/ladder/test_cuda_epoch_v6_math.py).
//   v7a, v7b: the lagged-Gram step, two launches an epoch (its changelog and its entry points:
//      epoch_v7_api.cuh).
#include "epoch_v2.cuh"
#include "epoch_v3.cuh"
#include "epoch_v4.cuh"
#include "epoch_v5.cuh"
#include "epoch_v6.cuh"
#include "epoch_v7_launch.cuh"
#include "epoch_v7_api.cuh"

namespace {

// ---- kernels and launch ----------------------------------------------------------------------
template <int V>
struct Version;
template <>
struct Version<2> {
  static constexpr int threads = THREADS;
  template <int NC>
  using Shape = ::Shape<NC>;
};
template <>
struct Version<3> {
  static constexpr int threads = THREADS3;
  template <int NC>
  using Shape = Shape3<NC>;
};
template <>
struct Version<4> {  // cluster only: no epoch_grid_kernel<4, NC> is instantiated
  static constexpr int threads = THREADS4;
  template <int NC>
  using Shape = Shape4<NC>;
  template <int NC>
  using Step = StepV4<NC>;
};
template <>
struct Version<5> {  // cluster only, as v4
  static constexpr int threads = THREADS4;
  template <int NC>
  using Shape = Shape5<NC>;
  template <int NC>
  using Step = StepV5<NC>;
};
template <>
struct Version<6> {  // cluster only, as v4
  static constexpr int threads = THREADS4;
  template <int NC>
  using Shape = Shape6<NC>;
  template <int NC>
  using Step = StepV6<NC>;
};
// v4, v5, v6: point-to-point mbarrier signals, clusters only.
__host__ __device__ constexpr bool signalled(int v) { return v >= 4; }

template <int V, int NC, class Ex>
__device__ void train_epoch(Ex& ex, const Args& a, float* sm) {
  if constexpr (V == 2)
    train_epoch_v2<NC>(ex, a, sm);
  else
    train_epoch_v3<NC>(ex, a, sm);
}

// TIMED: v4's, v5's or v6's phase-profiling build (cuda_epoch_phase_profile), never the timed row's.
template <int V, int NC, bool TIMED = false>
__global__ void __launch_bounds__(Version<V>::threads, 1) epoch_cluster_kernel(Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];  // v5's MMA tiles: 32-byte aligned at least
  if constexpr (signalled(V)) {
    using Step = typename Version<V>::template Step<NC>;
    train_epoch_signalled<NC, Step, TIMED>(static_cast<int>(cg::this_cluster().block_rank()), a,
                                           sm);
  } else {
    using S = typename Version<V>::template Shape<NC>;
    ClusterExchange ex{cg::this_cluster(), sm + S::INBOX_OFF};
    train_epoch<V, NC>(ex, a, sm);
  }
#endif
}

template <int V, int NC>
__global__ void __launch_bounds__(Version<V>::threads, 1) epoch_grid_kernel(Args a) {
  extern __shared__ __align__(128) float sm[];
  using S = typename Version<V>::template Shape<NC>;
  GridExchange<S::INBOX> ex{cg::this_grid(), a.scratch};
  train_epoch<V, NC>(ex, a, sm);
}

// Launch `kernel` over `ctas` CTAs of `threads` threads as one cluster or one cooperative grid.
template <class Kernel, class... Params>
cudaError_t launch(Kernel kernel, int ctas, int threads, int smem, bool cluster,
                   cudaStream_t stream, Params... params) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess && cluster && ctas > 8)  // 8 is the portable cluster size
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (cluster) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = ctas;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
  } else {
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, params...);
}

template <int V, int NC>
cudaError_t train(const Args& a, bool cluster, cudaStream_t stream) {
  constexpr int threads = Version<V>::threads, smem = Version<V>::template Shape<NC>::BYTES;
  if constexpr (signalled(V))  // point-to-point signals on mbarriers: clusters only
    return cluster ? launch(epoch_cluster_kernel<V, NC>, NC, threads, smem, true, stream, a)
                   : cudaErrorInvalidValue;
  else
    return cluster ? launch(epoch_cluster_kernel<V, NC>, NC, threads, smem, true, stream, a)
                   : launch(epoch_grid_kernel<V, NC>, NC, threads, smem, false, stream, a);
}

__device__ __forceinline__ long long globaltimer_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void cluster_sync_kernel(int iters, long long* ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const long long t0 = globaltimer_ns();
  for (int i = 0; i < iters; ++i) cluster.sync();
  const long long t1 = globaltimer_ns();
  if (cluster.block_rank() == 0 && threadIdx.x == 0) *ns = t1 - t0;
#endif
}

__global__ void grid_sync_kernel(int iters, long long* ns) {
  cg::grid_group grid = cg::this_grid();
  grid.sync();
  const long long t0 = globaltimer_ns();
  for (int i = 0; i < iters; ++i) grid.sync();
  const long long t1 = globaltimer_ns();
  if (blockIdx.x == 0 && threadIdx.x == 0) *ns = t1 - t0;
}

}  // namespace

extern "C" {

// The name of a cudaError_t this library returned, for the Python side's message.
const char* cuda_epoch_error_name(int code) {
  if (code == SIGNAL_TIMEOUT) return "cudaEpochSignalTimeout";
  return cudaGetErrorName(static_cast<cudaError_t>(code));
}

// The variants, for the Python side: 1 if (ctas, version, cluster) is one, and its launch
// configuration. Versions: 2 (two whole cluster barriers a step, 288 threads; timed on an H100 at
// 3.89 ms/epoch with 14 CTAs), 3 (512 threads, barrier A split around the next batch's widening,
// vector pushes, register-blocked gradient, no serial bias loop), 4 (v3 with point-to-point
// mbarrier signals instead of the barriers; cluster only), 5 (v4 with its GEMMs on tensor cores
// at fp32 accuracy; cluster only), 6 (v4 with W in registers, L and G register-tiled; cluster
// only). ctas: 7 or 14.
int cuda_epoch_variant(int ctas, int version, int cluster, int* threads, int* smem_bytes) {
  if (version >= 4 && !cluster) return 0;  // no cooperative-grid v4 to v7
  if (version == 7) {  // ctas: the chain's; the launch holds V7_CTAS
    if (ctas != V7_CHAIN) return 0;
    *threads = V7_T;
    *smem_bytes = 4 * V7_SMEM_FLOATS;
    return 1;
  }
#define FT_VARIANT(V, NC)                                                  \
  if (ctas == NC && version == V) {                                        \
    *threads = Version<V>::threads;                                        \
    *smem_bytes = Version<V>::template Shape<NC>::BYTES;                   \
    return 1;                                                              \
  }
  FT_VARIANT(2, 7)
  FT_VARIANT(2, 14)
  FT_VARIANT(3, 7)
  FT_VARIANT(3, 14)
  FT_VARIANT(4, 7)
  FT_VARIANT(4, 14)
  FT_VARIANT(5, 7)
  FT_VARIANT(5, 14)
  FT_VARIANT(6, 7)
  FT_VARIANT(6, 14)
#undef FT_VARIANT
  return 0;
}

// Bytes of the global scratch the grid variant needs for `ctas` CTAs (0 for a bad `ctas`): room
// for the larger inboxes of either version.
long long cuda_epoch_scratch_bytes(int ctas) {
  auto most = [](long long a, long long b) { return a > b ? a : b; };
  if (ctas == 7) return 4LL * 7 * most(Shape<7>::INBOX, Shape3<7>::INBOX);
  if (ctas == 14) return 4LL * 14 * most(Shape<14>::INBOX, Shape3<14>::INBOX);
  return 0;
}

// One epoch of SGD in one launch: x uint8 [n][784], y int32 [n], order int32 [n], w fp32
// [10][784] and b fp32 [10] updated in place, stats fp32 [2] += (sum of losses, correct count).
// ctas: 7 or 14 (features split 112 or 56 each); cluster: 1 = thread-block cluster (sm_90+),
// 0 = cooperative grid with `scratch` (cuda_epoch_scratch_bytes) for the inboxes; version: 2 to
// 7 (cuda_epoch_variant; 4 to 7 need cluster = 1; 7: ctas = 8 and `scratch` of
// cuda_epoch_v7_scratch_bytes, two launches). Returns 0 or a cudaError_t (of the launch: a
// v4 protocol timeout shows in cuda_epoch_signal_status).
int cuda_epoch_train(const void* x, const void* y, const void* order, int n, int bs, float lr,
                     void* w, void* b, void* stats, void* scratch, int ctas, int cluster,
                     int version, cudaStream_t stream) {
  if (n < 1 || bs < 1 || bs > BMAX || (!cluster && scratch == nullptr))
    return cudaErrorInvalidValue;
  const Args a{static_cast<const uint8_t*>(x), static_cast<const int*>(y),
               static_cast<const int*>(order), n, bs, lr, static_cast<float*>(w),
               static_cast<float*>(b), static_cast<float*>(stats), static_cast<float*>(scratch)};
  const bool cl = cluster != 0;
  if (version == 2 && ctas == 7) return train<2, 7>(a, cl, stream);
  if (version == 2 && ctas == 14) return train<2, 14>(a, cl, stream);
  if (version == 3 && ctas == 7) return train<3, 7>(a, cl, stream);
  if (version == 3 && ctas == 14) return train<3, 14>(a, cl, stream);
  if (version == 4 && ctas == 7) return train<4, 7>(a, cl, stream);
  if (version == 4 && ctas == 14) return train<4, 14>(a, cl, stream);
  if (version == 5 && ctas == 7) return train<5, 7>(a, cl, stream);
  if (version == 5 && ctas == 14) return train<5, 14>(a, cl, stream);
  if (version == 6 && ctas == 7) return train<6, 7>(a, cl, stream);
  if (version == 6 && ctas == 14) return train<6, 14>(a, cl, stream);
  if (version == 7 && ctas == V7_CHAIN && cl) return train_v7_variant(a, V7A, stream);
  return cudaErrorInvalidValue;
}

// v4's protocol check, after its launches on `stream`: waits for them, then reads and clears the
// sticky flag its bounded waits set on a timeout. Returns 0, a cudaError_t, or SIGNAL_TIMEOUT
// (20001) with *detail = kind (1 partials, 2 g) | CTA rank << 4 | step << 12 of the first wait
// that timed out. A launch that finds the flag set does nothing, so the first failure is kept.
// One epoch of v4, v5 or v6 (`version`) on a cluster by its phase-profiling build (the same
// arithmetic: it trains), then, per CTA, the clocks its thread 0 spent in each phase (out: ctas x
// PHASES, row-major) and CTA 0's loop span in ns and step count (span: 2). Syncs the stream.
int cuda_epoch_phase_profile(const void* x, const void* y, const void* order, int n, int bs,
                             float lr, void* w, void* b, void* stats, int ctas, int version,
                             unsigned long long* out, long long* span, cudaStream_t stream) {
  if (n < 1 || bs < 1 || bs > BMAX) return cudaErrorInvalidValue;
  const Args a{static_cast<const uint8_t*>(x), static_cast<const int*>(y),
               static_cast<const int*>(order), n, bs, lr, static_cast<float*>(w),
               static_cast<float*>(b), static_cast<float*>(stats), nullptr};
  cudaError_t err = cudaErrorInvalidValue;
#define FT_PROFILE(V, NC)                                                                       \
  if (version == V && ctas == NC)                                                              \
    err = launch(epoch_cluster_kernel<V, NC, true>, NC, THREADS4,                              \
                 Version<V>::template Shape<NC>::BYTES, true, stream, a);
  FT_PROFILE(4, 7)
  FT_PROFILE(4, 14)
  FT_PROFILE(5, 7)
  FT_PROFILE(5, 14)
  FT_PROFILE(6, 7)
  FT_PROFILE(6, 14)
#undef FT_PROFILE
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess)
    err = cudaMemcpyFromSymbol(out, g_phase_clocks, sizeof(unsigned long long) * ctas * PHASES);
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(span, g_phase_ns, sizeof(long long) * 2);
  return err;
}

int cuda_epoch_signal_status(cudaStream_t stream, int* detail) {
  int flag = 0;
  *detail = 0;
  cudaError_t err = cudaMemcpyFromSymbolAsync(&flag, g_signal_error, sizeof(int), 0,
                                              cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return err;
  if (flag == 0) return 0;
  const int zero = 0;
  err = cudaMemcpyToSymbolAsync(g_signal_error, &zero, sizeof(int), 0, cudaMemcpyHostToDevice,
                                stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  *detail = flag;
  return SIGNAL_TIMEOUT;
}

// Test hook of the bounded waits: fault 1 makes the next v4 (v5, v6) launches' CTA 0 wait at step
// 2 for bytes that never come (see epoch_v4.cuh); fault 2 makes v7's chain CTA 0 wait at step 2
// for a worker counter no worker reaches (v7a) or a partial tag no step writes (v7b); 0 switches
// it off. Returns 0 or a cudaError_t.
int cuda_epoch_signal_fault(int fault) {
  return cudaMemcpyToSymbol(g_signal_fault, &fault, sizeof(int));
}

// Microbenchmarks: `iters` back-to-back barriers over `ctas` CTAs; *ns (device) = their total
// time in ns, from the GPU's global timer.
int cuda_epoch_bench_cluster_sync(int ctas, int iters, long long* ns, cudaStream_t stream) {
  return launch(cluster_sync_kernel, ctas, THREADS, 0, true, stream, iters, ns);
}

int cuda_epoch_bench_grid_sync(int ctas, int iters, long long* ns, cudaStream_t stream) {
  return launch(grid_sync_kernel, ctas, THREADS, 0, false, stream, iters, ns);
}

}  // extern "C"
