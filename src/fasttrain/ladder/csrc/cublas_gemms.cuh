// Both GEMMs of a step through cuBLAS (cublasLt), for the families from `+cublas` on.
//
// cuBLAS is column-major; our row-major arrays are their transposes: x [B,784] is xᵀ (784×B, ld
// 784), W [10,784] is Wᵀ (784×10, ld 784), z and g [B,10] are zᵀ, gᵀ (10×B, ld 10).
//
// Each GEMM's algorithm is chosen once at setup, for the full batch and for the last partial one,
// and asked to split no k. cublasSgemm's own pick for this step (H100, 2026-11-26) runs a split-K
// GEMM and a second kernel to reduce the splits: sm80_xmma_gemm 32x64 7.2 µs + cublasLt
// splitKreduce 5.1 µs a step, against 3.4 µs for the hand-written forward kernel. Both GEMMs
// here have a small m·n (10×B and 784×10: one to 25 tiles), so splitting k fills the GPU, and a
// reduce kernel costs more than the split saves on k = 784 or 128. Asking the heuristic for
// algorithms without a reduction scheme (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = NONE)
// excludes split-K outright; where it offers none, its unrestricted best is taken and split_k
// says so. (The first try, the weight-gradient GEMM alone through cublasLt, left the split-K
// kernels in the profile: they may be the forward's, which is why both go through here now.)
#pragma once
#include <cublasLt.h>

#include "common.cuh"

// One GEMM D = alpha · op(A) · op(B) + beta · C with C = D, as layouts for the full batch [0] and
// the last one [1], and the algorithm chosen for each.
struct LtGemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a[2] = {}, b[2] = {}, c[2] = {};
  cublasLtMatmulAlgo_t algo[2];
  int split_k[2] = {0, 0};  // 1: an algorithm without a k split; 0: cuBLAS's unrestricted best
};

struct CublasGemms {
  cublasLtHandle_t lt = nullptr;
  LtGemm forward, update;
  int rows[2] = {0, 0};  // the full batch and the last one
};

// The heuristic's best algorithm for g's layouts i whose reduction scheme is in `mask`.
inline int lt_best(cublasLtHandle_t lt, LtGemm* g, int i, Ctx* c, uint32_t mask,
                   cublasLtMatmulHeuristicResult_t* best, int* n) {
  cublasLtMatmulPreference_t pref = nullptr;
  FT_TRY(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t bytes = c->workspace_bytes;
  int status = (int)cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes);
  if (status == 0)
    status = (int)cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
  if (status == 0)
    status = (int)cublasLtMatmulAlgoGetHeuristic(lt, g->op, g->a[i], g->b[i], g->c[i], g->c[i],
                                                 pref, 1, best, n);
  cublasLtMatmulPreferenceDestroy(pref);
  return status;
}

inline int lt_choose(cublasLtHandle_t lt, LtGemm* g, int i, Ctx* c) {
  cublasLtMatmulHeuristicResult_t best;
  int n = 0;
  // A heuristic that finds nothing under the mask may say so by an error status, not n = 0.
  if (lt_best(lt, g, i, c, CUBLASLT_REDUCTION_SCHEME_NONE, &best, &n) == 0 && n > 0) {
    g->algo[i] = best.algo;
    g->split_k[i] = 1;
    return 0;
  }
  FT_TRY(lt_best(lt, g, i, c, CUBLASLT_REDUCTION_SCHEME_MASK, &best, &n));
  if (n == 0) return (int)CUBLAS_STATUS_NOT_SUPPORTED;
  g->algo[i] = best.algo;
  g->split_k[i] = 0;
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
  for (int i = 0; i < 2; ++i) {
    const int B = G->rows[i];
    LtGemm *f = &G->forward, *u = &G->update;
    FT_TRY(lt_layout(&f->a[i], FT_IN, FT_CLASSES, FT_IN));
    FT_TRY(lt_layout(&f->b[i], FT_IN, B, FT_IN));
    FT_TRY(lt_layout(&f->c[i], FT_CLASSES, B, FT_CLASSES));
    FT_TRY(lt_layout(&u->a[i], FT_IN, B, FT_IN));
    FT_TRY(lt_layout(&u->b[i], FT_CLASSES, B, FT_CLASSES));
    FT_TRY(lt_layout(&u->c[i], FT_IN, FT_CLASSES, FT_IN));
    FT_TRY(lt_choose(G->lt, f, i, c));
    FT_TRY(lt_choose(G->lt, u, i, c));
  }
  return 0;
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
