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
//      (NC adds, not 128). Expected ~3.5 µs/step (see the report); not yet timed on a GPU.
#include <cooperative_groups.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cg = cooperative_groups;

namespace {

constexpr int K = 784;       // features
constexpr int C = 10;        // classes
constexpr int BMAX = 128;    // largest batch one launch supports
constexpr int THREADS = 288; // 9 warps: 256 for the logits (2 per row), 280 for the gradient

__host__ __device__ constexpr int align4(int n) { return (n + 3) / 4 * 4; }

template <int NC>
struct Shape {
  static constexpr int F = K / NC;                    // my features (112 or 56)
  static constexpr int FP = F + 4;                    // padded float row: 16-byte aligned, no
                                                      // bank conflicts between rows
  static constexpr int RPC = (BMAX + NC - 1) / NC;    // rows each CTA owns (row b -> CTA b % NC)
  static constexpr int PART = NC * RPC * C;           // inbox of partial logits [src][row][class]
  static constexpr int INBOX = align4(PART) + BMAX * C;  // + inbox of g [row][class]
  // Shared memory, in floats (every region 16-byte aligned).
  static constexpr int W_OFF = 0;
  static constexpr int BIAS_OFF = W_OFF + C * F;
  static constexpr int XF_OFF = BIAS_OFF + 16;
  static constexpr int INBOX_OFF = XF_OFF + 2 * BMAX * FP;
  static constexpr int RED_OFF = INBOX_OFF + align4(INBOX);
  static constexpr int IDX_OFF = RED_OFF + THREADS * 4;
  static constexpr int YS_OFF = IDX_OFF + 2 * BMAX;
  static constexpr int XB_OFF = YS_OFF + 2 * BMAX;
  static constexpr int BYTES = XB_OFF * 4 + BMAX * F;
  static_assert(K % NC == 0 && F % 8 == 0, "features split in 8-byte aligned slices");
  static_assert(C * (F / 4) <= THREADS, "one gradient unit (class, 4 features) per thread");
};

struct Args {
  const uint8_t* x;   // [N][784] raw pixels
  const int* y;       // [N] labels
  const int* order;   // [N] this epoch's order
  int n, bs;
  float lr;
  float* w;           // [10][784], updated in place
  float* b;           // [10]
  float* stats;       // [2] += (loss sum, correct count)
  float* scratch;     // [NC][INBOX] inboxes of the grid variant (unused by the cluster one)
};

// Where the inboxes live and how the CTAs wait for each other: the only difference between the
// cluster kernel and the cooperative-grid fallback.
#if defined(_CG_HAS_CLUSTER_GROUP)  // the host pass and sm_90+; the kernel is empty elsewhere
struct ClusterExchange {
  cg::cluster_group cluster;
  float* inbox;  // mine, in shared memory
  __device__ int rank() const { return static_cast<int>(cluster.block_rank()); }
  __device__ float* inbox_of(int q) { return cluster.map_shared_rank(inbox, q); }
  __device__ float* local() { return inbox; }
  __device__ float read(const float* p) const { return *p; }
  __device__ float4 read4(const float* p) const { return *reinterpret_cast<const float4*>(p); }
  __device__ void sync() { cluster.sync(); }  // barrier.cluster arrive.release/wait.acquire
  // The same barrier split in two (v3): local work between arrive and wait overlaps the
  // barrier's round trip; nothing between them may touch an inbox.
  __device__ void arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
  __device__ void wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
};
#endif

template <int INBOX>  // floats of one CTA's inbox
struct GridExchange {
  cg::grid_group grid;
  float* scratch;
  __device__ int rank() const { return static_cast<int>(blockIdx.x); }
  __device__ float* inbox_of(int q) const { return scratch + q * INBOX; }
  __device__ float* local() { return inbox_of(rank()); }
  __device__ float read(const float* p) const { return __ldcg(p); }
  __device__ float4 read4(const float* p) const {
    return __ldcg(reinterpret_cast<const float4*>(p));
  }
  __device__ void sync() { grid.sync(); }
  __device__ void arrive() {}  // a grid barrier cannot be split: the window runs before it
  __device__ void wait() { grid.sync(); }
};

// 4 uint8 pixels -> 4 exact floats with integer byte moves and one FADD each (2^23 + v - 2^23),
// instead of the I2F conversion, which runs at an eighth of the FMA rate.
__device__ __forceinline__ float4 bytes_to_float4(uint32_t v) {
  const float m = 8388608.f;
  return make_float4(__uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540)) - m,
                     __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7541)) - m,
                     __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7542)) - m,
                     __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7543)) - m);
}

template <int NC, class Ex>
__device__ void train_epoch_v2(Ex& ex, const Args& a, float* sm) {
  using S = Shape<NC>;
  constexpr int F = S::F, FP = S::FP, RPC = S::RPC, CH = F / 8;
  const int tid = threadIdx.x, r = ex.rank(), k0 = r * F;
  float* Ws = sm + S::W_OFF;
  float* bias = sm + S::BIAS_OFF;
  float* xf = sm + S::XF_OFF;         // [2][BMAX][FP] current and next batch, as floats
  float* red = sm + S::RED_OFF;       // [THREADS][4] gradient partials of the second row group
  int* idx = reinterpret_cast<int*>(sm + S::IDX_OFF);  // [2][BMAX] order, batch j in j & 1
  int* ys = reinterpret_cast<int*>(sm + S::YS_OFF);    // [2][BMAX] labels, batch j in j & 1
  uint8_t* xb = reinterpret_cast<uint8_t*>(sm + S::XB_OFF);  // [BMAX][F] next batch, raw
  float* inbox = ex.local();
  const float* part = inbox;           // [NC][RPC][C] partial logits of my rows
  const float* g = inbox + align4(S::PART);  // [BMAX][C] lr * dL/dz, every row
  const float inv255 = 1.f / 255.f;
  const int steps = (a.n + a.bs - 1) / a.bs;
  auto rows_of = [&](int step) { return min(a.bs, a.n - step * a.bs); };

  for (int i = tid; i < C * F; i += THREADS) Ws[i] = a.w[(i / F) * K + k0 + i % F];
  if (tid < C) bias[tid] = a.b[tid];
  for (int i = tid; i < 2 * BMAX * FP; i += THREADS) xf[i] = 0.f;  // finite, never NaN garbage

  // Prologue: order of batches 0 and 1, pixels and labels of batch 0.
  for (int j = 0; j < 2 && j < steps; ++j)
    for (int i = tid; i < rows_of(j); i += THREADS) idx[j * BMAX + i] = a.order[j * a.bs + i];
  __syncthreads();
  auto gather = [&](int step) {  // my F columns of the batch's rows -> xb, asynchronously
    const int* rows = idx + (step & 1) * BMAX;
    for (int i = tid; i < rows_of(step) * CH; i += THREADS) {
      const int row = i / CH, c = i % CH;
      __pipeline_memcpy_async(xb + row * F + c * 8,
                              a.x + static_cast<size_t>(rows[row]) * K + k0 + c * 8, 8);
    }
  };
  auto widen = [&](int step) {  // xb -> xf[step & 1]
    float* dst = xf + (step & 1) * BMAX * FP;
    const uint32_t* src = reinterpret_cast<const uint32_t*>(xb);
    for (int i = tid; i < rows_of(step) * (F / 4); i += THREADS) {
      const int row = i / (F / 4), c4 = i % (F / 4);
      *reinterpret_cast<float4*>(dst + row * FP + c4 * 4) = bytes_to_float4(src[i]);
    }
  };
  gather(0);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  widen(0);
  for (int i = tid; i < rows_of(0); i += THREADS) ys[i] = a.y[idx[i]];
  // Every CTA of the cluster has started (and is set up) before anyone writes into its shared
  // memory; a CTA can exit only after the last step's barrier B, after which nothing is remote.
  ex.sync();

  float loss = 0.f, correct = 0.f;
  for (int s = 0; s < steps; ++s) {
    const int nb = rows_of(s);
    const bool has_next = s + 1 < steps;
    const float* x = xf + (s & 1) * BMAX * FP;
    // Prefetch: pixels of batch s+1, order of batch s+2, label of batch s+1 (into a register).
    int y_next = 0;
    if (has_next) {
      gather(s + 1);
      if (s + 2 < steps)
        for (int i = tid; i < rows_of(s + 2); i += THREADS)
          __pipeline_memcpy_async(idx + (s & 1) * BMAX + i, a.order + (s + 2) * a.bs + i, 4);
      if (tid < rows_of(s + 1)) y_next = a.y[idx[((s + 1) & 1) * BMAX + tid]];
    }
    __pipeline_commit();

    // L: partial logits over my features; thread = (row, half of the classes).
    if (tid < 2 * BMAX) {
      const int row = tid >> 1, c0 = (tid & 1) * 5;
      float acc[5] = {0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
      for (int k = 0; k < F; k += 4) {
        const float4 xv = *reinterpret_cast<const float4*>(x + row * FP + k);
#pragma unroll
        for (int j = 0; j < 5; ++j) {
          const float4 wv = *reinterpret_cast<const float4*>(Ws + (c0 + j) * F + k);
          acc[j] += xv.x * wv.x + xv.y * wv.y + xv.z * wv.z + xv.w * wv.w;
        }
      }
      if (row < nb) {
        float* dst = ex.inbox_of(row % NC) + (r * RPC + row / NC) * C + c0;
#pragma unroll
        for (int j = 0; j < 5; ++j) dst[j] = acc[j];
      }
    }
    ex.sync();  // A: every partial of my rows is in my inbox

    // S: my rows; 16 lanes per row (10 active), reductions by shuffles within the 16.
    for (int base = 0; base < RPC; base += THREADS / 16) {
      const int i = base + tid / 16, c = tid % 16, row = r + i * NC;
      const bool valid = i < RPC && row < nb && c < C;
      float z = -INFINITY;
      if (valid) {
        float acc = 0.f;
        for (int src = 0; src < NC; ++src) acc += ex.read(part + (src * RPC + i) * C + c);
        z = acc * inv255 + bias[c];  // the partials are sums over raw 0..255 pixels
      }
      float m = z;
      for (int off = 8; off; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off, 16));
      const float e = valid ? __expf(z - m) : 0.f;
      float se = e;
      for (int off = 8; off; off >>= 1) se += __shfl_xor_sync(0xffffffffu, se, off, 16);
      if (valid) {
        const int label = ys[(s & 1) * BMAX + row];
        if (c == label) {
          loss += logf(se) + m - z;
          correct += z == m ? 1.f : 0.f;
        }
        const float gv = a.lr * (e / se - (c == label ? 1.f : 0.f)) / nb;
        for (int q = 0; q < NC; ++q) ex.inbox_of(q)[align4(S::PART) + row * C + c] = gv;
      }
    }
    ex.sync();  // B: every CTA holds g of every row

    // G: thread = (class, 4 features); with 56 features two row groups, summed through smem.
    {
      constexpr int UNITS = C * (F / 4), GROUPS = THREADS / UNITS;
      const int u = tid % UNITS, grp = tid / UNITS, c = u / (F / 4), k = (u % (F / 4)) * 4;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      if (grp < GROUPS) {
        for (int row = grp; row < nb; row += GROUPS) {
          const float gv = ex.read(g + row * C + c);
          const float4 xv = *reinterpret_cast<const float4*>(x + row * FP + k);
          acc.x += gv * xv.x;
          acc.y += gv * xv.y;
          acc.z += gv * xv.z;
          acc.w += gv * xv.w;
        }
      }
      if (GROUPS > 1 && grp >= 1 && grp < GROUPS)
        *reinterpret_cast<float4*>(red + tid * 4) = acc;
      if (GROUPS > 1) __syncthreads();
      if (grp == 0) {
        for (int q = 1; q < GROUPS; ++q) {
          const float4 o = *reinterpret_cast<const float4*>(red + (q * UNITS + u) * 4);
          acc.x += o.x;
          acc.y += o.y;
          acc.z += o.z;
          acc.w += o.w;
        }
        float4* wp = reinterpret_cast<float4*>(Ws + c * F + k);
        float4 wv = *wp;
        wv.x -= acc.x * inv255;
        wv.y -= acc.y * inv255;
        wv.z -= acc.z * inv255;
        wv.w -= acc.w * inv255;
        *wp = wv;
      }
      // The last C threads sum the bias gradient: 280..287 are otherwise idle, 278 and 279
      // have already done their share of the weight gradient above.
      if (tid >= THREADS - C) {
        const int cb = tid - (THREADS - C);
        float db = 0.f;
        for (int row = 0; row < nb; ++row) db += ex.read(g + row * C + cb);
        bias[cb] -= db;
      }
    }

    // The next batch: wait for its bytes, widen them, publish its labels.
    __pipeline_wait_prior(0);
    __syncthreads();
    if (has_next) {
      widen(s + 1);
      if (tid < rows_of(s + 1)) ys[((s + 1) & 1) * BMAX + tid] = y_next;
    }
    __syncthreads();
  }

  for (int i = tid; i < C * F; i += THREADS) a.w[(i / F) * K + k0 + i % F] = Ws[i];
  if (r == 0 && tid < C) a.b[tid] = bias[tid];
  if (loss != 0.f || correct != 0.f) {
    atomicAdd(a.stats, loss);
    atomicAdd(a.stats + 1, correct);
  }
}

// ---- v3 --------------------------------------------------------------------------------------
// The same step with the serial parts of v2 taken off the critical path (see the changelog at the
// top). 512 threads; owner q holds rows [q*RPC, (q+1)*RPC) (contiguous, so a warp's pushes go to
// one or two CTAs); per-row records are 16 floats with classes 0-4 in slots 0-4 and 5-9 in slots
// 8-12 (slot = c + 3*(c >= 5)), so a class half is one float4 and one float, 16-byte aligned.
constexpr int THREADS3 = 512;  // = 4 * BMAX: L is (row, class half, feature half)

__host__ __device__ constexpr int pow2_floor(int n) { return n >= 2 ? 2 * pow2_floor(n / 2) : 1; }

template <int NC>
struct Shape3 {
  static constexpr int F = K / NC;                  // my features (112 or 56)
  static constexpr int FP = F + 4;                  // padded float row of a batch
  static constexpr int KG = F / 4;                  // float4 feature groups (28 or 14)
  static constexpr int RPC = (BMAX + NC - 1) / NC;  // rows each CTA owns (19 or 10)
  static constexpr int UNITS = 2 * KG;              // gradient unit: (class half, feature group)
  static constexpr int RG = pow2_floor(THREADS3 / UNITS);  // row groups of the gradient (8, 16)
  static constexpr int PART = NC * RPC * 16;        // inbox of partial logits [src][row][16]
  static constexpr int GIN = BMAX * 16;             // inbox of g [row][16]
  static constexpr int DBIN = NC * 16;              // inbox of bias-gradient partials [src][16]
  static constexpr int INBOX = PART + GIN + DBIN;
  // Shared memory, in floats (every region 16-byte aligned).
  static constexpr int W_OFF = 0;
  static constexpr int BIAS_OFF = W_OFF + C * F;
  static constexpr int XF_OFF = BIAS_OFF + 16;
  static constexpr int INBOX_OFF = XF_OFF + 2 * BMAX * FP;
  static constexpr int RED_OFF = INBOX_OFF + INBOX;
  static constexpr int GL_OFF = RED_OFF + RG * C * F;  // my rows' g before they are sent
  static constexpr int IDX_OFF = GL_OFF + RPC * 16;
  static constexpr int YS_OFF = IDX_OFF + 4 * BMAX;
  static constexpr int XB_OFF = YS_OFF + 4 * BMAX;
  static constexpr int BYTES = XB_OFF * 4 + 2 * BMAX * F;
  static_assert(K % NC == 0 && F % 8 == 0 && KG % 2 == 0, "feature halves of whole float4s");
  static_assert(THREADS3 == 4 * BMAX && RPC * 16 <= THREADS3 && UNITS * RG <= THREADS3 &&
                C * KG <= THREADS3 - C, "one pass of each phase");
  static_assert(BYTES <= 227 * 1024, "fits a Hopper SM's shared memory");
};

__device__ __forceinline__ void fma4(float4& acc, float g, const float4& x) {
  acc.x += g * x.x;
  acc.y += g * x.y;
  acc.z += g * x.z;
  acc.w += g * x.w;
}

template <int NC, class Ex>
__device__ void train_epoch_v3(Ex& ex, const Args& a, float* sm) {
  using S = Shape3<NC>;
  constexpr int F = S::F, FP = S::FP, KG = S::KG, RPC = S::RPC, RG = S::RG, CH = F / 8;
  const int tid = threadIdx.x, r = ex.rank(), k0 = r * F;
  float* Ws = sm + S::W_OFF;
  float* bias = sm + S::BIAS_OFF;
  float* xf = sm + S::XF_OFF;   // [2][BMAX][FP] batch j in j & 1, as floats
  float* red = sm + S::RED_OFF;  // [RG][C][F] gradient partials of the row groups
  float* gl = sm + S::GL_OFF;    // [RPC][16] g of my rows
  int* idx = reinterpret_cast<int*>(sm + S::IDX_OFF);  // [4][BMAX] order, batch j in j & 3
  int* ys = reinterpret_cast<int*>(sm + S::YS_OFF);    // [4][BMAX] labels, batch j in j & 3
  uint8_t* xb = reinterpret_cast<uint8_t*>(sm + S::XB_OFF);  // [2][BMAX][F] raw, j in j & 1
  float* inbox = ex.local();
  const float* part = inbox;          // [NC][RPC][16] partial logits of my rows
  const float* g = inbox + S::PART;   // [BMAX][16] lr * dL/dz, every row
  const float* dbp = g + S::GIN;      // [NC][16] each owner's sum of its rows of g
  const float inv255 = 1.f / 255.f;
  const int steps = (a.n + a.bs - 1) / a.bs;
  auto rows_of = [&](int step) { return min(a.bs, a.n - step * a.bs); };

  for (int i = tid; i < C * F; i += THREADS3) Ws[i] = a.w[(i / F) * K + k0 + i % F];
  if (tid < C) bias[tid] = a.b[tid];
  for (int i = tid; i < 2 * BMAX * FP; i += THREADS3) xf[i] = 0.f;  // finite, never NaN garbage

  // Prologue: order of batches 0-3; pixels and labels of batches 0 and 1.
  for (int j = 0; j < 4 && j < steps; ++j)
    for (int i = tid; i < rows_of(j); i += THREADS3) idx[j * BMAX + i] = a.order[j * a.bs + i];
  __syncthreads();
  auto fetch = [&](int j) {  // pixels (my F columns) and labels of batch j, asynchronously
    const int* rows = idx + (j & 3) * BMAX;
    uint8_t* dst = xb + (j & 1) * BMAX * F;
    for (int i = tid; i < rows_of(j) * CH; i += THREADS3) {
      const int row = i / CH, c = i % CH;
      __pipeline_memcpy_async(dst + row * F + c * 8,
                              a.x + static_cast<size_t>(rows[row]) * K + k0 + c * 8, 8);
    }
    for (int i = tid; i < rows_of(j); i += THREADS3)
      __pipeline_memcpy_async(ys + (j & 3) * BMAX + i, a.y + rows[i], 4);
  };
  auto widen = [&](int j) {  // xb[j & 1] -> xf[j & 1]
    float* dst = xf + (j & 1) * BMAX * FP;
    const uint32_t* src = reinterpret_cast<const uint32_t*>(xb + (j & 1) * BMAX * F);
    for (int i = tid; i < rows_of(j) * (F / 4); i += THREADS3) {
      const int row = i / (F / 4), c4 = i % (F / 4);
      *reinterpret_cast<float4*>(dst + row * FP + c4 * 4) = bytes_to_float4(src[i]);
    }
  };
  fetch(0);
  if (steps > 1) fetch(1);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  widen(0);
  ex.sync();  // every CTA is set up before anyone writes into its inbox

  float loss = 0.f, correct = 0.f;
  for (int s = 0; s < steps; ++s) {
    const int nb = rows_of(s);
    const float* x = xf + (s & 1) * BMAX * FP;
    // Prefetch two batches ahead (order four ahead): the bytes land during this step and the next,
    // and are widened in the next step's barrier-A window, off the critical path. One commit
    // group per step, empty or not, so that wait_prior(1) below always means "the previous step's".
    if (s + 2 < steps) fetch(s + 2);  // its order came with step s-2's group
    if (s + 4 < steps)
      for (int i = tid; i < rows_of(s + 4); i += THREADS3)
        __pipeline_memcpy_async(idx + ((s + 4) & 3) * BMAX + i, a.order + (s + 4) * a.bs + i, 4);
    __pipeline_commit();

    // L: partial logits over my features; thread = (row, class half h, feature half fh), the two
    // feature halves summed by a shuffle; the pair stores one float4 + one float to the owner.
    {
      const int row = tid >> 2, h = (tid >> 1) & 1, fh = tid & 1, kb = fh * (F / 2);
      float acc[5] = {0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < F / 2; k += 4) {
        const float4 xv = *reinterpret_cast<const float4*>(x + row * FP + kb + k);
#pragma unroll
        for (int j = 0; j < 5; ++j) {
          const float4 wv = *reinterpret_cast<const float4*>(Ws + (5 * h + j) * F + kb + k);
          acc[j] += xv.x * wv.x + xv.y * wv.y + xv.z * wv.z + xv.w * wv.w;
        }
      }
#pragma unroll
      for (int j = 0; j < 5; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 1);
      if (row < nb) {
        float* dst = ex.inbox_of(row / RPC) + (r * RPC + row % RPC) * 16 + 8 * h;
        if (fh == 0)
          *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        else
          dst[4] = acc[4];
      }
    }
    ex.arrive();  // A: my partials are sent
    // Window: the next batch's bytes (the previous step's group) -> floats.
    __pipeline_wait_prior(1);
    __syncthreads();
    if (s + 1 < steps) widen(s + 1);
    ex.wait();  // A: every partial of my rows is in my inbox

    // S: my rows; 16 lanes per row (one per slot, 10 hold a class), every thread in the shuffles.
    {
      const int i = tid >> 4, l = tid & 15, row = r * RPC + i, c = l < 8 ? l : l - 3;
      const bool valid = i < RPC && row < nb && (l < 5 || (l >= 8 && l < 13));
      float z = -INFINITY;
      if (valid) {
        float acc = 0.f;
#pragma unroll
        for (int src = 0; src < NC; ++src) acc += ex.read(part + (src * RPC + i) * 16 + l);
        z = acc * inv255 + bias[c];  // the partials are sums over raw 0..255 pixels
      }
      float m = z;
      for (int off = 8; off; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off, 16));
      const float e = valid ? __expf(z - m) : 0.f;
      float se = e;
      for (int off = 8; off; off >>= 1) se += __shfl_xor_sync(0xffffffffu, se, off, 16);
      float gv = 0.f;  // 0 in the pad slots and past the batch: the bias partials sum them
      if (valid) {
        const int label = ys[(s & 3) * BMAX + row];
        if (c == label) {
          loss += logf(se) + m - z;
          correct += z == m ? 1.f : 0.f;
        }
        gv = a.lr * (e / se - (c == label ? 1.f : 0.f)) / nb;
      }
      if (i < RPC) gl[i * 16 + l] = gv;
    }
    __syncthreads();
    // Send my rows of g, and their sum (my share of the bias gradient), to every CTA as float4s;
    // consecutive threads write consecutive float4s of one destination.
    for (int it = tid; it < NC * (RPC + 1) * 4; it += THREADS3) {
      const int v = it & 3, i = (it >> 2) % (RPC + 1), q = (it >> 2) / (RPC + 1);
      float4 val;
      float* dst;
      if (i < RPC) {
        const int row = r * RPC + i;
        if (row >= nb) continue;
        val = *reinterpret_cast<const float4*>(gl + i * 16 + 4 * v);
        dst = ex.inbox_of(q) + S::PART + row * 16 + 4 * v;
      } else {
        val = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < RPC; ++j) {
          const float4 o = *reinterpret_cast<const float4*>(gl + j * 16 + 4 * v);
          val.x += o.x;
          val.y += o.y;
          val.z += o.z;
          val.w += o.w;
        }
        dst = ex.inbox_of(q) + S::PART + S::GIN + r * 16 + 4 * v;
      }
      *reinterpret_cast<float4*>(dst) = val;
    }
    ex.sync();  // B: every CTA holds g of every row and every owner's bias partial

    // G: thread = (row group, class half h, feature group kg): 5 classes x 4 features in registers,
    // so each x float4 is read once per class half instead of once per class; the RG row groups
    // are summed through shared memory by the thread that updates those 4 weights of a class.
    {
      const int u = tid % S::UNITS, rg = tid / S::UNITS, h = u / KG, kg = u % KG;
      if (rg < RG) {
        float4 acc[5];
#pragma unroll
        for (int j = 0; j < 5; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int row = rg; row < nb; row += RG) {
          const float4 xv = *reinterpret_cast<const float4*>(x + row * FP + kg * 4);
          const float4 gv = ex.read4(g + row * 16 + 8 * h);
          fma4(acc[0], gv.x, xv);
          fma4(acc[1], gv.y, xv);
          fma4(acc[2], gv.z, xv);
          fma4(acc[3], gv.w, xv);
          fma4(acc[4], ex.read(g + row * 16 + 8 * h + 4), xv);
        }
#pragma unroll
        for (int j = 0; j < 5; ++j)
          *reinterpret_cast<float4*>(red + (rg * C + 5 * h + j) * F + kg * 4) = acc[j];
      }
      __syncthreads();
      if (tid < C * KG) {
        const int c = tid / KG, k = (tid % KG) * 4;
        float4 sum = *reinterpret_cast<const float4*>(red + c * F + k);
#pragma unroll
        for (int q = 1; q < RG; ++q) {
          const float4 o = *reinterpret_cast<const float4*>(red + (q * C + c) * F + k);
          sum.x += o.x;
          sum.y += o.y;
          sum.z += o.z;
          sum.w += o.w;
        }
        float4* wp = reinterpret_cast<float4*>(Ws + c * F + k);
        float4 wv = *wp;
        wv.x -= sum.x * inv255;
        wv.y -= sum.y * inv255;
        wv.z -= sum.z * inv255;
        wv.w -= sum.w * inv255;
        *wp = wv;
      }
      if (tid >= THREADS3 - C) {  // otherwise idle: the bias from the NC owners' partials
        const int cb = tid - (THREADS3 - C), slot = cb < 5 ? cb : cb + 3;
        float db = 0.f;
#pragma unroll
        for (int src = 0; src < NC; ++src) db += ex.read(dbp + src * 16 + slot);
        bias[cb] -= db;
      }
      __syncthreads();  // W and b updated before the next step's L and S read them
    }
  }

  for (int i = tid; i < C * F; i += THREADS3) a.w[(i / F) * K + k0 + i % F] = Ws[i];
  if (r == 0 && tid < C) a.b[tid] = bias[tid];
  if (loss != 0.f || correct != 0.f) {
    atomicAdd(a.stats, loss);
    atomicAdd(a.stats + 1, correct);
  }
}

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

template <int V, int NC, class Ex>
__device__ void train_epoch(Ex& ex, const Args& a, float* sm) {
  if constexpr (V == 2)
    train_epoch_v2<NC>(ex, a, sm);
  else
    train_epoch_v3<NC>(ex, a, sm);
}

template <int V, int NC>
__global__ void __launch_bounds__(Version<V>::threads, 1) epoch_cluster_kernel(Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) float sm[];
  using S = typename Version<V>::template Shape<NC>;
  ClusterExchange ex{cg::this_cluster(), sm + S::INBOX_OFF};
  train_epoch<V, NC>(ex, a, sm);
#endif
}

template <int V, int NC>
__global__ void __launch_bounds__(Version<V>::threads, 1) epoch_grid_kernel(Args a) {
  extern __shared__ __align__(16) float sm[];
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
  return cudaGetErrorName(static_cast<cudaError_t>(code));
}

// The variants, for the Python side: 1 if (ctas, version) is one, and its launch configuration.
// Versions: 2 (two whole cluster barriers a step, 288 threads; timed on an H100 at 3.89 ms/epoch
// with 14 CTAs), 3 (512 threads, barrier A split around the next batch's widening, vector
// pushes, register-blocked gradient, no serial bias loop). ctas: 7 or 14.
int cuda_epoch_variant(int ctas, int version, int* threads, int* smem_bytes) {
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
// 0 = cooperative grid with `scratch` (cuda_epoch_scratch_bytes) for the inboxes; version: 2 or 3
// (cuda_epoch_variant). Returns 0 or a cudaError_t.
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
  return cudaErrorInvalidValue;
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
