// cuda-epoch v7a and v7b (the template parameter V7B): the lagged-Gram epoch as two launches on
// one stream (see epoch_v7_api.cuh for the changelog, epoch_v7_math.cuh for the algebra, the roles
// and every per-thread body, epoch_v7b_math.cuh for v7b's):
//   1. the Grams: every Γ_{t,j} = X_t X_{t−j}ᵀ of the epoch (j = 1 … L), u8 × u8 → s32 on the
//      tensor cores, rounded once to fp32 into global memory; it also zeroes the epoch kernel's
//      step counters. v7_gram_kernel (v1: gram_u8.cuh's warp tile from L2, checked on an H200,
//      493.8 µs a launch) or v7_gram_kernel_v2 (gram_v2.cuh: a CTA a (t, 64 rows of X_t) for all
//      L lags, operands staged by cp.async and read by ldmatrix; 211-237 µs an epoch on an H200).
//   2. v7_epoch_kernel: one persistent launch of V7_CTAS CTAs in clusters of 8: cluster 0 the
//      chain, clusters 1 … 7 the workers. They hand each other G and the partial logits through
//      global arrays indexed by step and per-CTA step counters (st.release.gpu after the data,
//      ld.acquire.gpu before reading it with ld.global.cg: L1 is not coherent across SMs).
// Co-residency: every role spins on the others, so the whole grid must be resident. The host
// checks cudaOccupancyMaxActiveClusters ≥ 8 at setup (cuda_epoch_v7_residency) and the launch
// also sets the cooperative attribute (NVIDIA's cuda.core LaunchConfig takes `cluster` and
// `is_cooperative` together, https://nvidia.github.io/cuda-python/cuda-core/latest/generated/
// cuda.core.LaunchConfig.html; the runtime's cudaLaunchAttributeValue documents both fields of
// one launch), so an unschedulable grid fails at launch instead of deadlocking.
//
// Waits, all bounded by WAIT_BUDGET clocks as v4's (a timeout records kind | CTA << 4 | step << 12
// in g_signal_error, read by cuda_epoch_signal_status):
//   chain CTA q, step t: G_{t−1} from the 8 chain CTAs (v4's mbarrier + st.async, ring slot
//     (t−1) % NB re-armed for step t−1+NB right after the wait: the sender of step t−1+NB needs
//     my G_{t+NB−2}, sent after every read of that slot) and each worker cluster's counter for
//     rows 16q … ≥ t + 1 (kind WAIT_V7_PARTIALS).
//   worker CTA (k, r): G_a published by all 8 chain CTAs before the update with G_a (kind
//     WAIT_V7_G). A failed wait is made uniform over the worker cluster before anyone reads
//     another CTA's shared memory: each CTA's ok bit is read by all 8 after the step's cluster
//     barrier, and all leave together after one more barrier.
// Worker partials: double-buffered by step parity, one cluster barrier a step (a CTA rewrites its
// buffer p at step t+2 only after barrier t+1, which every CTA passes after reading it at step t).
// v7b (epoch_v7b_math.cuh: what changed and why it is safe): the reduced partials go to the chain
// as tagged 8-byte words (st.relaxed.gpu.b64) in a ring of L + 1 slots that each Gram launch
// clears; no worker counter, no publish: the chain polls its 7 words (ld.relaxed.gpu.b64) until
// every tag is t (kind WAIT_V7_PARTIALS on a timeout; fault 2 wants a tag no step writes); and its
// softmax runs on 16 lanes a row with __shfl_xor_sync.
#pragma once
#include "epoch_v4.cuh"
#include "epoch_v7_math.cuh"
#include "epoch_v7b_math.cuh"
#include "epoch_v7_sync.cuh"
#include "epoch_v7_phases.cuh"
#include "epoch_v7l.cuh"
#include "gram_u8.cuh"
#include "gram_v2.cuh"

namespace {

enum V7Wait { WAIT_V7_PARTIALS = 3, WAIT_V7_G = 4 };

struct V7Args {
  Args a;
  V7Epoch e;
  V7Scratch s;
  int tagged;  // v7b: the Gram launch clears the tagged partials' ring
};

// v7b: every tagged word cleared by the Gram launch's CTA `block` of `blocks` (its threads
// striding over the ring), before any early return.
__device__ __forceinline__ void v7b_clear(const V7Args& v, int block, int blocks) {
  if (!v.tagged) return;
  for (size_t i = size_t(block) * blockDim.x + threadIdx.x; i < V7_PTAG_WORDS;
       i += size_t(blocks) * blockDim.x)
    v.s.ptag[i] = V7_CLEAR_WORD;
}

// ---- 1. the Grams ----------------------------------------------------------------------------
// Grid (BMAX / TILE_N, BMAX / TILE_M, steps · L): z = t · L + j − 1, Γ_{t,j} into its block.
__global__ void __launch_bounds__(32 * gram::WARPS) v7_gram_kernel(V7Args v) {
  v7b_clear(v, blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z),
            gridDim.x * gridDim.y * gridDim.z);
  if (blockIdx.x + blockIdx.y + blockIdx.z == 0 && threadIdx.x < 64) {
    if (threadIdx.x < V7_CHAIN) v.s.gflag[threadIdx.x] = 0;
    if (threadIdx.x < V7_WORKERS) v.s.pflag[threadIdx.x] = 0;
  }
  const int t = blockIdx.z / V7_LAG, j = blockIdx.z % V7_LAG + 1;
  if (t - j < 0) return;  // before the epoch: no term
  const int na = v.e.rows(t), nb = v.e.rows(t - j);
  const int m0 = blockIdx.y * gram::TILE_M + (threadIdx.x >> 5) * 16;
  const int n0 = blockIdx.x * gram::TILE_N;
  if (m0 >= na || n0 >= nb) return;  // warp-uniform: mma.sync needs every lane
  gram::DeviceWarp warp;
  gram::warp_tile(warp, v.a.x, v.a.order + t * v.e.bs, na, v.a.order + (t - j) * v.e.bs, nb, m0,
                  n0, v.s.gram + v7_gram_offset(t, j), BMAX);
}

// v2 (gram_v2.cuh): grid (TILES, steps), CTA (tile, t) computes Γ_{t,1…L} for X_t's rows
// 64·tile …; GRAM_V2_SMEM bytes of dynamic shared memory. Not yet run on a GPU.
constexpr int GRAM_V2_SMEM = gram::v2::SMEM;
__global__ void __launch_bounds__(gram::v2::THREADS, 1) v7_gram_kernel_v2(V7Args v) {
  v7b_clear(v, blockIdx.x + gridDim.x * blockIdx.y, gridDim.x * gridDim.y);
  if (blockIdx.x + blockIdx.y == 0 && threadIdx.x < 64) {
    if (threadIdx.x < V7_CHAIN) v.s.gflag[threadIdx.x] = 0;
    if (threadIdx.x < V7_WORKERS) v.s.pflag[threadIdx.x] = 0;
  }
  extern __shared__ __align__(128) uint8_t gram_smem[];
  const int t = blockIdx.y;
  const gram::v2::Job job = gram::v2::v7_job(v.e, v.a.x, v.a.order, v.s.gram, t, blockIdx.x);
  if (t == 0 || job.n[0] <= 0) return;  // no lag before the epoch; no rows (CTA-uniform)
  gram::v2::DeviceCta cta;
  gram::v2::cta_grams(cta, job, gram_smem);
}

// ---- 2. the chain (cluster 0, CTA q) ----------------------------------------------------------
// TIMED: the phase-profiling build (epoch_v7_phases.cuh), never the timed row's. V7B: v7b.
// gate(t): Γ_{t,·} may be read (epoch_v7l.cuh: always in two launches; in one, the producers'
// flag, false on a failed wait, which the next step's check turns into the loop's exit).
// A chain CTA's results after its last step (every chain's: v7_chain, v7c_chain, v7g_chain): CTA
// 0 writes the bias (every chain CTA holds the same copy); each CTA adds its rows' loss and
// correct count to the stats.
__device__ __forceinline__ void chain_results(const V7Args& v, int q, int tid, const float* bias,
                                              float loss, float correct) {
  if (q == 0 && tid < C) v.a.b[tid] = bias[tid];
  if (loss != 0.f || correct != 0.f) {
    atomicAdd(v.a.stats, loss);
    atomicAdd(v.a.stats + 1, correct);
  }
}

// Chain CTA q's G_t (its valid rows and their column sum, in gl) to every chain CTA's ring slot
// t % NB (st.async, completing on that slot's mbarrier), the rows also to global memory for the
// workers; by threads 0 … THREADS − 1 (v7a/v7b: all 512; v7c: its 256 critical threads).
// GLOBAL false (v7i): the ring slots only; the helper warps store the rows (epoch_v7i.cuh).
template <int THREADS, bool GLOBAL = true>
__device__ __forceinline__ void chain_send_g(const V7Args& v, int t, int q, int tid,
                                             const float* gl, uint32_t ring_u, uint32_t bar_u) {
  const int nt = v.e.rows(t), slot = v7_slot(t);
  for (int it = tid; it < V7_CHAIN * (V7_RPC + 1) * 4; it += THREADS) {
    const int w4 = it & 3, i = (it >> 2) % (V7_RPC + 1), d = (it >> 2) / (V7_RPC + 1);
    const int row = q * V7_RPC + i;
    if (i < V7_RPC && row >= nt) continue;
    const float4 val = *reinterpret_cast<const float4*>(gl + i * 16 + 4 * w4);
    const int off = i < V7_RPC ? row * V7_RS : BMAX * V7_RS + q * V7_GROW;
    st_async4(mapa(ring_u + 4 * (slot * ChainSmem::GSLOT + off + 4 * w4), d), val,
              mapa(bar_u + 8 * slot, d));
    if (GLOBAL && d == 0 && i < V7_RPC)
      *reinterpret_cast<float4*>(v.s.g + (size_t(t) * BMAX + row) * V7_GROW + 4 * w4) = val;
  }
}

// Every epoch kernel's prologue (v7_epoch_kernel's, v7c_epoch's): in one launch (GRAMS
// V7_GRAMS_LAUNCH) the ticket first, the producer CTAs' whole run (v7's counters and v7b's ring
// cleared by producer CTA 0), and the chain's and workers' wait for that reset; in both modes a
// stale failure not yet read by the host makes every CTA leave (as v4). True: this CTA runs its
// chain or worker role.
template <int GRAMS>
__device__ __forceinline__ bool v7_prologue(const V7Args& v, float* sm) {
  if constexpr (GRAMS == V7_GRAMS_LAUNCH) {  // the ticket before anything that may leave
    const V7LScratch l = v7l_scratch(v.a.scratch, v.e.steps);
    const int gen = v7l_arrive(l, v.e.steps, v7l_tile(blockIdx.x % V7_CLUSTER));
    if (*static_cast<volatile int*>(&g_signal_error) != 0) return false;
    if (blockIdx.x / V7_CLUSTER > V7_WCLUSTERS) {
      v7l_producer(blockIdx.x - V7_CTAS, v.e, v.a.x, v.a.order, v.s.gram,
                   reinterpret_cast<uint8_t*>(sm), [&] {
                     for (int i = threadIdx.x; i < V7_CHAIN * (1 + V7_WCLUSTERS); i += V7_T)
                       v.s.gflag[i] = 0;  // both counter arrays (gflag, pflag)
                     v7b_clear(v, 0, 1);
                   });
      return false;
    }
    return v7l_wait_reset(l, gen);
  } else {
    return *static_cast<volatile int*>(&g_signal_error) == 0;
  }
}

template <bool TIMED, bool V7B, class Gate = V7GramsReady>
__device__ void v7_chain(int q, const V7Args& v, float* sm, Gate gate = {}) {
  using S = ChainSmem;
  const V7Epoch& e = v.e;
  const int tid = threadIdx.x, steps = e.steps;
  float *ring = sm + S::RING, *bias = sm + S::BIAS, *red = sm + S::RED, *zs = sm + S::ZS,
        *gl = sm + S::GL;
  int* ys = reinterpret_cast<int*>(sm + S::YS);
  const uint32_t ring_u = smem_addr(ring), bar_u = smem_addr(sm + S::BAR);
  auto label = [&](int t, int i) {
    const int row = q * V7_RPC + i;
    return row < e.rows(t) ? v.a.y[v.a.order[t * e.bs + row]] : 0;
  };
  for (int i = tid; i < V7_NB * S::GSLOT; i += V7_T) ring[i] = 0.f;  // pads: finite
  if (tid < C) bias[tid] = v.a.b[tid];
  if (tid < V7_RPC) ys[tid] = label(0, tid);
  if (tid == 0) {
    for (int p = 0; p < V7_NB; ++p) mbar_init(bar_u + 8 * p, 1);
    mbar_init_fence();
    for (int t = 0; t < V7_NB && t < steps; ++t) mbar_arm(bar_u + 8 * t, v7_g_bytes(e, t));
  }
  __syncthreads();
  cluster_barrier();  // every chain CTA's mbarriers armed before anyone sends

  float loss = 0.f, correct = 0.f;
  bool failed = false, gram_ok = true;
  V7PhaseClock<TIMED> clock;
  // Software-pipelined Gram terms: entering step t, gam holds Γ_{t,·} (loaded during step t − 1)
  // and acc the terms j ≥ 2 (added at the end of step t − 1); only j = 1 waits for G_{t−1}.
  float gam[V7_LAG][V7_U], acc[C];
  chain_load_gram(e, v.s.gram, 0, q, tid, gam);
  for (int c = 0; c < C; ++c) acc[c] = 0.f;
  for (int t = 0; t < steps; ++t) {
    bool ok = true;
    if (t > 0)
      ok = bounded_wait(bar_u + 8 * v7_slot(t - 1), v7_parity(t - 1),
                        WAIT_G | blockIdx.x << 4 | t << 12);
    clock.mark(V7C_WAIT_G);
    // (The test hook, fault 2: chain CTA 0 waits at step 2 for a count no worker reaches.)
    const bool fault = t == 2 && q == 0 && g_signal_fault == 2;
    float p = 0.f;  // v7b: my (row, class)'s partials summed, read with their tags
    if constexpr (!V7B) {
      if (tid < V7_WCLUSTERS)
        ok = ok && poll_at_least(v.s.pflag + tid * V7_CLUSTER + q,
                                 fault ? 0x7fffffff : v7_part_ready(t),
                                 WAIT_V7_PARTIALS | blockIdx.x << 4 | t << 12);
    } else if (ok && v7b_part_mine(e, t, q, tid)) {
      const uint64_t* words = v7b_part_words(v.s.ptag, t, q, tid);
      const int want = fault ? V7_TAG_NEVER : t;
      if (!v7b_sum_tagged(words, want, LdRelaxed64{}, p)) {
        const unsigned long long got =
            poll_tagged(words, want, WAIT_V7_PARTIALS | blockIdx.x << 4 | t << 12);
        ok = got >> 32 != 0;
        p = __uint_as_float(static_cast<uint32_t>(got));
      }
    }
    if (__syncthreads_or(!ok || !gram_ok)) {
      failed = true;
      break;
    }
    clock.mark(V7C_WAIT_PART);
    if (t > 0) {
      if (tid == 0 && t - 1 + V7_NB < steps)  // slot (t−1) % NB read from here on: see the top
        mbar_arm(bar_u + 8 * v7_slot(t - 1), v7_g_bytes(e, t - 1 + V7_NB));
      chain_bias(e, ring, t - 1, tid, bias);
    }
    chain_gram_terms(e, gam, ring, t, tid, 1, 1, acc);
    chain_gram_store(tid, acc, red, V7B);
    clock.mark(V7C_GRAM);
    if (t + 1 < steps) gram_ok = gate(t + 1);  // one launch: the producers' flag of Γ_{t+1}
    clock.mark(V7C_WAIT_GRAM);
    if (t + 1 < steps) chain_load_gram(e, v.s.gram, t + 1, q, tid, gam);  // in flight till the end
    __syncthreads();
    clock.mark(V7C_GRAM);
    // The next step's labels, off the chain, by threads the softmax leaves idle.
    constexpr int LT = V7B ? V7_SMT : 32;
    if constexpr (V7B) {  // Z in the register of the lane that takes its softmax: no barrier
      const float z = tid < V7_SMT ? chain_logit16(e, t, q, tid, p, bias, red) : 0.f;
      clock.mark(V7C_LOGITS);
      if (tid < V7_SMT)
        chain_softmax16(V7DeviceWarp{}, e, t, q, tid / 32, z, ys + (t & 1) * V7_RPC, gl, loss,
                        correct);
    } else {
      // The partials through L2 (ld.global.cg: other SMs wrote them during this launch).
      const float* part_t = v7_part_rows(v.s, t, 0);
      chain_logits(
          e, [&](int k, int i) { return __ldcg(part_t + size_t(k) * BMAX * V7_GROW + i); }, t,
          q, tid, bias, red, zs);
      __syncthreads();
      clock.mark(V7C_LOGITS);
      chain_softmax(e, t, q, tid, zs, ys + (t & 1) * V7_RPC, gl, loss, correct);
    }
    if (tid >= LT && tid < LT + V7_RPC && t + 1 < steps)
      ys[((t + 1) & 1) * V7_RPC + tid - LT] = label(t + 1, tid - LT);
    __syncthreads();
    chain_colsum(tid, gl);
    __syncthreads();
    clock.mark(V7C_SOFTMAX);
    // G_t: my valid rows and their column sum to every chain CTA's slot t % NB, the rows to
    // global memory for the workers.
    chain_send_g<V7_T>(v, t, q, tid, gl, ring_u, bar_u);
    __syncthreads();
    clock.mark(V7C_SEND);
    publish(v.s.gflag + q, t + 1);
    clock.mark(V7C_PUBLISH);
    // Step t + 1's terms j ≥ 2: G_{t−1} … G_{t+1−L}, all in the ring (the re-armed slot of
    // G_{t−1} is next written with G_{t+L}, after my G_{t+L−1}).
    for (int c = 0; c < C; ++c) acc[c] = 0.f;
    if (t + 1 < steps) chain_gram_terms(e, gam, ring, t + 1, tid, 2, V7_LAG, acc);
    clock.mark(V7C_GRAM);
  }
  if (!failed) {  // G_{steps−1}: the last bias update, and no st.async left in flight to me
    const int t = steps;
    const bool ok = bounded_wait(bar_u + 8 * v7_slot(t - 1), v7_parity(t - 1),
                                 WAIT_G | blockIdx.x << 4 | t << 12);
    failed = __syncthreads_or(!ok);
    clock.mark(V7C_WAIT_G);
    if (!failed) chain_bias(e, ring, t - 1, tid, bias);
    clock.mark(V7C_GRAM);
  }
  if (failed) return;
  clock.write(steps);
  chain_results(v, q, tid, bias, loss, correct);
}

// ---- 3. the workers (cluster 1 + k, CTA r) ----------------------------------------------------
// v7a/v7b's hand-over of G_a to a worker CTA: threads 0 … 7 poll the 8 chain counters (wait),
// then, after the CTA's barrier, every thread loads G_a's rows from L2 into gs (stage); nothing
// fetched ahead. v7d's V7GAhead (epoch_v7d.cuh) fetches the next update's G during a step.
struct V7GDirect {
  __device__ __forceinline__ bool wait(const V7Args& v, int a, int tid) {
    return tid >= V7_CHAIN ||
           poll_at_least(v.s.gflag + tid, v7_g_ready(a), WAIT_V7_G | blockIdx.x << 4 | a << 12);
  }
  __device__ __forceinline__ void stage(const V7Args& v, int a, int tid, float* gs) {
    for (int i = tid; i < v.e.rows(a) * V7_GROW / 4; i += V7_T)
      reinterpret_cast<float4*>(gs)[i] =
          __ldcg(reinterpret_cast<const float4*>(v.s.g + size_t(a) * BMAX * V7_GROW) + i);
  }
  __device__ __forceinline__ void ahead(const V7Args&, int, int) {}
};

// GF: how G reaches the update (V7GDirect, or v7d's V7GAhead).
template <bool TIMED, bool V7B, class GF = V7GDirect>
__device__ void v7_worker(int k, int r, const V7Args& v, float* sm) {
  using S = WorkerSmem;
  const V7Epoch& e = v.e;
  const int tid = threadIdx.x, steps = e.steps, f0 = (k * V7_CLUSTER + r) * V7_FW;
  float *xs = sm + S::XS, *w = sm + S::W, *gs = sm + S::GS, *ured = sm + S::URED,
        *pbuf = sm + S::PBUF;
  int* okb = reinterpret_cast<int*>(sm + S::OK);
  for (int i = tid; i < 2 * BMAX * V7_GROW; i += V7_T) pbuf[i] = 0.f;
  if (tid < V7_FW * C) w[(tid / C) * 16 + tid % C] = v.a.w[(tid % C) * K + f0 + tid / C];
  __syncthreads();
  cluster_barrier();  // every CTA of the cluster runs before anyone reads its shared memory
  V7PhaseClock<TIMED> clock;

  GF gf;
  // The update with G_a, after all 8 chain CTAs published it. False: a wait failed.
  auto update = [&](int a) {
    if (__syncthreads_or(!gf.wait(v, a, tid))) return false;
    clock.mark(V7W_WAIT_G);
    gf.stage(v, a, tid, gs);
    __syncthreads();
    worker_update_sums(e, a, xs, gs, tid, ured);
    __syncthreads();
    worker_update_apply(e, ured, tid, w);
    __syncthreads();
    clock.mark(V7W_UPDATE);
    return true;
  };

  int applied = 0;
  bool failed = false;
  uint8_t xb[V7_XF];  // x_{t+1}'s bytes, loaded during step t
  worker_fetch_x(e, v.a.x, v.a.order, 0, f0, tid, V7_T, xb);
  worker_store_x(e, 0, tid, V7_T, xb, xs);
  for (int t = 0; t < steps; ++t) {
    const int p = t & 1;
    if (t + 1 < steps) worker_fetch_x(e, v.a.x, v.a.order, t + 1, f0, tid, V7_T, xb);
    clock.mark(V7W_LOAD_X);
    bool ok = true;
    for (; ok && applied < v7_applied_before(t); ++applied) ok = update(applied);
    __syncthreads();  // x_t in place (stored at the end of step t − 1)
    clock.mark(V7W_LOAD_X);
    if (ok) worker_partial(e, t, xs, w, tid, pbuf + p * BMAX * V7_GROW);
    // x_{t+1} into slot (t + 1) % XR, whose x_{t−L−1} this step's last update read (its
    // __syncthreads passed); read from the next step's barrier on.
    if (t + 1 < steps) worker_store_x(e, t + 1, tid, V7_T, xb, xs);
    // v7d: G of the next update (step `applied`'s), fetched now by the warps the partials leave
    // idle, its loads in flight through the barrier and the reduce (V7GDirect: nothing).
    if (ok && applied < steps) gf.ahead(v, applied, tid);
    clock.mark(V7W_PARTIALS);
    if (tid == 0) okb[p] = ok;
    cluster_barrier();
    // Lanes 0 … 7 of every warp read the 8 ok bits at once (a chain of dependent DSMEM reads
    // took most of this phase's 1.2 µs a step on an H200); every warp reaches the same verdict.
    const int lane = tid % 32;
    const bool mine = lane >= V7_CLUSTER || ld_dsmem(smem_addr(okb + p), lane) != 0;
    const bool all = __all_sync(0xffffffffu, mine);
    clock.mark(V7W_BARRIER);
    if (!all) {  // uniform over the cluster: leave together, nobody reads a departed CTA
      cluster_barrier();
      return;
    }
    const auto remote = [&](int src, int i) {
      return __uint_as_float(ld_dsmem(smem_addr(pbuf + p * BMAX * V7_GROW + i), src));
    };
    if constexpr (V7B) {  // the tagged words are the signal: no barrier, no counter
      uint64_t* ring = v.s.ptag;
      worker_reduce(e, t, r, tid, remote, [&](int row, int c, float val) {
        st_relaxed64(ring + v7b_word_at(t, k, row, c), v7b_word(val, t));
      });
      clock.mark(V7W_REDUCE);
    } else {
      float* out = v7_part_rows(v.s, t, k);
      worker_reduce(e, t, r, tid, remote,
                    [&](int row, int c, float val) { out[row * V7_GROW + c] = val; });
      __syncthreads();
      clock.mark(V7W_REDUCE);
      publish(v.s.pflag + k * V7_CLUSTER + r, t + 1);
    }
    clock.mark(V7W_PUBLISH);
  }
  for (; !failed && applied < steps; ++applied) failed = !update(applied);
  cluster_barrier();  // the last step's partial buffers read by every rank
  clock.mark(V7W_BARRIER);
  if (failed) return;
  clock.write(steps);
  if (tid < V7_FW * C) v.a.w[(tid % C) * K + f0 + tid / C] = w[(tid / C) * 16 + tid % C];
}

// GRAMS: V7_GRAMS_KERNEL (the Grams by their own launch before this one: V7_CTAS CTAs) or
// V7_GRAMS_LAUNCH (one launch of V7L_CTAS: the producer clusters after the workers, epoch_v7l.cuh).
template <bool TIMED = false, bool V7B = false, int GRAMS = V7_GRAMS_KERNEL>
__global__ void __launch_bounds__(V7_T, 1) v7_epoch_kernel(V7Args v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) float sm[];
  if (!v7_prologue<GRAMS>(v, sm)) return;
  const int cluster = blockIdx.x / V7_CLUSTER, rank = blockIdx.x % V7_CLUSTER;
  if (cluster == 0) {
    if constexpr (GRAMS == V7_GRAMS_LAUNCH)
      v7_chain<TIMED, V7B>(rank, v, sm, V7GramsGate{});
    else
      v7_chain<TIMED, V7B>(rank, v, sm);
  } else {
    v7_worker<TIMED, V7B>(cluster - 1, rank, v, sm);
  }
#endif
}

}  // namespace
