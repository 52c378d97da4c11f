// cuda-epoch v8 (design: docs/measurements/cuda-epoch-v8-design.md): the one-SM chain's critical
// product Z_t += Γ̃_{t,1} G'_{t−1} [128 × 128 @ 128 × 10] as 16 warps of mma.sync, compiled only:
// `nvcc -arch=sm_90a -cubin -Xptxas -v` and `cuobjdump -sass` ground the design's instruction
// counts and registers (tests/ladder/test_split_precision_chain.py). Never run, so never checked
// for results: the numerics it would have are tests/ladder/split_precision.py's.
//
// Warp w: rows 16·(w & 7) … + 15 (one m16 tile), K half w >> 3 (64 rows of G'), both n8 tiles (the
// 10 classes padded to 16). Γ̃'s fragments are loaded and split a step ahead (the Grams are known
// up front); after G'_{t−1}'s barrier a warp loads only B fragments and issues its mma chain, then
// the two K halves are summed through shared memory.
//   SCHEME 1: 1xTF32, m16n8k8, 8 k-steps × 2 n-tiles = 16 mma a warp
//   SCHEME 3: 3xTF32, the same × 3 (small·big, big·small, big·big) = 48 mma a warp
//   SCHEME 4: 3xFP16, m16n8k16, A = Γ̃·2⁻¹² and B = (p − y)·2¹² in hi + lo fp16: 4 × 2 × 3 = 24
#include <cstdint>
#include <cuda_fp16.h>

namespace {

constexpr int ROWS = 128, KHALF = 64, GRAM_STRIDE = 132;  // 132: the A loads hit 32 banks

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t tf32_rna(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// (big, small): big is x's own bits (the mma truncates them), small = rna(x − trunc(x)).
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
  big = __float_as_uint(x);
  small = tf32_rna(x - __uint_as_float(big & 0xffffe000u));
}

__device__ __forceinline__ void split_f16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  __half2 h = __floats2half2_rn(x0, x1);
  float2 f = __half22float2(h);
  __half2 l = __floats2half2_rn(x0 - f.x, x1 - f.y);
  hi = *reinterpret_cast<uint32_t*>(&h);
  lo = *reinterpret_cast<uint32_t*>(&l);
}

}  // namespace

// gram: per step a 128 × 128 fp32 Γ̃ (row = the step's row, column = the previous step's row);
// gp: per step G'_{t−1} already split, [piece][n-tile][k 128][8] (SCHEME 1/3: u32 TF32 bits;
// SCHEME 4: [piece][n-tile][k/2 64][8] half2 of p − y); z: per step 128 × 16 fp32 out.
template <int SCHEME>
__global__ void __launch_bounds__(512, 1)
    v8_chain_product(const float* __restrict__ gram, const uint32_t* __restrict__ gp,
                     float* __restrict__ z, int steps) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* s_gram = reinterpret_cast<float*>(smem);              // 128 × 132 fp32: 67,584 B
  uint32_t* s_b = reinterpret_cast<uint32_t*>(s_gram + ROWS * GRAM_STRIDE);  // 2 × 2 × 128 × 8
  float* s_half = reinterpret_cast<float*>(s_b + 2 * 2 * ROWS * 8);  // K half 1's sums: 8 × 512
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3, m0 = 16 * (warp & 7), k0 = KHALF * (warp >> 3);
  constexpr int PIECES = SCHEME == 1 ? 1 : 2;
  constexpr int KSTEPS = SCHEME == 4 ? KHALF / 16 : KHALF / 8;
  uint32_t a[PIECES][KSTEPS][4];

  for (int step = 0; step < steps; ++step) {
    // Γ̃_{t,1} to shared memory (in the kernel: a TMA bulk copy a step ahead), then its fragments.
    for (int i = threadIdx.x; i < ROWS * ROWS; i += blockDim.x)
      s_gram[(i >> 7) * GRAM_STRIDE + (i & 127)] = gram[(size_t)step * ROWS * ROWS + i];
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
      const float* r0 = s_gram + (m0 + g) * GRAM_STRIDE + k0;
      const float* r8 = r0 + 8 * GRAM_STRIDE;
      if constexpr (SCHEME == 4) {
        const float s = 1.0f / 4096.0f;  // Γ̃·2⁻¹² < 12,462: fp16 range, lo pieces normal
        int c = 16 * ks + 2 * t;
        split_f16x2(s * r0[c], s * r0[c + 1], a[0][ks][0], a[1][ks][0]);
        split_f16x2(s * r8[c], s * r8[c + 1], a[0][ks][1], a[1][ks][1]);
        split_f16x2(s * r0[c + 8], s * r0[c + 9], a[0][ks][2], a[1][ks][2]);
        split_f16x2(s * r8[c + 8], s * r8[c + 9], a[0][ks][3], a[1][ks][3]);
      } else {
        int c = 8 * ks + t;
        float v[4] = {r0[c], r8[c], r0[c + 4], r8[c + 4]};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if constexpr (SCHEME == 1) a[0][ks][r] = __float_as_uint(v[r]);
          else split_tf32(v[r], a[0][ks][r], a[1][ks][r]);
        }
      }
    }
    // G'_{t−1} (in the kernel: written by the softmax warps), then its barrier.
    for (int i = threadIdx.x; i < 2 * 2 * ROWS * 8; i += blockDim.x)
      s_b[i] = gp[(size_t)step * 2 * 2 * ROWS * 8 + i];
    __syncthreads();
    // --- the critical path: the mma chain, the K halves summed ---
    float d[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        // B: [piece][n-tile][k][8], k = the fragment's row of G' (SCHEME 4: its row pair).
        const int kk = SCHEME == 4 ? (k0 / 2 + 8 * ks + t) : (k0 + 8 * ks + t);
        const uint32_t* big = s_b + (nt * ROWS + kk) * 8 + g;
        const uint32_t* small = big + 2 * ROWS * 8;
        uint32_t bb0 = big[0], bb1 = big[4 * 8], bs0 = small[0], bs1 = small[4 * 8];
        if constexpr (SCHEME == 1) {
          mma_tf32(d[nt], a[0][ks], bb0, bb1);
        } else if constexpr (SCHEME == 3) {
          mma_tf32(d[nt], a[1][ks], bb0, bb1);  // small · big
          mma_tf32(d[nt], a[0][ks], bs0, bs1);  // big · small
          mma_tf32(d[nt], a[0][ks], bb0, bb1);  // big · big
        } else {
          mma_f16(d[nt], a[1][ks], bb0, bb1);
          mma_f16(d[nt], a[0][ks], bs0, bs1);
          mma_f16(d[nt], a[0][ks], bb0, bb1);
        }
      }
    }
    float* mine = s_half + (warp & 7) * 512 + lane * 8;
    if (warp >= 8) {
#pragma unroll
      for (int i = 0; i < 8; ++i) mine[i] = d[i >> 2][i & 3];
    }
    __syncthreads();
    if (warp < 8) {
      float* out = z + (size_t)step * ROWS * 16;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int col = 8 * nt + 2 * t;
        out[(m0 + g) * 16 + col] = d[nt][0] + mine[4 * nt];
        out[(m0 + g) * 16 + col + 1] = d[nt][1] + mine[4 * nt + 1];
        out[(m0 + g + 8) * 16 + col] = d[nt][2] + mine[4 * nt + 2];
        out[(m0 + g + 8) * 16 + col + 1] = d[nt][3] + mine[4 * nt + 3];
      }
    }
    __syncthreads();
  }
}

template __global__ void v8_chain_product<1>(const float*, const uint32_t*, float*, int);
template __global__ void v8_chain_product<3>(const float*, const uint32_t*, float*, int);
template __global__ void v8_chain_product<4>(const float*, const uint32_t*, float*, int);
