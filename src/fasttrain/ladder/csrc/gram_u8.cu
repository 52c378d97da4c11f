// The lagged-Gram step's Gram producer, as a kernel of its own: Γ = X_a X_bᵀ [na, nb] of two
// gathered uint8 batches (rows_a, rows_b index X [*, 784]), exact, in int32, on the tensor cores
// (u8 × u8 → s32 mma.sync.m16n8k32; the warp code is gram_u8.cuh's, checked on the CPU by
// tests/ladder/test_gram_u8.py). Not wired into any ladder row: the piece of
// docs/measurements/cuda-epoch-v7-design.md that can be checked alone (its step 2).
//
// Versions:
//   v1 one warp a 16 × 32 tile, four warps a CTA (64 × 32), operands loaded straight from global
//      memory as 32-bit words (no shared-memory staging, no multicast). Not yet run on a GPU.
#include <cuda_runtime.h>

#include "gram_u8.cuh"

namespace {

__global__ void __launch_bounds__(32 * gram::WARPS)
    gram_u8_kernel(const uint8_t* x, const int32_t* rows_a, int na, const int32_t* rows_b, int nb,
                   int32_t* out) {
  gram::DeviceWarp warp;
  const int m0 = blockIdx.y * gram::TILE_M + (threadIdx.x >> 5) * 16;
  const int n0 = blockIdx.x * gram::TILE_N;
  if (m0 >= na) return;  // a whole warp past the batch (warp-uniform: mma.sync needs all lanes)
  gram::warp_tile(warp, x, rows_a, na, rows_b, nb, m0, n0, out);
}

}  // namespace

// out [na][nb] = Σ_k x[rows_a[i]][k] · x[rows_b[j]][k]; x 4-byte aligned. Returns a cudaError_t.
extern "C" int lagged_gram_u8(const uint8_t* x, const int32_t* rows_a, int na,
                              const int32_t* rows_b, int nb, int32_t* out, cudaStream_t stream) {
  if (na <= 0 || nb <= 0) return 0;
  const dim3 grid((nb + gram::TILE_N - 1) / gram::TILE_N, (na + gram::TILE_M - 1) / gram::TILE_M);
  gram_u8_kernel<<<grid, 32 * gram::WARPS, 0, stream>>>(x, rows_a, na, rows_b, nb, out);
  return static_cast<int>(cudaGetLastError());
}
