// cuda-epoch v3 (see cuda_epoch.cu for the changelog).
#pragma once
#include "epoch_shared.cuh"

namespace {

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

// ---- the arithmetic of a step, shared by v3 and v4 (they differ in how data moves) -----------
// Reads of data that is already local: what v4 uses where v3 reads through its exchange.
struct PlainRead {
  __device__ float read(const float* p) const { return *p; }
  __device__ float4 read4(const float* p) const { return *reinterpret_cast<const float4*>(p); }
};

// L: thread (row, class half h, feature half fh) sums x[row] over its half of my features
// against classes 5h..5h+4; the two feature halves are added by a shuffle (both lanes hold it).
template <class S>
__device__ __forceinline__ void partial_logits(const float* x, const float* Ws, int tid,
                                               float (&acc)[5]) {
  constexpr int F = S::F, FP = S::FP;
  const int row = tid >> 2, h = (tid >> 1) & 1, fh = tid & 1, kb = fh * (F / 2);
#pragma unroll
  for (int j = 0; j < 5; ++j) acc[j] = 0.f;
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
}

// S: my rows, 16 lanes per row (one per slot, 10 hold a class), every thread in the shuffles:
// the NC partials summed, softmax, loss and accuracy of the row, and its g into gl.
template <int NC, class S, class Read>
__device__ __forceinline__ void softmax_rows(const Read& rd, const float* part, const float* bias,
                                             const int* labels, float* gl, int tid, int r, int nb,
                                             float lr, float& loss, float& correct) {
  constexpr int RPC = S::RPC;
  const float inv255 = 1.f / 255.f;
  const int i = tid >> 4, l = tid & 15, row = r * RPC + i, c = l < 8 ? l : l - 3;
  const bool valid = i < RPC && row < nb && (l < 5 || (l >= 8 && l < 13));
  float z = -INFINITY;
  if (valid) {
    float acc = 0.f;
#pragma unroll
    for (int src = 0; src < NC; ++src) acc += rd.read(part + (src * RPC + i) * 16 + l);
    z = acc * inv255 + bias[c];  // the partials are sums over raw 0..255 pixels
  }
  const auto [m, e, se] = row_softmax(z, valid);
  float gv = 0.f;  // 0 in the pad slots and past the batch: the bias partials sum them
  if (valid) {
    const int label = labels[row];
    if (c == label) {
      loss += logf(se) + m - z;
      correct += z == m ? 1.f : 0.f;
    }
    gv = lr * (e / se - (c == label ? 1.f : 0.f)) / nb;
  }
  if (i < RPC) gl[i * 16 + l] = gv;
}

// The sum of my RPC rows of g, float4 v of the 16 slots: my share of the bias gradient.
template <class S>
__device__ __forceinline__ float4 g_rows_sum(const float* gl, int v) {
  float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int j = 0; j < S::RPC; ++j)
    add4(val, *reinterpret_cast<const float4*>(gl + j * 16 + 4 * v));
  return val;
}

// G, first half: thread = (row group, class half h, feature group kg), 5 classes x 4 features in
// registers, so each x float4 is read once per class half instead of once per class; each row
// group's sums go to red.
template <class S, class Read>
__device__ __forceinline__ void gradient_partials(const Read& rd, const float* x, const float* g,
                                                  float* red, int tid, int nb) {
  constexpr int F = S::F, FP = S::FP, KG = S::KG, RG = S::RG;
  const int u = tid % S::UNITS, rg = tid / S::UNITS, h = u / KG, kg = u % KG;
  if (rg >= RG) return;
  float4 acc[5];
#pragma unroll
  for (int j = 0; j < 5; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int row = rg; row < nb; row += RG) {
    const float4 xv = *reinterpret_cast<const float4*>(x + row * FP + kg * 4);
    const float4 gv = rd.read4(g + row * 16 + 8 * h);
    fma4(acc[0], gv.x, xv);
    fma4(acc[1], gv.y, xv);
    fma4(acc[2], gv.z, xv);
    fma4(acc[3], gv.w, xv);
    fma4(acc[4], rd.read(g + row * 16 + 8 * h + 4), xv);
  }
#pragma unroll
  for (int j = 0; j < 5; ++j)
    *reinterpret_cast<float4*>(red + (rg * C + 5 * h + j) * F + kg * 4) = acc[j];
}

// G, second half (after a __syncthreads): the RG row groups summed by the thread that updates
// those 4 weights of a class; the last C threads, otherwise idle, update the bias from the NC
// owners' partials dbp [NC][16].
template <int NC, class S, class Read>
__device__ __forceinline__ void apply_update(const Read& rd, const float* red, const float* dbp,
                                             float* Ws, float* bias, int tid, int threads) {
  constexpr int F = S::F, KG = S::KG, RG = S::RG;
  const float inv255 = 1.f / 255.f;
  if (tid < C * KG) {
    const int c = tid / KG, k = (tid % KG) * 4;
    float4 sum = *reinterpret_cast<const float4*>(red + c * F + k);
#pragma unroll
    for (int q = 1; q < RG; ++q)
      add4(sum, *reinterpret_cast<const float4*>(red + (q * C + c) * F + k));
    descend4(Ws + c * F + k, sum, inv255);
  }
  if (tid >= threads - C) {
    const int cb = tid - (threads - C), slot = cb < 5 ? cb : cb + 3;
    float db = 0.f;
#pragma unroll
    for (int src = 0; src < NC; ++src) db += rd.read(dbp + src * 16 + slot);
    bias[cb] -= db;
  }
}

// Batch j's `rows` rows, asynchronously (cp.async): the pixels of my F columns into xb[j & 1],
// the labels into ys[j & 3], from the order indices in idx[j & 3]. v3's and v4's prefetch.
template <class S>
__device__ __forceinline__ void fetch_batch(const Args& a, int j, int rows, int tid, int k0,
                                            const int* idx, int* ys, uint8_t* xb) {
  constexpr int F = S::F, CH = F / 8;
  const int* order = idx + (j & 3) * BMAX;
  uint8_t* dst = xb + (j & 1) * BMAX * F;
  for (int i = tid; i < rows * CH; i += THREADS3) {
    const int row = i / CH, c = i % CH;
    __pipeline_memcpy_async(dst + row * F + c * 8,
                            a.x + static_cast<size_t>(order[row]) * K + k0 + c * 8, 8);
  }
  for (int i = tid; i < rows; i += THREADS3)
    __pipeline_memcpy_async(ys + (j & 3) * BMAX + i, a.y + order[i], 4);
}

// Step s's prefetch: batch s + 2's pixels and labels (its order came with step s - 2's) and
// batch s + 4's order, as one commit group, empty or not, so that wait_prior(1) always means
// "the previous step's". v3's and v4's.
template <class S>
__device__ __forceinline__ void prefetch_ahead(const Args& a, int s, int steps, int tid, int k0,
                                               int* idx, int* ys, uint8_t* xb) {
  auto rows_of = [&](int step) { return min(a.bs, a.n - step * a.bs); };
  if (s + 2 < steps) fetch_batch<S>(a, s + 2, rows_of(s + 2), tid, k0, idx, ys, xb);
  if (s + 4 < steps)
    for (int i = tid; i < rows_of(s + 4); i += THREADS3)
      __pipeline_memcpy_async(idx + ((s + 4) & 3) * BMAX + i, a.order + (s + 4) * a.bs + i, 4);
  __pipeline_commit();
}

// Batch j's fetched pixels as floats: xb[j & 1] -> xf[j & 1] (padded rows of FP).
template <class S>
__device__ __forceinline__ void widen_batch(int j, int rows, int tid, const uint8_t* xb,
                                            float* xf) {
  constexpr int F = S::F, FP = S::FP;
  float* dst = xf + (j & 1) * BMAX * FP;
  const uint32_t* src = reinterpret_cast<const uint32_t*>(xb + (j & 1) * BMAX * F);
  for (int i = tid; i < rows * (F / 4); i += THREADS3) {
    const int row = i / (F / 4), c4 = i % (F / 4);
    *reinterpret_cast<float4*>(dst + row * FP + c4 * 4) = bytes_to_float4(src[i]);
  }
}

template <int NC, class Ex>
__device__ void train_epoch_v3(Ex& ex, const Args& a, float* sm) {
  using S = Shape3<NC>;
  constexpr int F = S::F, FP = S::FP, RPC = S::RPC;
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
  const int steps = (a.n + a.bs - 1) / a.bs;
  auto rows_of = [&](int step) { return min(a.bs, a.n - step * a.bs); };

  load_slice<F, THREADS3>(a, k0, tid, Ws, bias);
  for (int i = tid; i < 2 * BMAX * FP; i += THREADS3) xf[i] = 0.f;  // finite, never NaN garbage

  // Prologue: order of batches 0-3; pixels and labels of batches 0 and 1.
  for (int j = 0; j < 4 && j < steps; ++j)
    for (int i = tid; i < rows_of(j); i += THREADS3) idx[j * BMAX + i] = a.order[j * a.bs + i];
  __syncthreads();
  auto fetch = [&](int j) { fetch_batch<S>(a, j, rows_of(j), tid, k0, idx, ys, xb); };
  auto widen = [&](int j) { widen_batch<S>(j, rows_of(j), tid, xb, xf); };
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
    // and are widened in the next step's barrier-A window, off the critical path.
    prefetch_ahead<S>(a, s, steps, tid, k0, idx, ys, xb);

    // L: partial logits over my features; thread = (row, class half h, feature half fh), the two
    // feature halves summed by a shuffle; the pair stores one float4 + one float to the owner.
    {
      const int row = tid >> 2, h = (tid >> 1) & 1, fh = tid & 1;
      float acc[5];
      partial_logits<S>(x, Ws, tid, acc);
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

    // S: my rows' softmax, loss and g (softmax_rows).
    softmax_rows<NC, S>(ex, part, bias, ys + (s & 3) * BMAX, gl, tid, r, nb, a.lr, loss, correct);
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
        val = g_rows_sum<S>(gl, v);
        dst = ex.inbox_of(q) + S::PART + S::GIN + r * 16 + 4 * v;
      }
      *reinterpret_cast<float4*>(dst) = val;
    }
    ex.sync();  // B: every CTA holds g of every row and every owner's bias partial

    // G: the weight gradient of my features (gradient_partials, apply_update).
    {
      gradient_partials<S>(ex, x, g, red, tid, nb);
      __syncthreads();
      apply_update<NC, S>(ex, red, dbp, Ws, bias, tid, THREADS3);
      __syncthreads();  // W and b updated before the next step's L and S read them
    }
  }

  write_back<F, THREADS3>(a, r, k0, tid, Ws, bias, loss, correct);
}

}  // namespace
