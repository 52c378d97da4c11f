// cuda-epoch v7 in ONE launch (EpochKernel(..., v7_grams="launch"), the C entry points' `grams`
// argument V7_GRAMS_LAUNCH): the bookkeeping its producer role and the chain's Γ wait share with
// the host emulation (tests/ladder/csrc/epoch_v7_math_host.cu). The device side is
// epoch_v7l.cuh. WRITTEN WITHOUT A GPU: not yet run on one.
//
// The launch: the 64 CTAs of v7a/v7b (chain cluster 0, worker clusters 1 … 7) and 7 producer
// clusters of 8 (CTAs 64 … 119), one kernel, one block size and one dynamic shared size for all:
// the producers run Gram v2's CTA code (gram_v2.cuh's cta_grams, 92,160 B of the kernel's
// 125 KiB) in the chain's config. Producer CTA p computes the Grams of items i ≡ p (mod 56),
// i = t · TILES + tile, in step order (a CTA a step's 64 rows of X_t for all L lags, as a CTA of
// Gram v2's grid), writes them where the Gram kernel does, and publishes a per-item ready flag
// (st.release.gpu after a __syncthreads that follows every thread's stores). Chain CTA q reads
// only rows 16q … 16q + 15 of each Γ_{t,j}: the flag of item (t, q · 16 / 64).
//
// No zeroing race: the flags are epoch-numbered. Every CTA's thread 0 takes a ticket
// (atomicAdd on `arrive`) when the CTA starts; the launch's generation is ticket / V7L_CTAS + 1
// (launches on one stream do not overlap and each takes exactly V7L_CTAS tickets, so all CTAs
// of launch g hold tickets V7L_CTAS (g − 1) … V7L_CTAS g − 1). A flag is ready when it holds
// the generation: the previous launch's values are g − 1 or less, so nothing needs zeroing
// (the scratch starts zeroed: EpochKernel allocates it with torch.zeros; the generation wraps
// after 2^32 / 120 ≈ 35.8 million launches). The step counters of v7a/v7b (gflag, pflag) and v7b's
// tagged ring are not epoch-numbered (the chain and workers are unchanged): producer CTA 0 zeroes
// and clears them first and publishes `reset` = g; every chain and worker CTA waits for
// reset == g before its role starts (the Gram kernel did that zeroing in the two-launch path).
// Flow control: none. The scratch holds every Γ of the epoch (as in two launches), so a
// producer never overwrites anything the chain has yet to read: the producers may run ahead as
// far as they can.
#pragma once
#include "epoch_v7_math.cuh"

namespace {

enum V7Grams { V7_GRAMS_KERNEL = 0, V7_GRAMS_LAUNCH = 1, V7_GRAMS_MODES };
constexpr int V7L_PCLUSTERS = 7;                              // producer clusters
constexpr int V7L_PRODUCERS = V7L_PCLUSTERS * V7_CLUSTER;     // 56 CTAs
constexpr int V7L_CTAS = V7_CTAS + V7L_PRODUCERS;             // 120: 15 clusters of 8
constexpr int V7L_ROWS = 64;                                  // rows of X_t an item (Gram v2's)
constexpr int V7L_TILES = BMAX / V7L_ROWS;                    // items a step
constexpr int V7L_HEAD_BYTES = 64;                            // arrive, reset, padding
static_assert(V7_RPC <= V7L_ROWS && V7L_ROWS % V7_RPC == 0, "a chain CTA's rows in one item");

struct V7LScratch {
  unsigned* arrive;  // tickets taken (every CTA of every one-launch epoch on this scratch)
  int* reset;        // the generation whose counters and ring producer CTA 0 has reset
  int* ready;        // [steps][TILES]: the generation whose item (t, tile) is written
};
// After v7's own scratch (its layout unchanged): the two-launch path never touches it.
FT_V7 size_t v7l_scratch_bytes(int steps) {
  return v7_scratch_bytes(steps) + V7L_HEAD_BYTES + 4 * size_t(steps) * V7L_TILES;
}
FT_V7 V7LScratch v7l_scratch(void* base, int steps) {
  char* p = static_cast<char*>(base) + v7_scratch_bytes(steps);
  V7LScratch s;
  s.arrive = reinterpret_cast<unsigned*>(p);
  s.reset = reinterpret_cast<int*>(p) + 1;
  s.ready = reinterpret_cast<int*>(p + V7L_HEAD_BYTES);
  return s;
}
FT_V7 int v7l_generation(unsigned ticket) { return static_cast<int>(ticket / V7L_CTAS) + 1; }
FT_V7 int v7l_items(int steps) { return steps * V7L_TILES; }
FT_V7 int v7l_item(int t, int tile) { return t * V7L_TILES + tile; }
FT_V7 int v7l_tile(int q) { return q * V7_RPC / V7L_ROWS; }  // chain CTA q's item of a step

}  // namespace
