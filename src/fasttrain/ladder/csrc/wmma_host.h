// The host pass's stand-in for nvcuda::wmma (16x16x16, bf16 inputs, fp32 accumulator), for the
// CPU test of cuda-epoch v5's tile indexing (epoch_v5_math.cuh with FT_HOST_MATH). A fragment
// holds its whole tile; the calls do what the CUDA C++ Programming Guide's WMMA section says
// they do, element by element, and count the uses its rules forbid (a pointer not 256-bit
// aligned, an ldm not a multiple of 8 for 16-bit elements or of 4 for float) in `violations`.
// The device pass never includes it.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

namespace ft_host_wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

inline int violations = 0;

inline void check(const void* p, unsigned ldm, unsigned multiple) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || ldm % multiple != 0) ++violations;
}

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment;

template <class Layout>
struct fragment<matrix_a, 16, 16, 16, __nv_bfloat16, Layout> {  // rows x k
  static constexpr int num_elements = 256;
  float x[256];
};
template <class Layout>
struct fragment<matrix_b, 16, 16, 16, __nv_bfloat16, Layout> {  // k x columns
  static constexpr int num_elements = 256;
  float x[256];
};
template <>
struct fragment<accumulator, 16, 16, 16, float, void> {  // rows x columns
  static constexpr int num_elements = 256;
  float x[256];
};

template <class Use, class Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout>& f,
                             const __nv_bfloat16* p, unsigned ldm) {
  check(p, ldm, 8);
  constexpr bool row = std::is_same_v<Layout, row_major>;
  for (int i = 0; i < 16; ++i)    // the tile's row (a: m, b: k)
    for (int j = 0; j < 16; ++j)  // its column (a: k, b: n)
      f.x[i * 16 + j] = __bfloat162float(row ? p[i * ldm + j] : p[i + j * ldm]);
}

inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float v) {
  for (float& e : f.x) e = v;
}

// d = a b + c, each sum in fp32 in k order (the products of bf16 values are exact in fp32).
template <class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[256];
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float s = c.x[m * 16 + n];
      for (int k = 0; k < 16; ++k) s += a.x[m * 16 + k] * b.x[k * 16 + n];
      out[m * 16 + n] = s;
    }
  for (int i = 0; i < 256; ++i) d.x[i] = out[i];
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  check(p, ldm, 4);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n)
      p[layout == mem_row_major ? m * ldm + n : m + n * ldm] = f.x[m * 16 + n];
}

}  // namespace ft_host_wmma
