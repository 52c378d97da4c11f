// The CPU side of tests/ladder/test_cuda_epoch_v5_math.py: cuda-epoch v5's tile arithmetic
// (epoch_v5_math.cuh) compiled for the host against the WMMA stand-in (wmma_host.h), run on one
// CTA's shared-memory image laid out by Shape5 exactly as the kernel lays it out, warp by warp
// and thread by thread as the kernel's phases call it.
#define FT_HOST_MATH
#include <cstdlib>
#include <cstring>
#include <vector>

#include "epoch_v5_math.cuh"

#if !defined(__CUDA_ARCH__)  // host code only: nvcc's device pass sees nothing here
namespace {

template <int NC>
int run_step(int p, const uint8_t* pixels, int rows, const float* w_in, const float* b_in,
             const float* g, const float* dbp_in, float* logits, float* w_out, float* b_out,
             float* logits_after) {
  using S = Shape5<NC>;
  constexpr int F = S::F, T = THREADS3;
  const size_t bytes = (S::BYTES + 127) / 128 * 128;
  char* sm = static_cast<char*>(std::aligned_alloc(128, bytes));
  std::memset(sm, 0xFF, bytes);  // NaN everywhere the kernel does not write first
  float* W = reinterpret_cast<float*>(sm + S::W_OFF);
  float* bias = reinterpret_cast<float*>(sm + S::BIAS_OFF);
  bf16* wp = reinterpret_cast<bf16*>(sm + S::WP_OFF);
  bf16* xh = reinterpret_cast<bf16*>(sm + S::XH_OFF);
  bf16* gb = reinterpret_cast<bf16*>(sm + S::GB_OFF + p * S::GB_BYTES);  // GB[p]
  float* lo = reinterpret_cast<float*>(sm + S::LO_OFF);
  float* red = reinterpret_cast<float*>(sm + S::RED_OFF);
  uint8_t* xb = reinterpret_cast<uint8_t*>(sm + S::XB_OFF);
  // setup: the kernel zeroes W's parts, the batches and the inboxes, then loads the slice.
  std::memset(sm + S::WP_OFF, 0, S::XH_OFF + 2 * 2 * BMAX * S::XLD - S::WP_OFF);
  std::memset(sm + S::PART_OFF, 0, S::BAR_OFF - S::PART_OFF);
  std::memcpy(W, w_in, 4 * C * F);
  std::memcpy(bias, b_in, 4 * C);
  // Batch j lands in buffer p = j & 1: a full batch there first (stale rows the partial batch
  // must not see; batch p + 2 then reuses the buffer), then batch p + 2.
  std::vector<uint8_t> full(BMAX * F, 255);
  std::memcpy(xb + p * BMAX * F, full.data(), full.size());
  for (int tid = 0; tid < T; ++tid) widen_batch_bf16<S>(p, BMAX, tid, T, xb, xh);
  std::memcpy(xb + p * BMAX * F, pixels, rows * F);
  for (int tid = 0; tid < T; ++tid) widen_batch_bf16<S>(p + 2, rows, tid, T, xb, xh);
  const bf16* x = xh + p * BMAX * S::XLD;  // StepV5::x(p)
  for (int i = 0; i < C * F; ++i) store_parts<S>(wp, i / F, i % F, W[i]);  // prepare()
  auto logits_out = [&](float* out) {  // L: warp m < MT with rows, then the rows by slot
    for (int m = 0; m < S::MT && m * 16 < rows; ++m) logits_tile<S>(x, wp, m, lo + m * 256);
    for (int row = 0; row < rows; ++row) std::memcpy(out + row * 16, lo + row * 16, 64);
  };
  logits_out(logits);
  // GB[p] holds earlier steps' rows (finite): the rows past a partial batch must not count.
  for (int i = 0; i < BMAX * S::GROW; ++i) gb[i] = __float2bfloat16_rn(1.f);
  // The owners' sends (StepV5::send_g's data at its addresses): every row of the batch, split,
  // and every owner's bias partial, into GB[p].
  for (int row = 0; row < rows; ++row)
    for (int v2 = 0; v2 < 2; ++v2) {
      uint4 parts[3];
      split8(g + row * 16 + 8 * v2, parts);
      for (int k = 0; k < 3; ++k) std::memcpy(gb + S::g_elem(row, k, v2), &parts[k], 16);
    }
  for (int q = 0; q < NC; ++q)
    for (int v = 0; v < 4; ++v)
      std::memcpy(reinterpret_cast<char*>(gb) + S::dbp_byte(q, v), dbp_in + q * 16 + 4 * v, 16);
  const float* dbp = reinterpret_cast<const float*>(reinterpret_cast<char*>(gb) +
                                                    S::dbp_byte(0, 0));  // StepV5::update's
  for (int warp = 0; warp < S::NT * S::KQ; ++warp)  // G
    gradient_tile<S>(x, gb, warp % S::NT, warp / S::NT, rows, red);
  for (int tid = 0; tid < T; ++tid) apply_update_tc<NC, S>(red, dbp, W, wp, bias, tid, T);
  std::memcpy(w_out, W, 4 * C * F);
  std::memcpy(b_out, bias, 4 * C);
  logits_out(logits_after);  // the next step's L, from the re-split parts
  std::free(sm);
  return ft_host_wmma::violations;
}

}  // namespace

extern "C" {

// One step of one CTA's share (ctas 7 or 14: F = 784 / ctas features) in buffer p (0 or 1, the
// step's parity: its batch and g inbox): pixels [rows][F] uint8,
// w [10][F], b [10], g [rows][16] (lr * dL/dz by slot), dbp [ctas][16] (the owners' bias
// partials) -> logits [rows][16] (partial, over my features, raw pixels), the updated w and b,
// and the logits of the same pixels under the updated w. Returns the WMMA rule violations.
int v5_step(int ctas, int p, const uint8_t* pixels, int rows, const float* w, const float* b,
            const float* g, const float* dbp, float* logits, float* w_out, float* b_out,
            float* logits_after) {
  ft_host_wmma::violations = 0;
  if (p != 0 && p != 1) return -1;
  if (ctas == 7)
    return run_step<7>(p, pixels, rows, w, b, g, dbp, logits, w_out, b_out, logits_after);
  if (ctas == 14)
    return run_step<14>(p, pixels, rows, w, b, g, dbp, logits, w_out, b_out, logits_after);
  return -1;
}

// hi + mid + lo of each of n values (split3), and the three parts as floats [n][3].
void v5_split(const float* v, int n, float* parts) {
  for (int i = 0; i < n; ++i) {
    bf16 p[3];
    split3(v[i], p);
    for (int k = 0; k < 3; ++k) parts[3 * i + k] = __bfloat162float(p[k]);
  }
}

// The stand-in's rule check is live: a load from a pointer 16 bytes off 256-bit alignment.
int v5_misaligned_load_violations() {
  ft_host_wmma::violations = 0;
  alignas(128) static bf16 tile[32 * 16];
  wm::fragment<wm::matrix_a, 16, 16, 16, bf16, wm::row_major> a;
  wm::load_matrix_sync(a, tile + 8, 16);
  return ft_host_wmma::violations;
}

}  // extern "C"
#endif
