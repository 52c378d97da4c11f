// cuda-epoch v8's chain cluster as a GPU probe (docs/measurements/cuda-epoch-v8-design.md, "Build
// first" step 4 with the chain of step 2): one cluster of 8 CTAs of 512 threads, rank 0 the chain
// (v8_chain.cu's v1 order: every warp loads its own next A after the softmax), ranks 1 … 6 the
// helpers of j = 2 … 6, rank 7 idle; the bodies are csrc/v8_chain.cuh's and csrc/v8_helpers.cuh's
// (the rings' protocol is described there), the same the host harness runs
// (tests/ladder/csrc/v8_helpers_host.cu). Included by v8_chain.cu (one library, one nvcc call).
//
// Shared memory (the same size in every CTA of the launch; the regions after the halves differ by
// role): the 2-slot Γ̃ ring [2][128][V8C_GS] · K half 1 sums · chain: B words (8 KB) and the Q
// inbox [NQ][5][128][10] (50 KB); helper: the G' ring [NSG][V8C_BWORDS] (32 KB) · mbarriers:
// chain qfull [NQ][5], gfree [NSG]; helper gfull [NSG], qfree [NQ]. 206,976 B in all.
//
// Waits are bounded (v8_cluster_ptx.cuh's V8K_BUDGET clocks, ~68 ms at 1.98 GHz): a timeout
// writes its code (kind << 4 | rank or lag << 8 | step << 16; kind 1 the chain's G' credit, 2 its
// Q parts, 3 a helper's G', 4 its Q credit) into g_v8k_error, every later wait gives up at once,
// and the launch still ends at its cluster barrier; the entry point returns -2 and the code.
#pragma once
#include "v8_cluster_ptx.cuh"
#include "v8_helpers.cuh"

namespace {

struct V8kSmem {
  static constexpr int RING = 0;  // bytes
  static constexpr int HALVES = RING + 2 * V8C_ROWS * V8C_GS * 4;
  static constexpr int BW = HALVES + V8C_HALVES * 4;           // chain: B words
  static constexpr int GRING = BW;                             // helper: the G' ring
  static constexpr int INBOX = BW + V8H_G_BYTES;               // chain: the Q inbox
  static constexpr int BAR = INBOX + V8H_NQ * V8H_QSLOT_FLOATS * 4;
  static constexpr int QFULL = BAR, GFREE = BAR + 8 * V8H_NQ * V8H_PARTS;  // chain
  static constexpr int GFULL = BAR, QFREE = BAR + 8 * V8H_NSG;            // helper
  static constexpr int BYTES = GFREE + 8 * V8H_NSG;
};
static_assert(V8kSmem::GRING + V8H_NSG * V8H_G_BYTES <= V8kSmem::BAR, "the G' ring fits");
static_assert(V8kSmem::BYTES <= 227 * 1024, "fits a Hopper SM's shared memory");

// Rows r0 … r0 + nr − 1 of Γ̃ ([128][128] fp32, global) into `slot` by `count` threads from
// `first`, 16 bytes a cp.async; one commit group.
__device__ __forceinline__ void v8k_issue_rows(float* slot, const float* gram, int r0, int nr,
                                               int tid, int count) {
  for (int i = tid; i < nr * (V8C_ROWS / 4); i += count) {
    const int row = r0 + (i >> 5), chunk = i & 31;
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(slot + row * V8C_GS +
                                                                      4 * chunk));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d),
                 "l"(gram + row * V8C_ROWS + 4 * chunk)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void v8k_cp_wait() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// The timing words (int64): the chain's (thread 0, and thread 256 for the Γ̃ ring), then each
// helper's (its first active warp's lane 0, and + 256 for its Γ̃ wait), clock64 sums over steps.
enum V8kTiming {
  KT_EPOCH_NS, KT_EPOCH_CLOCKS, KT_SEND_G, KT_INPUTS_MMA, KT_K_HALVES, KT_WAIT_Q, KT_SOFTMAX,
  KT_WRITE_B, KT_NEXT_A, KT_STEP_BARRIER, KT_WAIT_GRAM, KT_ISSUE_GRAM, KT_CHAIN_LEN
};
enum V8kHelperTiming {
  KH_WAIT_G, KH_MMA, KH_K_HALVES, KH_WAIT_CREDIT, KH_SEND_Q, KH_NEXT_A, KH_STEP_BARRIER,
  KH_WAIT_GRAM, KH_LEN
};
constexpr int KT_LEN = KT_CHAIN_LEN + V8H_HELPERS * KH_LEN;

struct V8kArgs {
  const float *gram1, *gramh, *p;  // [steps][128][128], [5][steps][128][128], [steps][128][10]
  const int* labels;
  int n;
  float c;
  float *g_out, *z_out, *stats;
  long long* timing;
};

// Rank 0: the chain. Step t: [gfree] G'_{t−1} (B_t, 16 B a thread) to the six helpers · P_t and
// labels, the product, K half 1 · (barrier) warps 0 … 7: [qfull of each j ≤ min(t, L)] Q added,
// softmax, G_t out, B_{t+1}; warps 8 … 15: Γ̃_{t+2} issued; all: A_{t+1} · (barrier) threads 1 … 6:
// re-arm and credit helper h's part of step t.
template <bool PHASES>
__device__ __forceinline__ void v8k_chain(const V8kArgs& v, unsigned char* smem, int steps) {
  using S = V8kSmem;
  float* ring = reinterpret_cast<float*>(smem + S::RING);
  float* halves = reinterpret_cast<float*>(smem + S::HALVES);
  uint32_t* bw = reinterpret_cast<uint32_t*>(smem + S::BW);
  const float* inbox = reinterpret_cast<const float*>(smem + S::INBOX);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t qfull = base + S::QFULL, gfree = base + S::GFREE;
  const uint32_t gring = base + S::GRING, gfull = base + S::GFULL, qfree = base + S::QFREE;
  const int tid = threadIdx.x, w = tid >> 5, n = v.n;
  const V8DeviceWarp warp;
  constexpr int SLOT = V8C_ROWS * V8C_GS;
  const size_t gram_step = size_t(V8C_ROWS) * V8C_ROWS, io_step = size_t(V8C_ROWS) * V8C_C;

  v8k_issue_rows(ring, v.gram1, 0, V8C_ROWS, tid, V8C_THREADS);
  if (steps > 1) v8k_issue_rows(ring + SLOT, v.gram1 + gram_step, 0, V8C_ROWS, tid, V8C_THREADS);
  for (int i = tid; i < V8C_BWORDS; i += V8C_THREADS) bw[i] = 0u;
  if (tid == 0) {
    for (int i = 0; i < V8H_NQ * V8H_PARTS; ++i) v8k_init(qfull + 8 * i, 1);
    for (int s = 0; s < V8H_NSG; ++s) v8k_init(gfree + 8 * s, V8H_HELPERS);
    v8k_init_fence();
    for (int j = 2; j <= V8H_LAG; ++j)  // each part's first NQ steps
      for (int t = j; t < j + V8H_NQ && t < steps; ++t)
        v8k_arm(qfull + 8 * v8h_qbar(t, j, V8H_NQ), V8H_PART_BYTES);
  }
  v8k_cp_wait();
  __syncthreads();
  uint32_t a[2][V8C_KSTEPS][4];
  v8c_load_a(warp, ring, w, V8C_A_SCALE, a);
  float d[2][4], pqr[2][4], pmy[2][4], loss = 0.f, correct = 0.f;
  int y[2];
  long long ph[KT_CHAIN_LEN] = {};
  bool ok = true;
  v8k_cluster_barrier();  // every CTA's mbarriers initialised and armed
  long long ns0 = 0, clk0 = clock64();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns0));

  for (int t = 0; t < steps; ++t) {
    const int rows = v8c_rows(n, t), u = t - 1;
    const float coef = -v.c / static_cast<float>(t ? v8c_rows(n, t - 1) : 1);
    long long c0 = 0, c1 = 0, c2 = 0, c3 = 0, c4 = 0, c5 = 0, c6 = 0, cq = 0;
    if (PHASES) c0 = clock64();
    if (u >= 0 && u <= steps - 2) {  // G'_{t−1}: this thread's 16 bytes to every helper
      if (u >= V8H_NSG)
        ok &= v8k_wait(gfree + 8 * (u % V8H_NSG), v8h_free_parity(u, V8H_NSG), 1 << 4 | u << 16);
      const uint4 g4 = reinterpret_cast<const uint4*>(bw)[tid];
      const uint32_t dst = gring + (u % V8H_NSG) * V8H_G_BYTES + 16 * tid,
                     bar = gfull + 8 * (u % V8H_NSG);
#pragma unroll
      for (int h = 1; h <= V8H_HELPERS; ++h) v8k_st16(v8k_mapa(dst, h), g4, v8k_mapa(bar, h));
    }
    if (PHASES) c1 = clock64();
    if (w < 8) v8c_load_inputs(warp, w, v.p + t * io_step, v.labels + t * V8C_ROWS, rows, pqr, y);
    v8c_product(warp, a, bw, w, d);
    if (PHASES) c2 = clock64();
    if (w >= 8) {
      v8c_store_half(warp, d, halves, w);
      if (PHASES) c5 = clock64();
      v8k_cp_wait();  // Γ̃_{t+1}
      if (PHASES) ph[KT_WAIT_GRAM] += clock64() - c5;
    }
    __syncthreads();
    if (PHASES) c3 = clock64();
    if (w < 8) {
      for (int j = 2; j <= V8H_LAG && j <= t; ++j)
        ok &= v8k_wait(qfull + 8 * v8h_qbar(t, j, V8H_NQ), v8h_q_parity(t, j, V8H_NQ),
                       2 << 4 | j << 8 | t << 16);
      v8h_add_q(warp, w, inbox + (t % V8H_NQ) * V8H_QSLOT_FLOATS, t, rows, pqr);
      if (PHASES) cq = clock64();
      v8c_softmax(warp, w, d, halves, pqr, y, rows, coef, v.g_out + t * io_step,
                  v.z_out ? v.z_out + t * io_step : nullptr, pmy, loss, correct);
      if (PHASES) c4 = clock64();
      v8c_write_b(warp, w, pmy, bw);
      if (PHASES) c5 = clock64();
    } else if (t + 2 < steps) {
      if (PHASES) c4 = clock64();
      v8k_issue_rows(ring + ((t & 1) ? SLOT : 0), v.gram1 + (t + 2) * gram_step, 0, V8C_ROWS,
                     tid - 256, 256);
      if (PHASES) ph[KT_ISSUE_GRAM] += clock64() - c4;
    }
    if (t + 1 < steps) v8c_load_a(warp, ring + (((t + 1) & 1) ? SLOT : 0), w, V8C_A_SCALE, a);
    if (PHASES) c6 = clock64();
    __syncthreads();  // B_{t+1} written, A_{t+1} loaded, step t's inbox read
    if (tid >= 1 && tid <= V8H_HELPERS && v8h_lag(tid) <= t) {
      const int j = v8h_lag(tid);
      if (tid != 1 && t + V8H_NQ < steps) v8k_arm(qfull + 8 * v8h_qbar(t, j, V8H_NQ), V8H_PART_BYTES);
      v8k_remote_arrive(qfree + 8 * (t % V8H_NQ), tid);
    }
    if (PHASES && tid == 0) {
      const long long c7 = clock64();
      ph[KT_SEND_G] += c1 - c0;
      ph[KT_INPUTS_MMA] += c2 - c1;
      ph[KT_K_HALVES] += c3 - c2;
      ph[KT_WAIT_Q] += cq - c3;
      ph[KT_SOFTMAX] += c4 - cq;
      ph[KT_WRITE_B] += c5 - c4;
      ph[KT_NEXT_A] += c6 - c5;
      ph[KT_STEP_BARRIER] += c7 - c6;
    }
  }
  if (tid == 0) {
    long long ns1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns1));
    v.timing[KT_EPOCH_NS] = ok ? ns1 - ns0 : -1;
    v.timing[KT_EPOCH_CLOCKS] = clock64() - clk0;
  }
  if (PHASES && (tid == 0 || tid == 256))
    for (int i = KT_SEND_G; i < KT_CHAIN_LEN; ++i)
      if ((i >= KT_WAIT_GRAM) == (tid == 256)) v.timing[i] = ph[i];
  v.stats[2 * tid] = loss;
  v.stats[2 * tid + 1] = correct;
}

// Ranks 1 … 6: helper h, lag j. Iteration u = 0 … steps − 2 (t = u + j): [gfull] the product of
// A (Γ̃_{t,j}, its rows) and G'_u, K half 1 · (barrier) gfull re-armed, the credit to the chain ·
// warps 0 … 7: [qfree] q_{t,j} into the chain's inbox; warps 8 … 15: Γ̃ of u + 2 issued; A of
// u + 1 · (barrier). Iterations with t ≥ steps take the slot and give the credit only.
template <bool PHASES>
__device__ __forceinline__ void v8k_helper(const V8kArgs& v, unsigned char* smem, int steps,
                                           int h) {
  using S = V8kSmem;
  float* ring = reinterpret_cast<float*>(smem + S::RING);
  float* halves = reinterpret_cast<float*>(smem + S::HALVES);
  const uint32_t* gring = reinterpret_cast<const uint32_t*>(smem + S::GRING);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t gfull = base + S::GFULL, qfree = base + S::QFREE;
  const uint32_t inbox = base + S::INBOX, qfull = base + S::QFULL, gfree = base + S::GFREE;
  const int tid = threadIdx.x, w = tid >> 5, j = v8h_lag(h), r0 = v8h_row0(h),
            nr = v8h_nrows(h);
  const bool active = v8h_active(h, w);
  const int tid0 = 32 * (r0 / 16);  // the first active warp's lane 0: the phase clocks
  const V8DeviceWarp warp;
  constexpr int SLOT = V8C_ROWS * V8C_GS;
  const size_t gram_step = size_t(V8C_ROWS) * V8C_ROWS;
  const float* gram = v.gramh + size_t(j - 2) * steps * gram_step;  // Γ̃_{·,j}

  if (tid == 0) {
    for (int s = 0; s < V8H_NSG; ++s) v8k_init(gfull + 8 * s, 1);
    for (int s = 0; s < V8H_NQ; ++s) v8k_init(qfree + 8 * s, 1);
    v8k_init_fence();
    for (int s = 0; s < V8H_NSG && s <= steps - 2; ++s) v8k_arm(gfull + 8 * s, V8H_G_BYTES);
  }
  for (int u = 0; u < 2; ++u)
    if (u + j < steps)
      v8k_issue_rows(ring + u * SLOT, gram + (u + j) * gram_step, r0, nr, tid, V8C_THREADS);
  v8k_cp_wait();
  __syncthreads();
  uint32_t a[2][V8C_KSTEPS][4];
  if (active && j < steps) v8c_load_a(warp, ring, w, V8C_A_SCALE, a);
  float d[2][4];
  long long ph[KH_LEN] = {};
  bool ok = true;
  v8k_cluster_barrier();

  for (int u = 0; u + 1 < steps; ++u) {
    const int tt = u + j, slot = u % V8H_NSG;
    const bool useful = tt < steps;
    long long c0 = 0, c1 = 0, c2 = 0, c3 = 0, c4 = 0, c5 = 0, c6 = 0;
    if (PHASES) c0 = clock64();
    ok &= v8k_wait(gfull + 8 * slot, v8h_full_parity(u, V8H_NSG), 3 << 4 | h << 8 | u << 16);
    if (PHASES) c1 = clock64();
    if (useful && active) v8c_product(warp, a, gring + slot * V8C_BWORDS, w, d);
    if (PHASES) c2 = clock64();
    if (useful && w >= 8) {
      if (active) v8c_store_half(warp, d, halves, w);
      if (PHASES) c5 = clock64();
      v8k_cp_wait();  // Γ̃ of u + 1
      if (PHASES && tid == tid0 + 256) ph[KH_WAIT_GRAM] += clock64() - c5;
    }
    __syncthreads();  // G'_u read by every product; K half 1 stored; Γ̃ of u + 1 landed
    if (tid == 0) {
      if (u + V8H_NSG <= steps - 2) v8k_arm(gfull + 8 * slot, V8H_G_BYTES);
      v8k_remote_arrive(gfree + 8 * slot, 0);
    }
    if (PHASES) c3 = c4 = c5 = clock64();
    if (useful) {
      if (w < 8 && active) {
        if (u >= V8H_NQ)
          ok &= v8k_wait(qfree + 8 * (tt % V8H_NQ), v8h_free_parity(u, V8H_NQ),
                         4 << 4 | h << 8 | u << 16);
        if (PHASES) c4 = clock64();
        const uint32_t dst = inbox + (tt % V8H_NQ) * V8H_QSLOT_FLOATS * 4,
                       bar = v8k_mapa(qfull + 8 * v8h_qbar(tt, j, V8H_NQ), 0);
        v8h_part(warp, w, d, halves, v8h_coef(v.c, v.n, tt, j),
                 [&](int row, int col, float v0, float v1) {
                   v8k_st8(v8k_mapa(dst + 4 * v8h_part_at(j, row, col), 0), v0, v1, bar);
                 });
        if (PHASES) c5 = clock64();
      } else if (w >= 8 && tt + 2 < steps) {
        v8k_issue_rows(ring + ((u & 1) ? SLOT : 0), gram + (tt + 2) * gram_step, r0, nr,
                       tid - 256, 256);
      }
      if (active && tt + 1 < steps)
        v8c_load_a(warp, ring + (((u + 1) & 1) ? SLOT : 0), w, V8C_A_SCALE, a);
    }
    if (PHASES) c6 = clock64();
    __syncthreads();
    if (PHASES && tid == tid0) {
      ph[KH_WAIT_G] += c1 - c0;
      ph[KH_MMA] += c2 - c1;
      ph[KH_K_HALVES] += c3 - c2;
      ph[KH_WAIT_CREDIT] += c4 - c3;
      ph[KH_SEND_Q] += c5 - c4;
      ph[KH_NEXT_A] += c6 - c5;
      ph[KH_STEP_BARRIER] += clock64() - c6;
    }
  }
  long long* out = v.timing + KT_CHAIN_LEN + (h - 1) * KH_LEN;
  if (PHASES && tid == tid0)
    for (int i = 0; i < KH_WAIT_GRAM; ++i) out[i] = ph[i];
  if (PHASES && tid == tid0 + 256) out[KH_WAIT_GRAM] = ph[KH_WAIT_GRAM];
  (void)ok;  // a timeout is in g_v8k_error, which the entry point reads
}

template <bool PHASES>
__global__ void __launch_bounds__(V8C_THREADS, 1) v8_cluster_kernel(V8kArgs v) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int rank = v8k_rank(), steps = (v.n + V8C_ROWS - 1) / V8C_ROWS;
  if (rank == 0)
    v8k_chain<PHASES>(v, smem, steps);
  else if (rank <= V8H_HELPERS)
    v8k_helper<PHASES>(v, smem, steps, rank);
  else
    v8k_cluster_barrier();  // rank 7: idle, but in the start's cluster barrier
  v8k_cluster_barrier();  // nobody leaves while a peer may still write its shared memory
}

template <bool PHASES>
cudaError_t v8k_launch(const V8kArgs& a, cudaStream_t stream) {
  cudaError_t e = cudaFuncSetAttribute(v8_cluster_kernel<PHASES>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, V8kSmem::BYTES);
  if (e) return e;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(V8H_CLUSTER);
  cfg.blockDim = dim3(V8C_THREADS);
  cfg.dynamicSmemBytes = V8kSmem::BYTES;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = V8H_CLUSTER;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, v8_cluster_kernel<PHASES>, a);
}

}  // namespace
