// cuda-epoch v8's workers alone, as a GPU probe (docs/measurements/cuda-epoch-v8-design.md,
// "Build first" step 3): the 56 worker CTAs (7 clusters of 8, one CTA an SM, 512 threads) run a
// whole epoch with NO chain. G'_a for every step is a global array written before the launch, so
// nothing waits for G and the time a step is the workers' throughput, the design's binding
// unknown (v7a's measured worker step, H200: 3.5 µs, ~3.1 without its publish).
//
// What it measures: each CTA stamps %globaltimer after its setup (W̃'s slice, x_0, the mbarriers,
// a cluster barrier) and after its last step's reduce; the result is (end − start)/steps, the
// median over the 56 CTAs (ladder/v8_workers.py) (mma-scatter: its span ends after the last
// step's deferred reduce). Thread 0 also sums clock64 over four phases of
// every step (load: the x and G fetches issued; update; partials and the x store; reduce), so the
// same run says where a step goes. The drain (the last L updates after the last step) is outside
// the span.
//
// Variants (template parameter V, csrc/v8_workers.cuh's bodies, the same the host harness runs):
//   V8_SIMT     v7's worker bodies (epoch_v7_math.cuh) + the bias slot; cluster barrier + DSMEM
//               reduce (v7's worker_reduce): the baseline, which must reproduce v7's ~3.1 µs a
//               step (less its G wait and publish) for a comparison to mean anything;
//   V8_MMA      the update and the partials on the tensor cores (m16n8k16 f16 → f32, hi/lo pieces),
//               the same cluster-barrier reduce;
//   V8_SCATTER  as V8_MMA, but a reduce-scatter: each warp's m16 tile of P_t goes by st.async (8 bytes a store) into
//               the owning rank's inbox slot t % V8_NS (an mbarrier with complete_tx a slot, armed
//               by its owner for 8 KiB), no cluster barrier; the owner reduces step t − 1's slot
//               during step t (after step t's sends: the stores' latency off the path; v8's P_t
//               has L steps of slack), then arrives on each sender's free[slot] mbarrier (count 8),
//               which a sender waits on before it writes that slot again.
// Outputs: every step's cluster P_t ([steps][7][128][10]) and every worker's final W̃ slice
// ([785][10]); per CTA the int64 record V8Out.
//
// Versions:
//   v1 the three variants. Written and compiled for sm_90a (ptxas: tests/ladder/test_v8_workers.py
//      holds no spill and the launch bound); NOT YET RUN ON A GPU. The bodies' arithmetic ran on
//      the CPU (tests/ladder/csrc/v8_workers_host.cu); the sync (st.async, the credits, the
//      cluster barrier) is only the GPU tests'.
#include <cuda_runtime.h>
#include <stdint.h>

#include "epoch_v7_sync.cuh"
#include "v8_workers.cuh"

namespace {

// The per-CTA record (int64), checked by ladder/v8_workers.py at load.
enum V8Out {
  V8O_START_NS,    // %globaltimer after the setup
  V8O_END_NS,      // after the last step's reduce
  V8O_CLK_LOAD,    // clock64 sums over the steps, thread 0: the x / G fetches issued
  V8O_CLK_UPDATE,  // the updates (G staged, the sums, the apply)
  V8O_CLK_PART,    // the partials and x_{t+1}'s store (scatter: with the credit wait, the sends)
  V8O_CLK_REDUCE,  // the reduce (cluster barrier or inbox wait, the sums, the stores)
  V8O_SMID,
  V8O_LEN
};

struct V8Args {
  V8Shape s;
  const uint8_t* x;
  const int* order;
  const __half* gh;  // [steps][BMAX][16]
  const __half* gl;
  const float* w0;   // [785][10]
  float* p;          // [steps][7][BMAX][10]
  float* w;          // [785][10]
  long long* out;    // [56][V8O_LEN]
};

__device__ __forceinline__ long long v8_now_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t v8_smid() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}
// v8k_remote_arrive, v8k_st8: v8_cluster_ptx.cuh (v7f and the chain cluster use them too).
constexpr int V8_WAIT_CODE = 0x80;  // | kind << 4 | CTA << 8 | step << 16 in g_signal_error

template <int V>
__global__ void __launch_bounds__(V7_T, 1) v8_workers_kernel(V8Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using S = V8Smem;
  extern __shared__ __align__(128) float sm[];
  const int q = blockIdx.x, k = q / V7_CLUSTER, r = q % V7_CLUSTER, tid = threadIdx.x,
            wi = tid >> 5, T = V7_T;
  const V7Epoch e = v8_epoch(v.s);
  const int steps = e.steps, f0 = v8_f0(q);
  const bool bias = v8_has_bias(q);
  float *xs = sm + S::XS, *w = sm + S::W, *gs = sm + S::GS, *ured = sm + S::URED,
        *pbuf = sm + S::PBUF, *inbox = sm + S::INBOX;
  __half* xh = reinterpret_cast<__half*>(xs);
  __half* gsh = reinterpret_cast<__half*>(gs);
  const uint32_t full_u = smem_addr(sm + S::BAR), free_u = full_u + 8 * V8_NS;
  for (int i = tid; i < V8_NF * 16; i += T) w[i] = 0.f;  // classes 10 … 15 are read as 0
  __syncthreads();
  if (tid < V8_NF * C) {
    const int f = tid / C, c = tid % C, row = v8_w_row(q, f);
    if (row >= 0) w[f * 16 + c] = v.w0[row * C + c];
  }
  if (V == V8_SCATTER && tid < V8_NS) {
    mbar_init(full_u + 8 * tid, 1);   // its owner's arm
    mbar_init(free_u + 8 * tid, V7_CLUSTER);  // the 8 receivers' credits
    mbar_init_fence();
  }
  uint8_t xb[V7_XF];  // x_{t+1}'s bytes, loaded during step t
  uint32_t gr[4];     // the next update's G' pieces, loaded an update ahead
  worker_fetch_x(e, v.x, v.order, 0, f0, tid, T, xb);
  if (V == V8_SIMT)
    worker_store_x(e, 0, tid, T, xb, v8_v7_view(xs, 0));
  else
    v8_store_xh(e, 0, tid, T, xb, bias, xh);
  v8_fetch_g(v.gh, v.gl, tid, T, gr);
  __syncthreads();
  cluster_barrier();  // every CTA's shared memory and mbarriers ready before anyone touches them
  long long clk[4] = {0, 0, 0, 0}, last = clock64();
  auto mark = [&](int ph) {
    const long long now = clock64();
    clk[ph] += now - last;
    last = now;
  };
  const long long start = v8_now_ns();

  auto update = [&](int a) {
    if (V == V8_SIMT)
      v8_put_g_simt(e, a, gr, tid, T, gs);
    else
      v8_put_g_mma(gr, tid, T, gsh);
    if (a + 1 < steps)
      v8_fetch_g(v.gh + size_t(a + 1) * BMAX * 16, v.gl + size_t(a + 1) * BMAX * 16, tid, T, gr);
    __syncthreads();
    if (V == V8_SIMT) {
      worker_update_sums(e, a, v8_v7_view(xs, a), gs, tid, ured);
      v8_simt_bias_sums(e, a, gs, tid, bias, ured);
      __syncthreads();
      worker_update_apply(e, ured, tid, w);
      v8_simt_bias_apply(e, ured, tid, bias, w);
    } else {
      v8_mma_update_sums(V8DeviceWarp{}, wi, xh + (a % V8_XR) * BMAX * 16, gsh, ured);
      __syncthreads();
      v8_mma_update_apply(e, a, ured, tid, w);
    }
    __syncthreads();
  };

  // mma-scatter: my rows of P_u from inbox slot u % NS (all 8 senders' bytes landed), then a
  // credit to each sender's free[slot]. Run for step u = t − 1 during step t (P_t has L steps of
  // slack in v8), so the st.asyncs' latency is off the step's path.
  auto reduce_slot = [&](int u) {
    const int slot = v8_ns_slot(u);
    const bool landed = bounded_wait(full_u + 8 * slot, v8_full_parity(u),
                                     V8_WAIT_CODE | 2 << 4 | q << 8 | u << 16);
    worker_reduce(e, u, r, tid,
                  [&](int src, int i) { return inbox[v8_inbox_at(slot, src, i / V7_GROW, i % V7_GROW)]; },
                  [&](int row, int c, float val) { v.p[v8_p_at(u, k, row, c)] = val; });
    __syncthreads();  // every read of the slot done: credit the 8 senders
    if (tid < V7_CLUSTER) v8k_remote_arrive(free_u + 8 * slot, tid);
    return landed;
  };

  int applied = 0;
  bool ok = true;
  for (int t = 0; t < steps; ++t) {
    const int p = t & 1, slot = v8_ns_slot(t);
    if (V == V8_SCATTER && tid == 0) mbar_arm(full_u + 8 * slot, V8_SLOT_BYTES);
    if (t + 1 < steps) worker_fetch_x(e, v.x, v.order, t + 1, f0, tid, T, xb);
    mark(0);
    for (; applied < v8_applied_before(t); ++applied) update(applied);
    __syncthreads();  // x_t in place (stored at the end of step t − 1)
    mark(1);
    float* pb = pbuf + p * BMAX * V7_GROW;
    if (V == V8_SIMT) {
      worker_partial(e, t, v8_v7_view(xs, t), w, tid, pb);
      v8_simt_bias_partial(e, t, w, tid, bias, pb);
    } else if (V == V8_MMA) {
      v8_mma_partial(V8DeviceWarp{}, wi, xh + (t % V8_XR) * BMAX * 16, w,
                     [&](int row, int c, float v0, float v1) {
                       *reinterpret_cast<float2*>(pb + row * V7_GROW + c) = make_float2(v0, v1);
                     });
    } else {
      if (t >= V8_NS)  // the 8 receivers have read this slot's previous step
        ok &= bounded_wait(free_u + 8 * slot, v8_free_parity(t),
                           V8_WAIT_CODE | 1 << 4 | q << 8 | t << 16);
      const uint32_t in_u = smem_addr(inbox);
      v8_mma_partial(V8DeviceWarp{}, wi, xh + (t % V8_XR) * BMAX * 16, w,
                     [&](int row, int c, float v0, float v1) {
                       const int dst = row / V7_RPC;
                       v8k_st8(mapa(in_u + 4 * v8_inbox_at(slot, r, row, c), dst), v0, v1,
                                    mapa(full_u + 8 * slot, dst));
                     });
    }
    // x_{t+1} into slot (t + 1) % XR, whose x_{t−L−1} this step's last update read.
    if (t + 1 < steps) {
      if (V == V8_SIMT)
        worker_store_x(e, t + 1, tid, T, xb, v8_v7_view(xs, t + 1));
      else
        v8_store_xh(e, t + 1, tid, T, xb, bias, xh);
    }
    mark(2);
    if (V == V8_SCATTER) {
      if (t >= 1) ok &= reduce_slot(t - 1);  // a step late: its stores have had a step to land
    } else {
      cluster_barrier();
      const uint32_t pb_u = smem_addr(pb);
      worker_reduce(e, t, r, tid,
                    [&](int src, int i) { return __uint_as_float(ld_dsmem(pb_u + 4 * i, src)); },
                    [&](int row, int c, float val) { v.p[v8_p_at(t, k, row, c)] = val; });
    }
    mark(3);
  }
  if (V == V8_SCATTER && steps >= 1) ok &= reduce_slot(steps - 1);
  const long long end = v8_now_ns();
  for (; applied < steps; ++applied) update(applied);
  cluster_barrier();  // nobody leaves while a peer may still read or write its shared memory
  if (tid < V8_NF * C) {
    const int f = tid / C, c = tid % C, row = v8_w_row(q, f);
    if (row >= 0) v.w[row * C + c] = w[f * 16 + c];
  }
  if (tid == 0) {
    long long* o = v.out + q * V8O_LEN;
    o[V8O_START_NS] = start;
    o[V8O_END_NS] = ok ? end : -1;
    for (int ph = 0; ph < 4; ++ph) o[V8O_CLK_LOAD + ph] = clk[ph];
    o[V8O_SMID] = v8_smid();
  }
#endif
}

template <int V>
cudaError_t v8_launch(const V8Args& a, cudaStream_t stream) {
  const int smem = 4 * V8Smem::FLOATS;
  cudaError_t err = cudaFuncSetAttribute(v8_workers_kernel<V>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(V7_WORKERS);
  cfg.blockDim = dim3(V7_T);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = V7_CLUSTER;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, v8_workers_kernel<V>, a);
}

int v8_status(cudaError_t err) {  // a launch's error cleared, so torch's next check is clean
  if (err) cudaGetLastError();
  return static_cast<int>(err);
}

}  // namespace

extern "C" {

int v8w_out_len() { return V8O_LEN; }
int v8w_lag() { return V8_LAG; }
int v8w_variants() { return V8_VARIANTS; }
const char* v8w_error_name(int err) { return cudaGetErrorName(static_cast<cudaError_t>(err)); }

// One epoch of `variant` (V8Variant) on `stream`, synchronously. Device pointers: x [n][784] u8,
// order [n], gh/gl [steps][128][16] fp16 bits, w0/w [785][10], p [steps][7][128][10], out
// [56][V8O_LEN]. Returns 0, a cudaError_t, or -1 (bad arguments) / -2 (a wait timed out: *signal
// gets g_signal_error's code).
int v8w_run(int variant, int n, int bs, float lr, const void* x, const void* order, const void* gh,
            const void* gl, const void* w0, void* p, void* w, void* out, void* stream, int* signal) {
  if (variant < 0 || variant >= V8_VARIANTS || n < 1 || bs < 1 || bs > BMAX) return -1;
  const V8Args a{{n, bs, (n + bs - 1) / bs, lr},
                 static_cast<const uint8_t*>(x),
                 static_cast<const int*>(order),
                 static_cast<const __half*>(gh),
                 static_cast<const __half*>(gl),
                 static_cast<const float*>(w0),
                 static_cast<float*>(p),
                 static_cast<float*>(w),
                 static_cast<long long*>(out)};
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int zero = 0;
  cudaError_t err = cudaMemcpyToSymbolAsync(g_signal_error, &zero, sizeof zero, 0,
                                            cudaMemcpyHostToDevice, s);
  if (!err) err = variant == V8_SIMT  ? v8_launch<V8_SIMT>(a, s)
                  : variant == V8_MMA ? v8_launch<V8_MMA>(a, s)
                                      : v8_launch<V8_SCATTER>(a, s);
  if (!err) err = cudaStreamSynchronize(s);
  if (!err) err = cudaMemcpyFromSymbol(signal, g_signal_error, sizeof *signal);
  if (err) return v8_status(err);
  return *signal ? -2 : 0;
}

}  // extern "C"
