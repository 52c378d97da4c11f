// cuda-epoch v8's tensor-core product (docs/measurements/cuda-epoch-v8-design.md): one warp's
// mma.sync.m16n8k16.row.col.f32.f16.f16.f32, its fragments' layout, and the hi/lo fp16 split of
// the design's 3xFP16 scheme, written once for the GPU and for the host.
//
// - The layout (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type"): lane =
//   4·group + quad; A [16 × 16] row-major in 4 registers of 2 halves, B [16 × 8] in 2, C/D [16 × 8]
//   in 4 floats. v8_a_at / v8_b_at / v8_c_at give the (row, column) of a lane's element, so code
//   that loads and stores fragments is the same on both sides.
// - V8DeviceWarp::mma issues the instruction; the host harness's policy
//   (tests/ladder/csrc/v8_mma_host.h) gathers the 32 lanes' fragments through the same maps and
//   computes D = A·B + C with the products exact and one rounding of the sum (the split-precision
//   emulation's "acc rn"; "acc rz" on request), as tests/ladder/split_precision.py models the
//   tensor core.
// - v8_split_f16x2: x → hi = fp16(x), lo = fp16(x − hi) (both round to nearest even), 22 bits of x
//   when neither piece is subnormal; the caller scales x so that they are not.
#pragma once
#include <cstdint>
#include <cuda_fp16.h>

#define FT_V8 __host__ __device__ __forceinline__

namespace {

struct V8Rc {
  int row, col;
};
// A [16 × 16]: register r ∈ 0…3, half h ∈ 0…1 → (row, k). r = 0: (g, 2q + h); 1: (g + 8, 2q + h);
// 2: (g, 2q + 8 + h); 3: (g + 8, 2q + 8 + h).
FT_V8 V8Rc v8_a_at(int lane, int r, int h) {
  const int g = lane >> 2, q = lane & 3;
  return {g + 8 * (r & 1), 2 * q + 8 * (r >> 1) + h};
}
// B [16 × 8] (k × n): register r ∈ 0…1, half h → (k, n) = (2q + 8r + h, g).
FT_V8 V8Rc v8_b_at(int lane, int r, int h) {
  const int g = lane >> 2, q = lane & 3;
  return {2 * q + 8 * r + h, g};
}
// C/D [16 × 8]: float i ∈ 0…3 → (row, n) = (g + 8·(i ≥ 2), 2q + (i & 1)).
FT_V8 V8Rc v8_c_at(int lane, int i) {
  const int g = lane >> 2, q = lane & 3;
  return {g + 8 * (i >> 1), 2 * q + (i & 1)};
}

// Two halves in one 32-bit register: `lo16` is the element of half 0 (the lower address).
FT_V8 uint32_t v8_pack(__half h0, __half h1) {
  return uint32_t(__half_as_ushort(h0)) | uint32_t(__half_as_ushort(h1)) << 16;
}
FT_V8 __half v8_half(uint32_t reg, int h) {
  return __ushort_as_half(static_cast<unsigned short>(h ? reg >> 16 : reg & 0xffffu));
}
// (x0, x1) → hi = (fp16(x0), fp16(x1)), lo = (fp16(x0 − hi0), fp16(x1 − hi1)); x − hi is exact in
// fp32 (hi holds x's top 11 bits), so lo is its one rounding.
FT_V8 void v8_split_f16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
  hi = v8_pack(h0, h1);
  lo = v8_pack(__float2half_rn(x0 - __half2float(h0)), __float2half_rn(x1 - __half2float(h1)));
}
// An exact small integer (a pixel, 0 … 255, or the bias pixel) as fp16: exact below 2¹¹.
FT_V8 uint32_t v8_pack_u8(uint8_t a, uint8_t b) {
  return v8_pack(__float2half_rn(float(a)), __float2half_rn(float(b)));
}

#ifdef __CUDACC__
// The lanes of a warp on the GPU: a lane is the thread; the mma is one instruction.
struct V8DeviceWarp {
  template <class T>
  using Reg = T;
  template <class T>
  __device__ __forceinline__ T& at(T& v, int) const { return v; }
  template <class T>
  __device__ __forceinline__ const T& at(const T& v, int) const { return v; }
  template <class F>
  __device__ __forceinline__ void each(F&& f) const { f(static_cast<int>(threadIdx.x & 31)); }
  __device__ __forceinline__ float shfl_xor(float v, int mask, int width = 32) const {
    return __shfl_xor_sync(0xffffffffu, v, mask, width);
  }
  // d = a·b + d, fp32 accumulate.
  __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4],
                                      const uint32_t (&b)[2]) const {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  // ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (v7j): addr(lane) is the start of the row
  // (16 bytes, 16-byte aligned, shared memory) that the lane gives: row lane % 8 of matrix lane / 8.
  template <class F>
  __device__ __forceinline__ void ldsm4(uint32_t (&r)[4], F&& addr) const {
    const uint32_t a = static_cast<uint32_t>(
        __cvta_generic_to_shared(addr(static_cast<int>(threadIdx.x & 31))));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  }
  template <class F>
  __device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], F&& addr) const {
    const uint32_t a = static_cast<uint32_t>(
        __cvta_generic_to_shared(addr(static_cast<int>(threadIdx.x & 31))));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  }
};
#endif

}  // namespace
