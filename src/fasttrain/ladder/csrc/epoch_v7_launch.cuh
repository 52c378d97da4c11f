// cuda-epoch v7's host side (epoch_v7_api.cuh's entry points call it): the launch configuration,
// an epoch's two launches (the Grams by either Gram kernel, then the epoch kernel of v7a, v7b,
// v7c, v7d, v7e, v7f, v7g, v7h, v7i, v7j, v7k or v7m, TIMED or not) or its one launch (`grams` V7_GRAMS_LAUNCH: the
// epoch kernel with its producer clusters, epoch_v7l.cuh), and the phase profile's read-back. v7's
// variants: V7A (0), V7B (1), V7C (2), V7D (3), V7E (4), V7F (5), V7G (6), V7H (7), V7I (8),
// V7J (9), V7K (10) and V7M (11), the
// `variant` of the entry points (cuda_epoch.V7_VARIANTS); `grams` is independent of it.
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
                 V7I = 8, V7J = 9, V7K = 10, V7M = 11, V7_VARIANTS };
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

// TIMED: the phase-profiling build of the epoch kernel (the same arithmetic: it trains). V7B:
// v7b's kernel (and its Gram launch, or its producer CTA 0, clears the tagged partials' ring);
// V7C (with V7B): v7c's; V7D (with V7B): v7d's. GRAMS: V7_GRAMS_KERNEL, two
// launches (the Gram kernel, then the epoch kernel); V7_GRAMS_LAUNCH, one (the scratch of
// v7l_scratch_bytes, zeroed before its first epoch: epoch_v7l_math.cuh). V7E (with V7B): v7e's;
// V7F (with V7B): v7f's; V7G (with V7B): v7g's; V7H (with V7B): v7h's; V7I (with V7B): v7i's;
// V7J (with V7B): v7j's; V7K (with V7B): v7k's; V7M (with V7B): v7m's.
template <bool TIMED = false, bool V7B = false, bool V7C = false, int GRAMS = V7_GRAMS_KERNEL,
          bool V7D = false, bool V7E = false, bool V7F = false, bool V7G = false,
          bool V7H = false, bool V7I = false, bool V7J = false, bool V7K = false,
          bool V7M = false>
cudaError_t train_v7(const Args& a, cudaStream_t stream) {
  if (a.scratch == nullptr) return cudaErrorInvalidValue;
  constexpr auto kernel = V7M   ? v7_epoch_kernel_m<TIMED, GRAMS>
                          : V7K ? v7_epoch_kernel_k<TIMED, GRAMS>
                          : V7J ? v7_epoch_kernel_j<TIMED, GRAMS>
                          : V7I ? v7_epoch_kernel_i<TIMED, GRAMS>
                          : V7H ? v7_epoch_kernel_h<TIMED, GRAMS>
                          : V7G ? v7_epoch_kernel_g<TIMED, GRAMS>
                          : V7F ? v7_epoch_kernel_f<TIMED, GRAMS>
                          : V7E ? v7_epoch_kernel_e<TIMED, GRAMS>
                          : V7D ? v7_epoch_kernel_d<TIMED, GRAMS>
                          : V7C ? v7_epoch_kernel_c<TIMED, GRAMS>
                                : v7_epoch_kernel<TIMED, V7B, GRAMS>;
  const V7Args v = v7_args(a, V7B);
  cudaError_t err = GRAMS == V7_GRAMS_KERNEL ? v7_grams(v, V7_GRAM_VERSION, stream) : cudaSuccess;
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               v7_smem_bytes(GRAMS));
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = v7_config(attr, true, stream, GRAMS);
  return cudaLaunchKernelEx(&cfg, kernel, v);
}
// `variant` (V7A … V7K, V7M) and `grams` (V7_GRAMS_KERNEL, V7_GRAMS_LAUNCH) resolved once,
// here.
template <bool TIMED = false>
cudaError_t train_v7_variant(const Args& a, int variant, cudaStream_t stream,
                             int grams = V7_GRAMS_KERNEL) {
  if (grams == V7_GRAMS_LAUNCH) {
    if (variant == V7A) return train_v7<TIMED, false, false, V7_GRAMS_LAUNCH>(a, stream);
    if (variant == V7B) return train_v7<TIMED, true, false, V7_GRAMS_LAUNCH>(a, stream);
    if (variant == V7C) return train_v7<TIMED, true, true, V7_GRAMS_LAUNCH>(a, stream);
    if (variant == V7D) return train_v7<TIMED, true, false, V7_GRAMS_LAUNCH, true>(a, stream);
    if (variant == V7E)
      return train_v7<TIMED, true, false, V7_GRAMS_LAUNCH, false, true>(a, stream);
    if (variant == V7F)
      return train_v7<TIMED, true, false, V7_GRAMS_LAUNCH, false, false, true>(a, stream);
    if (variant == V7G)
      return train_v7<TIMED, true, false, V7_GRAMS_LAUNCH, false, false, false, true>(a, stream);
    if (variant == V7H)
      return train_v7<TIMED, true, false, V7_GRAMS_LAUNCH, false, false, false, false, true>(a,
                                                                                           stream);
    if (variant == V7I)
      return train_v7<TIMED, true, false, V7_GRAMS_LAUNCH, false, false, false, false, false,
                      true>(a, stream);
    if (variant == V7J)
      return train_v7<TIMED, true, false, V7_GRAMS_LAUNCH, false, false, false, false, false,
                      false, true>(a, stream);
    if (variant == V7K)
      return train_v7<TIMED, true, false, V7_GRAMS_LAUNCH, false, false, false, false, false,
                      false, false, true>(a, stream);
    if (variant == V7M)
      return train_v7<TIMED, true, false, V7_GRAMS_LAUNCH, false, false, false, false, false,
                      false, false, false, true>(a, stream);
    return cudaErrorInvalidValue;
  }
  if (grams != V7_GRAMS_KERNEL) return cudaErrorInvalidValue;
  if (variant == V7A) return train_v7<TIMED, false>(a, stream);
  if (variant == V7B) return train_v7<TIMED, true>(a, stream);
  if (variant == V7C) return train_v7<TIMED, true, true>(a, stream);
  if (variant == V7D) return train_v7<TIMED, true, false, V7_GRAMS_KERNEL, true>(a, stream);
  if (variant == V7E) return train_v7<TIMED, true, false, V7_GRAMS_KERNEL, false, true>(a, stream);
  if (variant == V7F)
    return train_v7<TIMED, true, false, V7_GRAMS_KERNEL, false, false, true>(a, stream);
  if (variant == V7G)
    return train_v7<TIMED, true, false, V7_GRAMS_KERNEL, false, false, false, true>(a, stream);
  if (variant == V7H)
    return train_v7<TIMED, true, false, V7_GRAMS_KERNEL, false, false, false, false, true>(a,
                                                                                          stream);
  if (variant == V7I)
    return train_v7<TIMED, true, false, V7_GRAMS_KERNEL, false, false, false, false, false, true>(
        a, stream);
  if (variant == V7J)
    return train_v7<TIMED, true, false, V7_GRAMS_KERNEL, false, false, false, false, false, false,
                    true>(a, stream);
  if (variant == V7K)
    return train_v7<TIMED, true, false, V7_GRAMS_KERNEL, false, false, false, false, false, false,
                    false, true>(a, stream);
  if (variant == V7M)
    return train_v7<TIMED, true, false, V7_GRAMS_KERNEL, false, false, false, false, false, false,
                    false, false, true>(a, stream);
  return cudaErrorInvalidValue;
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
