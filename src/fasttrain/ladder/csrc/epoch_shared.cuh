// cuda-epoch: what every version shares (shapes, arguments, the two exchanges, helpers).
// Included by cuda_epoch.cu (see its header for the design and the versions).
#pragma once
#include <cooperative_groups.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cg = cooperative_groups;

namespace {

constexpr int K = 784;       // features
constexpr int C = 10;        // classes
constexpr int BMAX = 128;    // largest batch one launch supports
constexpr int THREADS = 288; // 9 warps: 256 for the logits (2 per row), 280 for the gradient

__host__ __device__ constexpr int align4(int n) { return (n + 3) / 4 * 4; }

template <int NC>
struct Shape {
  static constexpr int F = K / NC;                    // my features (112 or 56)
  static constexpr int FP = F + 4;                    // padded float row: 16-byte aligned, no
                                                      // bank conflicts between rows
  static constexpr int RPC = (BMAX + NC - 1) / NC;    // rows each CTA owns (row b -> CTA b % NC)
  static constexpr int PART = NC * RPC * C;           // inbox of partial logits [src][row][class]
  static constexpr int INBOX = align4(PART) + BMAX * C;  // + inbox of g [row][class]
  // Shared memory, in floats (every region 16-byte aligned).
  static constexpr int W_OFF = 0;
  static constexpr int BIAS_OFF = W_OFF + C * F;
  static constexpr int XF_OFF = BIAS_OFF + 16;
  static constexpr int INBOX_OFF = XF_OFF + 2 * BMAX * FP;
  static constexpr int RED_OFF = INBOX_OFF + align4(INBOX);
  static constexpr int IDX_OFF = RED_OFF + THREADS * 4;
  static constexpr int YS_OFF = IDX_OFF + 2 * BMAX;
  static constexpr int XB_OFF = YS_OFF + 2 * BMAX;
  static constexpr int BYTES = XB_OFF * 4 + BMAX * F;
  static_assert(K % NC == 0 && F % 8 == 0, "features split in 8-byte aligned slices");
  static_assert(C * (F / 4) <= THREADS, "one gradient unit (class, 4 features) per thread");
};

struct Args {
  const uint8_t* x;   // [N][784] raw pixels
  const int* y;       // [N] labels
  const int* order;   // [N] this epoch's order
  int n, bs;
  float lr;
  float* w;           // [10][784], updated in place
  float* b;           // [10]
  float* stats;       // [2] += (loss sum, correct count)
  float* scratch;     // [NC][INBOX] inboxes of the grid variant (unused by the cluster one)
};

// Where the inboxes live and how the CTAs wait for each other: the only difference between the
// cluster kernel and the cooperative-grid fallback.
#if defined(_CG_HAS_CLUSTER_GROUP)  // the host pass and sm_90+; the kernel is empty elsewhere
struct ClusterExchange {
  cg::cluster_group cluster;
  float* inbox;  // mine, in shared memory
  __device__ int rank() const { return static_cast<int>(cluster.block_rank()); }
  __device__ float* inbox_of(int q) { return cluster.map_shared_rank(inbox, q); }
  __device__ float* local() { return inbox; }
  __device__ float read(const float* p) const { return *p; }
  __device__ float4 read4(const float* p) const { return *reinterpret_cast<const float4*>(p); }
  __device__ void sync() { cluster.sync(); }  // barrier.cluster arrive.release/wait.acquire
  // The same barrier split in two (v3): local work between arrive and wait overlaps the
  // barrier's round trip; nothing between them may touch an inbox.
  __device__ void arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
  __device__ void wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
};
#endif

template <int INBOX>  // floats of one CTA's inbox
struct GridExchange {
  cg::grid_group grid;
  float* scratch;
  __device__ int rank() const { return static_cast<int>(blockIdx.x); }
  __device__ float* inbox_of(int q) const { return scratch + q * INBOX; }
  __device__ float* local() { return inbox_of(rank()); }
  __device__ float read(const float* p) const { return __ldcg(p); }
  __device__ float4 read4(const float* p) const {
    return __ldcg(reinterpret_cast<const float4*>(p));
  }
  __device__ void sync() { grid.sync(); }
  __device__ void arrive() {}  // a grid barrier cannot be split: the window runs before it
  __device__ void wait() { grid.sync(); }
};

// 4 uint8 pixels -> 4 exact floats with integer byte moves and one FADD each (2^23 + v - 2^23),
// instead of the I2F conversion, which runs at an eighth of the FMA rate.
__device__ __forceinline__ float4 bytes_to_float4(uint32_t v) {
  const float m = 8388608.f;
  return make_float4(__uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540)) - m,
                     __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7541)) - m,
                     __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7542)) - m,
                     __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7543)) - m);
}

// A row's softmax over the 16 lanes that hold it (z = -inf in the lanes of no class): its max m,
// this lane's exp(z - m) (0 in no class) and the row's sum of them, in every lane.
struct RowSoftmax {
  float m, e, se;
};
__device__ __forceinline__ RowSoftmax row_softmax(float z, bool valid) {
  float m = z;
  for (int off = 8; off; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off, 16));
  const float e = valid ? __expf(z - m) : 0.f;
  float se = e;
  for (int off = 8; off; off >>= 1) se += __shfl_xor_sync(0xffffffffu, se, off, 16);
  return {m, e, se};
}

__device__ __forceinline__ void add4(float4& a, const float4& b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}

// The SGD step of 4 consecutive weights (16-byte aligned): w -= scale * g.
__device__ __forceinline__ void descend4(float* w, const float4& g, float scale) {
  float4 v = *reinterpret_cast<const float4*>(w);
  v.x -= g.x * scale;
  v.y -= g.y * scale;
  v.z -= g.z * scale;
  v.w -= g.w * scale;
  *reinterpret_cast<float4*>(w) = v;
}

// CTA r's slice of the weights (columns [k0, k0 + F) of every class) and the bias into shared
// memory, T threads: every version's set-up.
template <int F, int T>
__device__ __forceinline__ void load_slice(const Args& a, int k0, int tid, float* Ws,
                                           float* bias) {
  for (int i = tid; i < C * F; i += T) Ws[i] = a.w[(i / F) * K + k0 + i % F];
  if (tid < C) bias[tid] = a.b[tid];
}

// The slice back to global memory (the bias from CTA 0: every CTA holds the same), and this
// thread's loss and accuracy sums added to the run's: every version's end.
template <int F, int T>
__device__ __forceinline__ void write_back(const Args& a, int r, int k0, int tid,
                                           const float* Ws, const float* bias, float loss,
                                           float correct) {
  for (int i = tid; i < C * F; i += T) a.w[(i / F) * K + k0 + i % F] = Ws[i];
  if (r == 0 && tid < C) a.b[tid] = bias[tid];
  if (loss != 0.f || correct != 0.f) {
    atomicAdd(a.stats, loss);
    atomicAdd(a.stats + 1, correct);
  }
}

}  // namespace
