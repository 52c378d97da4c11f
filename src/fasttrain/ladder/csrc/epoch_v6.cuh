// cuda-epoch v6: v4's step and signals with the partial logits and the gradient/update
// register-tiled, W in registers for the whole epoch (see cuda_epoch.cu for the changelog,
// epoch_v6_math.cuh for the tiles and their arithmetic counted).
//
// What moves is exactly v4's: 40 bytes a row and source of partial logits to the row's owner,
// 64 bytes a row of g and each owner's bias partial to every CTA, on the same mbarriers, double
// buffers and invariant (epoch_v4.cuh); the owners' softmax is v4's. What differs is where W is
// (registers, replicated over L's row groups, never in shared memory) and so the phases' work:
//   L  a thread: RT rows x 5 classes x 7 features from registers, a shuffle reduce-scatter over
//      the feature lanes, then one st.async (v4's float4 or float) per lane;
//   G  v4's partials (before the CTA barrier); after it, the row groups summed by 280 threads into
//      DW (scaled), a CTA barrier, and every thread's registers minus its block of DW.
// Not yet run on a GPU: the row stays on v4 until one measures v6 (sync_cost.py, the phase
// profile) and the GPU tests pass.
#pragma once
#include "epoch_v4.cuh"
#include "epoch_v6_math.cuh"

namespace {

template <int NC>
struct StepV6 {
  using S = Shape6<NC>;
  static constexpr int T = THREADS4, F = S::F, FP = S::FP, RPC = S::RPC;
  static constexpr int G_ROW_BYTES = 64;  // as v4
  static_assert(T == S::T, "v4's thread count");
  const int r, tid, k0;
  float* const sm;
  float* const bias = sm + S::BIAS_OFF;
  float* const xf = sm + S::XF_OFF;
  float* const red = sm + S::RED_OFF;
  float* const dw = sm + S::DW_OFF;
  float* const gl = sm + S::GL_OFF;
  int* const idx = reinterpret_cast<int*>(sm + S::IDX_OFF);
  int* const ys = reinterpret_cast<int*>(sm + S::YS_OFF);
  uint8_t* const xb = reinterpret_cast<uint8_t*>(sm + S::XB_OFF);
  const float* const part0 = sm + S::INBOX_OFF;  // [2][PART]
  const float* const gb0 = part0 + 2 * S::PART;  // [2][GB]
  const uint32_t part_u = smem_addr(part0), gb_u = smem_addr(gb0);
  const uint32_t pbar_u = smem_addr(sm + S::BAR_OFF), gbar_u = pbar_u + 16;  // PB[2], GBAR[2]
  float w[S::WN];  // W[5h + c][k0 + j + LJ e] at c * FL + e: this thread's tile, all epoch

  __device__ StepV6(float* sm_, int r_)
      : r(r_), tid(threadIdx.x), k0(r_ * F), sm(sm_) {}
  // L's tile of this thread, recomputed where used from a fresh read of %tid.x (volatile: the
  // compiler may not hoist it and hold the tile's addresses over the loop in registers).
  __device__ LTile tile() const {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return l_tile<S>(t);
  }
  __device__ const float* x(int p) const { return xf + p * BMAX * FP; }
  __device__ const float* part(int p) const { return part0 + p * S::PART; }

  __device__ void setup(const Args& a) {  // before the first CTA barrier
    const LTile lt = tile();
#pragma unroll
    for (int c = 0; c < 5; ++c)
#pragma unroll
      for (int e = 0; e < S::FL; ++e)
        w[c * S::FL + e] = a.w[l_class(lt, c) * K + k0 + l_feature<S>(lt, e)];
    if (tid < C) bias[tid] = a.b[tid];
    for (int i = tid; i < 2 * BMAX * FP; i += T) xf[i] = 0.f;
    for (int i = tid; i < S::INBOX; i += T) sm[S::INBOX_OFF + i] = 0.f;  // pad slots: finite
  }
  __device__ void prepare() {}
  __device__ void widen(int j, int rows) { widen_batch<S>(j, rows, tid, xb, xf); }

  // L: the register tile, the reduce-scatter, and each lane's float4 or float to the row's owner.
  __device__ void send_partials(int p, int nb) {
    const LTile lt = tile();
    float acc[S::NACC];
    const float* xp = x(p);
    // The next pair's x loads stay below each pair's fence (a memory barrier to the compiler):
    // hoisting every row's loads to the top would hold RT * 7 registers more and spill at the
    // 128 that 512 threads allow.
    l_schedule<S>([&](int i) { logits_row<S>(xp, w, lt, i, acc); },
                  [&](int k) {
                    const RsStep s = rs_step<S>(k);
                    const bool up = (lt.j & s.d) != 0;
                    rs_apply(acc, up, s, __shfl_xor_sync(0xffffffffu, rs_send(acc, up, s), s.d));
                  },
                  [] { __syncwarp(); });
    if (l_out_row<S>(lt) < nb) {
      const int q = l_out_owner<S>(lt);
      const uint32_t dst = mapa(part_u + 4 * (p * S::PART + l_out_offset<S>(lt, r)), q);
      const uint32_t bar = mapa(pbar_u + 8 * p, q);
      if (l_out_part(lt) == 0)
        st_async4(dst, make_float4(acc[0], acc[1], acc[2], acc[3]), bar);
      else
        st_async1(dst, acc[4], bar);
    }
  }

  __device__ void send_g(int p, int nb) { send_g_rows<NC, S>(gl, gb_u, gbar_u, r, tid, T, p, nb); }

  // G: v4's partials (before the CTA barrier), then (after it) the sum, DW, and the registers.
  __device__ void gradient(int p, int nb) {
    gradient_partials6<S>(x(p), gb0 + p * S::GB, red, tid, nb);
  }
  __device__ void update(int p) {
    const float inv255 = 1.f / 255.f;
    const GOut o = g_out<S>(tid);
    const float4 sum = g_sum<S>(red, o);
    if constexpr (S::RS == 2) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const float got = __shfl_xor_sync(0xffffffffu, g_swap_send(sum, o.s, m), 1);
        if (o.active)
          dw[dw_index<S>(o.c, o.kg * 4 + 2 * o.s + m)] = g_swap_keep(sum, o.s, m, got) * inv255;
      }
    } else if (o.active) {
      const float v[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
      for (int m = 0; m < 4; ++m) dw[dw_index<S>(o.c, o.kg * 4 + m)] = v[m] * inv255;
    }
    update_bias<NC>(gb0 + p * S::GB + Shape3<NC>::GIN, bias, tid, T);
    __syncthreads();  // DW complete
    apply_dw<S>(dw, tile(), w);
  }

  // The first row group's tiles write W back (one thread an element); the bias from CTA 0.
  __device__ void write_back(const Args& a, float loss, float correct) {
    const LTile lt = tile();
    if (lt.rg == 0)
#pragma unroll
      for (int c = 0; c < 5; ++c)
#pragma unroll
        for (int e = 0; e < S::FL; ++e)
          a.w[l_class(lt, c) * K + k0 + l_feature<S>(lt, e)] = w[c * S::FL + e];
    if (r == 0 && tid < C) a.b[tid] = bias[tid];
    if (loss != 0.f || correct != 0.f) {
      atomicAdd(a.stats, loss);
      atomicAdd(a.stats + 1, correct);
    }
  }
};

}  // namespace
