// The CPU side of tests/ladder/test_gram_u8.py: the Gram kernel's warp code (gram_u8.cuh) run on
// the host for its whole grid, each warp's 32 lanes in lockstep, with mma.m16n8k32 .u8 emulated
// element by element from the PTX ISA's fragment formulas (gram_host_warp.h's HostWarp). What it
// cannot check is that the GPU's layout is the ISA's: the GPU tests do (tests/ladder/
// test_gram_u8.py, marked gpu).
#include "gram_host_warp.h"

#if !defined(__CUDA_ARCH__)  // host code only

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
