// cuda-epoch v5: v4's step and signals with the two GEMMs on tensor cores (see cuda_epoch.cu for
// the changelog, epoch_v5_math.cuh for the arithmetic and why it is fp32-accurate).
//
// What moves differs from v4 in one place: an owner sends its rows of g already split into
// their three bf16 parts (96 bytes a row instead of 64), so that every CTA's G reads MMA
// operands straight from its inbox. The partial logits (40 bytes a row and source), the bias
// partials (fp32), the mbarriers, the double buffers and their invariant are v4's (epoch_v4.cuh).
// L: warps 0-7 each own a 16-row tile of the batch (one per row tile that holds rows); each
// sends its rows' partials as soon as its tile is stored, as v4's threads do. G: warp
// (nt, kq) computes feature tile nt over row split kq; the update sums the splits.
#pragma once
#include "epoch_v4.cuh"
#include "epoch_v5_math.cuh"

namespace {

template <int NC>
struct StepV5 {
  using S = Shape5<NC>;
  static constexpr int T = THREADS4, F = S::F, RPC = S::RPC;
  static constexpr int G_ROW_BYTES = 2 * S::GROW;  // a row of g: 3 parts x 16 slots of bf16
  const int r, tid, k0;
  char* const base;  // shared memory; S's offsets are in bytes
  float* const Ws = reinterpret_cast<float*>(base + S::W_OFF);
  float* const bias = reinterpret_cast<float*>(base + S::BIAS_OFF);
  bf16* const wp = reinterpret_cast<bf16*>(base + S::WP_OFF);
  bf16* const xh = reinterpret_cast<bf16*>(base + S::XH_OFF);
  float* const lo = reinterpret_cast<float*>(base + S::LO_OFF);
  float* const red = reinterpret_cast<float*>(base + S::RED_OFF);
  float* const gl = reinterpret_cast<float*>(base + S::GL_OFF);
  int* const idx = reinterpret_cast<int*>(base + S::IDX_OFF);
  int* const ys = reinterpret_cast<int*>(base + S::YS_OFF);
  uint8_t* const xb = reinterpret_cast<uint8_t*>(base + S::XB_OFF);
  const uint32_t part_u = smem_addr(base + S::PART_OFF), gb_u = smem_addr(base + S::GB_OFF);
  const uint32_t pbar_u = smem_addr(base + S::BAR_OFF), gbar_u = pbar_u + 16;  // PB[2], GBAR[2]

  __device__ StepV5(float* sm, int r_)
      : r(r_), tid(threadIdx.x), k0(r_ * F), base(reinterpret_cast<char*>(sm)) {}
  __device__ const bf16* x(int p) const { return xh + p * BMAX * S::XLD; }
  __device__ const float* part(int p) const {
    return reinterpret_cast<const float*>(base + S::PART_OFF) + p * S::PART;
  }
  __device__ const bf16* g(int p) const {
    return reinterpret_cast<const bf16*>(base + S::GB_OFF + p * S::GB_BYTES);
  }

  __device__ void setup(const Args& a) {  // before the first CTA barrier
    load_slice<F, T>(a, k0, tid, Ws, bias);
    // Zero the parts of W (pad slots and features stay so), both batches (pad features: finite
    // and 0), and the inboxes (never-written rows of g: finite).
    auto zero = [&](int from, int to) {
      for (int i = from / 4 + tid; i < to / 4; i += T) reinterpret_cast<uint32_t*>(base)[i] = 0u;
    };
    zero(S::WP_OFF, S::XH_OFF + 2 * 2 * BMAX * S::XLD);
    zero(S::PART_OFF, S::BAR_OFF);
  }
  __device__ void prepare() {  // after it: W's parts
    for (int i = tid; i < C * F; i += T) store_parts<S>(wp, i / F, i % F, Ws[i]);
  }
  __device__ void widen(int j, int rows) { widen_batch_bf16<S>(j, rows, tid, T, xb, xh); }

  // L: a warp per 16-row tile that holds rows of the batch; its lanes then send the tile's
  // rows as v4's threads do (a float4 and a float per class half) from the warp's staging.
  __device__ void send_partials(int p, int nb) {
    const int warp = tid >> 5, lane = tid & 31;
    if (warp >= S::MT || warp * 16 >= nb) return;
    float* mine = lo + warp * 256;
    logits_tile<S>(x(p), wp, warp, mine);
    __syncwarp();
#pragma unroll
    for (int e = lane; e < 64; e += 32) {
      const int i = e >> 2, h = (e >> 1) & 1, fh = e & 1, row = warp * 16 + i;
      if (row >= nb) continue;
      const int q = row / RPC;
      const uint32_t dst =
          mapa(part_u + 4 * (p * S::PART + (r * RPC + row % RPC) * 16 + 8 * h), q);
      const uint32_t bar = mapa(pbar_u + 8 * p, q);
      const float* v = mine + i * 16 + 8 * h;
      if (fh == 0)
        st_async4(dst, make_float4(v[0], v[1], v[2], v[3]), bar);
      else
        st_async1(dst + 16, v[4], bar);
    }
  }

  // Send my rows of g, split into their parts, and their fp32 sum to every CTA's GB[p],
  // completing on its GBAR[p]: per CTA, item (row, 8-slot half) is three 16-byte stores.
  __device__ void send_g(int p, int nb) {
    constexpr int ITEMS = 2 * RPC + 4;  // halves of my rows, then the 4 float4s of their sum
    for (int it = tid; it < NC * ITEMS; it += T) {
      const int q = it / ITEMS, e = it % ITEMS;
      const uint32_t inbox = gb_u + p * S::GB_BYTES, bar = mapa(gbar_u + 8 * p, q);
      if (e < 2 * RPC) {
        const int i = e >> 1, v2 = e & 1, row = r * RPC + i;
        if (row >= nb) continue;
        uint4 parts[3];
        split8(gl + i * 16 + 8 * v2, parts);
#pragma unroll
        for (int k = 0; k < 3; ++k)
          st_async4(mapa(inbox + 2 * S::g_elem(row, k, v2), q), parts[k], bar);
      } else {
        const int v = e - 2 * RPC;
        st_async4(mapa(inbox + S::dbp_byte(r, v), q), g_rows_sum<S>(gl, v), bar);
      }
    }
  }

  // G: a warp per (feature tile, row split) (before the CTA barrier), then the update.
  __device__ void gradient(int p, int nb) {
    const int warp = tid >> 5;
    if (warp < S::NT * S::KQ) gradient_tile<S>(x(p), g(p), warp % S::NT, warp / S::NT, nb, red);
  }
  __device__ void update(int p) {
    const float* dbp = reinterpret_cast<const float*>(base + S::GB_OFF + p * S::GB_BYTES +
                                                      S::dbp_byte(0, 0));
    apply_update_tc<NC, S>(red, dbp, Ws, wp, bias, tid, T);
  }
  __device__ void write_back(const Args& a, float loss, float correct) {
    ::write_back<F, T>(a, r, k0, tid, Ws, bias, loss, correct);
  }
};

}  // namespace
