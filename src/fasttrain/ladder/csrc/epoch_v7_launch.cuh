// cuda-epoch v7's host side (epoch_v7_api.cuh's entry points call it): the launch configuration,
// each variant's epoch kernel (v7_kernel: v7a … v7k, v7m, v7n, TIMED or not, for either `grams`), an
// epoch's two launches (the Grams by either Gram kernel, then the epoch kernel) or its one launch
// (`grams` V7_GRAMS_LAUNCH: the epoch kernel with its producer clusters, epoch_v7l.cuh), and the
// phase profile's read-back. v7's variants: V7A (0) … V7K (10), V7M (11), V7N (12), the `variant` of the
// entry points (cuda_epoch.V7_VARIANTS); `grams` is independent of it.
#pragma once
#include "epoch_v7.cuh"
#include "epoch_v7c.cuh"
#include "epoch_v7d.cuh"
#include "epoch_v7e.cuh"
#include "epoch_v7f.cuh"
#include "epoch_v7g.cuh"
#include "epoch_v7h.cuh"
#include "epoch_v7i.cuh"
#include "epoch_v7j.cuh"
#include "epoch_v7k.cuh"
#include "epoch_v7m.cuh"
#include "epoch_v7n.cuh"

namespace {

// The epoch kernel's dynamic shared memory: one launch's producers need Gram v2's (epoch_v7l.cuh).
constexpr int v7_smem_bytes(int grams) {
  return grams == V7_GRAMS_LAUNCH ? V7L_SMEM_BYTES : 4 * V7_SMEM_FLOATS;
}
// Every role within what either launch gives (one launch's first run faulted on a role that
// needed more than the launch's bytes: the CPU emulation cannot see that).
static_assert(4 * ChainSmem::FLOATS <= v7_smem_bytes(V7_GRAMS_KERNEL) &&
                  4 * ChainSmem::FLOATS <= v7_smem_bytes(V7_GRAMS_LAUNCH),
              "the chain's shared memory fits both launches'");
static_assert(4 * WorkerSmem::FLOATS <= v7_smem_bytes(V7_GRAMS_KERNEL) &&
                  4 * WorkerSmem::FLOATS <= v7_smem_bytes(V7_GRAMS_LAUNCH),
              "v7a-v7d's workers' shared memory fits both launches'");
static_assert(4 * V7ESmem::FLOATS <= v7_smem_bytes(V7_GRAMS_KERNEL) &&
                  4 * V7ESmem::FLOATS <= v7_smem_bytes(V7_GRAMS_LAUNCH),
              "v7e's workers' shared memory fits both launches'");
static_assert(4 * V7FSmem::FLOATS <= v7_smem_bytes(V7_GRAMS_KERNEL) &&
                  4 * V7FSmem::FLOATS <= v7_smem_bytes(V7_GRAMS_LAUNCH),
              "v7f's workers' shared memory fits both launches'");
static_assert(4 * V7JSmem::FLOATS <= v7_smem_bytes(V7_GRAMS_KERNEL) &&
                  4 * V7JSmem::FLOATS <= v7_smem_bytes(V7_GRAMS_LAUNCH),
              "v7j's workers' shared memory (v7f's and W's pieces) fits both launches'");

// The epoch kernel over V7_CTAS CTAs (V7L_CTAS in one launch) in clusters of 8, cooperative
// (every role spins on the others: the grid must be resident, see epoch_v7.cuh).
cudaLaunchConfig_t v7_config(cudaLaunchAttribute (&attr)[2], bool cooperative, cudaStream_t stream,
                             int grams = V7_GRAMS_KERNEL) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grams == V7_GRAMS_LAUNCH ? V7L_CTAS : V7_CTAS);
  cfg.blockDim = dim3(V7_T);
  cfg.dynamicSmemBytes = v7_smem_bytes(grams);
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = V7_CLUSTER;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeCooperative;
  attr[1].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cooperative ? 2 : 1;
  return cfg;
}

// The Gram kernels: 1 (v7a's, measured on an H200) or 2 (gram_v2.cuh, not yet run on a GPU).
constexpr int V7_GRAM_VERSION = 2;  // the epoch's
enum V7Variant { V7A = 0, V7B = 1, V7C = 2, V7D = 3, V7E = 4, V7F = 5, V7G = 6, V7H = 7,
                 V7I = 8, V7J = 9, V7K = 10, V7M = 11, V7N = 12,
                 V7_VARIANTS };
V7Args v7_args(const Args& a, bool tagged = false) {
  const int steps = (a.n + a.bs - 1) / a.bs;
  return V7Args{a, V7Epoch{a.n, a.bs, steps, a.lr}, v7_scratch(a.scratch, steps), tagged};
}

// Every Γ_{t,j} of the epoch and the step counters zeroed, by Gram kernel `version`, on `stream`.
cudaError_t v7_grams(const V7Args& v, int version, cudaStream_t stream) {
  if (version == 1) {
    const dim3 grid(BMAX / gram::TILE_N, BMAX / gram::TILE_M, v.e.steps * V7_LAG);
    v7_gram_kernel<<<grid, 32 * gram::WARPS, 0, stream>>>(v);
    return cudaGetLastError();
  }
  if (version != 2) return cudaErrorInvalidValue;
  cudaError_t err = cudaFuncSetAttribute(
      v7_gram_kernel_v2, cudaFuncAttributeMaxDynamicSharedMemorySize, GRAM_V2_SMEM);
  if (err != cudaSuccess) return err;
  v7_gram_kernel_v2<<<dim3(gram::v2::TILES, v.e.steps), gram::v2::THREADS, GRAM_V2_SMEM,
                      stream>>>(v);
  return cudaGetLastError();
}

// The epoch kernel of `variant` (V7A … V7N) in its TIMED build (the phase-profiling one: the same
// arithmetic, it trains) and GRAMS build (V7_GRAMS_KERNEL: the Gram kernel runs first;
// V7_GRAMS_LAUNCH: its producer clusters inside it); nullptr for any other number. The one place
// a variant's number meets its kernel (the GPU's one-launch test reads the kernel's name back).
using V7Kernel = void (*)(V7Args);
template <bool TIMED, int GRAMS>
V7Kernel v7_kernel(int variant) {
  switch (variant) {
    case V7A: return v7_epoch_kernel<TIMED, false, GRAMS>;
    case V7B: return v7_epoch_kernel<TIMED, true, GRAMS>;
    case V7C: return v7_epoch_kernel_c<TIMED, GRAMS>;
    case V7D: return v7_epoch_kernel_d<TIMED, GRAMS>;
    case V7E: return v7_epoch_kernel_e<TIMED, GRAMS>;
    case V7F: return v7_epoch_kernel_f<TIMED, GRAMS>;
    case V7G: return v7_epoch_kernel_g<TIMED, GRAMS>;
    case V7H: return v7_epoch_kernel_h<TIMED, GRAMS>;
    case V7I: return v7_epoch_kernel_i<TIMED, GRAMS>;
    case V7J: return v7_epoch_kernel_j<TIMED, GRAMS>;
    case V7K: return v7_epoch_kernel_k<TIMED, GRAMS>;
    case V7M: return v7_epoch_kernel_m<TIMED, GRAMS>;
    case V7N: return v7_epoch_kernel_n<TIMED, GRAMS>;
    default: return nullptr;
  }
}
template <bool TIMED = false>
V7Kernel v7_kernel(int variant, int grams) {
  return grams == V7_GRAMS_KERNEL   ? v7_kernel<TIMED, V7_GRAMS_KERNEL>(variant)
         : grams == V7_GRAMS_LAUNCH ? v7_kernel<TIMED, V7_GRAMS_LAUNCH>(variant)
                                    : nullptr;
}

// One epoch of `variant` on `stream`: `grams` V7_GRAMS_KERNEL, two launches (the Gram kernel, then
// the epoch kernel); V7_GRAMS_LAUNCH, one (the scratch of v7l_scratch_bytes, zeroed before its
// first epoch: epoch_v7l_math.cuh). Every variant but v7a tags its partials (v7b's ring, cleared by
// its Gram launch or its producer CTA 0).
template <bool TIMED = false>
cudaError_t train_v7_variant(const Args& a, int variant, cudaStream_t stream,
                             int grams = V7_GRAMS_KERNEL) {
  const V7Kernel kernel = v7_kernel<TIMED>(variant, grams);
  if (a.scratch == nullptr || kernel == nullptr) return cudaErrorInvalidValue;
  const V7Args v = v7_args(a, variant != V7A);
  cudaError_t err = grams == V7_GRAMS_KERNEL ? v7_grams(v, V7_GRAM_VERSION, stream) : cudaSuccess;
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               v7_smem_bytes(grams));
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = v7_config(attr, true, stream, grams);
  return cudaLaunchKernelEx(&cfg, kernel, v);
}

// One epoch by the phase-profiling build, then its figures (epoch_v7_phases.cuh): clocks
// [V7_PROFILED][V7_PHASE_COLS], span [V7_PROFILED + 1]. Zeroed first: a CTA that left early (a failed
// wait) reads back as 0, not as an earlier launch's figures. Syncs the stream.
// `grams`: as train_v7_variant's (the producer CTAs are not profiled: they write no figures).
cudaError_t v7_phase_profile(const Args& a, int variant, unsigned int* clocks, long long* span,
                             cudaStream_t stream, int grams = V7_GRAMS_KERNEL) {
  if (variant < 0 || variant >= V7_VARIANTS || grams < 0 || grams >= V7_GRAMS_MODES)
    return cudaErrorInvalidValue;
  void *c = nullptr, *s = nullptr;
  cudaError_t err = cudaGetSymbolAddress(&c, g_v7_phase_clocks);
  if (err == cudaSuccess) err = cudaGetSymbolAddress(&s, g_v7_phase_ns);
  if (err == cudaSuccess) err = cudaMemsetAsync(c, 0, sizeof(g_v7_phase_clocks), stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(s, 0, sizeof(g_v7_phase_ns), stream);
  if (err == cudaSuccess) err = train_v7_variant<true>(a, variant, stream, grams);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess)
    err = cudaMemcpyFromSymbol(clocks, g_v7_phase_clocks, sizeof(g_v7_phase_clocks));
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(span, g_v7_phase_ns, sizeof(g_v7_phase_ns));
  return err;
}

}  // namespace
