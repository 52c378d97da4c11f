// cuda-epoch v7j's worker bodies (epoch_v7j.cuh runs them on the GPU, the host emulation
// tests/ladder/csrc/epoch_v7j_host.h for every thread and warp): v7i's workers (v7e's mma bodies,
// v8_workers.cuh) with their fragments loaded by ldmatrix and W·2⁸'s split done once per apply (the
// design doc's "v7j" section: the SASS of v7i's update and partials, 32 LDS.U16 + 16 PRMT a warp
// and 4-way conflicted W loads, 512 and 384 shared wavefronts a step).
//
// The layout. x's ring slots, G′'s pieces and W·2⁸'s pieces are [rows][16] fp16 arrays whose
// rows are 32 bytes, two 16-byte halves; row i's half h sits at h ^ ((i >> 2) & 1) (v7j_swz), so
// the 8 rows of an ldmatrix phase (i0 … i0 + 7, i0 a multiple of 8) fall in 8 distinct 16-byte
// bank groups: no conflict (unswizzled, rows i and i + 4 share one: 2-way). Every reader and
// writer of those regions addresses them through v7j_swz (v7f's first GPU run lost a step to a
// writer and a reader that disagreed on an offset): the store of x, G′'s staging, W's pieces,
// the update's and the partials' ldmatrix.
//
// The fragments (PTX ISA, "ldmatrix": thread 8m + j gives the address of row j of matrix m; lane
// l receives in register m the elements (l / 4, 2(l % 4) + h) of matrix m, with .trans
// (2(l % 4) + h, l / 4)); scripts/v7_worker_smem.py checks these maps against v8_a_at / v8_b_at:
//   update A = X_aᵀ [f][i]: .trans, matrix m = rows i0 + 8(m >> 1) + j of x, features 8(m & 1) …;
//   update B = G′ [i][c]: .trans, matrix m = rows i0 + 8(m & 1) + j of piece m >> 1 (hi, lo),
//     classes 8·nt …: registers 0, 1 are B hi, 2, 3 B lo;
//   partials A = X_t [i][f]: no .trans, matrix m = rows 16·mt + 8(m & 1) + j, features 8(m >> 1) …;
//   partials B = (W·2⁸) [f][c]: .trans, matrix m = rows 8(m & 1) + j of piece m >> 1, classes 8·nt ….
// x_t by pixel pairs (j4, below): one 16-bit load, one index and one 32-bit store a pair, the
// bytes to fp16 by an exact subtraction instead of the conversion pipe.
// The same fp16 values in the same fragments as v7i's loads, W's pieces the same v8_split_f16x2 of
// the same fp32 W·2⁸, the mma chains in the same order: v7j trains as v7i bit for bit.
//
// The planted-bug hooks (the device passes the defaults): `swz_x` false reads x unswizzled in the
// partials (bug 27), `b_trans` false loads the update's B without .trans (bug 28).
#pragma once
#include "epoch_v7e_math.cuh"

namespace {

// A worker CTA's shared memory in v7j: v7f's regions, then W·2⁸'s pieces, hi [16][16] then lo,
// fp16, swizzled (1 KiB: 71.7 KB in all).
struct V7JSmem {
  static constexpr int WP = V7FSmem::FLOATS;
  static constexpr int FLOATS = WP + V8_NF * 16;
};
static_assert(V7JSmem::WP % 4 == 0 && V7ESmem::XH % 4 == 0 && V7ESmem::GSH % 4 == 0,
              "ldmatrix rows 16-byte aligned");
static_assert(V7JSmem::FLOATS <= V7_SMEM_FLOATS,
              "v7j's workers fit in the two-launch kernel's dynamic shared memory");

// The half index of (row, col) in a swizzled [rows][16] fp16 array: the 16-byte halves of rows
// 4 … 7 (mod 8) swapped. `on` false: unswizzled (bug 27's reader).
FT_V8 int v7j_swz(int row, int col, bool on = true) {
  return row * 16 + (on ? col ^ (((row >> 2) & 1) << 3) : col);
}

// j4: x_t by pixel pairs. A worker CTA's features f0 + 2j, f0 + 2j + 1 (j < 7; f0 = 14q even, K
// even) are adjacent bytes of a sample row: one 16-bit load a pair and one index, pair
// p = tid + k·T (row p / 7, pair p % 7), at most V7J_XP = 2 a thread (896 pairs) where v7h loads 4
// bytes by 4 indices. The indices of step t + 1 are loaded during step t − 1 (v7h's pipeline).
constexpr int V7J_PAIRS = V7_FW / 2;
constexpr int V7J_XP = 2;
static_assert(V7_FW % 2 == 0 && K % 2 == 0 && BMAX * V7J_PAIRS <= V7J_XP * V7_T,
              "a worker's features as pairs, at most V7J_XP a thread");

// The sample index of each of thread tid's pairs of x_t (-1: row past the batch, or no pair).
FT_V7 void v7j_fetch_idx(const V7Epoch& e, const int* order, int t, int tid, int T,
                         int (&idx)[V7J_XP]) {
  const int nt = e.rows(t);
  for (int k = 0; k < V7J_XP; ++k) {
    const int p = tid + k * T;
    idx[k] = p < nt * V7J_PAIRS ? order[t * e.bs + p / V7J_PAIRS] : -1;
  }
}
// Those pairs' bytes (lower address in the low byte), 0 where idx is -1.
FT_V7 void v7j_fetch_px(const uint8_t* x, const int (&idx)[V7J_XP], int f0, int tid, int T,
                        uint16_t (&px)[V7J_XP]) {
  for (int k = 0; k < V7J_XP; ++k) {
    const int j = (tid + k * T) % V7J_PAIRS;
    px[k] = idx[k] >= 0
                ? *reinterpret_cast<const uint16_t*>(x + size_t(idx[k]) * K + f0 + 2 * j)
                : uint16_t(0);
  }
}
// A pair of bytes as two fp16 halves without the conversion pipe: 0x6400 | b is the fp16 of
// 1024 + b exactly (in [1024, 2048) fp16's ulp is 1), and (1024 + b) − 1024 = b is exact
// (scripts/v7_worker_smem.py checks all 256 bytes; the host emulation's bit-equality with v7i,
// whose halves are __float2half_rn(b), checks it again).
FT_V8 uint32_t v7j_px_f16x2(uint16_t px) {
  const uint32_t biased = 0x64006400u | (px & 0xffu) | uint32_t(px >> 8) << 16;
  const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&biased),
                            __halves2half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400)));
  return *reinterpret_cast<const uint32_t*>(&h);
}
// x_t's pairs as halves into its ring slot, swizzled (a pair never straddles a 16-byte half:
// its first feature is even), one 32-bit store a pair; slots 14, 15 zero by threads < BMAX.
// Every row is written (rows past the batch: 0), as the fragments read all 128.
FT_V8 void v7j_store_xh(int t, int tid, int T, const uint16_t (&px)[V7J_XP], __half* xh) {
  uint32_t* d = reinterpret_cast<uint32_t*>(xh + (t % V7_XR) * BMAX * 16);
  for (int k = 0; k < V7J_XP; ++k) {
    const int p = tid + k * T;
    if (p < BMAX * V7J_PAIRS)
      d[v7j_swz(p / V7J_PAIRS, 2 * (p % V7J_PAIRS)) / 2] = v7j_px_f16x2(px[k]);
  }
  if (tid < BMAX) d[v7j_swz(tid, V8_BIAS) / 2] = 0u;
}

// v7e_put_g's pieces of G_a's float4 i (row i / 4, classes 4·(i % 4) …), swizzled: a float4's 4
// halves stay in one 16-byte half of the row.
FT_V7 void v7j_put_g(int i, float4 g, bool valid, int n, __half* gsh) {
  const float s = V8_GSCALE * static_cast<float>(n);
  const int c0 = 4 * (i % 4);
  const float v[4] = {valid && c0 < C ? g.x * s : 0.f, valid && c0 + 1 < C ? g.y * s : 0.f,
                      valid && c0 + 2 < C ? g.z * s : 0.f, valid && c0 + 3 < C ? g.w * s : 0.f};
  uint32_t* d = reinterpret_cast<uint32_t*>(gsh);
  const int at = v7j_swz(i / 4, c0) / 2;  // in words
  for (int h = 0; h < 2; ++h) v8_split_f16x2(v[2 * h], v[2 * h + 1], d[at + h], d[V8_GW + at + h]);
}

// W·2⁸[f][c]'s pieces (wp: hi, then lo at V8_NF·16) from W's fp32 entry: the split v8_mma_partial
// did in every lane every step, done once by the thread that wrote the entry.
// v8_split_f16x2's arithmetic, one element.
FT_V8 void v7j_put_w(int f, int c, const float* w, __half* wp) {
  const float x = w[f * 16 + c] * V8_WSCALE;
  const __half hi = __float2half_rn(x);
  wp[v7j_swz(f, c)] = hi;
  wp[V8_NF * 16 + v7j_swz(f, c)] = __float2half_rn(x - __half2float(hi));
}
// The prologue's: every entry (classes ≥ C and slots 14, 15 are 0 and stay 0), threads < 256.
FT_V8 void v7j_put_w_all(int tid, const float* w, __half* wp) {
  if (tid < V8_NF * 16) v7j_put_w(tid / 16, tid % 16, w, wp);
}
// v8_mma_update_apply, then the thread's entry's pieces (threads < 16·C: the only entries an
// apply changes).
FT_V8 void v7j_apply(const V7Epoch& e, int a, const float* ured, int tid, float* w, __half* wp) {
  v8_mma_update_apply(e, a, ured, tid, w);
  if (tid < V8_NF * C) v7j_put_w(tid / C, tid % C, w, wp);
}

// v8_mma_update_sums with A and B by ldmatrix (warp u < 8: n-tile u & 1, rows 32·(u >> 1) …).
template <class Warp>
FT_V8 void v7j_update_sums(const Warp& wp, int u, const __half* xa, const __half* gsh,
                           float* ured, bool b_trans = true) {
  if (u >= 8) return;
  const int nt = u & 1, kq = u >> 1;
  typename Warp::template Reg<float> d[4];
  wp.each([&](int lane) {
    for (int i = 0; i < 4; ++i) wp.at(d[i], lane) = 0.f;
  });
  for (int ks = 0; ks < 2; ++ks) {
    const int i0 = 32 * kq + 16 * ks;
    typename Warp::template Reg<uint32_t> a[4], b[4];
    wp.ldsm4t(a, [&](int lane) {
      const int m = lane >> 3;
      return xa + v7j_swz(i0 + 8 * (m >> 1) + (lane & 7), 8 * (m & 1));
    });
    const auto b_row = [&](int lane) {
      const int m = lane >> 3;
      return gsh + (m >> 1) * BMAX * 16 + v7j_swz(i0 + 8 * (m & 1) + (lane & 7), 8 * nt);
    };
    if (b_trans)
      wp.ldsm4t(b, b_row);
    else
      wp.ldsm4(b, b_row);
    const typename Warp::template Reg<uint32_t> bh[2] = {b[0], b[1]}, bl[2] = {b[2], b[3]};
    wp.mma(d, a, bh);
    wp.mma(d, a, bl);
  }
  wp.each([&](int lane) {
    for (int i = 0; i < 4; ++i) {
      const V8Rc e = v8_c_at(lane, i);
      ured[(kq * 16 + e.row) * 16 + 8 * nt + e.col] = wp.at(d[i], lane);
    }
  });
}

// v8_mma_partial with A and B by ldmatrix, B from W's pieces (warp w < 16: m-tile w & 7, n-tile
// w >> 3); out(row, c, v, v′) as v8_mma_partial's.
template <class Warp, class Out>
FT_V8 void v7j_partial(const Warp& wp, int wi, const __half* xt, const __half* wpc, Out out,
                       bool swz_x = true) {
  if (wi >= 16) return;
  const int mt = wi & 7, nt = wi >> 3;
  typename Warp::template Reg<float> d[4];
  typename Warp::template Reg<uint32_t> a[4], b[4];
  wp.each([&](int lane) {
    for (int i = 0; i < 4; ++i) wp.at(d[i], lane) = 0.f;
  });
  wp.ldsm4(a, [&](int lane) {
    const int m = lane >> 3;
    return xt + v7j_swz(16 * mt + 8 * (m & 1) + (lane & 7), 8 * (m >> 1), swz_x);
  });
  wp.ldsm4t(b, [&](int lane) {
    const int m = lane >> 3;
    return wpc + (m >> 1) * V8_NF * 16 + v7j_swz(8 * (m & 1) + (lane & 7), 8 * nt);
  });
  const typename Warp::template Reg<uint32_t> bh[2] = {b[0], b[1]}, bl[2] = {b[2], b[3]};
  wp.mma(d, a, bh);
  wp.mma(d, a, bl);
  wp.each([&](int lane) {
    for (int i = 0; i < 4; i += 2) {
      const V8Rc e = v8_c_at(lane, i);
      out(16 * mt + e.row, 8 * nt + e.col, wp.at(d[i], lane) * (1.f / V8_WSCALE),
          wp.at(d[i + 1], lane) * (1.f / V8_WSCALE));
    }
  });
}

}  // namespace
