// cuda-epoch v5's arithmetic: the step's two GEMMs on tensor cores at fp32 accuracy (see
// cuda_epoch.cu for the changelog, epoch_v5.cuh for the step that uses it).
//
// Why the tensor cores give fp32 results here: the pixels are integers 0..255, exact in bf16
// (8 significant bits); W and g are split into three bf16 parts (hi + mid + lo carries 24
// significant bits, fp32's own), every product of a pixel and a part is exact in fp32, and the
// MMA accumulates in fp32. So L = X W^T is three bf16 MMAs per tile and G = g^T X three, instead
// of ~140 shared-memory-bound FMAs per thread each (v3/v4): cuBLAS's "BF16x9" emulation of fp32
// needs nine products; three suffice because one factor is exact.
//
// Layouts (bf16 unless said; a "slot" is v3's class position, slot = c + 3 * (c >= 5)):
//   XH  [BMAX][XLD]     a batch, my F features, zero in [F, FPAD) and in the rows of a partial
//                       16-row tile past the batch's end
//   WP  [3][16][WLD]    the parts of my W slice by slot, zero in the pad slots and features
//   GB  [BMAX][3 * 16]  every row's g by part then slot (an owner sends its rows split)
//   LO  [8][16][16]     fp32: each L warp's 16 rows of partial logits by slot
//   RED [KQ][16][FPAD]  fp32: G's partial sums of the KQ row quarters (or halves), by slot
//
// Everything here is written for the WMMA API (nvcuda::wmma, 16x16x16 bf16 -> fp32) through the
// namespace alias `wm`. Define FT_HOST_MATH before including this header to compile the same
// functions for the host against ft_host_wmma (below), which implements the API's documented
// semantics on whole tiles and checks its alignment rules: the CPU test of the tile indexing
// (tests/ladder/test_cuda_epoch_v5_math.py).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "epoch_v3.cuh"

#if defined(FT_HOST_MATH)
#define FT_MATH __host__ __device__ __forceinline__
#else
#define FT_MATH __device__ __forceinline__
#endif

#if defined(__CUDA_ARCH__)
#include <mma.h>
namespace wm = nvcuda::wmma;
#else
#include "wmma_host.h"
namespace wm = ft_host_wmma;
#endif

namespace {

using bf16 = __nv_bfloat16;

template <int NC>
struct Shape5 {
  using S3 = Shape3<NC>;
  static constexpr int F = S3::F, RPC = S3::RPC, PART = S3::PART;
  static constexpr int KT = (F + 15) / 16;  // 16-feature tiles (4 or 7)
  static constexpr int FPAD = KT * 16;      // 64 or 112
  static constexpr int XLD = FPAD + 8;      // bf16 row strides: +16 bytes, so the 8 rows of a
  static constexpr int WLD = FPAD + 8;      //   fragment load fall in different banks
  static constexpr int NT = KT;             // G: 16-feature output tiles
  static constexpr int MT = BMAX / 16;      // 16-row tiles of a batch (L's warps; G's k tiles)
  static constexpr int KQ = pow2_floor(16 / NT) < MT ? pow2_floor(16 / NT) : MT;  // G's row
  static constexpr int KPW = MT / KQ;       //   splits (4 or 2) and k tiles a warp (2 or 4)
  static constexpr int GROW = 3 * 16;       // bf16 per row of the g inbox
  // One g inbox (what GBAR brings a step), in bytes: the rows' parts, then the bias partials.
  static constexpr int GB_BYTES = BMAX * GROW * 2 + NC * 16 * 4;
  // Shared memory, in bytes; every region 128-byte aligned.
  static constexpr int up(int n) { return (n + 127) / 128 * 128; }
  static constexpr int W_OFF = 0;                               // fp32 [C][F]: the master copy
  static constexpr int BIAS_OFF = up(W_OFF + 4 * C * F);        // fp32 [16]
  static constexpr int WP_OFF = up(BIAS_OFF + 64);              // bf16 [3][16][WLD]
  static constexpr int XH_OFF = up(WP_OFF + 2 * 3 * 16 * WLD);  // bf16 [2][BMAX][XLD]
  static constexpr int PART_OFF = up(XH_OFF + 2 * 2 * BMAX * XLD);  // fp32 [2][PART]
  static constexpr int GB_OFF = up(PART_OFF + 2 * 4 * PART);    // [2][GB_BYTES]
  static constexpr int BAR_OFF = up(GB_OFF + 2 * GB_BYTES);     // PB[2], GBAR[2]: 4 x 8 bytes
  static constexpr int LO_OFF = up(BAR_OFF + 32);               // fp32 [MT][16][16]
  static constexpr int RED_OFF = up(LO_OFF + 4 * MT * 256);     // fp32 [KQ][16][FPAD]
  static constexpr int GL_OFF = up(RED_OFF + 4 * KQ * 16 * FPAD);  // fp32 [RPC][16]
  static constexpr int IDX_OFF = up(GL_OFF + 4 * RPC * 16);     // int [4][BMAX]
  static constexpr int YS_OFF = IDX_OFF + 4 * 4 * BMAX;         // int [4][BMAX]
  static constexpr int XB_OFF = YS_OFF + 4 * 4 * BMAX;          // uint8 [2][BMAX][F]
  static constexpr int BYTES = XB_OFF + 2 * BMAX * F;
  static_assert(BYTES <= 227 * 1024, "fits a Hopper SM's shared memory");
  static_assert(NT * KQ <= THREADS3 / 32 && MT <= THREADS3 / 32, "one pass of warps a GEMM");
  static_assert(XLD % 8 == 0 && WLD % 8 == 0 && FPAD % 4 == 0, "WMMA's ldm rules");
  static_assert(NC * (2 * RPC + 4) <= THREADS3, "one pass of the g sends");
  static_assert(NC * RPC * 40 < (1 << 20) && GB_BYTES < (1 << 20), "tx-count range");
  static_assert(GB_BYTES % 32 == 0, "the second g inbox's MMA tiles 32-byte aligned too");
  // Where an owner's sends land in a g inbox (what G and the update read there): part k of the
  // 8-slot half v2 of row `row` (bf16 elements), and the float4 v of owner q's bias partial
  // (bytes).
  __host__ __device__ static constexpr int g_elem(int row, int k, int v2) {
    return row * GROW + k * 16 + 8 * v2;
  }
  __host__ __device__ static constexpr int dbp_byte(int q, int v) {
    return 2 * BMAX * GROW + 4 * (q * 16 + 4 * v);
  }
};

// The bits of `from` as a To (memcpy: a register move on the device, defined behaviour on both).
template <class To, class From>
FT_MATH To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

// 4 uint8 pixels -> 4 exact bf16 (a pixel's float has no bits below the top 16), packed in two
// words, lower pixel in the lower half.
FT_MATH uint2 bytes_to_bf16x4(uint32_t v) {
  uint32_t h[4];
  for (int i = 0; i < 4; ++i) {  // 2^23 + byte, minus 2^23: the byte as an exact float
    const float f = bit_cast<float>(0x4B000000u | ((v >> (8 * i)) & 0xFFu)) - 8388608.f;
    h[i] = bit_cast<uint32_t>(f) >> 16;
  }
  return make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
}

// v = hi + mid + lo to within 2^-24 |v| (each part the bf16 nearest to what is left), for
// |v| below bf16's largest finite value (~3.39e38, where hi would round to infinity).
FT_MATH void split3(float v, bf16 (&part)[3]) {
  part[0] = __float2bfloat16_rn(v);
  const float r1 = v - __bfloat162float(part[0]);  // exact (Sterbenz), and so is the next
  part[1] = __float2bfloat16_rn(r1);
  part[2] = __float2bfloat16_rn(r1 - __bfloat162float(part[1]));
}

// The three parts of 8 consecutive fp32 values, each as 8 bf16 packed in a uint4: what an owner
// sends of 8 slots of one of its rows of g.
FT_MATH void split8(const float* v, uint4 (&out)[3]) {
  uint32_t w[3][4];
  for (int i = 0; i < 4; ++i) {
    bf16 a[3], b[3];
    split3(v[2 * i], a);
    split3(v[2 * i + 1], b);
    for (int p = 0; p < 3; ++p)
      w[p][i] = bit_cast<uint16_t>(a[p]) | static_cast<uint32_t>(bit_cast<uint16_t>(b[p])) << 16;
  }
  for (int p = 0; p < 3; ++p) out[p] = make_uint4(w[p][0], w[p][1], w[p][2], w[p][3]);
}

// Batch j's fetched pixels as bf16: xb[j & 1] -> xh[j & 1], and zeros in the rows from `rows` to
// the end of its last 16-row tile (the GEMMs read whole tiles; G's k tiles past the batch are
// skipped). T threads.
template <class S>
FT_MATH void widen_batch_bf16(int j, int rows, int tid, int T, const uint8_t* xb, bf16* xh) {
  constexpr int F = S::F, XLD = S::XLD, Q = F / 4;
  bf16* dst = xh + (j & 1) * BMAX * XLD;
  const uint32_t* src = reinterpret_cast<const uint32_t*>(xb + (j & 1) * BMAX * F);
  for (int i = tid; i < rows * Q; i += T)
    *reinterpret_cast<uint2*>(dst + (i / Q) * XLD + (i % Q) * 4) = bytes_to_bf16x4(src[i]);
  const int pad = (rows + 15) / 16 * 16 - rows;
  for (int i = tid; i < pad * Q; i += T)
    *reinterpret_cast<uint2*>(dst + (rows + i / Q) * XLD + (i % Q) * 4) = make_uint2(0u, 0u);
}

// The parts of W's entry (class c, feature k) into WP. The pad slots and features stay zero.
template <class S>
FT_MATH void store_parts(bf16* wp, int c, int k, float w) {
  bf16 part[3];
  split3(w, part);
  const int slot = c + 3 * (c >= 5);
  for (int p = 0; p < 3; ++p) wp[(p * 16 + slot) * S::WLD + k] = part[p];
}

using Acc = wm::fragment<wm::accumulator, 16, 16, 16, float>;

// A tile's three per-part accumulators summed, hi + (mid + lo), and stored (fp32, row-major).
FT_MATH void store_parts_sum(float* p, Acc (&acc)[3], unsigned ldm) {
  for (int i = 0; i < acc[0].num_elements; ++i) acc[0].x[i] += acc[1].x[i] + acc[2].x[i];
  wm::store_matrix_sync(p, acc[0], ldm, wm::mem_row_major);
}

// L for one warp: partial logits of batch rows [16m, 16m + 16) over my features, by slot, into
// lo [16][16] (fp32): the three parts of W against the same exact pixels, one accumulator each
// (three independent MMA chains of KT), summed hi + (mid + lo).
template <class S>
FT_MATH void logits_tile(const bf16* xh, const bf16* wp, int m, float* lo) {
  Acc acc[3];
  for (int p = 0; p < 3; ++p) wm::fill_fragment(acc[p], 0.f);
#pragma unroll
  for (int kt = 0; kt < S::KT; ++kt) {
    wm::fragment<wm::matrix_a, 16, 16, 16, bf16, wm::row_major> a;  // X rows x features
    wm::load_matrix_sync(a, xh + m * 16 * S::XLD + kt * 16, S::XLD);
#pragma unroll
    for (int p = 0; p < 3; ++p) {
      wm::fragment<wm::matrix_b, 16, 16, 16, bf16, wm::col_major> b;  // features x slots
      wm::load_matrix_sync(b, wp + p * 16 * S::WLD + kt * 16, S::WLD);
      wm::mma_sync(acc[p], a, b, acc[p]);
    }
  }
  store_parts_sum(lo, acc, 16);
}

// G for one warp: the gradient of my features [16 nt, 16 nt + 16) by slot, summed over the k
// tiles (16 rows each) [kq * KPW, (kq + 1) * KPW) that hold rows of the batch (nb), into RED's
// row split kq: g^T (slots x rows, from GB's part p) times X (rows x features).
template <class S>
FT_MATH void gradient_tile(const bf16* xh, const bf16* gb, int nt, int kq, int nb, float* red) {
  Acc acc[3];
  for (int p = 0; p < 3; ++p) wm::fill_fragment(acc[p], 0.f);
#pragma unroll
  for (int j = 0; j < S::KPW; ++j) {
    const int kt = kq * S::KPW + j;
    if (kt * 16 >= nb) break;  // the same for the whole warp
    wm::fragment<wm::matrix_b, 16, 16, 16, bf16, wm::row_major> b;  // rows x features
    wm::load_matrix_sync(b, xh + kt * 16 * S::XLD + nt * 16, S::XLD);
#pragma unroll
    for (int p = 0; p < 3; ++p) {
      wm::fragment<wm::matrix_a, 16, 16, 16, bf16, wm::col_major> a;  // slots x rows
      wm::load_matrix_sync(a, gb + kt * 16 * S::GROW + p * 16, S::GROW);
      wm::mma_sync(acc[p], a, b, acc[p]);
    }
  }
  store_parts_sum(red + kq * 16 * S::FPAD + nt * 16, acc, S::FPAD);
}

// After G (and a CTA barrier): every weight of my slice minus its gradient (the KQ row splits
// summed, the 1/255 pixel scale applied), its parts re-split for the next L; the last C threads
// also update the bias from the NC owners' partials dbp [NC][16]. T threads.
template <int NC, class S>
FT_MATH void apply_update_tc(const float* red, const float* dbp, float* W, bf16* wp,
                             float* bias, int tid, int T) {
  constexpr int F = S::F, FPAD = S::FPAD;
  const float inv255 = 1.f / 255.f;
  for (int i = tid; i < C * F; i += T) {
    const int c = i / F, k = i % F, slot = c + 3 * (c >= 5);
    float sum = red[slot * FPAD + k];
    for (int q = 1; q < S::KQ; ++q) sum += red[(q * 16 + slot) * FPAD + k];
    const float w = W[i] - sum * inv255;
    W[i] = w;
    store_parts<S>(wp, c, k, w);
  }
  if (tid >= T - C) {
    const int cb = tid - (T - C), slot = cb < 5 ? cb : cb + 3;
    float db = 0.f;
    for (int src = 0; src < NC; ++src) db += dbp[src * 16 + slot];
    bias[cb] -= db;
  }
}

}  // namespace
