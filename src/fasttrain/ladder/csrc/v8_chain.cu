// cuda-epoch v8's chain alone, as a GPU probe (docs/measurements/cuda-epoch-v8-design.md, "Build
// first" step 2). Called by ladder/v8_chain.py.
//
// What it measures: T_chain, the µs a step of the design's one-SM chain with nothing else on the
// GPU: one CTA of 512 threads (16 warps) runs a whole epoch (469 MNIST steps: batch 128, the last
// 96) of Z_t = (P_t + Q_t) + (−c/n_{t−1})·S_t, S_t = (Γ̃_{t,1}·2⁻¹²)·((p − y)_{t−1}·2¹²) in 3xFP16
// on the tensor cores from zero, the softmax in the accumulator layout, G_t to global memory and
// (p − y)_t as the next step's hi/lo B fragments in shared memory (csrc/v8_chain.cuh's bodies,
// which the CPU tests run for every warp). P_t + Q_t and Γ̃_{t,1} come from precomputed arrays
// (float64 SGD, the real Grams), so the logits are the real ones; no worker, helper or flag.
//   - Γ̃ travels global → shared a step ahead by cp.async (16 B a thread, the idle K-half warps
//     8 … 15 while warps 0 … 7 run the softmax) into a 2-slot ring, Γ̃_s in slot s & 1: at step t
//     the warps load and split A_{t+1} from slot (t + 1) & 1 and Γ̃_{t+2} is issued into slot t & 1
//     (read at step t − 1); warps 8 … 15 wait for their copies before step t + 1's first barrier.
//   - The epoch's time by globaltimer (thread 0, after the prologue, so the fill of the ring and
//     A_0 are outside it) and clock64; the phase build (PHASES) also sums clock64 per phase over
//     the steps for warp 0 (a softmax warp: on the critical path) and warp 8 (the ring's copies).
//   - Two variants (`variant`), for one GPU call to choose between:
//     v1: warps 0 … 7 load and split their own A_{t+1} after their softmax, before the step's last
//         barrier: on the critical path ("next_a");
//     v2: warps 8 … 15 split warps 0 … 7's A_{t+1} into a 32 KB stage during the softmax (and
//         their own), and warps 0 … 7 load it back at the step's start (8 16-byte loads a lane,
//         beside the B loads): off the path, unless the split's issue slots slow the softmax warps
//         that share their SMSPs (warp w and w + 8 sit on SMSP w % 4).
//     v3: v1 with the Γ̃ ring filled by bulk copies (cp.async.bulk global → shared, 512 B a row:
//         the slot's rows are padded to V8C_GS, so one copy a row) by warps 8 … 11, one row a
//         lane, each warp's 16 KB of tx on the slot's mbarrier (4 arrivals a phase); warps 8 … 15
//         wait on it (parity) where v1 waits for its cp.async group. A slot is refilled, as in
//         v1, only after every warp passed the barrier that ends the step that read it, and after
//         fence.proxy.async.shared::cta (its generic-proxy reads, then async-proxy writes).
//
//   - The cluster variant (v8_cluster_run, csrc/v8_cluster.cuh): the chain in v1's order with P_t
//     alone from the array and Q_t from six helper CTAs of its cluster (j = 2 … 6), so one GPU
//     call measures the chain alone (v1, v2) and with its helpers' protocol.
//
// Versions:
//   v1 and v2 written and compiled for sm_90a (2026-11-28); NOT YET RUN ON A GPU: no figure exists.
//   The cluster variant written and compiled for sm_90a (2026-11-28, branch v8h): 96 registers (128
//   in the phase build), no spill; its bodies and rings ran on the CPU only
//   (tests/ladder/test_v8_helpers.py); NOT YET RUN ON A GPU.
//   Run 9 (H200, 2026-11-28): softmax 1.78 µs a step (v1), 1.92 (v2). Then (branch s18-softmax,
//   compiled for sm_90a, NOT YET RUN ON A GPU): v8c_softmax without per-element branches or CALLs
//   (8 exps interleaved, 1/x by rcp.approx + one Newton step, G and Z as STG.64 pairs), −c/n_{t−1}
//   without a division a step, and the phase build's input wait made real (see the doc's "The
//   chain's softmax in SASS": run 9's wait_inputs measured nothing and its softmax held the wait).
//   v3 written and compiled for sm_90a (2026-11-28, branch s18-bulk; 99 registers, 127 in the
//   phase build, no spill; v1's and v2's SASS unchanged); NOT YET RUN ON A GPU.
//
// Entry points return 0 or a cudaError_t (a failed launch's error is cleared).
#include <cuda_runtime.h>
#include <stdint.h>

#include "v8_chain.cuh"
#include "v8_cluster.cuh"
#include "v8_grams.cuh"

namespace {

enum Timing {
  TM_EPOCH_NS, TM_EPOCH_CLOCKS, TM_INPUTS_MMA, TM_K_HALVES, TM_SOFTMAX, TM_WRITE_B, TM_NEXT_A,
  TM_STEP_BARRIER, TM_WAIT_INPUTS, TM_WAIT_GRAM, TM_ISSUE_GRAM, TM_LEN
};

constexpr int SLOT_FLOATS = V8C_ROWS * V8C_GS;
constexpr size_t SMEM = (2 * SLOT_FLOATS + V8C_HALVES) * sizeof(float) +
                        V8C_BWORDS * sizeof(uint32_t);  // 139,264 + 8,192 + 8,192 B
constexpr size_t SMEM_STAGED = SMEM + V8C_STAGE * sizeof(uint32_t);  // + 32,768 B (v2)
constexpr size_t SMEM_BULK = SMEM + 2 * sizeof(uint64_t);  // + the ring's 2 mbarriers (v3)
constexpr int SLOT_BYTES = V8C_ROWS * V8C_ROW_BYTES;       // a Γ̃'s tx: 65,536 B

__device__ __forceinline__ long long globaltimer_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Γ̃_s ([128][128] fp32 in global memory) into `slot` ([128][V8C_GS]) by threads `first` …
// `first + count − 1` of the CTA, 16 bytes each a copy; one commit group (the cluster's
// v8k_issue_rows over all 128 rows).
__device__ __forceinline__ void issue_gram(float* slot, const float* gram_s, int tid, int count) {
  v8k_issue_rows(slot, gram_s, 0, V8C_ROWS, tid, count);
}

// v3: warp 8 + part's share of Γ̃_s into `slot` (rows 32·part … + 31, one bulk copy a lane:
// v8c_bulk_row), after its lane 0 armed the slot's mbarrier `bar` (4 arrivals a phase, one a
// issuing warp) with its rows' 16,384 bytes of tx. The proxy fence first: the slot's previous
// reads (every warp's ld.shared of its A, before the step barrier this warp has passed) are
// generic-proxy accesses, the copies async-proxy writes; fence.proxy.async.shared::cta (PTX ISA:
// bidirectional between the generic and the async proxy, here on this CTA's shared memory) orders
// them, as CUTLASS's TMA pipelines order smem reuse.
__device__ __forceinline__ void issue_gram_bulk(float* slot, const float* gram_s, uint32_t bar,
                                                int part, int lane) {
  v8k_fence_proxy_async();
  if (lane == 0) v8k_arm(bar, SLOT_BYTES / V8C_BULK_WARPS);
  __syncwarp();
  v8c_bulk_row(slot, gram_s, part, lane, [bar](float* dst, const float* src, int bytes) {
    v8k_bulk_g2s(static_cast<uint32_t>(__cvta_generic_to_shared(dst)), src, bytes, bar);
  });
}

// v3: the wait for a slot's copies (parity: Γ̃_s is slot s & 1's fill s >> 1, so its phase's
// parity is (s >> 1) & 1), bounded by V8K_BUDGET clocks (~68 ms) without a slow-path call; false
// if it timed out (the kernel then skips its later waits and reports epoch_ns = −1).
__device__ __forceinline__ bool wait_gram_bulk(uint32_t bar, int s) {
  const int parity = (s >> 1) & 1;
  const long long t0 = clock64();
  while (!v8k_try_wait<true>(bar, parity))
    if (clock64() - t0 > V8K_BUDGET) return false;
  return true;
}

template <bool PHASES, bool STAGED, bool BULK>
__global__ void __launch_bounds__(V8C_THREADS, 1)
    v8_chain_kernel(const float* __restrict__ gram, const float* __restrict__ pq,
                    const int* __restrict__ labels, int n, float c, float* __restrict__ g_out,
                    float* __restrict__ z_out, float* __restrict__ stats,
                    long long* __restrict__ timing) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* ring = reinterpret_cast<float*>(smem);
  float* halves = ring + 2 * SLOT_FLOATS;
  uint32_t* bw = reinterpret_cast<uint32_t*>(halves + V8C_HALVES);
  uint32_t* stage = bw + V8C_BWORDS;  // v2 only
  // v3 only: slot i's mbarrier at bars + 8i (after the B words: v3 has no stage)
  const uint32_t bars = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
  const int tid = threadIdx.x, w = tid >> 5;
  const V8DeviceWarp warp;
  const int steps = (n + V8C_ROWS - 1) / V8C_ROWS;
  const size_t gram_step = size_t(V8C_ROWS) * V8C_ROWS, io_step = size_t(V8C_ROWS) * V8C_C;

  // Prologue: Γ̃_0 and Γ̃_1 into the ring, B = 0 (step 0 has no lagged term), A_0.
  bool stuck = false;  // v3: a wait timed out
  if (BULK) {
    if (tid == 0) {
      v8k_init(bars, V8C_BULK_WARPS);
      v8k_init(bars + 8, V8C_BULK_WARPS);
      v8k_init_fence();
    }
    __syncthreads();
    if (w >= 8 && w < 8 + V8C_BULK_WARPS) {
      issue_gram_bulk(ring, gram, bars, w - 8, tid & 31);
      if (steps > 1)
        issue_gram_bulk(ring + SLOT_FLOATS, gram + gram_step, bars + 8, w - 8, tid & 31);
    }
  } else {
    issue_gram(ring, gram, tid, V8C_THREADS);
    if (steps > 1) issue_gram(ring + SLOT_FLOATS, gram + gram_step, tid, V8C_THREADS);
  }
  for (int i = tid; i < V8C_BWORDS; i += V8C_THREADS) bw[i] = 0u;
  if (BULK) {
    stuck = !wait_gram_bulk(bars, 0);
    if (steps > 1 && !stuck) stuck = !wait_gram_bulk(bars + 8, 1);
  } else {
    v8k_cp_wait();
  }
  __syncthreads();
  uint32_t a[2][V8C_KSTEPS][4];
  if (!STAGED || w >= 8) v8c_load_a(warp, ring, w, V8C_A_SCALE, a);
  if (STAGED && w >= 8) v8c_stage_a(warp, ring, w - 8, V8C_A_SCALE, stage);
  float d[2][4], pqr[2][4], pmy[2][4], loss = 0.f, correct = 0.f;
  int y[2];
  long long ph[TM_LEN] = {};
  __syncthreads();
  // Only the last batch is short, so n_{t−1} = 128 for every t ≥ 1: −c/n_{t−1} without a division
  // a step (whose slow-path check ptxas had sunk into the phase build's input-wait window).
  const float coef_full = -c / static_cast<float>(V8C_ROWS);
  const long long ns0 = globaltimer_ns(), clk0 = clock64();

  for (int t = 0; t < steps; ++t) {
    const int rows = v8c_rows(n, t);
    const float coef = t ? coef_full : -c;  // −c/n_{t−1}
    long long c0 = 0, c1 = 0, c2 = 0, c2i = 0, c3 = 0, c4 = 0, c5 = 0;
    if (PHASES) c0 = clock64();
    if (STAGED && w < 8) v8c_load_staged_a(warp, stage, w, a);
    if (w < 8) v8c_load_inputs(warp, w, pq + t * io_step, labels + t * V8C_ROWS, rows, pqr, y);
    v8c_product(warp, a, bw, w, d);
    if (PHASES) c1 = clock64();
    if (w >= 8) {
      v8c_store_half(warp, d, halves, w);
      if (PHASES) c4 = clock64();
      if (!BULK) v8k_cp_wait();  // Γ̃_{t+1}, issued at step t − 1 (or the prologue)
      if (BULK && t + 1 < steps && !stuck)
        stuck = !wait_gram_bulk(bars + (((t + 1) & 1) ? 8 : 0), t + 1);
      if (PHASES) ph[TM_WAIT_GRAM] += clock64() - c4;
    }
    __syncthreads();  // K half 1's sums; Γ̃_{t+1} in its slot
    if (PHASES) c2 = clock64();
    if (PHASES && w < 8) {  // the phase build: P+Q's and the labels' loads (issued before the
      float used = 0.f;     // product) arrive here, not inside the softmax
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) used += pqr[nt][i];
      used += static_cast<float>(y[0] + y[1]);
      // A store that depends on the sum (never made: P+Q are finite; stats[2·tid] is rewritten
      // at the end) puts the loads' wait before c2i. Run 9's build held `used` in an empty asm
      // instead, which emits no SASS: ptxas dropped the sum, and the wait fell in the softmax.
      if (used != used) stats[2 * tid] = used;
      c2i = clock64();
    }
    if (w < 8) {
      v8c_softmax(warp, w, d, halves, pqr, y, rows, coef, g_out + t * io_step,
                  z_out ? z_out + t * io_step : nullptr, pmy, loss, correct);
      if (PHASES) c3 = clock64();
      v8c_write_b(warp, w, pmy, bw);
      if (PHASES) c4 = clock64();
    } else if (t + 2 < steps && (!BULK || w < 8 + V8C_BULK_WARPS)) {
      if (PHASES) c3 = clock64();
      if (BULK)
        issue_gram_bulk(ring + ((t & 1) ? SLOT_FLOATS : 0), gram + (t + 2) * gram_step,
                        bars + ((t & 1) ? 8 : 0), w - 8, tid & 31);
      else
        issue_gram(ring + ((t & 1) ? SLOT_FLOATS : 0), gram + (t + 2) * gram_step, tid - 256, 256);
      if (PHASES) ph[TM_ISSUE_GRAM] += clock64() - c3;
    }
    if (t + 1 < steps) {
      const float* next = ring + (((t + 1) & 1) ? SLOT_FLOATS : 0);
      if (!STAGED || w >= 8) v8c_load_a(warp, next, w, V8C_A_SCALE, a);
      if (STAGED && w >= 8) v8c_stage_a(warp, next, w - 8, V8C_A_SCALE, stage);
    }
    if (PHASES) c5 = clock64();
    __syncthreads();  // B_{t+1} written; every A_{t+1} loaded (slot (t + 1) & 1 free next step)
    if (PHASES && w == 0) {
      const long long c6 = clock64();
      ph[TM_INPUTS_MMA] += c1 - c0;
      ph[TM_K_HALVES] += c2 - c1;
      ph[TM_WAIT_INPUTS] += c2i - c2;
      ph[TM_SOFTMAX] += c3 - c2i;
      ph[TM_WRITE_B] += c4 - c3;
      ph[TM_NEXT_A] += c5 - c4;
      ph[TM_STEP_BARRIER] += c6 - c5;
    }
  }
  if (BULK) {  // the epoch's marks, then whether any wait timed out (outside the epoch's time)
    const long long epoch_ns = globaltimer_ns() - ns0, epoch_clocks = clock64() - clk0;
    stuck = __syncthreads_or(stuck);
    if (tid == 0) {
      timing[TM_EPOCH_NS] = stuck ? -1 : epoch_ns;
      timing[TM_EPOCH_CLOCKS] = epoch_clocks;
    }
  } else if (tid == 0) {
    timing[TM_EPOCH_NS] = globaltimer_ns() - ns0;
    timing[TM_EPOCH_CLOCKS] = clock64() - clk0;
  }
  if (PHASES && (tid == 0 || tid == 256)) {
    for (int i = TM_INPUTS_MMA; i < TM_LEN; ++i)
      if ((i >= TM_WAIT_GRAM) == (tid == 256)) timing[i] = ph[i];
  }
  stats[2 * tid] = loss;
  stats[2 * tid + 1] = correct;
}

template <bool PHASES, bool STAGED, bool BULK = false>
int launch(const float* gram, const float* pq, const int* labels, int n, float c, float* g_out,
           float* z_out, float* stats, long long* timing, cudaStream_t stream) {
  constexpr size_t smem = STAGED ? SMEM_STAGED : BULK ? SMEM_BULK : SMEM;
  cudaError_t e = cudaFuncSetAttribute(v8_chain_kernel<PHASES, STAGED, BULK>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e == cudaSuccess) {
    v8_chain_kernel<PHASES, STAGED, BULK><<<1, V8C_THREADS, smem, stream>>>(
        gram, pq, labels, n, c, g_out, z_out, stats, timing);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess) cudaGetLastError();
  return static_cast<int>(e);
}

}  // namespace

extern "C" {

// One epoch of n samples (⌈n/128⌉ steps; n ≥ 1): gram [steps][128][128], pq [steps][128][10],
// labels [steps][128] in device memory; g_out (and z_out, or null) [steps][128][10], stats
// [512][2] (each thread's summed loss and hits), timing [v8_chain_timing_len()] int64; variant 1,
// 2 or 3 (the top of this file; v3's epoch_ns is −1 if a wait for its bulk copies timed out).
int v8_chain_run(const float* gram, const float* pq, const int* labels, int n, float c,
                 float* g_out, float* z_out, float* stats, long long* timing, int phases,
                 int variant, void* stream) {
  if (n < 1 || variant < 1 || variant > 3) return static_cast<int>(cudaErrorInvalidValue);
  const auto s = static_cast<cudaStream_t>(stream);
  auto go = [&](auto f) { return f(gram, pq, labels, n, c, g_out, z_out, stats, timing, s); };
  if (variant == 2) return phases ? go(launch<true, true>) : go(launch<false, true>);
  if (variant == 3) return phases ? go(launch<true, false, true>) : go(launch<false, false, true>);
  return phases ? go(launch<true, false>) : go(launch<false, false>);
}

// The cluster variant (csrc/v8_cluster.cuh): one cluster of 8 CTAs, P_t (not P_t + Q_t) in `p`,
// gramh [5][steps][128][128] the Γ̃_{t,j} of j = 2 … 6; timing [v8_cluster_timing_len()]. Returns
// 0, a cudaError_t, or -2 (a wait timed out: *signal gets its code). Synchronous.
int v8_cluster_run(const float* gram1, const float* gramh, const float* p, const int* labels,
                   int n, float c, float* g_out, float* z_out, float* stats, long long* timing,
                   int phases, void* stream, int* signal) {
  if (n < 1) return static_cast<int>(cudaErrorInvalidValue);
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      major < 9)
    return static_cast<int>(cudaErrorNotSupported);  // thread-block clusters: sm_90+
  const auto s = static_cast<cudaStream_t>(stream);
  const V8kArgs a{gram1, gramh, p, labels, n, c, g_out, z_out, stats, timing};
  const int zero = 0;
  cudaError_t e = cudaMemcpyToSymbolAsync(g_v8k_error, &zero, sizeof zero, 0,
                                          cudaMemcpyHostToDevice, s);
  if (!e) e = phases ? v8k_launch<true>(a, s) : v8k_launch<false>(a, s);
  if (!e) e = cudaStreamSynchronize(s);
  if (!e) e = cudaMemcpyFromSymbol(signal, g_v8k_error, sizeof *signal);
  if (e) {
    cudaGetLastError();
    return static_cast<int>(e);
  }
  return *signal ? -2 : 0;
}

// The v8 Grams of one epoch (csrc/v8_grams.cuh): x [*][784] uint8 and order [n] int32 in device
// memory, grams [steps][128][128] and gramh [5][steps][128][128] fp32 (every entry written: Γ̃
// with the bias pixel, 0 outside valid pairs and for t < j). Asynchronous on `stream`.
int v8_grams_run(const uint8_t* x, const int* order, int n, float* grams, float* gramh,
                 void* stream) {
  if (n < 1) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(
      v8_gram_launch(x, order, n, grams, gramh, static_cast<cudaStream_t>(stream)));
}

int v8_cluster_timing_len() { return KT_LEN; }
int v8_chain_timing_len() { return TM_LEN; }
int v8_chain_threads() { return V8C_THREADS; }
const char* v8_chain_error_name(int code) { return cudaGetErrorName(cudaError_t(code)); }
const char* v8_chain_error_string(int code) { return cudaGetErrorString(cudaError_t(code)); }

}  // extern "C"
