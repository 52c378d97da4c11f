// cuda-epoch v7a's and v7b's arithmetic and bookkeeping: the lagged-Gram step (docs/measurements/
// cuda-epoch-v7-design.md) cut into the per-thread bodies its roles run between barriers and
// waits (epoch_v7.cuh runs them on the GPU; tests/ladder/csrc/epoch_v7_math_host.cu runs the same
// functions on the host for every thread of every CTA, in an order the flags allow).
//
// The algebra (tests/ladder/lagged_reference.py), step t of an epoch, lag L, s = max(t − L, 0):
//   Z_t = X_t W_s / 255 + b_t − c Σ_{j=1..t−s} Γ_{t,j} G_{t−j},   c = lr / 255²,
//   Γ_{t,j} = X_t X_{t−j}ᵀ (exact in s32, rounded once to fp32 by the Gram kernel),
//   G_t = (softmax(Z_t) − onehot(y_t)) / n_t,   b_{t+1} = b_t − lr 1ᵀ G_t.
// Roles (one launch of V7_CTAS CTAs in clusters of 8):
//   chain   cluster 0, CTA q owns rows 16q … 16q+15 of every batch: Q_t = the worker clusters'
//           partials summed, Z_t = Q_t + b_t − c Σ_j Γ_{t,j} G_{t−j} (every j on the chain in
//           v7a), softmax, loss, G_t's rows to the 8 chain CTAs (DSMEM) and to global memory.
//   workers clusters 1 … V7_WCLUSTERS, CTA (k, r) owns V7_FW features: W_s's slice in shared
//           memory, updated with G_{t−L−1} (from global memory) before P_t = X_t W_s; the 8 CTAs'
//           partials reduced over DSMEM (rank r: rows 16r …), then handed to the chain.
// Everything crossing SMs goes through global arrays indexed by step (no ring: nothing is
// overwritten within an epoch), published by per-CTA step counters (release/acquire).
// v7b (the bottom of this file) changes two things of the chain: the worker partials travel as
// 8-byte words {value, step} through a ring of V7_PR slots, no counter (one L2 round trip, not
// two), and each row's softmax runs on 16 lanes with shuffles (a Warp policy: the kernel's
// __shfl_xor_sync, the host harness's emulation of the PTX instruction).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "epoch_shared.cuh"

// Host and device: the launch's host code computes the scratch layout, the tests run the rest.
#define FT_V7 __host__ __device__ __forceinline__

namespace {

constexpr int V7_LAG = 4;            // L: the design's choice (slack for two global hand-offs)
constexpr int V7_CLUSTER = 8;        // portable cluster size
constexpr int V7_CHAIN = 8;          // chain CTAs (cluster 0)
constexpr int V7_RPC = BMAX / V7_CHAIN;  // 16 rows a chain CTA
constexpr int V7_WCLUSTERS = 7;      // worker clusters
constexpr int V7_WORKERS = V7_WCLUSTERS * V7_CLUSTER;  // 56
constexpr int V7_FW = K / V7_WORKERS;                  // 14 features a worker CTA
constexpr int V7_CTAS = V7_CLUSTER * (1 + V7_WCLUSTERS);  // 64
constexpr int V7_T = 512;            // threads of every CTA (one kernel, both roles)
constexpr int V7_NB = V7_LAG + 1;    // chain G ring: G_{t−1} … G_{t−L} read while G_t arrives
constexpr int V7_XR = V7_LAG + 2;    // worker x ring: x_t and the update's x_{t−L−1}
constexpr int V7_LANES = V7_T / V7_RPC;  // 32 lanes split a chain row's Gram terms
constexpr int V7_GROW = 16;          // floats of a row of G or of a partial (10 used)
// A row's stride in the chain's G ring: 20 floats (80 bytes), so that the 8 lanes of a 128-bit
// shared load's phase (rows m … m + 7) hit 8 distinct 4-bank groups. At 16 floats they hit 2,
// a 4-way conflict: v7a's Gram terms took 6.4 µs a step on an H200 (2026-11-27), the model of
// 16 warps × 16 (j, u) × 3 loads × 16 wavefronts at 1 a clock predicting 6.2.
constexpr int V7_RS = 20;
constexpr int V7_XF = (BMAX * V7_FW + V7_T - 1) / V7_T;  // a worker thread's bytes of x_t
static_assert(V7_FW * V7_WORKERS == K && V7_RPC * V7_CHAIN == BMAX, "an even split");
static_assert(BMAX % V7_LANES == 0 && 2 * V7_FW * C <= V7_T && 2 * BMAX <= V7_T, "one pass");

struct V7Epoch {  // the launch's shape
  int n, bs, steps;
  float lr;
  FT_V7 int rows(int t) const { return t * bs + bs <= n ? bs : n - t * bs; }
};

// ---- the lag window --------------------------------------------------------------------------
// The updates applied to the workers' W before P_t: steps 0 … s − 1, s = max(t − L, 0).
FT_V7 int v7_applied_before(int t) { return t > V7_LAG ? t - V7_LAG : 0; }
// The Gram terms the chain adds to Z_t: j = 1 … t − s.
FT_V7 int v7_window(int t) { return t - v7_applied_before(t); }
// What a chain CTA's G counter must reach for G_a to be readable (it holds steps published).
FT_V7 int v7_g_ready(int a) { return a + 1; }
// What a worker CTA's partial counter must reach for its rows of P_t.
FT_V7 int v7_part_ready(int t) { return t + 1; }

// ---- global scratch: flags, Grams, G, partials (one launch's, indexed by step) -----------------
struct V7Scratch {
  int* gflag;    // [V7_CHAIN]: steps whose G rows chain CTA q has published
  int* pflag;    // [V7_WCLUSTERS][V7_CLUSTER]: steps whose partial rows (k, r) has published
  float* gram;   // [steps][L][BMAX][BMAX]: Γ_{t,j} at v7_gram_offset(t, j), row stride BMAX
  float* g;      // [steps][BMAX][V7_GROW]: G_t's rows
  float* part;   // [steps][V7_WCLUSTERS][BMAX][V7_GROW]: worker cluster k's P_t (÷ 255)
  uint64_t* ptag;  // v7b: [V7_PR][V7_WCLUSTERS][BMAX][C] tagged words of P_t (v7b_word_at)
};
constexpr size_t V7_FLAG_BYTES = 256;  // both flag arrays, padded to an aligned block
static_assert(4 * V7_CHAIN * (1 + V7_WCLUSTERS) <= V7_FLAG_BYTES, "flags fit");
FT_V7 size_t v7_gram_floats(int steps) { return size_t(steps) * V7_LAG * BMAX * BMAX; }
FT_V7 size_t v7_g_floats(int steps) { return size_t(steps) * BMAX * V7_GROW; }
FT_V7 size_t v7_part_floats(int steps) { return size_t(steps) * V7_WCLUSTERS * BMAX * V7_GROW; }
constexpr int V7_PR = V7_LAG + 1;  // v7b: slots of the tagged partials' ring (v7b_pslot: why)
constexpr size_t V7_PTAG_WORDS = size_t(V7_PR) * V7_WCLUSTERS * BMAX * C;  // 44,800: 358 KB
FT_V7 size_t v7_scratch_bytes(int steps) {  // (the partials' float count keeps ptag 8-aligned)
  return V7_FLAG_BYTES + 4 * (v7_gram_floats(steps) + v7_g_floats(steps) + v7_part_floats(steps)) +
         8 * V7_PTAG_WORDS;
}
FT_V7 V7Scratch v7_scratch(void* base, int steps) {
  char* p = static_cast<char*>(base);
  V7Scratch s;
  s.gflag = reinterpret_cast<int*>(p);
  s.pflag = s.gflag + V7_CHAIN;
  s.gram = reinterpret_cast<float*>(p + V7_FLAG_BYTES);
  s.g = s.gram + v7_gram_floats(steps);
  s.part = s.g + v7_g_floats(steps);
  s.ptag = reinterpret_cast<uint64_t*>(s.part + v7_part_floats(steps));
  return s;
}
FT_V7 size_t v7_gram_offset(int t, int j) {  // j = 1 … L
  return (size_t(t) * V7_LAG + (j - 1)) * BMAX * BMAX;
}
FT_V7 float* v7_part_rows(const V7Scratch& s, int t, int k) {
  return s.part + (size_t(t) * V7_WCLUSTERS + k) * BMAX * V7_GROW;
}

// ---- chain CTA q: shared memory, in floats ----------------------------------------------------
// ring [NB][GSLOT]: slot t % NB holds G_t's 128 rows (at stride V7_RS, V7_GROW floats written)
// and, after them, the 8 chain CTAs' column sums of their rows (their share of the bias
// gradient), as v4's g inbox.
struct ChainSmem {
  static constexpr int GSLOT = BMAX * V7_RS + V7_CHAIN * V7_GROW;
  static constexpr int RING = 0;
  static constexpr int BIAS = RING + V7_NB * GSLOT;
  static constexpr int RED = BIAS + 16;           // [C][RPC][LANES + 1]: conflict-free writes
  static constexpr int ZS = RED + C * V7_RPC * (V7_LANES + 1);
  static constexpr int GL = ZS + V7_RPC * 16;     // [RPC + 1][16]: my rows of G_t, their sum
  static constexpr int YS = GL + (V7_RPC + 1) * 16;  // int [2][RPC]: labels, a step ahead
  static constexpr int BAR = YS + 2 * V7_RPC;     // NB mbarriers (8 bytes each)
  static constexpr int FLOATS = BAR + 2 * V7_NB;
};
// ---- worker CTA (k, r) ------------------------------------------------------------------------
struct WorkerSmem {
  static constexpr int XS = 0;                      // [XR][BMAX][16]: my features of a batch
  static constexpr int W = XS + V7_XR * BMAX * 16;  // [FW][16]: W's slice, W[f][c]
  static constexpr int GS = W + V7_FW * 16;         // [BMAX][V7_GROW]: G_a for the update
  static constexpr int URED = GS + BMAX * V7_GROW;  // [2][FW][C]: the update's row halves
  static constexpr int PBUF = URED + 2 * V7_FW * C; // [2][BMAX][V7_GROW]: P_t by step parity
  static constexpr int OK = PBUF + 2 * BMAX * V7_GROW;  // int [2]: no wait failed, by parity
  static constexpr int FLOATS = OK + 4;
};
constexpr int V7_SMEM_FLOATS =
    ChainSmem::FLOATS > WorkerSmem::FLOATS ? ChainSmem::FLOATS : WorkerSmem::FLOATS;
static_assert(ChainSmem::BAR % 2 == 0 && ChainSmem::GSLOT % 4 == 0, "aligned regions");
static_assert(4 * V7_SMEM_FLOATS <= 227 * 1024, "fits a Hopper SM's shared memory");

// The chain's G ring: step t's slot, and the parity its mbarrier's wait for step t passes with
// (slot t % NB completes one phase per step it serves: t, t + NB, …; try_wait.parity(P) passes
// once the phase of parity P has completed).
FT_V7 int v7_slot(int t) { return t % V7_NB; }
FT_V7 int v7_parity(int t) { return (t / V7_NB) & 1; }
// Bytes chain CTA q's slot receives for step t: every valid row of G_t and 8 column sums.
FT_V7 int v7_g_bytes(const V7Epoch& e, int t) {
  return 4 * V7_GROW * (e.rows(t) + V7_CHAIN);
}

// ---- chain: per-thread bodies -----------------------------------------------------------------
// Thread tid = (row i, lane l): the Grams it reads for step t, loaded a step ahead (they were
// written by the previous launch): gam[j − 1][u] = Γ_{t,j}[16q + i][l + 32u] (0 outside). The
// terms are split by their place on the critical path: j = 1 after G_{t−1} has arrived, j ≥ 2 at
// the end of step t − 1 (G_{t−2} … are in the ring by then).
// Tried and measured slower (H200, 2026-11-27): the terms j ≥ 2 by 4 warps of 4 rows a thread,
// Γ copied into shared memory by cp.async (each row of G read once for 4 rows, not once a row):
// 2.87 µs a step for the Gram phase against 1.85, 4 warps too few to hide the loads' latency.
struct ChainLane {
  int i, l;
};
FT_V7 ChainLane chain_lane(int tid) { return {tid / V7_LANES, tid % V7_LANES}; }
constexpr int V7_U = BMAX / V7_LANES;  // 4 columns of Γ a lane and j
// red's layout: v7a [C][RPC][LANES + 1]; v7b by row, [RPC][C][LANES + 1]: the writes stay
// conflict-free (a warp is one row's 32 lanes), and v7b's readers (a half-warp a row, lane c)
// hit 20 distinct banks, where v7a's readers (thread i · C + c) share a bank 5 ways.
FT_V7 int red_at(int c, int i, int l, bool by_row = false) {
  return (by_row ? i * C + c : c * V7_RPC + i) * (V7_LANES + 1) + l;
}
FT_V7 void chain_load_gram(const V7Epoch& e, const float* gram, int t, int q, int tid,
                           float (&gam)[V7_LAG][V7_U]) {
  const ChainLane ln = chain_lane(tid);
  const int row = q * V7_RPC + ln.i, w = v7_window(t);
  for (int j = 1; j <= V7_LAG; ++j)
    for (int u = 0; u < V7_U; ++u) {
      const int m = ln.l + V7_LANES * u;
      const bool in = j <= w && row < e.rows(t) && m < e.rows(t - j);
      gam[j - 1][u] = in ? gram[v7_gram_offset(t, j) + size_t(row) * BMAX + m] : 0.f;
    }
}
// Σ_{j = j0 … j1} Σ_{m ≡ l} Γ_{t,j}[row][m] G_{t−j}[m][c] added to acc; G's row m from the ring
// in three 128-bit loads (classes 0 … 11; 10 and 11 unused).
FT_V7 void chain_gram_terms(const V7Epoch& e, const float (&gam)[V7_LAG][V7_U], const float* ring,
                            int t, int tid, int j0, int j1, float (&acc)[C]) {
  const ChainLane ln = chain_lane(tid);
  const int w = v7_window(t);
  for (int j = j0; j <= j1; ++j) {
    if (j > w) break;
    const float* g = ring + v7_slot(t - j) * ChainSmem::GSLOT;
    for (int u = 0; u < V7_U; ++u) {
      const int m = ln.l + V7_LANES * u;
      if (m >= e.rows(t - j)) break;
      float gm[12];
      for (int h = 0; h < 3; ++h)
        *reinterpret_cast<float4*>(gm + 4 * h) =
            *reinterpret_cast<const float4*>(g + m * V7_RS + 4 * h);
      for (int c = 0; c < C; ++c) acc[c] = fmaf(gam[j - 1][u], gm[c], acc[c]);
    }
  }
}
// The lanes' sums → red (summed over the lanes by chain_logits; v7b: by_row, chain_logit16).
FT_V7 void chain_gram_store(int tid, const float (&acc)[C], float* red, bool by_row = false) {
  const ChainLane ln = chain_lane(tid);
  for (int c = 0; c < C; ++c) red[red_at(c, ln.i, ln.l, by_row)] = acc[c];
}
// b_t = b_{t−1} − lr Σ_src colsum_src(G_{t−1}) (threads c < C; every chain CTA in the same order,
// so their copies stay equal).
FT_V7 void chain_bias(const V7Epoch& e, const float* ring, int t_prev, int tid, float* bias) {
  if (tid >= C) return;
  const float* cs = ring + v7_slot(t_prev) * ChainSmem::GSLOT + BMAX * V7_RS;
  float db = 0.f;
  for (int src = 0; src < V7_CHAIN; ++src) db += cs[src * V7_GROW + tid];
  bias[tid] -= e.lr * db;
}
// Z of (row i, class c), threads tid < RPC · C: the worker clusters' partials (part(k, index)
// reads cluster k's P_t; the kernel through L2) + b_t − c · the lanes' Gram terms.
template <class Part>
FT_V7 void chain_logits(const V7Epoch& e, Part part, int t, int q, int tid, const float* bias,
                        const float* red, float* zs) {
  if (tid >= V7_RPC * C) return;
  const int i = tid / C, c = tid % C, row = q * V7_RPC + i;
  if (row >= e.rows(t)) return;
  float p = 0.f;
  for (int k = 0; k < V7_WCLUSTERS; ++k) p += part(k, row * V7_GROW + c);
  float corr = 0.f;
  for (int l = 0; l < V7_LANES; ++l) corr += red[red_at(c, i, l)];
  const float cg = e.lr * (1.f / 255.f) * (1.f / 255.f);
  zs[i * 16 + c] = p + bias[c] - cg * corr;
}
// Row i's softmax, loss and G (threads tid < RPC): gl[i] = (p − onehot) / n_t, 0 past the batch.
FT_V7 void chain_softmax(const V7Epoch& e, int t, int q, int tid, const float* zs,
                         const int* labels, float* gl, float& loss, float& correct) {
  if (tid >= V7_RPC) return;
  const int i = tid, row = q * V7_RPC + i, nt = e.rows(t);
  if (row >= nt) {
    for (int c = 0; c < 16; ++c) gl[i * 16 + c] = 0.f;
    return;
  }
  const float* z = zs + i * 16;
  float m = z[0];
  for (int c = 1; c < C; ++c) m = fmaxf(m, z[c]);
  float ex[C], se = 0.f;
  for (int c = 0; c < C; ++c) {
    ex[c] = expf(z[c] - m);
    se += ex[c];
  }
  const int y = labels[i];
  loss += logf(se) + m - z[y];
  correct += z[y] == m ? 1.f : 0.f;
  const float inv_n = 1.f / static_cast<float>(nt);
  for (int c = 0; c < C; ++c) gl[i * 16 + c] = (ex[c] / se - (c == y ? 1.f : 0.f)) * inv_n;
  for (int c = C; c < 16; ++c) gl[i * 16 + c] = 0.f;
}
// My rows' column sums into gl's row RPC (threads c < 16; invalid rows hold 0).
FT_V7 void chain_colsum(int tid, float* gl) {
  if (tid >= 16) return;
  float s = 0.f;
  for (int i = 0; i < V7_RPC; ++i) s += gl[i * 16 + tid];
  gl[V7_RPC * 16 + tid] = s;
}

// ---- workers: per-thread bodies ---------------------------------------------------------------
// My features of batch t (rows gathered by the order), in two halves: the byte loads into
// registers a step ahead (their latency hidden behind the step's waits and work), then, after the
// step's update has read x_{t−L−1} (slot (t + 1) % XR's previous batch), as floats into x ring slot
// t % XR. T threads, T · V7_XF ≥ BMAX · FW.
FT_V7 void worker_fetch_x(const V7Epoch& e, const uint8_t* x, const int* order, int t, int f0,
                          int tid, int T, uint8_t (&buf)[V7_XF]) {
  const int nt = e.rows(t);
  for (int k = 0; k < V7_XF; ++k) {
    const int it = tid + k * T, i = it / V7_FW, f = it % V7_FW;
    buf[k] = it < nt * V7_FW ? x[size_t(order[t * e.bs + i]) * K + f0 + f] : 0;
  }
}
FT_V7 void worker_store_x(const V7Epoch& e, int t, int tid, int T, const uint8_t (&buf)[V7_XF],
                          float* xs) {
  const int nt = e.rows(t);
  float* dst = xs + (t % V7_XR) * BMAX * 16;
  for (int k = 0; k < V7_XF; ++k) {
    const int it = tid + k * T, i = it / V7_FW, f = it % V7_FW;
    if (it < nt * V7_FW) dst[i * 16 + f] = buf[k];
  }
}
// G_a's rows from global memory into gs (the caller loads them coherently: ld.global.cg).
// Update, first half: thread (h, f, c) < 2·FW·C sums rows i ≡ h (mod 2) of x_a[i][f] G_a[i][c].
FT_V7 void worker_update_sums(const V7Epoch& e, int a, const float* xs, const float* gs, int tid,
                              float* ured) {
  if (tid >= 2 * V7_FW * C) return;
  const int h = tid / (V7_FW * C), f = tid / C % V7_FW, c = tid % C;
  const float* xa = xs + (a % V7_XR) * BMAX * 16;
  float acc = 0.f;
  for (int i = h; i < e.rows(a); i += 2) acc = fmaf(xa[i * 16 + f], gs[i * V7_GROW + c], acc);
  ured[tid] = acc;
}
// Second half: W[f][c] −= (lr / 255) (both halves), threads tid < FW·C.
FT_V7 void worker_update_apply(const V7Epoch& e, const float* ured, int tid, float* w) {
  if (tid >= V7_FW * C) return;
  const int f = tid / C, c = tid % C;
  w[f * 16 + c] -= (e.lr * (1.f / 255.f)) * (ured[tid] + ured[V7_FW * C + tid]);
}
// P_t over my features: thread (row i, class half h) < 2·BMAX, classes 5h … 5h+4.
FT_V7 void worker_partial(const V7Epoch& e, int t, const float* xs, const float* w, int tid,
                          float* pb) {
  if (tid >= 2 * BMAX) return;
  const int i = tid / 2, h = tid % 2;
  if (i >= e.rows(t)) return;
  const float* xr = xs + (t % V7_XR) * BMAX * 16 + i * 16;
  float acc[5] = {0.f, 0.f, 0.f, 0.f, 0.f};
  for (int f = 0; f < V7_FW; ++f)
    for (int c = 0; c < 5; ++c) acc[c] = fmaf(xr[f], w[f * 16 + 5 * h + c], acc[c]);
  for (int c = 0; c < 5; ++c) pb[i * V7_GROW + 5 * h + c] = acc[c];
}
// Rank r of a worker cluster: rows 16r … of the cluster's 8 partials summed (÷ 255) into the
// cluster's P_t in global memory, threads tid < RPC · C. pb(src, i): float i of CTA src's
// buffer (the kernel reads it over DSMEM); out(row, c, value) stores it (v7a: a float of
// v7_part_rows; v7b: a tagged word, v7b_word_at).
template <class Remote, class Out>
FT_V7 void worker_reduce(const V7Epoch& e, int t, int r, int tid, Remote pb, Out out) {
  if (tid >= V7_RPC * C) return;
  const int i = tid / C, c = tid % C, row = r * V7_RPC + i;
  if (row >= e.rows(t)) return;
  float s = 0.f;
  for (int src = 0; src < V7_CLUSTER; ++src) s += pb(src, row * V7_GROW + c);
  out(row, c, s * (1.f / 255.f));
}

}  // namespace
