// The CPU side of tests/ladder/test_v8_chain.py: csrc/v8_chain.cu's epoch on the host, every warp's
// per-step body of csrc/v8_chain.cuh run for the 16 warps in the kernel's order, its mma through
// V8HostWarp (exact products, one rounding, "acc rn" or "acc rz") and its shared memory as
// arrays: the 2-slot Γ̃ ring (Γ̃_s in slot s & 1, filled one step ahead as the kernel's cp.async
// does), B's fragment words, the K half 1 sums.
//
// Step t, as the kernel: warps 0 … 7 load P_t + Q_t and labels; every warp's product (A_t in
// registers, loaded a step ahead); warps 8 … 15 store their K half; (barrier) warps 0 … 7 the
// softmax, G_t out, B_{t+1} written; every warp loads A_{t+1} from slot (t + 1) & 1; Γ̃_{t+2} into
// slot t & 1; (barrier). Variant 2 (`staged`): warps 0 … 7 load their A_t from the stage at the
// step's start, and warps 8 … 15 write it (v8c_stage_a, warp w + 8 for warp w) instead of warps
// 0 … 7 loading A_{t+1} themselves after the softmax. Variant 3 (`bulk`): variant 1 with the ring
// filled as the kernel's bulk copies fill it: v8c_bulk_row (one copy a row: row 32·part + lane by
// lane `lane` of issuing warp `part`), each copy a memcpy.
//
// Planted bugs (`bug`, each must fail the test's checks): 1 A scaled by 2⁻¹¹ (not 2⁻¹²), 2 the
// step's scale −c/n_t (not n_{t−1}: differs at the short last batch), 3 A's lo piece dropped, 4 the
// softmax's butterflies over 8 lanes (masks 4, 2, 1: rows g and g ^ 1 mixed).
#include <vector>

// The bodies are __host__ __device__; instantiated here with a host-only policy (its lanes in a loop).
#pragma nv_diag_suppress 20011, 20014
#include "v8_chain.cuh"
#include "v8_mma_host.h"

namespace {

using U = V8HostWarp::Reg<uint32_t>;
using F = V8HostWarp::Reg<float>;
using I = V8HostWarp::Reg<int>;

struct WarpRegs {
  U a[2][V8C_KSTEPS][4];
  F d[2][4], pq[2][4], pmy[2][4], loss{}, correct{};
  I y[2];
};

void fill_slot(std::vector<float>& slot, const float* gram_t, bool bulk) {
  if (bulk) {
    for (int part = 0; part < V8C_BULK_WARPS; ++part)
      for (int lane = 0; lane < 32; ++lane)
        v8c_bulk_row(slot.data(), gram_t, part, lane, [](float* dst, const float* src, int bytes) {
          std::memcpy(dst, src, bytes);
        });
    return;
  }
  for (int r = 0; r < V8C_ROWS; ++r)
    for (int k = 0; k < V8C_ROWS; ++k) slot[r * V8C_GS + k] = gram_t[r * V8C_ROWS + k];
}

}  // namespace

extern "C" {

// gram [steps][128][128] (Γ̃_{t,1}, zero outside the batches; step 0's all zero), pq
// [steps][128][10], labels [steps][128]; n samples, steps = ⌈n / 128⌉; c = lr/255². Writes g_out
// and z_out [steps][128][10] and stats = (summed loss, hits); variant 1, 2 or 3. Returns 0.
int v8_chain_host(const float* gram, const float* pq, const int* labels, int n, float c, int rz,
                  int bug, float* g_out, float* z_out, float* stats, int variant) {
  const bool staged = variant == 2, bulk = variant == 3;
  V8HostWarp warp;
  warp.round_toward_zero = rz != 0;
  const float a_scale = bug == 1 ? 1.0f / 2048.0f : V8C_A_SCALE;
  const int steps = (n + V8C_ROWS - 1) / V8C_ROWS;
  const size_t gram_step = size_t(V8C_ROWS) * V8C_ROWS, io_step = size_t(V8C_ROWS) * V8C_C;
  std::vector<std::vector<float>> ring(2, std::vector<float>(V8C_ROWS * V8C_GS, NAN));
  std::vector<uint32_t> bw(V8C_BWORDS, 0u);
  std::vector<float> halves(V8C_HALVES, NAN);
  std::vector<uint32_t> stage(V8C_STAGE, 0xffffffffu);
  std::vector<WarpRegs> regs(V8C_WARPS);
  auto drop_lo = [&](int w) {
    if (bug == 3)
      for (auto& ks : regs[w].a[1])
        for (auto& r : ks) r.fill(0u);
  };
  // A_s for every warp (v1), or for warps 8 … 15 and the stage of warps 0 … 7 (v2).
  auto load_a = [&](int s) {
    for (int w = 0; w < V8C_WARPS; ++w) {
      if (staged && w >= 8) v8c_stage_a(warp, ring[s & 1].data(), w - 8, a_scale, stage.data());
      if (staged && w < 8) continue;
      v8c_load_a(warp, ring[s & 1].data(), w, a_scale, regs[w].a);
      drop_lo(w);
    }
  };
  fill_slot(ring[0], gram, bulk);
  if (steps > 1) fill_slot(ring[1], gram + gram_step, bulk);
  load_a(0);
  for (int t = 0; t < steps; ++t) {
    const int rows = v8c_rows(n, t), prev = t ? v8c_rows(n, t - 1) : 1;
    const float coef = -c / static_cast<float>(bug == 2 ? rows : prev);
    for (int w = 0; staged && w < 8; ++w) {
      v8c_load_staged_a(warp, stage.data(), w, regs[w].a);
      drop_lo(w);
    }
    for (int w = 0; w < 8; ++w)
      v8c_load_inputs(warp, w, pq + t * io_step, labels + t * V8C_ROWS, rows, regs[w].pq,
                      regs[w].y);
    for (int w = 0; w < V8C_WARPS; ++w) v8c_product(warp, regs[w].a, bw.data(), w, regs[w].d);
    for (int w = 8; w < V8C_WARPS; ++w) v8c_store_half(warp, regs[w].d, halves.data(), w);
    for (int w = 0; w < 8; ++w) {
      WarpRegs& r = regs[w];
      v8c_softmax(warp, w, r.d, halves.data(), r.pq, r.y, rows, coef, g_out + t * io_step,
                  z_out + t * io_step, r.pmy, r.loss, r.correct, bug == 4 ? 8 : V8C_QUAD);
      v8c_write_b(warp, w, r.pmy, bw.data());
    }
    if (t + 1 < steps) load_a(t + 1);
    if (t + 2 < steps) fill_slot(ring[t & 1], gram + (t + 2) * gram_step, bulk);
  }
  double loss = 0, hits = 0;
  for (int w = 0; w < 8; ++w)
    for (int lane = 0; lane < 32; ++lane) {
      loss += regs[w].loss[lane];
      hits += regs[w].correct[lane];
    }
  stats[0] = static_cast<float>(loss);
  stats[1] = static_cast<float>(hits);
  return 0;
}

}  // extern "C"
