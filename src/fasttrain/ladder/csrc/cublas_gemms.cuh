// Both GEMMs of a step through cuBLAS (cublasLt), for the families from `+cublas` on.
//
// cuBLAS is column-major; our row-major arrays are their transposes: x [B,784] is xᵀ (784×B, ld
// 784), W [10,784] is Wᵀ (784×10, ld 784), z and g [B,10] are zᵀ, gᵀ (10×B, ld 10).
//
// Each GEMM's algorithm is chosen once at setup, for the full batch and for the last partial one,
// by timing: the heuristic's first 16 algorithms, and its first 16 that split no k, each run on
// scratch operands of the step's shapes, the fastest kept. Both GEMMs have a small m·n (10×B and
// 784×10: one to 25 tiles), so the heuristic likes to split k and reduce the splits in a second
// kernel, and no single rule picks well for both (H100, 2026-11-26 and -27):
// - cublasSgemm's own pick for the forward: split-K sm80_xmma_gemm 32x64 7.25 µs + cublasLt
//   splitKreduce 5.14 µs a step; the heuristic's best without a reduction scheme 7.06 µs alone.
// - for the weight-gradient update, the first of the heuristic's 16 that splits no k was a
//   cutlass simt sgemm 32x128 at 4.01 µs; its best without a reduction scheme an sm80_xmma_gemm
//   32x32 at 18.2 µs, which made `+cublas` 2.6 ms/epoch slower on the third loan.
// Setup runs each candidate 3 times untimed, then times it on the GPU alone: 20 calls captured as
// one CUDA graph on the private stream, replayed once to warm and then 5 times between two events
// (in a graph the GEMMs follow each other as in `+cuda-graphs`, with no host in between). The
// H200 loan (2026-11-27) timed 20 back-to-back calls on a stream instead, where the host's cost of
// issuing each call can hide the GPU's: the forward's pick measured 14.2 µs a call there ran
// 18.1 µs a step in the loop, and the rows' picks differed from process to process.
#pragma once
#include <cublasLt.h>
#include <string.h>

#include "common.cuh"

// One GEMM D = alpha · op(A) · op(B) + beta · C with C = D, as layouts for the full batch [0] and
// the last one [1], and the algorithm chosen for each.
struct LtGemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a[2] = {}, b[2] = {}, c[2] = {};
  cublasLtMatmulAlgo_t algo[2];
  int split_k[2] = {0, 0};  // the chosen algorithms' k splits (1: none)
  int algo_id[2] = {0, 0}, tile_id[2] = {0, 0};  // CUBLASLT_ALGO_CONFIG_ID and _TILE_ID
  float us[2] = {0.f, 0.f};  // their GPU time a call at setup (in a graph), µs
};

struct CublasGemms {
  cublasLtHandle_t lt = nullptr;
  LtGemm forward, update;
  int rows[2] = {0, 0};  // the full batch and the last one
};

constexpr int LT_CANDIDATES = 16;  // asked of the heuristic, twice: unrestricted, and no split
constexpr int LT_WARMUP = 3, LT_TIMED = 20, LT_REPLAYS = 5;

// Up to LT_CANDIDATES of the heuristic's algorithms for g's layouts i whose reduction scheme is
// in `mask`, appended to found[*n].
inline int lt_heuristic(cublasLtHandle_t lt, LtGemm* g, int i, Ctx* c, uint32_t mask,
                        cublasLtMatmulHeuristicResult_t* found, int* n) {
  cublasLtMatmulPreference_t pref = nullptr;
  FT_TRY(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t bytes = c->workspace_bytes;
  int status = (int)cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes);
  if (status == 0)
    status = (int)cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
  int got = 0;
  if (status == 0)
    status = (int)cublasLtMatmulAlgoGetHeuristic(lt, g->op, g->a[i], g->b[i], g->c[i], g->c[i],
                                                 pref, LT_CANDIDATES, found + *n, &got);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status == 0) *n += got;
  return status;
}

// One int attribute of an algorithm's configuration (`fallback` where it has none).
inline int lt_config(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t what,
                     int fallback) {
  int32_t v = fallback;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, what, &v, sizeof v, &written);
  return v;
}

// GPU µs a call of `algo` on scratch operands A, B, CD (contents irrelevant: zeros), timed in a
// CUDA graph on the private stream s; a negative value where the algorithm fails to run or to be
// captured (its error is cleared: it is not the chosen algorithm's).
inline float lt_time(cublasLtHandle_t lt, LtGemm* g, int i, const cublasLtMatmulAlgo_t& algo,
                     const float* A, const float* B, float* CD, Ctx* c, cudaStream_t s,
                     cudaEvent_t start, cudaEvent_t stop) {
  const float alpha = 1.f, beta = 1.f;
  auto call = [&] {
    return cublasLtMatmul(lt, g->op, &alpha, A, g->a[i], B, g->b[i], &beta, CD, g->c[i], CD,
                          g->c[i], &algo, c->workspace, c->workspace_bytes, s);
  };
  bool ok = true;
  for (int r = 0; r < LT_WARMUP && ok; ++r) ok = call() == CUBLAS_STATUS_SUCCESS;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (ok) ok = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    for (int r = 0; r < LT_TIMED && ok; ++r) ok = call() == CUBLAS_STATUS_SUCCESS;
    ok = cudaStreamEndCapture(s, &graph) == cudaSuccess && ok;  // ends the capture even on error
  }
  ok = ok && graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  ok = ok && cudaGraphLaunch(exec, s) == cudaSuccess && cudaEventRecord(start, s) == cudaSuccess;
  for (int r = 0; r < LT_REPLAYS && ok; ++r) ok = cudaGraphLaunch(exec, s) == cudaSuccess;
  float ms = -1.f;
  ok = ok && cudaEventRecord(stop, s) == cudaSuccess && cudaEventSynchronize(stop) == cudaSuccess &&
       cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (!ok) {
    cudaStreamSynchronize(s);
    (void)cudaGetLastError();
    return -1.f;
  }
  return ms * 1000.f / (LT_TIMED * LT_REPLAYS);
}

// The fastest of the heuristic's candidates for g's layouts i, an m×n output over k; scratch
// holds at least m·k + k·n + m·n floats.
inline int lt_choose(cublasLtHandle_t lt, LtGemm* g, int i, Ctx* c, int m, int n, int k,
                     float* scratch, cudaStream_t s) {
  cublasLtMatmulHeuristicResult_t found[2 * LT_CANDIDATES];
  int count = 0;
  // A heuristic that finds nothing under a mask may say so by an error status, not a count of 0.
  lt_heuristic(lt, g, i, c, CUBLASLT_REDUCTION_SCHEME_NONE, found, &count);
  FT_TRY(lt_heuristic(lt, g, i, c, CUBLASLT_REDUCTION_SCHEME_MASK, found, &count));
  FT_TRY(cudaMemsetAsync(scratch, 0, sizeof(float) * ((size_t)m * k + (size_t)k * n + m * n), s));
  const float *A = scratch, *B = scratch + (size_t)m * k;
  float* CD = scratch + (size_t)m * k + (size_t)k * n;
  cudaEvent_t start, stop;
  FT_TRY(cudaEventCreate(&start));
  FT_TRY(cudaEventCreate(&stop));
  float best = -1.f;
  for (int j = 0; j < count; ++j) {
    bool seen = false;  // the two lists overlap
    for (int q = 0; q < j && !seen; ++q)
      seen = memcmp(&found[q].algo, &found[j].algo, sizeof(cublasLtMatmulAlgo_t)) == 0;
    if (seen) continue;
    const float us = lt_time(lt, g, i, found[j].algo, A, B, CD, c, s, start, stop);
    if (us >= 0.f && (best < 0.f || us < best)) {
      best = us;
      g->algo[i] = found[j].algo;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  FT_TRY(cudaStreamSynchronize(s));
  if (best < 0.f) return (int)CUBLAS_STATUS_NOT_SUPPORTED;
  g->us[i] = best;
  g->split_k[i] = lt_config(g->algo[i], CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1);
  g->algo_id[i] = lt_config(g->algo[i], CUBLASLT_ALGO_CONFIG_ID, -1);
  g->tile_id[i] = lt_config(g->algo[i], CUBLASLT_ALGO_CONFIG_TILE_ID, -1);
  return 0;
}

// A layout of `rows`×`cols` floats (column-major, leading dimension `ld`).
inline int lt_layout(cublasLtMatrixLayout_t* out, int rows, int cols, int ld) {
  return (int)cublasLtMatrixLayoutCreate(out, CUDA_R_32F, rows, cols, ld);
}

// Plain FP32 compute (no TF32: the rungs are checked against float64 to fp32 tolerance).
inline int lt_op(LtGemm* g, cublasOperation_t ta, cublasOperation_t tb) {
  FT_TRY(cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  FT_TRY(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  return (int)cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
}

inline int cublas_gemms_create(CublasGemms* G, Ctx* c) {
  FT_TRY(cublasLtCreate(&G->lt));
  G->rows[0] = c->batch;
  G->rows[1] = c->n % c->batch ? c->n % c->batch : c->batch;
  // Forward: zᵀ (10×B) = (Wᵀ)ᵀ · xᵀ + zᵀ: m = 10, n = B, k = 784; A = Wᵀ (T), B = xᵀ (N).
  FT_TRY(lt_op(&G->forward, CUBLAS_OP_T, CUBLAS_OP_N));
  // Update: Wᵀ (784×10) ← Wᵀ - lr · xᵀ · g: m = 784, n = 10, k = B; A = xᵀ (N), B = gᵀ (T).
  FT_TRY(lt_op(&G->update, CUBLAS_OP_N, CUBLAS_OP_T));
  // Scratch operands for timing the candidates (the step's own buffers are not touched).
  const int B0 = G->rows[0];
  const size_t floats = (size_t)FT_IN * B0 + (size_t)B0 * FT_CLASSES + FT_IN * FT_CLASSES;
  float* scratch = nullptr;
  FT_TRY(cudaMalloc(&scratch, floats * sizeof(float)));
  const cudaStream_t s = c->capture;
  int status = 0;
  for (int i = 0; i < 2 && status == 0; ++i) {
    const int B = G->rows[i];
    LtGemm *f = &G->forward, *u = &G->update;
    status = lt_layout(&f->a[i], FT_IN, FT_CLASSES, FT_IN);
    if (status == 0) status = lt_layout(&f->b[i], FT_IN, B, FT_IN);
    if (status == 0) status = lt_layout(&f->c[i], FT_CLASSES, B, FT_CLASSES);
    if (status == 0) status = lt_layout(&u->a[i], FT_IN, B, FT_IN);
    if (status == 0) status = lt_layout(&u->b[i], FT_CLASSES, B, FT_CLASSES);
    if (status == 0) status = lt_layout(&u->c[i], FT_IN, FT_CLASSES, FT_IN);
    if (status == 0) status = lt_choose(G->lt, f, i, c, FT_CLASSES, B, FT_IN, scratch, s);
    if (status == 0) status = lt_choose(G->lt, u, i, c, FT_IN, FT_CLASSES, B, scratch, s);
  }
  const int freed = (int)cudaFree(scratch);  // synchronizes: the timing is done with it
  return status ? status : freed;
}

inline void lt_gemm_destroy(LtGemm* g) {
  for (int i = 0; i < 2; ++i)
    for (cublasLtMatrixLayout_t l : {g->a[i], g->b[i], g->c[i]})
      if (l) cublasLtMatrixLayoutDestroy(l);
  if (g->op) cublasLtMatmulDescDestroy(g->op);
}

inline int cublas_gemms_destroy(CublasGemms* G) {
  lt_gemm_destroy(&G->forward);
  lt_gemm_destroy(&G->update);
  return G->lt ? (int)cublasLtDestroy(G->lt) : 0;
}

inline int lt_run(cublasLtHandle_t lt, LtGemm* g, int i, float alpha, const float* A,
                  const float* B, float* CD, Ctx* c, cudaStream_t s) {
  const float one = 1.f;
  return (int)cublasLtMatmul(lt, g->op, &alpha, A, g->a[i], B, g->b[i], &one, CD, g->c[i], CD,
                             g->c[i], &g->algo[i], c->workspace, c->workspace_bytes, s);
}

// Forward: zᵀ = W · xᵀ + zᵀ, onto z pre-filled with the bias (beta = 1 adds it).
inline int cublas_forward(CublasGemms* G, Ctx* c, int B, cudaStream_t s) {
  bias_fill_kernel<<<blocks(B * FT_CLASSES, 256), 256, 0, s>>>(c->b, B, c->z);
  FT_LAUNCHED();
  const int i = B == G->rows[0] ? 0 : 1;  // every batch but the last is full
  return lt_run(G->lt, &G->forward, i, 1.f, c->W, c->xb, c->z, c, s);
}

// Weight gradient and update in one GEMM, Wᵀ ← Wᵀ - lr · xᵀ · g (alpha = -lr, beta = 1: the
// gradient is never stored); then the bias kernel.
inline int cublas_update(CublasGemms* G, Ctx* c, int B, cudaStream_t s) {
  const int i = B == G->rows[0] ? 0 : 1;
  FT_TRY(lt_run(G->lt, &G->update, i, -c->lr, c->xb, c->p, c->W, c, s));
  sgd_update_kernel<<<1, SGD_THREADS, 0, s>>>(c->W, nullptr, c->b, c->p, B, c->lr);
  return (int)cudaGetLastError();
}

// What setup chose, for the row's details: for the forward then the update GEMM, for the full
// then the last batch, 4 values each: µs a call, k splits, algorithm id, tile id (16 in all).
inline void cublas_gemms_choice(const CublasGemms* G, float* out) {
  const LtGemm* gemms[2] = {&G->forward, &G->update};
  for (int g = 0; g < 2; ++g)
    for (int i = 0; i < 2; ++i) {
      float* o = out + 8 * g + 4 * i;
      o[0] = gemms[g]->us[i];
      o[1] = (float)gemms[g]->split_k[i];
      o[2] = (float)gemms[g]->algo_id[i];
      o[3] = (float)gemms[g]->tile_id[i];
    }
}

// The entry point for it, in a family whose Library holds `gemms`.
#define FT_EXPORT_GEMM_CHOICE \
  extern "C" void ft_gemm_choice(Ctx* c, float* out) { cublas_gemms_choice(&c->lib->gemms, out); }
