// Probes that set cuda-epoch v7's lag (docs/measurements/cuda-epoch-v7-design.md, step 1): what one
// global-memory hand-off between SMs costs, and whether v7's 128 CTAs in clusters can all be
// resident at once. Called by benchmarks/sync_cost.py through ladder/sync_probes.py.
//
// - ping-pong: two CTAs, one an SM, bounce one counter through L2 with st.release.gpu /
//   ld.acquire.gpu; each hand-off optionally carries a payload written with plain stores before the
//   release and read (and checked) after the acquire, as v7's G and partials travel;
// - broadcast: one producer CTA releases a flag that `consumers` CTAs poll at once (v7's chain →
//   56 workers); each consumer stamps the global timer when it sees it;
// - co-residency: cudaOccupancyMaxActiveClusters for a role's threads and shared memory, and a
//   launch of clusters (optionally cooperative) whose CTAs count who has arrived.
//
// The ping-pong's and the broadcast's protocols are sync_probes.cuh's, run here by the CTAs of a
// cooperative launch and on the CPU by threads (tests/ladder/csrc/sync_probes_host.cu).
//
// Versions:
//   v1 the three probes. Written and compiled for sm_90a; not yet run on a GPU (the protocols'
//      bookkeeping run on the CPU).
//
// Every entry point returns 0 or a cudaError_t; a failed launch's error is cleared so that torch's
// own launch checks do not find it later.
#include <cuda_runtime.h>
#include <stdint.h>

#include "sync_probes.cuh"

namespace {

using namespace probes;

constexpr int THREADS = 256;
// A wait this long is a deadlock (a peer not resident), reported instead of hanging the GPU.
constexpr long long TIMEOUT_NS = 1000000000LL;

// out[] of the resident launch.
enum Resident { RS_ALL_SEEN, RS_CLUSTER_SIZE, RS_LEN };

__device__ __forceinline__ long long globaltimer_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The two halves of every hand-off, at GPU scope (the peers are on other SMs, maybe other GPCs).
__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void red_add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

struct DeviceCta {  // the CTA's threads; thread 0 polls and releases
  __device__ bool leader() const { return threadIdx.x == 0; }
  template <class F>
  __device__ void each(int n, F&& f) const {
    for (int i = threadIdx.x; i < n; i += blockDim.x) f(i);
  }
  __device__ void sync() const { __syncthreads(); }
  __device__ void release(unsigned* p, unsigned v) const { store_release(p, v); }
  __device__ unsigned acquire(const unsigned* p) const { return load_acquire(p); }
  __device__ void add_release(unsigned* p, unsigned v) const { red_add_release(p, v); }
  __device__ void add(long long* p, long long v) const {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  }
  __device__ long long now_ns() const { return globaltimer_ns(); }
  __device__ void relax() const {}  // spin flat out: the hand-off's latency is the figure
  __device__ long long timeout_ns() const { return TIMEOUT_NS; }
  __device__ long long smid() const {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
  }
};

// Two CTAs, on two SMs (see pingpong_smem).
__global__ void __launch_bounds__(THREADS)
    pingpong_kernel(int rounds, int words, unsigned* flag, unsigned* payload, long long* out) {
  __shared__ int ok;
  pingpong(DeviceCta(), ok, blockIdx.x, rounds, words, flag, payload, out);
}

// CTA 0 produces, CTAs 1 … consumers poll.
__global__ void __launch_bounds__(THREADS)
    broadcast_kernel(int rounds, unsigned* flag, unsigned* arrivals, long long* stamps,
                     long long* out) {
  if (threadIdx.x != 0) return;
  if (blockIdx.x == 0)
    broadcast_producer(DeviceCta(), gridDim.x - 1, rounds, flag, arrivals, stamps, out);
  else
    broadcast_consumer(DeviceCta(), blockIdx.x - 1, rounds, flag, arrivals, stamps, out);
}

// Every CTA arrives on `arrivals` and waits (bounded) until the whole grid has: a CTA that sees
// everyone proves the grid was resident at once, which v7's spinning roles need.
// Its dynamic shared memory is only reserved (never touched): it sizes the CTA like a v7 role's.
__global__ void resident_kernel(unsigned* arrivals, long long* out) {
  if (threadIdx.x != 0) return;
  const DeviceCta cta;
  cta.add_release(arrivals, 1);
  if (wait_at_least(cta, arrivals, gridDim.x)) cta.add(out + RS_ALL_SEEN, 1);
  if (blockIdx.x == 0) {
    unsigned n = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
#endif
    out[RS_CLUSTER_SIZE] = n;
  }
}

// More than half an SM's shared memory a CTA: no two CTAs of the ping-pong share an SM (the
// kernel also reports the SMs it ran on). -1 where one CTA may not ask for that much.
int pingpong_smem() {
  int dev, per_sm, per_block;
  if (cudaGetDevice(&dev) || cudaDeviceGetAttribute(&per_sm,
                                                    cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                                    dev) ||
      cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev))
    return -1;
  const int smem = per_sm / 2 + 1;
  return smem <= per_block ? smem : -1;
}

// A launch of `kernel` over `ctas` CTAs: clusters of `cluster` CTAs (0: none), cooperative or not.
template <class Kernel, class... Params>
cudaError_t launch(Kernel kernel, int ctas, int threads, int smem, int cluster, bool cooperative,
                   cudaStream_t stream, Params... params) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (!err && cluster > 8)  // 8 is the portable cluster size
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cluster) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n].val.cooperative = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, params...);
}

// The first error of a probe; a launch's own error is also the runtime's "last error", which is
// cleared here so that it does not surface in torch's next launch check.
int status(cudaError_t err) {
  if (err) cudaGetLastError();
  return static_cast<int>(err);
}

}  // namespace

extern "C" {

int sync_probe_pingpong_out_len() { return PP_LEN; }
int sync_probe_broadcast_header_len() { return BC_HEADER; }
int sync_probe_resident_out_len() { return RS_LEN; }

// One launch of the ping-pong: rounds round trips (plus a warm-up one), `words` 32-bit payload
// words each way. flag [1], payload [2 × words], out [PP_LEN] (int64): zeroed here.
int sync_probe_pingpong(int rounds, int words, unsigned* flag, unsigned* payload, long long* out,
                        cudaStream_t stream) {
  if (rounds < 1 || words < 0) return status(cudaErrorInvalidValue);
  const int smem = pingpong_smem();
  if (smem < 0) return status(cudaErrorInvalidConfiguration);
  cudaError_t err = cudaMemsetAsync(flag, 0, sizeof(unsigned), stream);
  if (!err) err = cudaMemsetAsync(out, 0, PP_LEN * sizeof(long long), stream);
  // Cooperative: both CTAs are resident or the launch fails (a lone CTA would wait forever).
  if (!err) err = launch(pingpong_kernel, 2, THREADS, smem, 0, true, stream, rounds, words, flag,
                         payload, out);
  return status(err);
}

// The broadcast to `consumers` CTAs, rounds timed rounds (plus a warm-up one). flag [1],
// arrivals [1], stamps [consumers] (int64), out [BC_HEADER + 2 × rounds] (int64): zeroed here.
int sync_probe_broadcast(int consumers, int rounds, unsigned* flag, unsigned* arrivals,
                         long long* stamps, long long* out, cudaStream_t stream) {
  if (consumers < 1 || rounds < 1) return status(cudaErrorInvalidValue);
  const int smem = pingpong_smem();  // one CTA an SM, as v7's roles
  if (smem < 0) return status(cudaErrorInvalidConfiguration);
  cudaError_t err = cudaMemsetAsync(flag, 0, sizeof(unsigned), stream);
  if (!err) err = cudaMemsetAsync(arrivals, 0, sizeof(unsigned), stream);
  if (!err) err = cudaMemsetAsync(out, 0, (BC_HEADER + 2 * rounds) * sizeof(long long), stream);
  if (!err) err = launch(broadcast_kernel, consumers + 1, THREADS, smem, 0, true, stream, rounds,
                         flag, arrivals, stamps, out);
  return status(err);
}

// cudaOccupancyMaxActiveClusters for clusters of `cluster` CTAs of `threads` threads and `smem`
// bytes of dynamic shared memory (host outputs: *clusters, and *regs, the registers a thread of
// the probe kernel uses: a real role's registers can only lower the answer). The CUDA 13.0
// runtime API's note on it: "Runtime environment may affect how the hardware schedules the
// clusters, so the calculated occupancy is not guaranteed to be achievable" — hence the launch
// below, which counts the CTAs that were resident.
// https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__OCCUPANCY.html
int sync_probe_max_active_clusters(int cluster, int threads, int smem, int* clusters, int* regs) {
  cudaError_t err = cudaFuncSetAttribute(resident_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (!err && cluster > 8)
    err = cudaFuncSetAttribute(resident_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncAttributes attrs;
  if (!err) err = cudaFuncGetAttributes(&attrs, resident_kernel);
  if (err) return status(err);
  *regs = attrs.numRegs;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster);  // must be a multiple of the cluster; the count is the answer
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return status(cudaOccupancyMaxActiveClusters(clusters, resident_kernel, &cfg));
}

// `clusters` clusters of `cluster` CTAs launched at once, with cudaLaunchAttributeClusterDimension
// and, if `cooperative`, cudaLaunchAttributeCooperative. What the CUDA 13.0 documentation says of
// the pair: cuLaunchKernelEx (cuda.h) — "Setting CU_LAUNCH_ATTRIBUTE_COOPERATIVE to a non-zero
// value causes the kernel launch to be a cooperative launch, with exactly the same usage and
// semantics of cuLaunchCooperativeKernel"; cudaLaunchCooperativeKernel (cuda_runtime_api.h) — "The
// total number of blocks launched cannot exceed the maximum number of blocks per multiprocessor as
// returned by cudaOccupancyMaxActiveBlocksPerMultiprocessor ... times the number of
// multiprocessors", a limit that knows nothing of clusters. Neither says whether the two attributes
// may be combined, nor whether the cooperative check then accounts for the GPCs that clusters are
// placed in: this launch finds out. arrivals [1], out [RS_LEN] (int64): zeroed here.
int sync_probe_resident_launch(int clusters, int cluster, int threads, int smem, int cooperative,
                               unsigned* arrivals, long long* out, cudaStream_t stream) {
  if (clusters < 1 || cluster < 1) return status(cudaErrorInvalidValue);
  cudaError_t err = cudaMemsetAsync(arrivals, 0, sizeof(unsigned), stream);
  if (!err) err = cudaMemsetAsync(out, 0, RS_LEN * sizeof(long long), stream);
  if (!err) err = launch(resident_kernel, clusters * cluster, threads, smem, cluster,
                         cooperative != 0, stream, arrivals, out);
  return status(err);
}

const char* sync_probe_error_name(int code) {
  return cudaGetErrorName(static_cast<cudaError_t>(code));
}

const char* sync_probe_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // extern "C"
