// cuda-epoch v7d's per-thread share of the G hand-off (epoch_v7d.cuh's V7GAhead; the host
// emulation, tests/ladder/csrc/epoch_v7_math_host.cu, copies G by the same map): warps 8-15 of a
// worker CTA (tid ≥ V7D_PF0, idle in the partials phase: worker_partial uses tid < 2·BMAX) hold
// the next update's G_a in registers, V7D_VEC float4s a thread, float4 v7d_vec(tid, k) of G_a's
// rows (row-major [BMAX][V7_GROW]; those past rows(a) · V7_GROW / 4 are not loaded).
#pragma once
#include "epoch_v7_math.cuh"

constexpr int V7D_PF0 = 2 * BMAX;  // the first fetching thread: warp 8
constexpr int V7D_VEC = BMAX * V7_GROW / 4 / (V7_T - V7D_PF0);  // 2 float4s a thread
static_assert(V7D_VEC * (V7_T - V7D_PF0) * 4 == BMAX * V7_GROW && V7D_PF0 % 32 == 0,
              "the fetching warps cover G exactly");
FT_V7 int v7d_vec(int tid, int k) { return tid - V7D_PF0 + k * (V7_T - V7D_PF0); }
// Whether float4 `i` of G_a holds a row of the batch.
FT_V7 bool v7d_vec_valid(const V7Epoch& e, int a, int i) { return i < e.rows(a) * V7_GROW / 4; }
