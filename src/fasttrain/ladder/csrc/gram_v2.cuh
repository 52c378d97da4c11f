// cuda-epoch v7's Gram kernel, version 2 (v7_gram_kernel_v2 in epoch_v7.cuh): the CTA code,
// shared by the kernel and its host harness (tests/ladder/csrc/gram_v2_host.cu runs it for whole
// epochs: the copies deferred until their wait, ldmatrix and mma emulated from the PTX ISA).
// WRITTEN WITHOUT A GPU: not yet run on one; its figures below are estimates.
//
// One CTA per (step t, tile of ROWS = 64 rows of X_t) computes Γ_{t,j} = X_t X_{t−j}ᵀ for those
// rows and every lag j = 1 … L (v1: one CTA per (t, j, 64 × 32 tile), every warp reading its own
// operands from L2). K = 784 bytes is staged in STAGES = 13 chunks of 64 bytes (4 cp.async
// 16-byte units a row: 784 = 49 × 16, the last chunk one unit and three zero-filled), double-
// buffered: the 64 rows of X_t and the 4 × 128 rows of X_{t−1} … X_{t−4}, gathered by the epoch's
// order, 576 rows a chunk. 16 warps share them: warp w owns rows 32·(w & 1) … of the tile, lag
// j = (w >> 1) % 4 + 1 and columns 64·(w >> 3) …, a 32 × 64 tile (2 × 8 mma.m16n8k32 a k-step,
// 64 s32 accumulators a thread), fed by ldmatrix.x4 (gram_u8.cuh's fragments are ldmatrix's:
// a u8 A or B register is 4 consecutive bytes of k of one row, as an 8 × 8 b16 matrix gives lane
// i row i / 4, word i % 4). Rows are padded to 80 bytes so the 8 rows of one ldmatrix phase fall
// in 8 different 16-byte bank groups (80 r mod 128 = 0, 80, 32, 112, 64, 16, 96, 48): no conflict.
// The fp32 rounding (one cvt.rn of the exact s32 sum) and the output layout are v1's; entries
// past a partial batch are not written (the epoch kernel never reads them: chain_load_gram).
//
// Cost model (ESTIMATES, not measured; H100/H200 figures from NVIDIA's datasheets):
//   CTAs: 2 a step, 938 an epoch (469 steps), 1 resident an SM (512 threads at ≤ 128 registers
//     fill the register file; 92,160 B of shared memory): ~7.1 waves on 132 SMs.
//   L2 → SM: 576 rows × 784 B = 452 KB a CTA, ~424 MB an epoch (v1: ~2.3 GB, a model too).
//   HBM written: every Γ, 1,876 × 128 × 128 × 4 B = 123 MB (unchanged), as float2 stores.
//   MMA: 64 × 512 × 800 / (16 · 8 · 32) = 6,400 mma.m16n8k32 a CTA, 6.0 M an epoch (24.1 G u8
//     multiply-adds and the k padding 800/784).
//   Time: writes 123 MB at ~3.3 TB/s (H100) / ~4.8 TB/s (H200) = ~37 / ~26 µs; L2 reads 424 MB
//     at an assumed ~8 TB/s = ~53 µs; the mma.sync at an assumed ~half of the ~990 T u8 MAC/s
//     dense peak = ~50 µs. They overlap in part: an estimate of 60–120 µs an epoch on an H200,
//     against v1's measured 493.8 µs.
//
// Parametrized (branch gram6, 2026-11-28) by Cfg<L, BIAS, WN>: V7 is the kernel above, its PTX
// unchanged (nvcc -O3 -arch=sm_90a -ptx cuda_epoch.cu before and after: every .entry equal once
// register names are renumbered, scripts/ptx_entry_diff.py); V8 is cuda-epoch v8's (L = 6, byte
// 784 of every valid row 255 by a plain shared store, every block written, 32 × 96 warp tiles:
// csrc/v8_grams.cuh says why, and what it costs).
#pragma once
#include <cstddef>
#include <cstring>

#include "epoch_v7_math.cuh"
#include "gram_u8.cuh"

namespace gram {
namespace v2 {

// The kernel's shape, one struct an instantiation: L lags, the bias pixel, the warp's columns.
//   V7: L = 4, no bias, a warp 32 rows × 64 columns of one lag (the original kernel, its PTX
//       unchanged by this parametrization: docs in the gram6 branch's report);
//   V8: L = 6, byte 784 of every valid row 255 (Γ̃ = Γ + 255² on valid pairs), every entry of
//       every [128][128] block written (0 outside valid pairs and for t < j), a warp 32 rows × 96
//       of the lags' concatenated columns (16 warps: 2 × 768 / 96; 96 s32 accumulators a thread).
template <int L, bool BIAS_, int WN_>
struct Cfg {
  static constexpr int LAGS = L;
  static constexpr bool BIAS = BIAS_;             // also: write every entry (zeros included)
  static constexpr int NB = BMAX;                 // rows of X_{t−j} a CTA stages: a whole batch
  static constexpr int ROWS = 64;                 // rows of X_t a CTA
  static constexpr int TILES = BMAX / ROWS;       // CTAs a step
  static constexpr int WARPS = 16, THREADS = 32 * WARPS;
  static constexpr int WM = 32, WN = WN_;         // a warp's tile
  static constexpr int MT = WM / 16, NTL = WN / 8;  // its m16 and n8 blocks
  static constexpr int UNIT = 16;                 // bytes a cp.async
  static constexpr int UNITS = K_BYTES / UNIT;    // 49 a row
  static constexpr int SU = 4;                    // units a stage: 2 k-steps of 32 bytes
  static constexpr int STAGES = (UNITS + SU - 1) / SU;  // 13
  static constexpr int KSTEPS = CHUNKS;           // 25: stage 12's second k-step: padding (and
                                                  // V8's bias byte 784) only
  static constexpr int SROWS = ROWS + LAGS * NB;  // rows staged a stage: 576 (V7), 832 (V8)
  static constexpr int RSTRIDE = SU * UNIT + UNIT;  // 80 bytes: padded, ldmatrix conflict-free
  static constexpr int BUF = SROWS * RSTRIDE;     // 46,080 (V7), 66,560 (V8) bytes a buffer
  static constexpr int SMEM = 2 * BUF;            // 92,160 (V7), 133,120 (V8): double-buffered
  static constexpr int COPIES = SROWS * SU;       // 2,304 (V7), 3,328 (V8) cp.async a stage
  static constexpr int CPT = (COPIES + THREADS - 1) / THREADS;  // 5 (V7), 7 (V8) a thread
  static_assert(THREADS % SU == 0, "a thread copies the same unit of each of its rows");
  static_assert(WARPS * WM * WN == ROWS * LAGS * NB, "the warps' tiles cover the CTA's");
  static_assert(BIAS || NB % WN == 0, "V7's store: a warp's columns in one lag");
  static_assert(NB % 16 == 0 && WN % 16 == 0, "an ldmatrix pair of n8 blocks in one lag");
  static_assert(K_BYTES % UNIT == 0 && 2 * KSTEPS >= UNITS && 2 * (KSTEPS - 1) < UNITS, "k");
  static_assert(!BIAS || UNITS % SU != 0, "the bias unit (byte 784) inside the last stage");
};
using V7 = Cfg<V7_LAG, false, 64>;
using V8 = Cfg<6, true, 96>;

// v7's names, as before the parametrization (epoch_v7*.cuh, the host harness).
constexpr int LAGS = V7::LAGS, NB = V7::NB, ROWS = V7::ROWS, TILES = V7::TILES;
constexpr int WARPS = V7::WARPS, THREADS = V7::THREADS, WM = V7::WM, WN = V7::WN;
constexpr int MT = V7::MT, NTL = V7::NTL, UNIT = V7::UNIT, UNITS = V7::UNITS, SU = V7::SU;
constexpr int STAGES = V7::STAGES, KSTEPS = V7::KSTEPS, SROWS = V7::SROWS;
constexpr int RSTRIDE = V7::RSTRIDE, BUF = V7::BUF, SMEM = V7::SMEM, COPIES = V7::COPIES;
constexpr int CPT = V7::CPT;

// One CTA's work: X_t's rows from m_base (rows[0], n[0] of them valid, ≤ 0: none), X_{t−j}'s
// (rows[j], n[j]; 0 where t − j < 0) and where Γ_{t,j}'s row m_base goes (out[j − 1], stride BMAX).
template <class C>
struct JobT {
  const uint8_t* x;
  const int32_t* rows[1 + C::LAGS];
  int n[1 + C::LAGS];
  float* out[C::LAGS];
};
using Job = JobT<V7>;

// v7's job for CTA (tile, t) of the Gram launch: Γ_{t,j} at v7_gram_offset(t, j) (v1's layout).
GRAM_HD Job v7_job(const V7Epoch& e, const uint8_t* x, const int32_t* order, float* gram, int t,
                   int tile) {
  Job job;
  job.x = x;
  const int m_base = tile * ROWS;
  job.rows[0] = order + size_t(t) * e.bs + m_base;
  job.n[0] = e.rows(t) - m_base;
  for (int j = 1; j <= LAGS; ++j) {
    const bool in = t - j >= 0;
    job.rows[j] = in ? order + size_t(t - j) * e.bs : order;
    job.n[j] = in ? e.rows(t - j) : 0;
    job.out[j - 1] = gram + (in ? v7_gram_offset(t, j) + size_t(m_base) * BMAX : 0);
  }
  return job;
}

// v8's job for CTA (tile, t) of an epoch of n samples in batches of bs (≤ BMAX), `steps` of them:
// Γ̃_{t,1} into grams [steps][BMAX][BMAX] (ladder/v8_chain.py's "grams"), Γ̃_{t,j≥2} into gramh
// [L − 1][steps][BMAX][BMAX] ("gramh"); every t, j gets its block (zeros where t < j).
GRAM_HD JobT<V8> v8_job(int n, int bs, int steps, const uint8_t* x, const int32_t* order,
                        float* grams, float* gramh, int t, int tile) {
  JobT<V8> job;
  job.x = x;
  const int m_base = tile * V8::ROWS;
  auto rows = [&](int s) { return n - s * bs < bs ? n - s * bs : bs; };
  job.rows[0] = order + size_t(t) * bs + m_base;
  job.n[0] = rows(t) - m_base;
  for (int j = 1; j <= V8::LAGS; ++j) {
    const bool in = t - j >= 0;
    job.rows[j] = in ? order + size_t(t - j) * bs : order;
    job.n[j] = in ? rows(t - j) : 0;
    const size_t block = j == 1 ? size_t(t) : size_t(j - 2) * steps + t;
    job.out[j - 1] = (j == 1 ? grams : gramh) + (block * BMAX + m_base) * BMAX;
  }
  return job;
}

// arr[k] for a k known only at run time, by compare-and-select over the constant indices: an
// index into a kernel parameter's array that is not a constant puts the array in local memory.
template <class T, int N>
GRAM_HD T pick(const T (&arr)[N], int k) {
  T v = arr[0];
#pragma unroll
  for (int i = 1; i < N; ++i)
    if (i == k) v = arr[i];
  return v;
}

// Thread tid's staged rows, the same every stage: r = tid / SU + q · THREADS / SU (q < CPT), each
// as its offset in x (row · 784), or -1 past its batch or past the SROWS rows (zero-filled, or no
// copy at all).
template <class C>
struct SrcT {
  int32_t off[C::CPT];
};
using Src = SrcT<V7>;
template <class C>
GRAM_HD SrcT<C> thread_rows(const JobT<C>& job, int tid) {
  constexpr int ROWS = C::ROWS, NB = C::NB, SU = C::SU, THREADS = C::THREADS;
  SrcT<C> src;
#pragma unroll
  for (int q = 0; q < C::CPT; ++q) {
    const int r = tid / SU + q * (THREADS / SU);
    const int j = r < ROWS ? 0 : (r - ROWS) / NB + 1, i = r < ROWS ? r : (r - ROWS) % NB;
    src.off[q] = r < C::SROWS && i < pick(job.n, j) ? pick(job.rows, j)[i] * K_BYTES : -1;
  }
  return src;
}

// Thread tid's copies for stage s into `buf` (its unit tid % SU of each of its rows). With the
// bias pixel, unit UNITS (bytes 784 … 799) is no copy but a 16-byte shared store (cta.put16): 255
// then zeros on a valid row, zeros past its batch, at issue time as the copies (the buffer is free
// then: the previous iteration's last barrier), visible after the stage's barrier.
template <class Cta, class C>
GRAM_HD void issue_stage(Cta& cta, const JobT<C>& job, const SrcT<C>& src, uint8_t* buf, int s,
                         int tid) {
  constexpr int SU = C::SU, UNIT = C::UNIT, RSTRIDE = C::RSTRIDE;
  const int u = tid % SU, unit = s * SU + u;
#pragma unroll
  for (int q = 0; q < C::CPT; ++q) {
    const int r = tid / SU + q * (C::THREADS / SU);
    if (r >= C::SROWS) break;
    if constexpr (C::BIAS) {
      if (unit == C::UNITS) {
        cta.put16(buf + r * RSTRIDE + u * UNIT, src.off[q] >= 0);
        continue;
      }
    }
    const bool valid = src.off[q] >= 0 && unit < C::UNITS;
    cta.copy16(buf + r * RSTRIDE + u * UNIT, job.x + (valid ? src.off[q] + unit * UNIT : 0), valid);
  }
}

struct Role {  // warp w's tile: rows m0 … m0 + WM − 1 of the CTA's; columns n0 … n0 + WN − 1 of
  int m0, j, n0, na, nb;  // Γ_{t,j} (V7); V8: n0 is a column of the lags' concatenation
  float* out;             // Γ_{t,j}'s row m_base (V7 only; V8 picks a block's lag at its store)
  bool active;            // warp-uniform: mma.sync needs every lane
};
template <class C>
GRAM_HD Role role(const JobT<C>& job, int w) {
  Role r;
  r.m0 = C::WM * (w & 1);
  r.na = job.n[0];
  if constexpr (C::BIAS) {  // every warp active: the zero rows give the zeros it must write
    r.j = 0;
    r.n0 = C::WN * (w >> 1);
    r.nb = 0;
    r.out = nullptr;
    r.active = true;
  } else {
    r.j = (w >> 1) % C::LAGS + 1;
    r.n0 = C::WN * (w / (2 * C::LAGS));
    r.nb = pick(job.n, r.j);
    r.out = pick(job.out, r.j - 1);
    r.active = r.m0 < r.na && r.n0 < r.nb;
  }
  return r;
}

// Warp `r`'s two k-steps of stage s from `buf` into acc [MT][NTL].
template <class C, class Warp, class AccT>
GRAM_HD void mma_stage(Warp& warp, const uint8_t* buf, const Role& r, int s,
                       AccT (&acc)[C::MT][C::NTL]) {
  constexpr int MT = C::MT, NTL = C::NTL, RSTRIDE = C::RSTRIDE, UNIT = C::UNIT;
  if (!r.active) return;
  const uint8_t* b_rows;
  if constexpr (C::BIAS)
    b_rows = buf + (C::ROWS + r.n0) * RSTRIDE;
  else
    b_rows = buf + (C::ROWS + (r.j - 1) * C::NB + r.n0) * RSTRIDE;
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    if (2 * s + ks >= C::KSTEPS) break;
    typename Warp::template Reg<FragA> a[MT];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)  // matrices: rows +0/+8 (lane bit 3), k unit +0/+1 (bit 4)
      warp.ldsm4(a[mi], [&](int lane) {
        return buf + (r.m0 + 16 * mi + (lane & 7) + 8 * ((lane >> 3) & 1)) * RSTRIDE +
               (2 * ks + (lane >> 4)) * UNIT;
      });
#pragma unroll
    for (int np = 0; np < NTL / 2; ++np) {  // two n8 blocks: k unit +0/+1 (bit 3), rows +8 (bit 4)
      typename Warp::template Reg<FragA> q;
      warp.ldsm4(q, [&](int lane) {
        return b_rows + (16 * np + (lane & 7) + 8 * (lane >> 4)) * RSTRIDE +
               (2 * ks + ((lane >> 3) & 1)) * UNIT;
      });
      typename Warp::template Reg<FragB> b0, b1;
      warp.each([&](int lane) {
        const FragA& v = warp.at(q, lane);
        warp.at(b0, lane) = FragB{{v.r[0], v.r[1]}};
        warp.at(b1, lane) = FragB{{v.r[2], v.r[3]}};
      });
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        warp.mma(acc[mi][2 * np], a[mi], b0);
        warp.mma(acc[mi][2 * np + 1], a[mi], b1);
      }
    }
  }
}

// c[0], c[1] (and c[2], c[3]) are adjacent columns 2t, 2t + 1: one 8-byte store each where both
// are inside the batch (Γ's row stride and column are even: aligned), else v1's scalar stores.
GRAM_HD void store_pair(float* out, int na, int nb, int i, int j, int32_t c0, int32_t c1) {
  if (i >= na || j >= nb) return;
  float* p = out + size_t(i) * BMAX + j;
  if (j + 1 < nb)
    *reinterpret_cast<float2*>(p) = make_float2(static_cast<float>(c0), static_cast<float>(c1));
  else
    *p = static_cast<float>(c0);
}

// V8: every entry of the warp's 32 × 96 tile, 8-byte stores, each n8 block into its lag's block
// (a block's 8 columns never straddle two lags: NB % 8 == 0). The lags j ≥ 2 are equally spaced
// (v8_job's "gramh"): out[1] and one stride, not six pointers, stay live through the k loop (six
// made ptxas spill).
template <class C, class Warp, class AccT>
GRAM_HD void store_warp_full(Warp& warp, const JobT<C>& job, const Role& r,
                             AccT (&acc)[C::MT][C::NTL]) {
  static_assert(C::LAGS >= 3, "the stride of the lags j >= 2: out[2] - out[1]");
  const ptrdiff_t stride = job.out[2] - job.out[1];
#pragma unroll
  for (int nt = 0; nt < C::NTL; ++nt) {
    const int col = r.n0 + 8 * nt, lag = col / C::NB;
    float* out = (lag == 0 ? job.out[0] : job.out[1] + (lag - 1) * stride) + col % C::NB;
#pragma unroll
    for (int mi = 0; mi < C::MT; ++mi)
      warp.each([&](int lane) {
        const Acc& c = warp.at(acc[mi][nt], lane);
        float* p = out + size_t(r.m0 + 16 * mi + (lane >> 2)) * BMAX + 2 * (lane & 3);
        *reinterpret_cast<float2*>(p) =
            make_float2(static_cast<float>(c.c[0]), static_cast<float>(c.c[1]));
        *reinterpret_cast<float2*>(p + 8 * BMAX) =
            make_float2(static_cast<float>(c.c[2]), static_cast<float>(c.c[3]));
      });
  }
}

template <class C, class Warp, class AccT>
GRAM_HD void store_warp(Warp& warp, const JobT<C>& job, const Role& r,
                        AccT (&acc)[C::MT][C::NTL]) {
  constexpr int MT = C::MT, NTL = C::NTL, WM = C::WM, WN = C::WN;
  if constexpr (C::BIAS) {
    store_warp_full<C>(warp, job, r, acc);
    return;
  }
  if (!r.active) return;
  if (r.m0 + WM <= r.na && r.n0 + WN <= r.nb) {  // the whole tile inside: 8-byte stores only
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int nt = 0; nt < NTL; ++nt)
        warp.each([&](int lane) {
          const Acc& c = warp.at(acc[mi][nt], lane);
          float* p = r.out + size_t(r.m0 + 16 * mi + (lane >> 2)) * BMAX + r.n0 + 8 * nt +
                     2 * (lane & 3);
          *reinterpret_cast<float2*>(p) =
              make_float2(static_cast<float>(c.c[0]), static_cast<float>(c.c[1]));
          *reinterpret_cast<float2*>(p + 8 * BMAX) =
              make_float2(static_cast<float>(c.c[2]), static_cast<float>(c.c[3]));
        });
    return;
  }
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int nt = 0; nt < NTL; ++nt)
      warp.each([&](int lane) {
        const Acc& c = warp.at(acc[mi][nt], lane);
        const int i = r.m0 + 16 * mi + (lane >> 2), j = r.n0 + 8 * nt + 2 * (lane & 3);
        store_pair(r.out, r.na, r.nb, i, j, c.c[0], c.c[1]);
        store_pair(r.out, r.na, r.nb, i + 8, j, c.c[2], c.c[3]);
      });
}

// The CTA: stage 0 issued, then for each stage s the next one issued into the other buffer, a
// wait for s's copies (cp.async.wait_group: all but the newest group), a barrier (every thread's
// copies of s visible), the k-steps of s, a barrier (buffer s % 2 read by every warp before the
// copies of s + 2, issued in the next iteration, overwrite it); then the stores. The thread's
// source rows are read from the order once (cta.src(tid): registers on the GPU). `Cta` runs it:
// on the GPU a thread (threads(f) calls f(tid), sync is __syncthreads), on the host the CTA's 512
// threads and 16 warps a phase at a time (tests/ladder/csrc/gram_v2_host.cu).
template <class Cta, class C>
GRAM_HD void cta_grams(Cta& cta, const JobT<C>& job, uint8_t* smem) {
  constexpr int MT = C::MT, NTL = C::NTL, STAGES = C::STAGES, BUF = C::BUF;
  cta.warps([&](auto& warp, int, auto& acc) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int nt = 0; nt < NTL; ++nt)
        warp.each([&](int lane) { warp.at(acc[mi][nt], lane) = Acc{{0, 0, 0, 0}}; });
  });
  cta.threads([&](int tid) {
    cta.src(tid) = thread_rows(job, tid);
    issue_stage(cta, job, cta.src(tid), smem, 0, tid);
  });
  cta.commit();
  for (int s = 0; s < STAGES; ++s) {
    if (s + 1 < STAGES) {
      cta.threads([&](int tid) {
        issue_stage(cta, job, cta.src(tid), smem + ((s + 1) & 1) * BUF, s + 1, tid);
      });
      cta.commit();
      cta.template wait<1>();
    } else {
      cta.template wait<0>();
    }
    cta.sync();
    cta.warps([&](auto& warp, int w, auto& acc) {
      mma_stage<C>(warp, smem + (s & 1) * BUF, role(job, w), s, acc);
    });
    cta.sync();
  }
  cta.warps([&](auto& warp, int w, auto& acc) { store_warp<C>(warp, job, role(job, w), acc); });
}

#if defined(__CUDACC__)
// ldmatrix on the GPU: DeviceWarp's lanes, each giving the address of its row.
struct DeviceWarpV2 : DeviceWarp {
  template <class F>
  __device__ __forceinline__ void ldsm4(FragA& out, F&& addr) const {
    const uint32_t a = static_cast<uint32_t>(
        __cvta_generic_to_shared(addr(static_cast<int>(threadIdx.x & 31))));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(out.r[0]), "=r"(out.r[1]), "=r"(out.r[2]), "=r"(out.r[3])
                 : "r"(a));
  }
};

// A thread of the CTA: its accumulators in registers (every index a constant once unrolled), its
// source rows in registers (V7) or, V8, in a shared-memory table [THREADS] of SrcT (`table`, set
// by the kernel: 14,336 B past the buffers; thread tid's 7 words at 28·tid + 4q, on 32 distinct
// banks a warp): in registers they made ptxas spill 16 bytes at 128 registers beside V8's 96
// accumulators.
template <class C>
struct DeviceCtaT {
  Acc acc[C::MT][C::NTL];
  SrcT<C> rows;
  SrcT<C>* table = nullptr;
  __device__ __forceinline__ SrcT<C>& src(int tid) {
    if constexpr (C::BIAS)
      return table[tid];
    else
      return rows;
  }
  template <class F>
  __device__ __forceinline__ void threads(F&& f) { f(static_cast<int>(threadIdx.x)); }
  template <class F>
  __device__ __forceinline__ void warps(F&& f) {
    DeviceWarpV2 warp;
    f(warp, static_cast<int>(threadIdx.x >> 5), acc);
  }
  // 16 bytes global → shared, zero-filled where !valid (src-size 0: nothing is read).
  __device__ __forceinline__ void copy16(uint8_t* dst, const uint8_t* src, bool valid) {
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
  }
  // 16 bytes into shared memory by a plain store: the bias unit, 255 then zeros (or zeros).
  __device__ __forceinline__ void put16(uint8_t* dst, bool valid) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(valid ? 255u : 0u, 0u, 0u, 0u);
  }
  __device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
  template <int N>
  __device__ __forceinline__ void wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
  }
  __device__ __forceinline__ void sync() { __syncthreads(); }
};
using DeviceCta = DeviceCtaT<V7>;
#endif

}  // namespace v2
}  // namespace gram
