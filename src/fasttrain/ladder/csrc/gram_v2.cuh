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
#pragma once
#include <cstring>

#include "epoch_v7_math.cuh"
#include "gram_u8.cuh"

namespace gram {
namespace v2 {

constexpr int LAGS = V7_LAG;
constexpr int NB = BMAX;                           // rows of X_{t−j} a CTA stages: a whole batch
constexpr int ROWS = 64;                           // rows of X_t a CTA
constexpr int TILES = BMAX / ROWS;                 // CTAs a step
constexpr int WARPS = 16, THREADS = 32 * WARPS;
constexpr int WM = 32, WN = 64;                    // a warp's tile
constexpr int MT = WM / 16, NTL = WN / 8;          // its m16 and n8 blocks
constexpr int UNIT = 16;                           // bytes a cp.async
constexpr int UNITS = K_BYTES / UNIT;              // 49 a row
constexpr int SU = 4;                              // units a stage: 2 k-steps of 32 bytes
constexpr int STAGES = (UNITS + SU - 1) / SU;      // 13
constexpr int KSTEPS = CHUNKS;                     // 25: stage 12's second k-step is padding only
constexpr int SROWS = ROWS + LAGS * NB;            // 576 rows staged a stage
constexpr int RSTRIDE = SU * UNIT + UNIT;          // 80 bytes: padded, ldmatrix conflict-free
constexpr int BUF = SROWS * RSTRIDE;               // 46,080 bytes a buffer
constexpr int SMEM = 2 * BUF;                      // 92,160 bytes: double-buffered
constexpr int COPIES = SROWS * SU;                 // 2,304 cp.async a stage
constexpr int CPT = (COPIES + THREADS - 1) / THREADS;  // 5 a thread (the 5th: threads < 256)
static_assert(THREADS % SU == 0, "a thread copies the same unit of each of its rows");
static_assert(WARPS == (ROWS / WM) * LAGS * (NB / WN), "one warp a (row half, lag, col half)");
static_assert(K_BYTES % UNIT == 0 && 2 * KSTEPS >= UNITS && 2 * (KSTEPS - 1) < UNITS, "k");

// One CTA's work: X_t's rows from m_base (rows[0], n[0] of them valid, ≤ 0: none), X_{t−j}'s
// (rows[j], n[j]; 0 where t − j < 0) and where Γ_{t,j}'s row m_base goes (out[j − 1], stride BMAX).
struct Job {
  const uint8_t* x;
  const int32_t* rows[1 + LAGS];
  int n[1 + LAGS];
  float* out[LAGS];
};

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
// as its offset in x (row · 784), or -1 past its batch or past the 576 rows (zero-filled, or no
// copy at all).
struct Src {
  int32_t off[CPT];
};
GRAM_HD Src thread_rows(const Job& job, int tid) {
  Src src;
#pragma unroll
  for (int q = 0; q < CPT; ++q) {
    const int r = tid / SU + q * (THREADS / SU);
    const int j = r < ROWS ? 0 : (r - ROWS) / NB + 1, i = r < ROWS ? r : (r - ROWS) % NB;
    src.off[q] = r < SROWS && i < pick(job.n, j) ? pick(job.rows, j)[i] * K_BYTES : -1;
  }
  return src;
}

// Thread tid's copies for stage s into `buf` (its unit tid % SU of each of its rows).
template <class Cta>
GRAM_HD void issue_stage(Cta& cta, const Job& job, const Src& src, uint8_t* buf, int s, int tid) {
  const int u = tid % SU, unit = s * SU + u;
#pragma unroll
  for (int q = 0; q < CPT; ++q) {
    const int r = tid / SU + q * (THREADS / SU);
    if (r >= SROWS) break;
    const bool valid = src.off[q] >= 0 && unit < UNITS;
    cta.copy16(buf + r * RSTRIDE + u * UNIT, job.x + (valid ? src.off[q] + unit * UNIT : 0), valid);
  }
}

struct Role {  // warp w's tile: rows m0 … m0 + 31 of the CTA's, Γ_{t,j}'s columns n0 … n0 + 63
  int m0, j, n0, na, nb;  // na, nb: the valid rows of X_t's tile and of X_{t−j}
  float* out;             // Γ_{t,j}'s row m_base
  bool active;            // warp-uniform: mma.sync needs every lane
};
GRAM_HD Role role(const Job& job, int w) {
  Role r;
  r.m0 = WM * (w & 1);
  r.j = (w >> 1) % LAGS + 1;
  r.n0 = WN * (w / (2 * LAGS));
  r.na = job.n[0];
  r.nb = pick(job.n, r.j);
  r.out = pick(job.out, r.j - 1);
  r.active = r.m0 < r.na && r.n0 < r.nb;
  return r;
}

// Warp `r`'s two k-steps of stage s from `buf` into acc [MT][NTL].
template <class Warp, class AccT>
GRAM_HD void mma_stage(Warp& warp, const uint8_t* buf, const Role& r, int s, AccT (&acc)[MT][NTL]) {
  if (!r.active) return;
  const uint8_t* b_rows = buf + (ROWS + (r.j - 1) * NB + r.n0) * RSTRIDE;
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    if (2 * s + ks >= KSTEPS) break;
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

template <class Warp, class AccT>
GRAM_HD void store_warp(Warp& warp, const Role& r, AccT (&acc)[MT][NTL]) {
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
template <class Cta>
GRAM_HD void cta_grams(Cta& cta, const Job& job, uint8_t* smem) {
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
      mma_stage(warp, smem + (s & 1) * BUF, role(job, w), s, acc);
    });
    cta.sync();
  }
  cta.warps([&](auto& warp, int w, auto& acc) { store_warp(warp, role(job, w), acc); });
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

// A thread of the CTA: its accumulators in registers (every index a constant once unrolled).
struct DeviceCta {
  Acc acc[MT][NTL];
  Src rows;
  __device__ __forceinline__ Src& src(int) { return rows; }
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
  __device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
  template <int N>
  __device__ __forceinline__ void wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
  }
  __device__ __forceinline__ void sync() { __syncthreads(); }
};
#endif

}  // namespace v2
}  // namespace gram
