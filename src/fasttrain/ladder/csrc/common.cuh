// The ladder's CUDA C++ shared by every rung family: the training context, the hand-written kernels
// and the epoch loop. Each rungs_*.cu file supplies the three operations its rungs change (forward
// GEMM, softmax, weight-gradient GEMM + update) as a struct `Ops`, and exports the same four
// extern "C" entry points through FT_EXPORT_ENTRY_POINTS(Ops).
//
// Model: z = x·Wᵀ + b (x [B,784] in [0,1], W [10,784], b [10]), p = softmax(z), mean cross-entropy,
// plain SGD. Layout is row-major throughout (W as nn.Linear stores it).
// Error handling: every entry point returns 0 or the first cudaError_t / library status it met.
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define FT_IN 784
#define FT_CLASSES 10

// Bits of `flags` in ft_epoch, resolved by the Python row once per epoch.
#define FT_STATS 1       // compute loss and accuracy this epoch
#define FT_SYNC_STEP 2   // copy them to the host after every step and wait (the report's baseline)
#define FT_FUSED 4       // one kernel for loss and accuracy instead of two
#define FT_GRAPH 8       // replay the epoch as a CUDA graph captured on first use

#define FT_TRY(expr)                                   \
  do {                                                 \
    int ft_status_ = (int)(expr);                      \
    if (ft_status_ != 0) return ft_status_;            \
  } while (0)
#define FT_LAUNCHED() FT_TRY(cudaGetLastError())

struct Library;  // per-family handles (cuBLAS, cuDNN), defined by the family's .cu

struct Ctx {
  const uint8_t* X;     // [n, 784] training pixels, on the device
  const int64_t* Y;     // [n] labels
  int n, batch;
  float lr;
  float* W;             // [10, 784] weights, updated in place
  float* b;             // [10]
  float* xb;            // [batch, 784] the gathered batch in [0, 1]
  int* yb;              // [batch]
  float* z;             // [batch, 10] logits
  float* p;             // [batch, 10] softmax, then (in place) dLoss/dz
  float* gW;            // [10, 784] weight gradient (families whose GEMM does not update W itself)
  double* stats;        // [2] loss sum and correct count of the epoch, on the device
  int64_t* order_buf;   // [n] the epoch's order, copied here when replaying a graph
  void* workspace;      // library workspace (cuBLAS), fixed so that graph capture allocates nothing
  size_t workspace_bytes;
  Library* lib;
  cudaStream_t capture;  // private stream to capture graphs on (torch's default stream cannot be)
  cudaGraphExec_t graphs[2];  // [with stats?]
  double host_stats[2];
};

// ---- kernels ---------------------------------------------------------------------------------

// Batch gather on the device: row i of the batch is sample order[i] of the resident uint8 set.
__global__ void gather_kernel(const uint8_t* __restrict__ X, const int64_t* __restrict__ Y,
                              const int64_t* __restrict__ order, int B, float* __restrict__ xb,
                              int* __restrict__ yb) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= B * FT_IN) return;
  int i = t / FT_IN, k = t - i * FT_IN;
  int64_t s = order[i];
  xb[t] = (float)X[s * FT_IN + k] / 255.0f;  // division, not *1/255: rounds as the reference does
  if (k == 0) yb[i] = (int)Y[s];
}

// z[i, j] = b[j] + Σ_k x[i, k] W[j, k]: one warp per output, lanes stride over k (coalesced).
__global__ void forward_kernel(const float* __restrict__ x, const float* __restrict__ W,
                               const float* __restrict__ b, int B, float* __restrict__ z) {
  int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= B * FT_CLASSES) return;
  int i = warp / FT_CLASSES, j = warp % FT_CLASSES;
  float acc = 0.f;
  for (int k = lane; k < FT_IN; k += 32) acc += x[i * FT_IN + k] * W[j * FT_IN + k];
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffff, acc, off);
  if (lane == 0) z[warp] = acc + b[j];
}

// z[i, j] = b[j]: the GEMM then accumulates onto it (beta = 1), adding the bias for free.
__global__ void bias_fill_kernel(const float* __restrict__ b, int B, float* __restrict__ z) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < B * FT_CLASSES) z[t] = b[t % FT_CLASSES];
}

// Row-wise stable softmax, one thread per sample (10 classes).
__global__ void softmax_kernel(const float* __restrict__ z, int B, float* __restrict__ p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B) return;
  const float* zi = z + i * FT_CLASSES;
  float m = zi[0];
  for (int j = 1; j < FT_CLASSES; ++j) m = fmaxf(m, zi[j]);
  float e[FT_CLASSES], s = 0.f;
  for (int j = 0; j < FT_CLASSES; ++j) s += (e[j] = expf(zi[j] - m));
  for (int j = 0; j < FT_CLASSES; ++j) p[i * FT_CLASSES + j] = e[j] / s;
}

// Block sum of one double per thread, then one atomic per block into *out.
__device__ void block_sum_into(double v, double* out) {
  __shared__ double part[32];
  for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xffffffff, v, off);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0;
    for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xffffffff, v, off);
    if (threadIdx.x == 0) atomicAdd(out, v);
  }
}

__device__ double sample_loss(const float* p, const int* y, int i) {
  return -log(fmax((double)p[i * FT_CLASSES + y[i]], 1e-30));
}

__device__ double sample_correct(const float* p, const int* y, int i) {
  int best = 0;
  for (int j = 1; j < FT_CLASSES; ++j)
    if (p[i * FT_CLASSES + j] > p[i * FT_CLASSES + best]) best = j;
  return best == y[i] ? 1.0 : 0.0;
}

// Blocks must be a multiple of 32 threads (block_sum_into); threads past B add 0.
__global__ void loss_kernel(const float* p, const int* y, int B, double* stats) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  block_sum_into(i < B ? sample_loss(p, y, i) : 0.0, &stats[0]);
}

__global__ void accuracy_kernel(const float* p, const int* y, int B, double* stats) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  block_sum_into(i < B ? sample_correct(p, y, i) : 0.0, &stats[1]);
}

// One pass over p for both figures: half the launches and reads of the two kernels above.
__global__ void loss_accuracy_kernel(const float* p, const int* y, int B, double* stats) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  bool in = i < B;
  block_sum_into(in ? sample_loss(p, y, i) : 0.0, &stats[0]);
  __syncthreads();  // block_sum_into's shared buffer is reused
  block_sum_into(in ? sample_correct(p, y, i) : 0.0, &stats[1]);
}

// dLoss/dz of mean cross-entropy through softmax: (p - onehot(y)) / B, in place.
__global__ void softmax_backward_kernel(float* p, const int* __restrict__ y, int B) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= B * FT_CLASSES) return;
  int i = t / FT_CLASSES, j = t % FT_CLASSES;
  p[t] = (p[t] - (j == y[i] ? 1.f : 0.f)) / (float)B;
}

// gW[j, k] = Σ_i g[i, j] x[i, k]. v1 (H100: 6.15 µs a step at B = 128) gave each of the 7,840
// weights a thread that walked all B rows: x was read 10 times (once per class), only 31 CTAs ran,
// and each thread's B dependent loads were the kernel's time. v2: a CTA takes WG_K features, its
// WG_R row groups each sum B / WG_R rows for all 10 classes (x read once, 10 independent chains
// a thread), and the row groups are added in shared memory; 49 CTAs of 256 threads.
#define WG_K 16
#define WG_R 16
__global__ void __launch_bounds__(WG_K * WG_R)
    weight_grad_kernel(const float* __restrict__ g, const float* __restrict__ x, int B,
                       float* __restrict__ gW) {
  __shared__ float part[WG_R][FT_CLASSES][WG_K];
  const int kf = threadIdx.x % WG_K, rg = threadIdx.x / WG_K, k = blockIdx.x * WG_K + kf;
  float acc[FT_CLASSES] = {};
  for (int i = rg; i < B; i += WG_R) {  // a half-warp reads 16 consecutive x (64 B) of row i
    const float xv = x[i * FT_IN + k];
#pragma unroll
    for (int j = 0; j < FT_CLASSES; ++j) acc[j] += g[i * FT_CLASSES + j] * xv;  // g: L1 broadcast
  }
#pragma unroll
  for (int j = 0; j < FT_CLASSES; ++j) part[rg][j][kf] = acc[j];
  __syncthreads();
  if (threadIdx.x < FT_CLASSES * WG_K) {
    const int j = threadIdx.x / WG_K, f = threadIdx.x % WG_K;
    float sum = 0.f;
#pragma unroll
    for (int r = 0; r < WG_R; ++r) sum += part[r][j][f];
    gW[j * FT_IN + blockIdx.x * WG_K + f] = sum;
  }
}
static_assert(FT_IN % WG_K == 0, "whole feature tiles");

// SGD: W -= lr gW (when gW is given; cuBLAS families fold it into their GEMM) and b -= lr Σ_i g[i].
// v1 (H100: 7.06 µs a step, 6.92 µs alone in the cuBLAS rungs' <<<1, 32>>>) summed the bias
// gradient with one thread per class walking all B rows of g: B dependent global loads. v2: one
// warp per class in block 0 (lanes stride the rows, then a shuffle tree); blocks of SGD_THREADS
// (10 warps), so the same kernel serves as <<<1, SGD_THREADS>>> for the bias alone.
#define SGD_THREADS (32 * FT_CLASSES)
__global__ void __launch_bounds__(SGD_THREADS)
    sgd_update_kernel(float* W, const float* __restrict__ gW, float* b,
                      const float* __restrict__ g, int B, float lr) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (gW != nullptr && t < FT_CLASSES * FT_IN) W[t] -= lr * gW[t];
  if (blockIdx.x == 0) {
    const int j = threadIdx.x / 32, lane = threadIdx.x % 32;
    float gb = 0.f;
    for (int i = lane; i < B; i += 32) gb += g[i * FT_CLASSES + j];
    for (int off = 16; off > 0; off /= 2) gb += __shfl_down_sync(0xffffffff, gb, off);
    if (lane == 0) b[j] -= lr * gb;
  }
}

inline unsigned blocks(long work, int threads) { return (unsigned)((work + threads - 1) / threads); }

// ---- the epoch -------------------------------------------------------------------------------

// One SGD step on samples order[0:B]. Ops supplies forward (z from xb), softmax (p from z) and
// update (W and b from p = dLoss/dz): what the rung families differ in.
template <class Ops>
int step(Ctx* c, const int64_t* order, int B, int flags, cudaStream_t s) {
  gather_kernel<<<blocks((long)B * FT_IN, 256), 256, 0, s>>>(c->X, c->Y, order, B, c->xb, c->yb);
  FT_LAUNCHED();
  FT_TRY(Ops::forward(c, B, s));
  FT_TRY(Ops::softmax(c, B, s));
  if (flags & FT_STATS) {
    if (flags & FT_FUSED) {
      loss_accuracy_kernel<<<blocks(B, 128), 128, 0, s>>>(c->p, c->yb, B, c->stats);
      FT_LAUNCHED();
    } else {
      loss_kernel<<<blocks(B, 128), 128, 0, s>>>(c->p, c->yb, B, c->stats);
      FT_LAUNCHED();
      accuracy_kernel<<<blocks(B, 128), 128, 0, s>>>(c->p, c->yb, B, c->stats);
      FT_LAUNCHED();
    }
    if (flags & FT_SYNC_STEP) {
      // The report's baseline: this step's loss and accuracy to the host, and wait for them.
      double h[2];
      FT_TRY(cudaMemcpyAsync(h, c->stats, sizeof h, cudaMemcpyDeviceToHost, s));
      FT_TRY(cudaStreamSynchronize(s));
      c->host_stats[0] += h[0];
      c->host_stats[1] += h[1];
      FT_TRY(cudaMemsetAsync(c->stats, 0, 2 * sizeof(double), s));
    }
  }
  softmax_backward_kernel<<<blocks(B * FT_CLASSES, 256), 256, 0, s>>>(c->p, c->yb, B);
  FT_LAUNCHED();
  return Ops::update(c, B, s);
}

template <class Ops>
int epoch_steps(Ctx* c, const int64_t* order, int flags, cudaStream_t s) {
  if (flags & FT_STATS) FT_TRY(cudaMemsetAsync(c->stats, 0, 2 * sizeof(double), s));
  for (int start = 0; start < c->n; start += c->batch) {
    int B = c->n - start < c->batch ? c->n - start : c->batch;  // the last partial batch is kept
    FT_TRY(step<Ops>(c, order + start, B, flags, s));
  }
  return 0;
}

// The epoch as a graph: captured once per stats setting (ft_capture, at setup) on the private
// capture stream, reading the order from order_buf; each replay first copies the epoch's order
// there (device to device, asynchronous: no host wait).
template <class Ops>
int capture_graph(Ctx* c, int flags) {
  cudaGraphExec_t& exec = c->graphs[(flags & FT_STATS) ? 1 : 0];
  if (exec != nullptr) return 0;
  FT_TRY(Ops::bind(c, c->capture));
  FT_TRY(cudaStreamBeginCapture(c->capture, cudaStreamCaptureModeThreadLocal));
  int status = epoch_steps<Ops>(c, c->order_buf, flags, c->capture);
  cudaGraph_t graph = nullptr;
  int end = (int)cudaStreamEndCapture(c->capture, &graph);  // ends the capture even on error
  FT_TRY(status);
  FT_TRY(end);
  status = (int)cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  return status;
}

template <class Ops>
int epoch_graph(Ctx* c, const int64_t* order, int flags, cudaStream_t s) {
  FT_TRY(capture_graph<Ops>(c, flags));
  FT_TRY(cudaMemcpyAsync(c->order_buf, order, (size_t)c->n * sizeof(int64_t),
                         cudaMemcpyDeviceToDevice, s));
  return (int)cudaGraphLaunch(c->graphs[(flags & FT_STATS) ? 1 : 0], s);
}

// The entry points every family's library exports (ctypes calls them; see cuda_rungs.py).
#define FT_EXPORT_ENTRY_POINTS(Ops)                                                              \
  extern "C" int ft_create(const uint8_t* X, const int64_t* Y, int n, int batch, float lr,      \
                           float* W, float* b, float* xb, int* yb, float* z, float* p, float* gW, \
                           double* stats, int64_t* order_buf, void* workspace,                  \
                           size_t workspace_bytes, Ctx** out) {                                 \
    Ctx* c = new Ctx{X, Y, n, batch, lr, W, b, xb, yb, z, p, gW, stats, order_buf, workspace,   \
                     workspace_bytes, nullptr, nullptr, {nullptr, nullptr}, {0.0, 0.0}};        \
    *out = c;                                                                                   \
    FT_TRY(cudaStreamCreateWithFlags(&c->capture, cudaStreamNonBlocking));                      \
    return Ops::create(c);                                                                      \
  }                                                                                             \
  extern "C" int ft_capture(Ctx* c, int flags) { return capture_graph<Ops>(c, flags); }          \
  extern "C" int ft_epoch(Ctx* c, const int64_t* order, int flags, cudaStream_t s) {            \
    if (flags & FT_GRAPH) return epoch_graph<Ops>(c, order, flags, s);                          \
    FT_TRY(Ops::bind(c, s));                                                                    \
    c->host_stats[0] = c->host_stats[1] = 0.0;                                                  \
    return epoch_steps<Ops>(c, order, flags, s);                                                \
  }                                                                                             \
  /* The loss sum and correct count the baseline gathered on the host during the last epoch. */ \
  extern "C" void ft_host_stats(Ctx* c, double* out) {                                          \
    out[0] = c->host_stats[0];                                                                  \
    out[1] = c->host_stats[1];                                                                  \
  }                                                                                             \
  extern "C" int ft_destroy(Ctx* c) {                                                           \
    for (cudaGraphExec_t g : c->graphs)                                                         \
      if (g) cudaGraphExecDestroy(g);                                                           \
    int status = Ops::destroy(c);                                                               \
    if (c->capture) cudaStreamDestroy(c->capture);                                              \
    delete c;                                                                                   \
    return status;                                                                              \
  }
