// cuda-epoch v8's chain on one SM (docs/measurements/cuda-epoch-v8-design.md, "The chain SM's
// step" and "Build first" step 2): the per-warp bodies of one step, written once for the GPU
// (csrc/v8_chain.cu, V8DeviceWarp) and for the host (tests/ladder/csrc/v8_chain_host.cu,
// V8HostWarp: the 32 lanes in lockstep), so that the CPU tests run the code the probe runs.
//
// One CTA, 16 warps, all 128 rows of every batch. Step t (n_t rows; n_{t−1} the previous step's):
//   S_t = (Γ̃_{t,1}·2⁻¹²) · ((p − y)_{t−1}·2¹²)      3xFP16 on the tensor cores, from zero
//   Z_t = (P_t + Q_t) + (−c/n_{t−1})·S_t            one fp32 multiply, one fp32 add (no FMA)
//   p = softmax(Z_t), G_t = (p − y)/n_t, and (p − y)·2¹² split hi/lo fp16 as step t + 1's B.
// (split_precision.mma_3xfp16's scaling: B = n G·2¹² = (p − y)·2¹², scaled back by −c/n with n
// the rows of G, i.e. of step t − 1.)
//
// Warp w: rows m0 = 16·(w & 7) … + 15, K half kh = w >> 3 (Γ̃'s columns 64·kh … + 63, the
// previous step's rows), both n8 tiles (classes 0 … 15, 10 … 15 zero). Per k-step (16 of K) and
// n-tile the products lo·hi, hi·lo, hi·hi (A·B), split_precision's SCHEMES["3xTF32"] order; each
// warp's chain starts from zero, then the two K halves are summed by one fp32 add (half 0 + half 1).
// Warps 0 … 7 own the softmax: a row's classes sit in a quad of lanes (v8_c_at), so its max and
// sum are 2 + 2 shfl_xor at width 4.
//
// Shared memory (the kernel's and the harness's): a 2-slot ring of Γ̃ in fp32 [128][V8C_GS]
// (Γ̃_s in slot s & 1), B's fragments in hi/lo fp16 (V8C_BWORDS u32, v8c_bword's order: a lane's
// loads are consecutive words), the K half 1 sums (V8C_HALVES floats).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "v8_mma.cuh"

namespace {

constexpr int V8C_ROWS = 128, V8C_C = 10, V8C_WARPS = 16, V8C_THREADS = 32 * V8C_WARPS;
constexpr int V8C_KSTEPS = 4;  // m16n8k16 k-steps in a warp's K half (64)
constexpr int V8C_GS = 136;    // floats a Γ̃ row in shared memory: a half-warp's 8-byte A loads
                               // (rows g, columns 2q) fall on 32 distinct banks
constexpr int V8C_BWORDS = 2 * 8 * 2 * 2 * 32;  // [piece][k-step of 8][n-tile][reg][lane]: 8 KB
constexpr int V8C_HALVES = 8 * 2 * 4 * 32;      // [warp & 7][n-tile][float][lane]: 8 KB
constexpr int V8C_STAGE = 8 * V8C_KSTEPS * 2 * 32 * 4;  // v2: warps 0 … 7's A, [w][ks][piece]
                                                        // [lane][reg]: 32 KB
constexpr float V8C_A_SCALE = 1.0f / 4096.0f;   // Γ̃·2⁻¹² ∈ [15.9, 12,462]: no fp16 subnormal
constexpr float V8C_B_SCALE = 4096.0f;          // (p − y)·2¹², |p − y| ≤ 1
constexpr int V8C_QUAD = 4;  // lanes a row in the accumulator layout (v8_c_at: lane = 4g + q)

template <class Warp, class T>
using V8Reg = typename Warp::template Reg<T>;

FT_V8 int v8c_rows(int n, int t) { return n - t * V8C_ROWS < V8C_ROWS ? n - t * V8C_ROWS
                                                                     : V8C_ROWS; }
FT_V8 int v8c_bword(int piece, int ks, int nt, int r, int lane) {
  return (((piece * 8 + ks) * 2 + nt) * 2 + r) * 32 + lane;
}
// The half (index in halves of piece 0's words) that holds B's element (k = row, n = col):
// v8_b_at inverted, k = 16·ks + 2q + 8r + h, n = 8·nt + g.
FT_V8 int v8c_b_half(int row, int col) {
  const int kin = row & 15;
  return 2 * v8c_bword(0, row >> 4, col >> 3, kin >> 3, 4 * (col & 7) + ((kin & 7) >> 1)) +
         (kin & 1);
}
FT_V8 int v8c_half_at(int w, int nt, int i, int lane) {
  return (((w & 7) * 2 + nt) * 4 + i) * 32 + lane;
}
// One fp16 into B's words (a lane writes single halves: its rows g and g + 8 are not a pair).
FT_V8 void v8c_put_half(uint32_t* words, int half, uint32_t bits) {
#if defined(__CUDA_ARCH__)
  reinterpret_cast<unsigned short*>(words)[half] = static_cast<unsigned short>(bits);
#else
  const uint16_t b = static_cast<uint16_t>(bits);
  std::memcpy(reinterpret_cast<unsigned char*>(words) + 2 * half, &b, 2);
#endif
}
// pq + coef·s, rounded twice (split_precision: acc + fl32(−c/n)·s in NumPy, no FMA).
FT_V8 float v8c_scale_add(float pq, float coef, float s) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(pq, __fmul_rn(coef, s));
#else
  return pq + coef * s;
#endif
}

// Warp w's A fragments of Γ̃ (`slot`, [128][V8C_GS] fp32), times `scale`, split: a[0] hi, a[1] lo.
template <class Warp>
FT_V8 void v8c_load_a(const Warp& warp, const float* slot, int w, float scale,
                      V8Reg<Warp, uint32_t> (&a)[2][V8C_KSTEPS][4]) {
  const int m0 = 16 * (w & 7), k0 = 64 * (w >> 3);
  warp.each([&](int lane) {
#pragma unroll
    for (int ks = 0; ks < V8C_KSTEPS; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const V8Rc e = v8_a_at(lane, r, 0);  // half 1 is the next column
        const float* p = slot + (m0 + e.row) * V8C_GS + k0 + 16 * ks + e.col;
        v8_split_f16x2(scale * p[0], scale * p[1], warp.at(a[0][ks][r], lane),
                       warp.at(a[1][ks][r], lane));
      }
  });
}

// v2: warp w + 8 splits warp w's (w < 8) A fragments into `stage` (v8c_stage_at's layout: a lane's
// 4 registers of a k-step and piece in 16 consecutive bytes) while warps 0 … 7 run the softmax;
// warp w loads them back at the next step's start (8 16-byte loads, beside its B loads).
FT_V8 int v8c_stage_at(int w, int ks, int piece, int lane) {
  return ((((w & 7) * V8C_KSTEPS + ks) * 2 + piece) * 32 + lane) * 4;
}
FT_V8 void v8c_put4(uint32_t* p, const uint32_t (&v)[4]) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(p) = make_uint4(v[0], v[1], v[2], v[3]);
#else
  for (int r = 0; r < 4; ++r) p[r] = v[r];
#endif
}
FT_V8 void v8c_get4(const uint32_t* p, uint32_t& v0, uint32_t& v1, uint32_t& v2, uint32_t& v3) {
#if defined(__CUDA_ARCH__)
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  v0 = q.x, v1 = q.y, v2 = q.z, v3 = q.w;
#else
  v0 = p[0], v1 = p[1], v2 = p[2], v3 = p[3];
#endif
}
template <class Warp>
FT_V8 void v8c_stage_a(const Warp& warp, const float* slot, int w, float scale, uint32_t* stage) {
  const int m0 = 16 * (w & 7), k0 = 64 * ((w >> 3) & 1);
  warp.each([&](int lane) {
#pragma unroll
    for (int ks = 0; ks < V8C_KSTEPS; ++ks) {
      uint32_t hi[4], lo[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const V8Rc e = v8_a_at(lane, r, 0);
        const float* p = slot + (m0 + e.row) * V8C_GS + k0 + 16 * ks + e.col;
        v8_split_f16x2(scale * p[0], scale * p[1], hi[r], lo[r]);
      }
      v8c_put4(stage + v8c_stage_at(w, ks, 0, lane), hi);
      v8c_put4(stage + v8c_stage_at(w, ks, 1, lane), lo);
    }
  });
}
template <class Warp>
FT_V8 void v8c_load_staged_a(const Warp& warp, const uint32_t* stage, int w,
                             V8Reg<Warp, uint32_t> (&a)[2][V8C_KSTEPS][4]) {
  warp.each([&](int lane) {
#pragma unroll
    for (int ks = 0; ks < V8C_KSTEPS; ++ks)
#pragma unroll
      for (int pc = 0; pc < 2; ++pc)
        v8c_get4(stage + v8c_stage_at(w, ks, pc, lane), warp.at(a[pc][ks][0], lane),
                 warp.at(a[pc][ks][1], lane), warp.at(a[pc][ks][2], lane),
                 warp.at(a[pc][ks][3], lane));
  });
}

// v3 (csrc/v8_chain.cu's BULK): Γ̃_s's row r (512 contiguous bytes in global memory) goes to
// slot + r·V8C_GS by one bulk copy (a row's 544 B in the slot hold 32 B of padding, so rows are
// not contiguous there and cannot share a copy): 128 copies, row 32·part + lane by lane `lane` of
// issuing warp `part` (0 … V8C_BULK_WARPS − 1), each by `copy(dst, src, bytes)`: cp.async.bulk on
// the GPU, memcpy in the host harness. Every row's destination is 16-byte aligned (544 = 34·16).
// Four warps, one a scheduler (warps 8 … 11 sit on SMSPs 0 … 3), not one: ptxas (13.0) wraps a
// UBLKCP whose operands differ across lanes in a loop over the active lanes (ELECT, 4 R2UR,
// UBLKCP, BRA.U.ANY: 9 issues a copy), so one warp would issue its 128 copies' ~1,150 slots on
// one SMSP, beside softmax warps 0 and 4 (the design doc's "v3" subsection).
constexpr int V8C_ROW_BYTES = V8C_ROWS * 4;
constexpr int V8C_BULK_WARPS = V8C_ROWS / 32;
static_assert(V8C_GS * 4 % 16 == 0 && V8C_ROW_BYTES % 16 == 0, "bulk copies: 16-byte multiples");
template <class Copy>
FT_V8 void v8c_bulk_row(float* slot, const float* gram_s, int part, int lane, Copy&& copy) {
  const int r = 32 * part + lane;
  copy(slot + r * V8C_GS, gram_s + r * V8C_ROWS, V8C_ROW_BYTES);
}

// Warps 0 … 7: step t's P_t + Q_t (`pq`: [128][10]) and labels of its rows, loaded before the
// product (their latency behind the mma). 0 and −1 outside the batch and the classes.
template <class Warp>
FT_V8 void v8c_load_inputs(const Warp& warp, int w, const float* pq, const int* labels, int rows,
                           V8Reg<Warp, float> (&p)[2][4], V8Reg<Warp, int> (&y)[2]) {
  warp.each([&](int lane) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const V8Rc e = v8_c_at(lane, i);
        const int row = 16 * w + e.row, col = 8 * nt + e.col;
        warp.at(p[nt][i], lane) = row < rows && col < V8C_C ? pq[row * V8C_C + col] : 0.f;
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * w + (lane >> 2) + 8 * h;
      warp.at(y[h], lane) = row < rows ? labels[row] : -1;
    }
  });
}

// d = (A's pieces) · (B's pieces in `bw`) from zero: warp w's rows, its K half, both n-tiles.
template <class Warp>
FT_V8 void v8c_product(const Warp& warp, const V8Reg<Warp, uint32_t> (&a)[2][V8C_KSTEPS][4],
                       const uint32_t* bw, int w, V8Reg<Warp, float> (&d)[2][4]) {
  warp.each([&](int lane) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) warp.at(d[nt][i], lane) = 0.f;
  });
#pragma unroll
  for (int ks = 0; ks < V8C_KSTEPS; ++ks)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      V8Reg<Warp, uint32_t> hi[2], lo[2];
      warp.each([&](int lane) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          warp.at(hi[r], lane) = bw[v8c_bword(0, 4 * (w >> 3) + ks, nt, r, lane)];
          warp.at(lo[r], lane) = bw[v8c_bword(1, 4 * (w >> 3) + ks, nt, r, lane)];
        }
      });
      warp.mma(d[nt], a[1][ks], hi);  // lo · hi
      warp.mma(d[nt], a[0][ks], lo);  // hi · lo
      warp.mma(d[nt], a[0][ks], hi);  // hi · hi
    }
}

// Warps 8 … 15: their K half's sums into shared memory for warp w − 8.
template <class Warp>
FT_V8 void v8c_store_half(const Warp& warp, const V8Reg<Warp, float> (&d)[2][4], float* halves,
                          int w) {
  warp.each([&](int lane) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) halves[v8c_half_at(w, nt, i, lane)] = warp.at(d[nt][i], lane);
  });
}

// 1/x, correctly rounded, for x of biased exponent 1 … 252 (here 1 ≤ x ≤ 128): on the GPU the fast
// path of ptxas's own expansion of 1.f / x (rcp.rn: MUFU.RCP, one Newton step by FFMA) without
// its range check, a branch, a convergence block and a CALL of the slow path each (SASS, nvcc 13.0
// sm_90a); so bit-equal to the host's 1.f / x.
FT_V8 float v8c_rcp(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return fmaf(r, fmaf(-x, r, 1.f), r);
#else
  return 1.f / x;
#endif
}
// Two floats to p, p + 1 (p 8-byte aligned: one STG.64 on the GPU).
static_assert(V8C_C % 2 == 0, "a lane's columns 2q, 2q + 1 are both classes or both padding");
FT_V8 void v8c_put2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
#else
  p[0] = a, p[1] = b;
#endif
}

// Warps 0 … 7, after the K halves' barrier: Z = pq + coef·(d + half 1), the softmax of rows
// 16w + g and 16w + g + 8 across each quad (shfl_xor at width 4), G_t's rows into g_out
// ([128][10]: 0 past the batch), Z into z_out when given, loss and hits added by the label's lane;
// returns (p − y) in `pmy` (0 outside the batch and the classes) for v8c_write_b. `quad`: the
// butterflies' width and masks (quad/2 … 1); anything but V8C_QUAD is the harness's planted bug.
// Branch-free but for the predicated stores (docs/measurements/cuda-epoch-v8-design.md, "The
// chain's softmax in SASS"): a class outside the 10 holds Z = −∞, whose exp is 0; a lane's two
// columns 2q, 2q + 1 share a row and their validity (10 is even), so G and Z go out as pairs.
template <class Warp>
FT_V8 void v8c_softmax(const Warp& warp, int w, const V8Reg<Warp, float> (&d)[2][4],
                       const float* halves, const V8Reg<Warp, float> (&pq)[2][4],
                       const V8Reg<Warp, int> (&y)[2], int rows, float coef, float* g_out,
                       float* z_out, V8Reg<Warp, float> (&pmy)[2][4], V8Reg<Warp, float>& loss,
                       V8Reg<Warp, float>& correct, int quad = V8C_QUAD) {
  using F = V8Reg<Warp, float>;
  F m[2], se[2];
  warp.each([&](int lane) {
#pragma unroll
    for (int h = 0; h < 2; ++h) warp.at(m[h], lane) = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float s = warp.at(d[nt][i], lane) + halves[v8c_half_at(w, nt, i, lane)];
        const float z = v8c_scale_add(warp.at(pq[nt][i], lane), coef, s);
        const bool valid = 8 * nt + v8_c_at(lane, i).col < V8C_C;
        warp.at(pmy[nt][i], lane) = valid ? z : -INFINITY;  // Z, until the exp below
        warp.at(m[i >> 1], lane) = fmaxf(warp.at(m[i >> 1], lane), warp.at(pmy[nt][i], lane));
      }
  });
  for (int o = quad / 2; o > 0; o /= 2)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const F other = warp.shfl_xor(m[h], o, quad);
      warp.each([&](int lane) {
        warp.at(m[h], lane) = fmaxf(warp.at(m[h], lane), warp.at(other, lane));
      });
    }
  F ex[2][4];
  warp.each([&](int lane) {
#pragma unroll
    for (int h = 0; h < 2; ++h) warp.at(se[h], lane) = 0.f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // expf(−∞) = 0 outside the classes (m is finite)
        const float e = expf(warp.at(pmy[nt][i], lane) - warp.at(m[i >> 1], lane));
        warp.at(ex[nt][i], lane) = e;
        warp.at(se[i >> 1], lane) += e;
      }
  });
  for (int o = quad / 2; o > 0; o /= 2)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const F other = warp.shfl_xor(se[h], o, quad);
      warp.each([&](int lane) { warp.at(se[h], lane) += warp.at(other, lane); });
    }
  // One reciprocal a row (1 ≤ se ≤ 10: the max's exp is 1) and one log a row, every lane; G =
  // (p − y) times 1/n_t (exact for 128; within an ulp of split_precision's (p − y)/n for 96).
  const float inv_rows = v8c_rcp(static_cast<float>(rows));
  warp.each([&](int lane) {
    float inv_se[2], lse[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      inv_se[h] = v8c_rcp(warp.at(se[h], lane));
      lse[h] = logf(warp.at(se[h], lane)) + warp.at(m[h], lane);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {  // floats 2rh, 2rh + 1: row g + 8rh, columns col, col + 1
        const V8Rc e = v8_c_at(lane, 2 * rh);
        const int row = 16 * w + e.row, col = 8 * nt + e.col, label = warp.at(y[rh], lane);
        const bool in = row < rows && col < V8C_C;
        float z[2], v[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = 2 * rh + h;
          const bool hit = in && col + h == label;
          z[h] = warp.at(pmy[nt][i], lane);
          v[h] = in ? warp.at(ex[nt][i], lane) * inv_se[rh] - (hit ? 1.f : 0.f) : 0.f;
          if (hit) {
            warp.at(loss, lane) += lse[rh] - z[h];
            warp.at(correct, lane) += z[h] == warp.at(m[rh], lane) ? 1.f : 0.f;
          }
          warp.at(pmy[nt][i], lane) = v[h];
        }
        if (z_out && in) v8c_put2(z_out + row * V8C_C + col, z[0], z[1]);
        if (col < V8C_C) v8c_put2(g_out + row * V8C_C + col, v[0] * inv_rows, v[1] * inv_rows);
      }
  });
}

// Warps 0 … 7: (p − y)·2¹² split hi/lo into step t + 1's B fragments (`bw`): every element of
// the warp's 16 rows × 16 classes, zeros included, so no stale row survives a short batch.
template <class Warp>
FT_V8 void v8c_write_b(const Warp& warp, int w, const V8Reg<Warp, float> (&pmy)[2][4],
                       uint32_t* bw) {
  warp.each([&](int lane) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {  // rows g, g + 8: floats (2rh, 2rh + 1), columns 2q, 2q + 1
        uint32_t hi, lo;
        v8_split_f16x2(V8C_B_SCALE * warp.at(pmy[nt][2 * rh], lane),
                       V8C_B_SCALE * warp.at(pmy[nt][2 * rh + 1], lane), hi, lo);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const V8Rc e = v8_c_at(lane, 2 * rh + h);
          const int at = v8c_b_half(16 * w + e.row, 8 * nt + e.col);
          v8c_put_half(bw, at, h ? hi >> 16 : hi);
          v8c_put_half(bw, at + V8C_BWORDS, h ? lo >> 16 : lo);  // piece 1: word 1024
        }
      }
  });
}

}  // namespace
