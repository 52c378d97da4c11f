// The host stand-in of one warp for the Gram kernels' CPU harnesses (gram_u8_host.cu,
// gram_v2_host.cu): the 32 lanes in lockstep, mma.m16n8k32 .u8 and ldmatrix.x4 emulated element
// by element from the PTX ISA's formulas — written from the element's index, not from the
// headers' per-register loads, so that the two meet only in what the instructions compute. What
// it cannot check is that the GPU's layout is the ISA's: the GPU tests do.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>

#include "gram_u8.cuh"

namespace {

uint8_t byte_of(uint32_t word, int i) { return static_cast<uint8_t>(word >> (8 * (i & 3))); }

struct HostWarp {  // the 32 lanes of one warp in lockstep
  template <class T>
  using Reg = std::array<T, 32>;
  template <class T>
  T& at(Reg<T>& v, int lane) const { return v[lane]; }
  template <class F>
  void each(F&& f) const {
    for (int lane = 0; lane < 32; ++lane) f(lane);
  }
  // ldmatrix.sync.aligned.m8n8.x4.b16 (PTX ISA, "Warp-level matrix load instruction: ldmatrix"):
  // lanes 8m … 8m + 7 give the addresses of the 8 rows (16 bytes each) of matrix m; lane i
  // receives, in its register m, the 32-bit element i % 4 of row i / 4 of matrix m.
  template <class F>
  void ldsm4(Reg<gram::FragA>& out, F&& addr) const {
    const uint8_t* row[32];
    for (int lane = 0; lane < 32; ++lane) row[lane] = addr(lane);
    for (int i = 0; i < 32; ++i)
      for (int m = 0; m < 4; ++m) std::memcpy(&out[i].r[m], row[8 * m + i / 4] + 4 * (i % 4), 4);
  }
  // D = A·B + C on the warp's 16 × 8 × 32 operands, every element placed by the ISA's formulas:
  //   A a_i (i = 0..15): row g + 8·((i / 4) % 2), col 4t + (i % 4) + 16·(i ≥ 8)
  //   B b_i (i = 0..7):  row (k) 4t + (i % 4) + 16·(i ≥ 4), col g
  //   C c_i (i = 0..3):  row g + 8·(i ≥ 2), col 2t + (i % 2)
  void mma(Reg<gram::Acc>& d, const Reg<gram::FragA>& a, const Reg<gram::FragB>& b) const {
    int A[16][32], B[32][8];
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      for (int i = 0; i < 16; ++i)
        A[g + 8 * ((i / 4) % 2)][4 * t + i % 4 + 16 * (i >= 8)] = byte_of(a[lane].r[i / 4], i);
      for (int i = 0; i < 8; ++i)
        B[4 * t + i % 4 + 16 * (i >= 4)][g] = byte_of(b[lane].r[i / 4], i);
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i >= 2), col = 2 * t + i % 2;
        int32_t s = 0;
        for (int k = 0; k < 32; ++k) s += A[row][k] * B[k][col];
        d[lane].c[i] += s;
      }
    }
  }
};

}  // namespace
