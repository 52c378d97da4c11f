// The host's side of csrc/v8_mma.cuh: the 32 lanes of a warp in lockstep (Reg<T> a lane's value
// each, as HostWarp16 in epoch_v7_math_host.cu), and mma.sync.m16n8k16 f16 → f32 emulated through
// the same fragment maps the kernels load and store with.
//
// The rounding model (tests/ladder/split_precision.py's): each product of two fp16 values is exact
// (22 bits); the 16 products and C are summed, then rounded once to fp32, to nearest ("acc rn", the
// default) or toward zero ("acc rz", the pessimistic model: Fasi et al. 2021 found truncating
// accumulation on Volta through Ampere). Each product is exact in double; the running sum is kept
// as an unevaluated pair hi + lo by Knuth's two-sum, exact to ~106 bits, and rounded once.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

#include "v8_mma.cuh"

struct V8HostWarp {
  bool round_toward_zero = false;  // "acc rz"
  template <class T>
  using Reg = std::array<T, 32>;
  template <class T>
  T& at(Reg<T>& v, int lane) const { return v[lane]; }
  template <class T>
  const T& at(const Reg<T>& v, int lane) const { return v[lane]; }
  template <class F>
  void each(F&& f) const {
    for (int lane = 0; lane < 32; ++lane) f(lane);
  }

  // __shfl_xor_sync(full mask, v, mask, width): shfl.sync.bfly with c = ((32 − width) << 8) | 31;
  // the PTX ISA's source lane: j = lane ^ mask, kept only if j ≤ (lane & segmask) | (31 & ~segmask).
  Reg<float> shfl_xor(const Reg<float>& v, int mask, int width = 32) const {
    const int segmask = (32 - width) & 31;
    Reg<float> out;
    for (int lane = 0; lane < 32; ++lane) {
      const int max_lane = (lane & segmask) | (31 & ~segmask), j = lane ^ mask;
      out[lane] = v[j <= max_lane ? j : lane];
    }
    return out;
  }

  // ldmatrix.sync.aligned.m8n8.x4.b16 (PTX ISA, "Warp-level matrix load instruction: ldmatrix"),
  // element by element from the ISA's lane map: lanes 8m … 8m + 7 give the addresses of rows
  // 0 … 7 of matrix m (8 halves each); lane l receives, in register m, half h of row l / 4,
  // column 2(l % 4) + h (.trans: row 2(l % 4) + h, column l / 4). addr(lane): a const __half*.
  template <class F>
  void ldsm4(Reg<uint32_t> (&out)[4], F&& addr) const { ldsm(out, addr, false); }
  template <class F>
  void ldsm4t(Reg<uint32_t> (&out)[4], F&& addr) const { ldsm(out, addr, true); }
  template <class F>
  void ldsm(Reg<uint32_t> (&out)[4], F&& addr, bool trans) const {
    const __half* row[32];
    for (int lane = 0; lane < 32; ++lane) row[lane] = addr(lane);
    for (int l = 0; l < 32; ++l)
      for (int m = 0; m < 4; ++m) {
        __half e[2];
        for (int h = 0; h < 2; ++h) {
          const int r = trans ? 2 * (l % 4) + h : l / 4, c = trans ? l / 4 : 2 * (l % 4) + h;
          e[h] = row[8 * m + r][c];
        }
        out[m][l] = v8_pack(e[0], e[1]);
      }
  }

  void mma(Reg<float> (&d)[4], const Reg<uint32_t> (&a)[4], const Reg<uint32_t> (&b)[2]) const {
    double A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; ++lane) {
      for (int r = 0; r < 4; ++r)
        for (int h = 0; h < 2; ++h) {
          const V8Rc e = v8_a_at(lane, r, h);
          A[e.row][e.col] = __half2float(v8_half(a[r][lane], h));
        }
      for (int r = 0; r < 2; ++r)
        for (int h = 0; h < 2; ++h) {
          const V8Rc e = v8_b_at(lane, r, h);
          B[e.row][e.col] = __half2float(v8_half(b[r][lane], h));
        }
      for (int i = 0; i < 4; ++i) {
        const V8Rc e = v8_c_at(lane, i);
        C[e.row][e.col] = d[i][lane];
      }
    }
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const V8Rc e = v8_c_at(lane, i);
        double hi = C[e.row][e.col], lo = 0.0;
        for (int k = 0; k < 16; ++k) {  // two-sum: hi + lo stays the exact running sum
          const double p = A[e.row][k] * B[k][e.col], s = hi + p, bp = s - hi;
          lo += (hi - (s - bp)) + (p - bp);
          hi = s;
        }
        d[i][lane] = round_to_float(hi, lo);
      }
  }

  // The exact hi + lo (|lo| ≤ half an ulp of hi's double) rounded once to float. f = fp32(hi) is
  // within half a float ulp of hi, so the exact rounding is f or a neighbour: d = f − (hi + lo),
  // computed exactly enough (f − hi is exact: the two are within a float ulp), picks it.
  float round_to_float(double hi, double lo) const {
    const double s = hi + lo, e = lo - (s - hi);  // s + e == hi + lo, |e| ≤ ulp(s)/2
    float f = static_cast<float>(s);
    const double d = (double(f) - s) - e;  // f − exact
    if (round_toward_zero) {
      if ((s > 0 && d > 0) || (s < 0 && d < 0)) f = std::nextafter(f, 0.0f);
      return f;
    }
    // fp32(s) may round a tie the wrong way when e ≠ 0 (double rounding): re-decide it.
    const float other = std::nextafter(f, d > 0 ? -INFINITY : INFINITY);
    const double d2 = (double(other) - s) - e;
    return std::fabs(d2) < std::fabs(d) ? other : f;
  }
};
