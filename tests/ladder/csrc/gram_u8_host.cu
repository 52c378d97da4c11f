// The CPU side of tests/ladder/test_gram_u8.py: the Gram kernel's warp code (gram_u8.cuh) run on
// the host for its whole grid, each warp's 32 lanes in lockstep, with mma.m16n8k32 .u8 emulated
// element by element from the PTX ISA's fragment formulas — written from the element's index
// (row, col of a_i, b_i, c_i), not from the header's per-register loads, so that the two meet
// only in what the instruction computes. What it cannot check is that the GPU's layout is the
// ISA's: the GPU tests do (tests/ladder/test_gram_u8.py, marked gpu).
#include <array>
#include <cstdint>

#include "gram_u8.cuh"

#if !defined(__CUDA_ARCH__)  // host code only
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

// The kernel's grid on the host: block (bx, by), warp w computes the tile at
// (by · TILE_M + 16w, bx · TILE_N), skipping warps past the batch as the kernel does.
extern "C" void gram_u8_host(const uint8_t* x, const int32_t* rows_a, int na,
                             const int32_t* rows_b, int nb, int32_t* out) {
  HostWarp warp;
  for (int by = 0; by < (na + gram::TILE_M - 1) / gram::TILE_M; ++by)
    for (int bx = 0; bx < (nb + gram::TILE_N - 1) / gram::TILE_N; ++bx)
      for (int w = 0; w < gram::WARPS; ++w) {
        const int m0 = by * gram::TILE_M + 16 * w;
        if (m0 < na)
          gram::warp_tile(warp, x, rows_a, na, rows_b, nb, m0, bx * gram::TILE_N, out);
      }
}
#endif
