// cuda-epoch v6's arithmetic: v4's two products (partial logits L, weight gradient G) and its
// update, register-tiled (see cuda_epoch.cu for the changelog, epoch_v6.cuh for the step).
//
// Shapes (NC = 14 | 7): F = 56 | 112 features a CTA, T = 512 threads, batch rows 128.
//
// W lives in REGISTERS for the whole epoch. L's thread tile is (row group rg, class half h,
// feature lane j): tid = rg * LG + h * LJ + j with LJ = F / 7 (8 | 16) feature lanes of FL = 7
// features each (j, j + LJ, ..., j + 6 LJ: strided, so a warp's x loads are consecutive floats),
// RT = LJ / 2 (4 | 8) rows, 5 classes. Each thread holds w[5 classes][7 features] = 35 registers,
// the same in every row group (LRG = 32 | 16 replicas; every replica applies the same fp32 update
// to the same values, so they stay bit-identical). Per thread and step:
//   L  RT * 5 * 7 = 140 | 280 FMA in RT * 5 = 20 | 40 independent chains of 7; RT * 7 = 28 | 56
//      scalar x loads (LDS.32: a warp reads 8 | 16 consecutive floats of 2 | 1 rows, one wavefront:
//      the two rows of a 14-CTA warp are 4 rows apart, 4 * FP = 240 floats = a 16-bank offset);
//      no W load (v4: 42 LDS.128 for its 140 FMA, 35 of them W). The LJ partial sums of each
//      (row, class) are combined by a shuffle reduce-scatter over the feature lanes (rs_step:
//      5 (RT - 1) + 4 = 19 | 39 SHFL), after which lane j holds row rg * RT + j / 2, classes
//      5h..5h+3 (j even: v4's float4) or 5h+4 (j odd: v4's float): the same 40 bytes a row and
//      source as v4, so the owners' softmax and the protocol are v4's.
//   G  partials as v4's (thread = (class half, 4-feature group, row group of RG): 5 x 4 weights,
//      20 chains, 8 | 16 rows, 3 loads a row: 160 | 320 FMA, 24 | 48 loads), then the row groups
//      summed by 280 threads (14 CTAs: 2 threads a float4 output, RG / 2 = 8 LDS.128 each and 2
//      SHFL; 7 CTAs: 1 thread, 8 LDS.128) instead of v4's 140 threads x 16 serial LDS.128; the
//      sum, times 1/255, goes to DW in the register tiles' order, and every thread reads its 35
//      (9 LDS.128, broadcast over the replicas) and subtracts them from its registers.
// Registers: 35 w + 20 | 40 accumulators + addresses; 512 threads allow 128 a thread (no spill:
// ptxas -v, see the report in docs/measurements/ladder-h100.md).
//
// Every index mapping is a small __host__ __device__ function below when FT_HOST_MATH is defined
// (tests/ladder/test_cuda_epoch_v6_math.py compiles this header for the host and runs a whole
// cluster's epoch with them, lanes in lockstep, against float64).
#pragma once
#include <cstdint>

#include "epoch_v3.cuh"

#if defined(FT_HOST_MATH)
#define FT_V6 __host__ __device__ __forceinline__
#else
#define FT_V6 __device__ __forceinline__
#endif

namespace {

template <int NC>
struct Shape6 {
  using S3 = Shape3<NC>;
  static constexpr int F = S3::F, FP = S3::FP, KG = S3::KG, RPC = S3::RPC, UNITS = S3::UNITS,
                       RG = S3::RG;
  static constexpr int T = THREADS3;
  static constexpr int FL = 7;               // features a lane (strided by LJ)
  static constexpr int LJ = F / FL;          // feature lanes of a row group and class half
  static constexpr int LG = 2 * LJ;          // lanes of a row group: class half x feature lane
  static constexpr int RT = LJ / 2;          // rows a thread (one per lane pair after L)
  static constexpr int LRG = T / LG;         // L's row groups = W's replicas
  static constexpr int NACC = RT * 5;        // L's accumulators
  static constexpr int WN = 5 * FL;          // weights a thread
  static constexpr int WB = align4(WN);      // a thread's block of DW (float4s)
  static constexpr int NSHFL = 5 * (RT - 1) + 4;  // L's reduce-scatter
  static constexpr int GO = C * KG;          // G's outputs: (class, 4 features)
  static constexpr int RS = pow2_floor(T / GO);   // threads a G output (2 | 1)
  static constexpr int PART = S3::PART;      // as v4: [NC][RPC][16]
  static constexpr int GB = S3::GIN + S3::DBIN;
  static constexpr int INBOX = 2 * PART + 2 * GB;
  // Shared memory, in floats (every region 16-byte aligned). No W: it is in registers.
  static constexpr int BIAS_OFF = 0;
  static constexpr int XF_OFF = BIAS_OFF + 16;
  static constexpr int INBOX_OFF = XF_OFF + 2 * BMAX * FP;
  static constexpr int BAR_OFF = INBOX_OFF + INBOX;  // PB[2], GBAR[2]: 4 x 8 bytes
  static constexpr int RED_OFF = BAR_OFF + 8;
  static constexpr int DW_OFF = RED_OFF + RG * C * F;  // [2 * LJ][WB]
  static constexpr int GL_OFF = DW_OFF + 2 * LJ * WB;
  static constexpr int IDX_OFF = GL_OFF + RPC * 16;
  static constexpr int YS_OFF = IDX_OFF + 4 * BMAX;
  static constexpr int XB_OFF = YS_OFF + 4 * BMAX;
  static constexpr int BYTES = XB_OFF * 4 + 2 * BMAX * F;
  static_assert(F == FL * LJ && (LJ & (LJ - 1)) == 0 && RT >= 2, "feature lanes: a power of 2");
  static_assert(LRG * RT == BMAX && 32 % LG == 0, "L: a batch in one pass, groups in a warp");
  static_assert((RS == 1 || RS == 2) && GO * RS <= T && RG % RS == 0, "G's sum in one pass");
  static_assert(UNITS * RG <= T && RPC * 16 <= T, "one pass of G's partials and of S");
  static_assert(BYTES <= 227 * 1024, "fits a Hopper SM's shared memory");
  static_assert(NC * RPC * 40 < (1 << 20) && (BMAX + NC) * 64 < (1 << 20), "tx-count range");
};

// ---- L: who computes what ---------------------------------------------------------------------
struct LTile {
  int rg, h, j;  // row group, class half, feature lane
};
template <class S>
FT_V6 LTile l_tile(int tid) {
  return {tid / S::LG, (tid / S::LJ) & 1, tid % S::LJ};
}
template <class S>
FT_V6 int l_row(LTile t, int i) {  // accumulator row i < RT
  return t.rg * S::RT + i;
}
FT_V6 int l_class(LTile t, int c) { return 5 * t.h + c; }  // c < 5
template <class S>
FT_V6 int l_feature(LTile t, int e) {  // e < FL; also the register w[c * FL + e]'s feature
  return t.j + S::LJ * e;
}
// After the reduce-scatter: the row lane j holds, and which part of its class half (0: classes
// 5h..5h+3 in acc[0..3]; 1: class 5h+4 in acc[4]).
template <class S>
FT_V6 int l_out_row(LTile t) {
  return t.rg * S::RT + (t.j >> 1);
}
FT_V6 int l_out_part(LTile t) { return t.j & 1; }

// L's products of accumulator row i: acc[i * 5 + c] = sum over e of x[row i][feature e] *
// w[c][e], 5 chains over e (in l_schedule's order of rows).
template <class S>
FT_V6 void logits_row(const float* x, const float* w, LTile t, int i, float* acc) {
  const float* xr = x + l_row<S>(t, i) * S::FP;
#pragma unroll
  for (int c = 0; c < 5; ++c) acc[i * 5 + c] = 0.f;
#pragma unroll
  for (int e = 0; e < S::FL; ++e) {
    const float xv = xr[l_feature<S>(t, e)];
#pragma unroll
    for (int c = 0; c < 5; ++c) acc[i * 5 + c] = fmaf(xv, w[c * S::FL + e], acc[i * 5 + c]);
  }
}

// Step k < NSHFL of the reduce-scatter over the LJ feature lanes: partner = lane ^ d; a lane with
// (j & d) == 0 ("low") sends acc[send_lo] and sets acc[dest_lo] = acc[keep_lo] + received, an
// "up" lane likewise with the _up slots; -1: send 0 / keep nothing (no write). Row levels (d = RT,
// RT/2, ..., 2) halve the rows a lane holds (low keeps the lower half, moved to the front); the
// last level (d = 1) splits the one row's 5 classes: low keeps 0-3, up keeps 4.
struct RsStep {
  int d, send_lo, send_up, keep_lo, keep_up, dest_lo, dest_up;
};
template <class S>
FT_V6 RsStep rs_step(int k) {
  int n = S::RT;
  for (; n > 1; n /= 2) {  // row level n: (n / 2) * 5 steps
    if (k < (n / 2) * 5) {
      const int lo = k, hi = k + (n / 2) * 5;  // (i, c) and (i + n/2, c), flattened i * 5 + c
      return {n, hi, lo, lo, hi, lo, lo};
    }
    k -= (n / 2) * 5;
  }
  // class level, k < 4: low gathers class k (0-3), up gathers class 4 (sent by low at k = 0).
  return {1, k == 0 ? 4 : -1, k, k, k == 0 ? 4 : -1, k, k == 0 ? 4 : -1};
}
// (Values are selected, never indices: with k unrolled every index is a constant, so acc stays in
// registers.)
FT_V6 float rs_send(const float* acc, bool up, RsStep s) {
  const float lo = s.send_lo < 0 ? 0.f : acc[s.send_lo];
  const float hi = s.send_up < 0 ? 0.f : acc[s.send_up];
  return up ? hi : lo;
}
FT_V6 void rs_apply(float* acc, bool up, RsStep s, float got) {
  if (s.dest_lo == s.dest_up) {
    acc[s.dest_lo] = (up ? acc[s.keep_up] : acc[s.keep_lo]) + got;
    return;
  }
  if (s.dest_lo >= 0) acc[s.dest_lo] = up ? acc[s.dest_lo] : acc[s.keep_lo] + got;
  if (s.dest_up >= 0) acc[s.dest_up] = up ? acc[s.keep_up] + got : acc[s.dest_up];
}

// L's order, the device's and the host test's: rows i and i + RT/2, then the 5 first-level steps
// that combine them (5i..5i+4), so that only half the rows' accumulators are live at once; `fence`
// after each pair (the device's __syncwarp: the next pair's x loads are not hoisted above it);
// then the remaining steps.
template <class S, class Row, class Step, class Fence>
FT_V6 void l_schedule(Row row, Step step, Fence fence) {
#pragma unroll
  for (int i = 0; i < S::RT / 2; ++i) {
    row(i);
    row(i + S::RT / 2);
#pragma unroll
    for (int c = 0; c < 5; ++c) step(5 * i + c);
    fence();
  }
#pragma unroll
  for (int k = 5 * (S::RT / 2); k < S::NSHFL; ++k) step(k);
}

// Where lane t's result goes in its owner's partial-logit inbox (floats from the inbox's
// start, v4's record: [src r][row % RPC][slot], slot = c + 3 (c >= 5)), and the owner.
template <class S>
FT_V6 int l_out_owner(LTile t) {
  return l_out_row<S>(t) / S::RPC;
}
template <class S>
FT_V6 int l_out_offset(LTile t, int r) {
  const int row = l_out_row<S>(t);
  return (r * S::RPC + row % S::RPC) * 16 + 8 * t.h + 4 * l_out_part(t);
}

// ---- G: the gradient partials (v4's gradient_partials, host-callable) -------------------------
struct GUnit {
  int rg, h, kg;  // row group (rows rg, rg + RG, ...), class half, 4-feature group
};
template <class S>
FT_V6 GUnit g_unit(int tid) {
  const int u = tid % S::UNITS;
  return {tid / S::UNITS, u / S::KG, u % S::KG};
}
// red [RG][C][F]: row group rg's sum for (class 5h + c, features 4kg..4kg+3). g: [row][16] by
// slot (5h + c at 8h + c).
template <class S>
FT_V6 void gradient_partials6(const float* x, const float* g, float* red, int tid, int nb) {
  const GUnit u = g_unit<S>(tid);
  if (u.rg >= S::RG) return;
  float acc[5][4];
#pragma unroll
  for (int c = 0; c < 5; ++c)
#pragma unroll
    for (int m = 0; m < 4; ++m) acc[c][m] = 0.f;
#pragma unroll 2
  for (int row = u.rg; row < nb; row += S::RG) {
    const float4 xv = *reinterpret_cast<const float4*>(x + row * S::FP + u.kg * 4);
    const float4 gv = *reinterpret_cast<const float4*>(g + row * 16 + 8 * u.h);
    const float g4 = g[row * 16 + 8 * u.h + 4];
    const float gc[5] = {gv.x, gv.y, gv.z, gv.w, g4};
#pragma unroll
    for (int c = 0; c < 5; ++c) {
      acc[c][0] = fmaf(gc[c], xv.x, acc[c][0]);
      acc[c][1] = fmaf(gc[c], xv.y, acc[c][1]);
      acc[c][2] = fmaf(gc[c], xv.z, acc[c][2]);
      acc[c][3] = fmaf(gc[c], xv.w, acc[c][3]);
    }
  }
#pragma unroll
  for (int c = 0; c < 5; ++c)
    *reinterpret_cast<float4*>(red + (u.rg * C + 5 * u.h + c) * S::F + u.kg * 4) =
        make_float4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]);
}

// G's sum: output o = (class c, group kg) by RS threads (tid = o * RS + s), thread s summing the
// row groups s, s + RS, ...; with RS = 2 the pair then swaps halves (lane s keeps features
// 4kg + 2s, +1). Threads past GO * RS sum nothing but take part in the swap (full-warp SHFL).
struct GOut {
  int c, kg, s;
  bool active;
};
template <class S>
FT_V6 GOut g_out(int tid) {
  const int o = tid / S::RS;
  return {o / S::KG, o % S::KG, tid % S::RS, o < S::GO};
}
template <class S>
FT_V6 float4 g_sum(const float* red, GOut o) {
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  if (!o.active) return sum;
#pragma unroll
  for (int t = 0; t < S::RG / S::RS; ++t) {
    const int q = t * S::RS + o.s;
    const float4 v = *reinterpret_cast<const float4*>(red + (q * C + o.c) * S::F + o.kg * 4);
    sum.x += v.x;
    sum.y += v.y;
    sum.z += v.z;
    sum.w += v.w;
  }
  return sum;
}
// RS = 2's swap, step m < 2: what lane s sends, and its kept sum of feature 4kg + 2s + m.
FT_V6 float g_swap_send(float4 v, int s, int m) {
  return s ? (m ? v.y : v.x) : (m ? v.w : v.z);
}
FT_V6 float g_swap_keep(float4 v, int s, int m, float got) {
  return (s ? (m ? v.w : v.z) : (m ? v.y : v.x)) + got;
}
// DW's slot of W's (class c, feature k): the block of L's thread (h, j) that holds it, at its
// register index c % 5 * FL + e (k = j + LJ e).
template <class S>
FT_V6 int dw_index(int c, int k) {
  return ((c / 5) * S::LJ + k % S::LJ) * S::WB + (c % 5) * S::FL + k / S::LJ;
}
// A thread's 35 weights minus its block of DW (already scaled by 1/255).
template <class S>
FT_V6 void apply_dw(const float* dw, LTile t, float* w) {
  const float* blk = dw + (t.h * S::LJ + t.j) * S::WB;
#pragma unroll
  for (int v = 0; v < S::WB / 4; ++v) {
    const float4 d = *reinterpret_cast<const float4*>(blk + 4 * v);
    const float dv[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int m = 0; m < 4; ++m)
      if (4 * v + m < S::WN) w[4 * v + m] -= dv[m];
  }
}
// The last C threads update the bias from the NC owners' partials dbp [NC][16] (as v4).
template <int NC>
FT_V6 void update_bias(const float* dbp, float* bias, int tid, int T) {
  if (tid < T - C) return;
  const int cb = tid - (T - C), slot = cb < 5 ? cb : cb + 3;
  float db = 0.f;
#pragma unroll
  for (int src = 0; src < NC; ++src) db += dbp[src * 16 + slot];
  bias[cb] -= db;
}

}  // namespace
