// The lagged-Gram step's Gram tiles (docs/measurements/cuda-epoch-v7-design.md): Γ = X_a X_bᵀ of
// two gathered uint8 batches, exact in int32 (at most 784 · 255² = 50,979,600 < 2³¹), on the
// tensor cores with mma.sync.m16n8k32.row.col.s32.u8.u8.s32. Shared by the kernel (gram_u8.cu)
// and its host harness (tests/ladder/csrc/gram_u8_host.cu), which runs this same warp code with
// the 32 lanes in lockstep and the MMA emulated from the PTX ISA's fragment layout.
//
// A warp computes a 16 × (8·NT) tile of Γ over all 784 features in chunks of K = 32 bytes (the
// last chunk half zero: 784 = 24.5 × 32). Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k32"
// with .u8; g = lane / 4, t = lane % 4; every register packs 4 consecutive k, low byte first):
//   A (16 × 32, row):  a[0] row g,   k 4t … 4t+3     a[1] row g+8, k 4t …
//                      a[2] row g,   k 16+4t …       a[3] row g+8, k 16+4t …
//   B (32 × 8, col):   b[0] col g,   k 4t … 4t+3     b[1] col g,   k 16+4t …
//   C (16 × 8, s32):   c[0] (g, 2t)  c[1] (g, 2t+1)  c[2] (g+8, 2t)  c[3] (g+8, 2t+1)
// Both operands are rows of X (B = X_bᵀ stored column-major is X_b row-major), so every register
// is one aligned 32-bit load of 4 pixels: a row is 784 = 196 × 4 bytes.
// Version 1: operands straight from global memory (L2), no shared-memory staging: a correctness
// piece, not yet the producer role's kernel (which stages X_{t−j} chunks and multicasts them).
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define GRAM_HD __host__ __device__ __forceinline__
#else
#define GRAM_HD inline
#endif

namespace gram {

constexpr int K_BYTES = 784;            // features a row
constexpr int K_WORDS = K_BYTES / 4;    // 196 words of 4 pixels
constexpr int K_CHUNK = 32;             // bytes of k per mma
constexpr int CHUNKS = (K_BYTES + K_CHUNK - 1) / K_CHUNK;  // 25, the last one half padding
constexpr int NT = 4;                   // n8 blocks a warp: a 16 × 32 warp tile
constexpr int WARPS = 4;                // warps a CTA, stacked along m: a 64 × 32 CTA tile
constexpr int TILE_M = 16 * WARPS, TILE_N = 8 * NT;

struct FragA { uint32_t r[4]; };
struct FragB { uint32_t r[2]; };
struct Acc { int32_t c[4]; };

// Word `w` (4 pixels) of batch row `i` (rows[i] indexes X [*, 784]); 0 past the batch or the row.
GRAM_HD uint32_t word(const uint8_t* x, const int32_t* rows, int n, int i, int w) {
  if (i >= n || w >= K_WORDS) return 0u;
  return reinterpret_cast<const uint32_t*>(x + (int64_t)rows[i] * K_BYTES)[w];
}

GRAM_HD FragA load_a(const uint8_t* x, const int32_t* rows, int n, int m0, int chunk, int lane) {
  const int g = lane >> 2, t = lane & 3, w = chunk * (K_CHUNK / 4) + t;
  return FragA{{word(x, rows, n, m0 + g, w), word(x, rows, n, m0 + g + 8, w),
                word(x, rows, n, m0 + g, w + 4), word(x, rows, n, m0 + g + 8, w + 4)}};
}

GRAM_HD FragB load_b(const uint8_t* x, const int32_t* rows, int n, int n0, int chunk, int lane) {
  const int g = lane >> 2, t = lane & 3, w = chunk * (K_CHUNK / 4) + t;
  return FragB{{word(x, rows, n, n0 + g, w), word(x, rows, n, n0 + g, w + 4)}};
}

// out [na][ld] row-major (ld >= nb); entries past the batches are not written. An Out of float
// rounds each exact s32 sum once (cvt.rn), as the v7 epoch kernel reads its Grams.
template <class Out>
GRAM_HD void store_c(Out* out, int ld, int na, int nb, int m0, int n0, const Acc& acc, int lane) {
  const int g = lane >> 2, t = lane & 3;
  for (int v = 0; v < 4; ++v) {
    const int i = m0 + g + 8 * (v >> 1), j = n0 + 2 * t + (v & 1);
    if (i < na && j < nb) out[(int64_t)i * ld + j] = static_cast<Out>(acc.c[v]);
  }
}

// One warp's 16 × 32 tile at (m0, n0). `Warp` says how lanes run: on the GPU each lane is a thread
// (Reg<T> is T, each(f) calls f(laneid), mma is the instruction); on the host all 32 lanes of one
// warp run in lockstep (Reg<T> holds 32 T, each(f) loops, mma is emulated).
template <class Warp, class Out>
GRAM_HD void warp_tile(Warp& warp, const uint8_t* x, const int32_t* rows_a, int na,
                       const int32_t* rows_b, int nb, int m0, int n0, Out* out, int ld) {
  typename Warp::template Reg<Acc> acc[NT];
  for (int j = 0; j < NT; ++j)
    warp.each([&](int lane) { warp.at(acc[j], lane) = Acc{{0, 0, 0, 0}}; });
  for (int chunk = 0; chunk < CHUNKS; ++chunk) {
    typename Warp::template Reg<FragA> a;
    warp.each([&](int lane) { warp.at(a, lane) = load_a(x, rows_a, na, m0, chunk, lane); });
    for (int j = 0; j < NT; ++j) {
      typename Warp::template Reg<FragB> b;
      warp.each([&](int lane) {
        warp.at(b, lane) = load_b(x, rows_b, nb, n0 + 8 * j, chunk, lane);
      });
      warp.mma(acc[j], a, b);
    }
  }
  for (int j = 0; j < NT; ++j)
    warp.each([&](int lane) {
      store_c(out, ld, na, nb, m0, n0 + 8 * j, warp.at(acc[j], lane), lane);
    });
}
// The same tile into a dense [na][nb] int32 Γ (gram_u8.cu's layout).
template <class Warp>
GRAM_HD void warp_tile(Warp& warp, const uint8_t* x, const int32_t* rows_a, int na,
                       const int32_t* rows_b, int nb, int m0, int n0, int32_t* out) {
  warp_tile(warp, x, rows_a, na, rows_b, nb, m0, n0, out, nb);
}

#if defined(__CUDACC__)
// On the GPU each lane is a thread: Reg<T> is T, each(f) calls f(laneid), mma is the instruction.
struct DeviceWarp {  // each lane is a thread of the warp
  template <class T>
  using Reg = T;
  template <class T>
  __device__ __forceinline__ T& at(T& v, int) const { return v; }
  template <class F>
  __device__ __forceinline__ void each(F&& f) const { f(static_cast<int>(threadIdx.x & 31)); }
  __device__ __forceinline__ void mma(Acc& d, const FragA& a, const FragB& b) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+r"(d.c[0]), "+r"(d.c[1]), "+r"(d.c[2]), "+r"(d.c[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
#else
    __trap();  // integer mma.sync needs sm_80+
#endif
  }
};
#endif

}  // namespace gram
