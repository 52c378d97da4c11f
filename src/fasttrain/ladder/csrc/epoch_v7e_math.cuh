// cuda-epoch v7e's workers on the tensor cores: the per-thread share that is v7e's own (the
// shared-memory layout and G_a's conversion into the mma's B operand); the products themselves are
// the v8 workers probe's bodies (v8_workers.cuh: v8_store_xh, v8_mma_update_sums/apply,
// v8_mma_partial), reused as they are. epoch_v7e.cuh runs them on the GPU, the host emulation
// (tests/ladder/csrc/epoch_v7_math_host.cu, variant 4) for every thread and warp.
//
// What stays v7's (epoch_v7_math.cuh): L = V7_LAG = 4, so the x ring has V7_XR = 6 slots (the
// probe's V8_XR = 8 is for L = 6); the bias is the chain's (not folded into W̃): a worker CTA's 14
// features sit in slots 0 … 13 of a 16-slot row, slots 14 and 15 are 0 in x (v8_store_xh with
// bias = false) and W (rows 14, 15: 0, and they stay 0: their x is 0, so the update's sums are 0);
// G_a comes from v7's global G (fp32 rows [BMAX][V7_GROW], G = (p − onehot)/n_a, published by the
// chain counters), fetched a step ahead by warps 8-15 as v7d's V7GAhead does.
//
// G_a → B operand: G'_a = G_a·n_a·2¹² split into fp16 hi and lo (v8_split_f16x2), so that the
// probe's update (v8_mma_update_apply: W −= (lr/255)·2⁻¹²/n_a · X_aᵀ(G'hi + G'lo)) is v7's
// W −= (lr/255)·X_aᵀG_a. |G_a·n_a| = |p − onehot| ≤ 1 (to fp32's rounding of the chain's 1/n_t), so
// |G'| ≤ 2¹² < 65,504: no overflow, and n_a ≤ 128 and 2¹² are powers of two or small integers whose
// product with G is one fp32 rounding (2⁻²⁴ relative) before the split. Subnormal lo: when lo is
// subnormal its quantum is fp16's 2⁻²⁴, i.e. 2⁻³⁶ in units of p − onehot, so the split's error is
// at most 2⁻³⁷ absolute there: below half of fp32's own ulp of any |p − onehot| ≥ 2⁻¹² (≥ 2⁻³⁵), and
// for a smaller entry far below what it moves W by (≤ lr·2⁻¹²/n a pixel of 255). Not worth a scale.
// W̃'s scale 2⁸ (v8_mma_partial): |ΔW| ≤ lr a step (|x| ≤ 255, Σ_i |p − y|/n ≤ 1), 46.9 an epoch
// of 469 steps at lr = 0.1 from 0: W·2⁸ stays below 65,504 for 5 such epochs by that (loose) bound;
// the row's weights are ~0.1.
#pragma once
#include <vector_types.h>

#include "epoch_v7d_math.cuh"
#include "v8_workers.cuh"

namespace {

// A worker CTA's shared memory in v7e, in floats (the kernel's launch gives v7_smem_bytes: both
// modes' are checked below).
struct V7ESmem {
  static constexpr int XH = 0;                         // __half [XR][BMAX][16]: x by step
  static constexpr int W = XH + V7_XR * BMAX * 16 / 2; // [16][16]: W's slice, W[slot][c]
  static constexpr int GSH = W + V8_NF * 16;           // __half hi [BMAX][16], then lo
  static constexpr int URED = GSH + BMAX * 16;         // [4][16][16]: the update's row quarters
  static constexpr int PBUF = URED + 4 * V8_NF * 16;   // [2][BMAX][V7_GROW]: P_t by step parity
  static constexpr int OK = PBUF + 2 * BMAX * V7_GROW; // int [2]: no wait failed, by parity
  static constexpr int FLOATS = OK + 4;
};
static_assert(V7ESmem::W % 4 == 0 && V7ESmem::GSH % 4 == 0 && V7ESmem::PBUF % 4 == 0,
              "16-byte aligned regions");
static_assert(V7ESmem::FLOATS <= V7_SMEM_FLOATS,
              "v7e's workers fit in the two-launch kernel's dynamic shared memory");
static_assert(V7_GROW == 16 && V8_NF == 16 && V7D_VEC * 4 * (V7_T - V7D_PF0) == BMAX * 16,
              "G's rows are the B operand's: one float4 of G_a, 4 halves of each piece");

// v7f (epoch_v7f.cuh): v7e's regions up to URED, then the probe's reduce-scatter inbox in place of
// the partial buffers (P_t's tiles go straight to their owners): [V8_NS][8 src][16 rows][16], and
// the full[NS], free[NS] mbarriers. (With PBUF kept as well, 87 KB: over the two-launch kernel's
// 77 KB, which epoch_v7_launch.cuh's static_assert refuses.)
struct V7FSmem {
  static constexpr int INBOX = V7ESmem::PBUF;
  static constexpr int BAR = INBOX + V8_NS * V8_SLOT_FLOATS;  // full[NS], then free[NS]
  static constexpr int FLOATS = BAR + 4 * V8_NS;
};
static_assert(V7FSmem::INBOX % 4 == 0 && V7FSmem::BAR % 2 == 0, "aligned regions");
static_assert(V7FSmem::FLOATS <= V7_SMEM_FLOATS,
              "v7f's workers fit in the two-launch kernel's dynamic shared memory");
// v7f: the step whose partials a worker's reduce at step t (0 … steps) sums and hands to the chain
// as tagged words: t − 1, a step late (its tiles have had a step to land). P_u's words are then
// written while the worker runs step u + 1, after its updates a < v7_applied_before(u + 1) = u − 3,
// i.e. after the chain published G_{u−4}: the chain CTA has read ring slot u % V7_PR's previous
// words (P_{u−5}) before that, as v7b's ring needs (the host emulation checks it). The chain wants
// P_u at its step u, L − 1 = 3 steps after the workers could have sent it: no deadlock.
FT_V7 int v7f_reduced_at(int t) { return t - 1; }

// Float4 i of G_a (row i / 4, classes 4·(i % 4) …: v7d's map, V7GAhead's registers) as the B
// operand's pieces: hi at gsh[4i …], lo at gsh[BMAX·16 + 4i …]; G' = G·n·2¹² (n: the rows of the
// batch, e.rows(a); the host's planted bug 15 passes another), 0 for a row past the batch
// (`valid` false: g was never loaded) and for classes ≥ C.
FT_V7 void v7e_put_g(int i, float4 g, bool valid, int n, __half* gsh) {
  const float s = V8_GSCALE * static_cast<float>(n);
  const int c0 = 4 * (i % 4);
  const float v[4] = {valid && c0 < C ? g.x * s : 0.f, valid && c0 + 1 < C ? g.y * s : 0.f,
                      valid && c0 + 2 < C ? g.z * s : 0.f, valid && c0 + 3 < C ? g.w * s : 0.f};
  uint32_t* d = reinterpret_cast<uint32_t*>(gsh);
  for (int h = 0; h < 2; ++h) v8_split_f16x2(v[2 * h], v[2 * h + 1], d[2 * i + h], d[V8_GW + 2 * i + h]);
}

}  // namespace
