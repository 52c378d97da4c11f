// cuda-epoch v7i's per-thread body shared by the device (epoch_v7i.cuh: the helper warps' store of
// G_t) and the host emulation (tests/ladder/csrc/epoch_v7i_host.h), so both store the same rows.
#pragma once
#include "epoch_v7c_math.cuh"

namespace {

constexpr int V7I_STORERS = V7_RPC * 4;  // helper threads storing G_t: a float4 each
// The storers are the last two helper warps (14, 15), not warp 8, whose thread 0 releases the
// counter: if a fence waits only for its own warp's stores (not documented), it has none to wait
// for. FT_V7 (host too): the emulation stores through it.
constexpr int V7I_STORE0 = V7C_HELP - V7I_STORERS;

// Helper thread h (V7I_STORE0 + j, j < 64): its float4 of chain CTA q's rows of G_t (row
// q·16 + j / 4, classes 4·(j % 4) …) from gl to global memory, as chain_send_g's d = 0 stores.
FT_V7 void v7i_store_g(const V7Epoch& e, float* g, int t, int q, int h, const float* gl) {
  const int j = h - V7I_STORE0, i = j >> 2, w4 = j & 3, row = q * V7_RPC + i;
  if (j >= 0 && row < e.rows(t)) {
    const float4 val = *reinterpret_cast<const float4*>(gl + i * 16 + 4 * w4);
    *reinterpret_cast<float4*>(g + (size_t(t) * BMAX + row) * V7_GROW + 4 * w4) = val;
  }
}

}  // namespace
