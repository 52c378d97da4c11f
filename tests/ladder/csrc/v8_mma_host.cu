// csrc/v8_mma.cuh's fragment maps, split and mma emulation (v8_mma_host.h) called from
// tests/ladder/test_v8_mma.py through ctypes. Matrices travel as fp32 arrays; A and B must hold
// fp16-exact values (the test makes them so).
#include <cstring>

#include "v8_mma_host.h"

extern "C" {

// D = A[16 × 16] B[16 × 8] + C[16 × 8] through the lanes' fragments; rz: "acc rz". Returns 0, or
// 1 when the maps do not cover every element exactly once.
int v8_mma_ref(const float* a, const float* b, const float* c, int rz, float* d) {
  V8HostWarp warp{rz != 0};
  V8HostWarp::Reg<uint32_t> fa[4], fb[2];
  V8HostWarp::Reg<float> acc[4];
  int seen_a[16][16] = {}, seen_b[16][8] = {}, seen_c[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < 4; ++r) {
      const V8Rc e0 = v8_a_at(lane, r, 0), e1 = v8_a_at(lane, r, 1);
      fa[r][lane] = v8_pack(__float2half_rn(a[e0.row * 16 + e0.col]),
                            __float2half_rn(a[e1.row * 16 + e1.col]));
      ++seen_a[e0.row][e0.col];
      ++seen_a[e1.row][e1.col];
    }
    for (int r = 0; r < 2; ++r) {
      const V8Rc e0 = v8_b_at(lane, r, 0), e1 = v8_b_at(lane, r, 1);
      fb[r][lane] = v8_pack(__float2half_rn(b[e0.row * 8 + e0.col]),
                            __float2half_rn(b[e1.row * 8 + e1.col]));
      ++seen_b[e0.row][e0.col];
      ++seen_b[e1.row][e1.col];
    }
    for (int i = 0; i < 4; ++i) {
      const V8Rc e = v8_c_at(lane, i);
      acc[i][lane] = c[e.row * 8 + e.col];
      ++seen_c[e.row][e.col];
    }
  }
  for (int i = 0; i < 16 * 16; ++i)
    if ((&seen_a[0][0])[i] != 1) return 1;
  for (int i = 0; i < 16 * 8; ++i)
    if ((&seen_b[0][0])[i] != 1 || (&seen_c[0][0])[i] != 1) return 1;
  warp.mma(acc, fa, fb);
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const V8Rc e = v8_c_at(lane, i);
      d[e.row * 8 + e.col] = acc[i][lane];
    }
  return 0;
}

// x[2k], x[2k + 1] → their hi and lo fp16 pieces, as floats (n even).
void v8_split_ref(const float* x, int n, float* hi, float* lo) {
  for (int k = 0; k < n; k += 2) {
    uint32_t h, l;
    v8_split_f16x2(x[k], x[k + 1], h, l);
    for (int s = 0; s < 2; ++s) {
      hi[k + s] = __half2float(v8_half(h, s));
      lo[k + s] = __half2float(v8_half(l, s));
    }
  }
}
}

extern "C" {
// out[lane] = v[lane] after butterflies over masks 1, 2, … < width (each adds the partner's).
void v8_butterfly_sum_ref(const float* v, int width, float* out) {
  V8HostWarp warp;
  V8HostWarp::Reg<float> x;
  for (int lane = 0; lane < 32; ++lane) x[lane] = v[lane];
  for (int m = 1; m < width; m <<= 1) {
    const V8HostWarp::Reg<float> o = warp.shfl_xor(x, m, width);
    for (int lane = 0; lane < 32; ++lane) x[lane] += o[lane];
  }
  for (int lane = 0; lane < 32; ++lane) out[lane] = x[lane];
}
}

extern "C" {
void v8_shfl_xor_ref(const float* v, int mask, int width, float* out) {
  V8HostWarp warp;
  V8HostWarp::Reg<float> x;
  for (int lane = 0; lane < 32; ++lane) x[lane] = v[lane];
  const V8HostWarp::Reg<float> o = warp.shfl_xor(x, mask, width);
  for (int lane = 0; lane < 32; ++lane) out[lane] = o[lane];
}
}
