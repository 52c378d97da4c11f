// cuda-epoch v2: push with two cluster barriers per step, 288 threads (see cuda_epoch.cu).
#pragma once
#include "epoch_shared.cuh"

namespace {

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

  load_slice<F, THREADS>(a, k0, tid, Ws, bias);
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
      const auto [m, e, se] = row_softmax(z, valid);
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
        for (int q = 1; q < GROUPS; ++q)
          add4(acc, *reinterpret_cast<const float4*>(red + (q * UNITS + u) * 4));
        descend4(Ws + c * F + k, acc, inv255);
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

  write_back<F, THREADS>(a, r, k0, tid, Ws, bias, loss, correct);
}

}  // namespace
