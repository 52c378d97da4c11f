// cuda-epoch v7h's per-thread bodies (epoch_v7h.cuh runs them on the GPU;
// tests/ladder/csrc/epoch_v7_math_host.cu runs them on the host for whole epochs). v7h is v7g (its
// chain, v7f's workers and protocol) with the workers' x gather split in two and pipelined a step
// deeper (the design doc's "v7h" section: the SASS behind it; h's other change, its reduce's
// stores after the credits, is v7f_worker's LATE: epoch_v7h.cuh).
//
// Why. worker_fetch_x (v7a-v7g) loads, for each of a thread's V7_XF = 4 bytes of x_{t+1}, the
// sample index order[(t + 1)·bs + i] and then the pixel x[index·784 + f]: a dependent pair. In
// v7c's workers ptxas issued the 4 order[] loads together (one L2 round trip before the pixel
// loads could issue: "load x" 0.30-0.32 µs a step on an H200, 2026-11-28); in v7e's and v7f's
// tensor-core workers it issued them one pair at a time (LDG order → IMAD.WIDE on its result →
// LDG.U8, four times: four L2 round trips in a row, the thread stalled at each IMAD), and "load x"
// grew to 0.87-0.95 µs a step (run 7-9, at the workers' own clock), the largest of their phases.
// Neither the fp16 conversion nor the ring stores are in that phase: they run in "partials"
// (v8_store_xh, after the mma). The pixel bytes are consumed only at the end of the step.
//
// What v7h does. The sample indices are read-only for the whole epoch, so a worker thread loads
// step t + 2's indices during step t (v7h_fetch_idx, into 4 registers) and issues step t + 1's
// pixel loads (v7h_fetch_px) from the indices it loaded a step earlier: no load in the loop waits
// on another load, so nothing stalls until v8_store_xh at the end of the step reads the bytes
// (~1 µs of update and partials later). The index of a row past its batch is -1 (its byte 0),
// so the partial last batch reads no order[] entry past the epoch (as worker_fetch_x, whose
// bytes v7h_fetch_idx + v7h_fetch_px equal: the host emulation's h trains as its g bit for bit).
#pragma once
#include "epoch_v7_math.cuh"

namespace {

// The sample index of each of thread tid's V7_XF bytes of x_t (-1: row past the batch).
FT_V7 void v7h_fetch_idx(const V7Epoch& e, const int* order, int t, int tid, int T,
                         int (&idx)[V7_XF]) {
  const int nt = e.rows(t);
  for (int k = 0; k < V7_XF; ++k) {
    const int it = tid + k * T, i = it / V7_FW;
    idx[k] = it < nt * V7_FW ? order[t * e.bs + i] : -1;
  }
}
// Those bytes (features f0 + f of the sample rows idx), 0 where idx is -1: worker_fetch_x's.
FT_V7 void v7h_fetch_px(const uint8_t* x, const int (&idx)[V7_XF], int f0, int tid, int T,
                        uint8_t (&buf)[V7_XF]) {
  for (int k = 0; k < V7_XF; ++k) {
    const int f = (tid + k * T) % V7_FW;
    buf[k] = idx[k] >= 0 ? x[size_t(idx[k]) * K + f0 + f] : 0;
  }
}

}  // namespace
