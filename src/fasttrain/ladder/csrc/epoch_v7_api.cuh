// cuda-epoch v7's entry points (cuda_epoch.cu includes this header once; moved out of it as they
// were, then v7b's `variant` added) and its changelog.
//
// Changelog (cuda_epoch.cu's versions continued):
//   v7a (epoch_v7.cuh, epoch_v7_math.cuh; on an H200: 2.74 ms/epoch, v6 2.04) the lagged-
//      Gram step of docs/measurements/cuda-epoch-v7-design.md, as TWO launches an epoch: a Gram
//      kernel (every Γ_{t,j} = X_t X_{t−j}ᵀ, j = 1 … 4, u8 mma.sync → fp32) and one persistent
//      launch of 64 CTAs in clusters of 8: a chain cluster (16 rows a CTA: b_t + the workers'
//      partials − c Σ_j Γ_{t,j} G_{t−j}, softmax, G to the chain over DSMEM and to the workers
//      through global memory) and 7 worker clusters (14 features a CTA, W updated with the lagged
//      G, partial logits reduced over DSMEM) handing data over through step-indexed global
//      arrays and release/acquire step counters. Its per-thread arithmetic runs on the CPU for
//      whole epochs in an emulation of every role against float64 at 2e-5
//      (tests/ladder/test_cuda_epoch_v7_math.py). The ctas argument is the chain's 8. Its phase-
//      profiling build (epoch_v7_phases.cuh, cuda_epoch_v7_phase_profile) times each role's
//      phases, as v4's does v4's loop (docs/measurements/cuda-epoch-v7-design.md, "v7a on an
//      H200": the measured phases and what each change since the first run bought).
//      Its Gram kernel: v1 (v7a's, 493.8 µs a launch on an H200) or v2 (gram_v2.cuh: a CTA a
//      step's 64 rows for all 4 lags, operands staged by cp.async, read by ldmatrix; written
//      without a GPU; on an H200, 2026-11-28: 211-237 µs an epoch, bit-equal to v1), the epoch's
//      (V7_GRAM_VERSION); cuda_epoch_v7_grams launches either alone, for sync_cost.py to time.
//   v7b (epoch_v7b_math.cuh; variant 1 of cuda_epoch_v7_train; written without a GPU; H200,
//      2026-11-28: 2.18-2.23 ms/epoch in two launches, v7a 2.34-2.39) v7a
//      with the worker partials as 8-byte words {value, step} in a ring of L + 1 slots, polled by
//      the chain until every tag is its step (one L2 round trip, not v7a's counter-then-data two;
//      no worker counter or publish), and the chain's softmax on 16 lanes a row with shuffles,
//      its logits in registers (no zs round trip). Its per-thread code runs on the CPU for whole
//      epochs like v7a's, its shuffles through a host emulation of shfl.sync.bfly.
//   v7c (epoch_v7c.cuh, epoch_v7c_math.cuh; variant 2; H200, 2026-11-28: 2.15-2.20 ms/epoch)
//      v7b with the chain CTA's warps split: warps 0-7 the critical path (the term j = 1 on 16
//      lanes a row, summed by shuffles), warps 8-15 step t + 1's terms j >= 2 during step t,
//      handed over by one 512-thread named barrier a step (a stop flag read after it).
//   v7d (epoch_v7d.cuh, epoch_v7d_math.cuh; variant 3; H200, 2026-11-28: 2.06-2.09 ms/epoch)
//      v7c with workers that fetch the next update's G a step ahead: during the partials, warps
//      8-15 check the 8 chain counters without blocking (ld.acquire, then __syncwarp) and load
//      G into registers, consumed by the next update (which polls as v7b's if it was not there).
//   v7 in one launch (epoch_v7l.cuh, epoch_v7l_math.cuh; the entry points' `grams` 1,
//      V7_GRAMS_LAUNCH, for every variant; its first H200 run faulted: the launch
//      gave the producers less shared memory than Gram v2's staging, now v7_smem_bytes; then v7c
//      1.960 ms/epoch, v7d 1.998, v7b 2.068 against v6's 2.036: v7c in one launch is the row's) the Grams made during the epoch by 7 producer clusters of the
//      same kernel (120 CTAs, 15 clusters of 8: the most an H200 holds of this config) with Gram
//      v2's CTA code, each (step, 64 rows) released by an epoch-numbered flag that the chain
//      acquires before it loads that Γ; v7's counters zeroed by producer CTA 0 behind a flag of
//      the same generation. Its producer role and the chain's wait run on the CPU in the host
//      emulation for whole epochs (tests/ladder/test_cuda_epoch_v7_math.py).
//   v7e (epoch_v7e.cuh, epoch_v7e_math.cuh; variant 4; written without a GPU, not yet run on one)
//      v7c's chain with workers on the tensor cores: the v8 workers probe's "mma" bodies
//      (v8_workers.cuh: the update and the partials as m16n8k16 f16 products of hi/lo pieces) in
//      v7's protocol (L = 4, bias on the chain, G_a from v7's global G turned into G' = G·n·2¹²
//      by the worker, fetched a step ahead as v7d's), v7's cluster-barrier reduce. Estimate (not
//      measured): workers ~0.9-1.7 µs a step, the chain (~2.8) the bound, ~1.3-1.5 ms/epoch.
//   v7f (epoch_v7f.cuh; variant 5; H200, 2026-11-28: 1.72-1.75 ms/epoch in one launch, the row's)
//      v7e with the probe's reduce-scatter ("mma-scatter": each warp's tile of P_t by st.async into
//      its owner's inbox ring, the owner's sum a step late, credits back; no cluster barrier).
//   v7g (epoch_v7g.cuh, epoch_v7g_math.cuh; variant 6; written without a GPU, not yet run on one)
//      v7f with the chain's helper warps polling P_{t+1}'s tagged words a step ahead and handing
//      them over with the terms j >= 2, so the critical warps poll no partials and pass no
//      producers' flag; the helpers' labels loaded an iteration ahead; the Gram terms branch-free.
//   v7h (epoch_v7h.cuh, epoch_v7h_math.cuh; variant 7; written without a GPU, not yet run on one)
//      v7g with its workers' x gather a step deeper: order[] of step t + 2 loaded during step t,
//      so the pixel loads of step t + 1 wait on no load (v7f's SASS: 4 dependent round trips),
//      and the reduce's tagged stores after the inbox credits (whose fence waited for them).
//   v7i (epoch_v7i.cuh; variant 8; written without a GPU, not yet run on one)
//      v7h with G_t's global store and the chain CTA's step counter done by its helper warps:
//      the critical warps send G_t to the rings and go straight to the next step's wait (v7h's
//      SASS: a barrier and thread 0's fence for the stores' L2 round trip on their path).
//   v7j (epoch_v7j.cuh; variant 9; written without a GPU, not yet run on one)
//      v7i with the workers' mma fragments loaded by ldmatrix from swizzled rows and W·2⁸'s
//      fp16 pieces split once by the apply (v7i's SASS: 512 + 384 shared wavefronts a step of
//      LDS.U16 / conflicted LDS.32 fragment loads, the split in every lane).
//   v7k (epoch_v7k.cuh; variant 10; written without a GPU, not yet run on one)
//      v7j with two CTA-wide barriers fewer a worker step (G′ staged before the vote; x_t's
//      barrier only in a step without an update) and the chain counters read relaxed at the
//      step's top, tested after the partials, then fence.acquire (v7j: an acquire's round trip
//      in "reduce").
//   v7m (epoch_v7m.cuh, epoch_v7m_math.cuh; variant 11; written without a GPU, not yet run on one)
//      v7j with the chain's critical warps' tail cut: each warp sends its own rows of G_t right
//      after its softmax, only warp 0 waits (for the column sums), the loss after the sends
//      (v7i's SASS: two 256-thread barriers, warp 0's column sums and 2-3 serial send blocks a
//      thread between the softmax and the next wait, the loss's logf inline before them).
//   v7n (epoch_v7n.cuh, epoch_v7n_math.cuh; variant 12; written without a GPU, not yet run on one)
//      v7k with no column sums in the chain's G exchange: each critical warp sends its own rows
//      right after its softmax (no barrier in the tail), a 16-byte token a chain CTA keeps the
//      slots' pacing, and the receiver's helper warps sum the rows for the bias (v7k's SASS: two
//      256-thread barriers, warp 0's column sums and 2-3 serial send blocks before the last
//      st.async; v7m's: the sums' row the last piece every peer waits for).
#pragma once
#include "epoch_v7_launch.cuh"

extern "C" {

// Bytes of v7's global scratch for an epoch of n samples in batches of bs: its step counters,
// every Gram of the epoch (fp32), every step's G and the worker clusters' partial logits, then
// the one-launch path's tickets and ready flags (zeroed once, before the first epoch: the
// one-launch path needs it; the two-launch path ignores that tail).
long long cuda_epoch_v7_scratch_bytes(int n, int bs) {
  if (n < 1 || bs < 1 || bs > BMAX) return 0;
  return static_cast<long long>(v7l_scratch_bytes((n + bs - 1) / bs));
}

// v7's co-residency, checked at setup: *clusters = how many clusters of 8 of its epoch kernel the
// device holds at once (cudaOccupancyMaxActiveClusters), *needed = how many one launch has.
// Returns 0 or a cudaError_t.
// `variant`: whose epoch kernel (V7A 0, V7B 1, V7C 2, V7D 3, V7E 4, V7F 5, V7G 6, V7H 7, V7I 8,
// V7J 9, V7K 10, V7M 11, V7N 12); `grams`:
// V7_GRAMS_KERNEL 0
// (8 clusters) or V7_GRAMS_LAUNCH 1 (one launch: 15 clusters, the producers').
int cuda_epoch_v7_residency(int variant, int grams, int* clusters, int* needed) {
  *needed = (grams == V7_GRAMS_LAUNCH ? V7L_CTAS : V7_CTAS) / V7_CLUSTER;
  *clusters = 0;
  if (variant < 0 || variant >= V7_VARIANTS || grams < 0 || grams >= V7_GRAMS_MODES)
    return cudaErrorInvalidValue;
  const V7Kernel kernel = v7_kernel(variant, grams);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         v7_smem_bytes(grams));
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = v7_config(attr, false, nullptr, grams);
  return cudaOccupancyMaxActiveClusters(clusters, kernel, &cfg);
}

// How many v7 variants the entry points take (`variant` 0 … count − 1: v7a … v7k, v7m).
// Host only.
int cuda_epoch_v7_variants() { return V7_VARIANTS; }

// One epoch of v7 variant `variant` (0 v7a: cuda_epoch_train's version 7; 1 v7b; 2 v7c; 3 v7d;
// 4 v7e; 5 v7f; 6 v7g; 7 v7h; 8 v7i; 9 v7j; 10 v7k; 11 v7m),
// args as cuda_epoch_train's with ctas = 8, cluster = 1 and `scratch` of
// cuda_epoch_v7_scratch_bytes: its Grams, then its epoch kernel (`grams` 0), or its one launch
// (`grams` 1: the scratch zeroed before its first epoch), on `stream`. Returns 0 or a
// cudaError_t (a timed-out wait shows in
// cuda_epoch_signal_status).
int cuda_epoch_v7_train(const void* x, const void* y, const void* order, int n, int bs, float lr,
                        void* w, void* b, void* stats, void* scratch, int variant, int grams,
                        cudaStream_t stream) {
  if (n < 1 || bs < 1 || bs > BMAX || scratch == nullptr) return cudaErrorInvalidValue;
  const Args a{static_cast<const uint8_t*>(x), static_cast<const int*>(y),
               static_cast<const int*>(order), n, bs, lr, static_cast<float*>(w),
               static_cast<float*>(b), static_cast<float*>(stats), static_cast<float*>(scratch)};
  return train_v7_variant(a, variant, stream, grams);
}

// v7's phase-profiling build: *chain, *worker and *helper phases a row of each role
// (epoch_v7_phases.cuh), *rows the rows profiled (the 64 chain and worker CTAs, then the chain
// CTAs' helper warps: v7c-v7m's), *cols the clock columns a row (the buffers' shape). Host only.
void cuda_epoch_v7_phase_shape(int* chain, int* worker, int* helper, int* rows, int* cols) {
  *chain = V7C_PHASES;
  *worker = V7W_PHASES;
  *helper = V7H_PHASES;
  *rows = V7_PROFILED;
  *cols = V7_PHASE_COLS;
}

// One epoch of v7 variant `variant` (its Grams and its epoch kernel, arguments as
// cuda_epoch_v7_train's, `grams` too) by the phase-profiling build (it trains), then per CTA of
// the chain and the workers (the producers are not profiled) the clocks its
// thread 0 spent in each of its role's phases, then per chain CTA those of its helper warps'
// first thread (v7c-v7m; rows of zeros for v7a, v7b) (out: rows x cols of
// cuda_epoch_v7_phase_shape, 32-bit, chain CTAs first) and each row's loop's span in ns (span:
// rows + 1, the last the steps).
// Syncs the stream.
int cuda_epoch_v7_phase_profile(const void* x, const void* y, const void* order, int n, int bs,
                                float lr, void* w, void* b, void* stats, void* scratch,
                                int variant, int grams, unsigned int* out, long long* span,
                                cudaStream_t stream) {
  if (n < 1 || bs < 1 || bs > BMAX || scratch == nullptr) return cudaErrorInvalidValue;
  const Args a{static_cast<const uint8_t*>(x), static_cast<const int*>(y),
               static_cast<const int*>(order), n, bs, lr, static_cast<float*>(w),
               static_cast<float*>(b), static_cast<float*>(stats), static_cast<float*>(scratch)};
  return v7_phase_profile(a, variant, out, span, stream, grams);
}

// v7's Grams alone (to time them): the first launch of a v7 epoch (every Γ_{t,j} into `scratch`,
// the step counters zeroed), by Gram kernel `gram_version` (1: v7a's, 2: gram_v2.cuh's, the
// epoch's; cuda_epoch_v7_gram_versions), on `stream`; arguments as cuda_epoch_train's (w, b and
// stats untouched). Returns 0 or a cudaError_t.
int cuda_epoch_v7_grams(const void* x, const void* y, const void* order, int n, int bs, float lr,
                        void* w, void* b, void* stats, void* scratch, int gram_version,
                        cudaStream_t stream) {
  if (n < 1 || bs < 1 || bs > BMAX || scratch == nullptr) return cudaErrorInvalidValue;
  const Args a{static_cast<const uint8_t*>(x), static_cast<const int*>(y),
               static_cast<const int*>(order), n, bs, lr, static_cast<float*>(w),
               static_cast<float*>(b), static_cast<float*>(stats), static_cast<float*>(scratch)};
  return v7_grams(v7_args(a), gram_version, stream);
}

// The Gram kernel versions cuda_epoch_v7_grams takes (*count of them, in out[0 … count − 1]) and
// the one a v7 epoch runs (the return value). Host only.
int cuda_epoch_v7_gram_versions(int* out, int* count) {
  out[0] = 1;
  out[1] = 2;
  *count = 2;
  return V7_GRAM_VERSION;
}

}  // extern "C"
