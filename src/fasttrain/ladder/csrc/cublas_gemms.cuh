// Both GEMMs of a step through cuBLAS, for the families from `+cublas` on.
//
// cuBLAS is column-major; our row-major arrays are their transposes: x [B,784] is xᵀ (784×B, ld
// 784), W [10,784] is Wᵀ (784×10, ld 784), z and g [B,10] are zᵀ, gᵀ (10×B, ld 10).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>

#include "common.cuh"

// Forward: zᵀ = W · xᵀ + zᵀ, onto z pre-filled with the bias (beta = 1 adds it).
inline int cublas_forward(cublasHandle_t h, Ctx* c, int B, cudaStream_t s) {
  bias_fill_kernel<<<blocks(B * FT_CLASSES, 256), 256, 0, s>>>(c->b, B, c->z);
  FT_LAUNCHED();
  const float one = 1.f;
  return (int)cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, FT_CLASSES, B, FT_IN, &one, c->W, FT_IN,
                          c->xb, FT_IN, &one, c->z, FT_CLASSES);
}

// Weight gradient and update in one GEMM, Wᵀ ← Wᵀ - lr · xᵀ · g (alpha = -lr, beta = 1: the
// gradient is never stored): m = 784, n = 10, k = B, A = xᵀ (N), B = g (T); then the bias kernel.
//
// Through cublasLt with the algorithm chosen at setup, not cublasSgemm's pick. For this shape
// cublasSgemm chooses split-K (H100, 2026-11-26: sm80_xmma_gemm 32x64 7.26 µs + cublasLt
// splitKreduce 5.28 µs a step): m·n is only 25 of its 32x64 tiles, so it splits the 128-long k to
// fill the GPU, and pays a second kernel to reduce the splits, far more than the split saves on a
// k of 128 (16 steps of 8). We take the heuristic's best algorithm that does not split k
// (CUBLASLT_ALGO_CONFIG_SPLITK_NUM == 1); if it offers none, its best with the split forced to 1
// (checked by cublasLtMatmulAlgoCheck), else its best as is. The transposes are fixed by the
// layouts (W row-major is Wᵀ column-major; a GEMM cannot write a transposed output).
struct LtUpdate {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x[2] = {}, g[2] = {};  // [0] full batch, [1] the last one
  cublasLtMatmulAlgo_t algo[2];
  int rows[2] = {0, 0};
  int split_k[2] = {0, 0};  // the chosen algorithms' k splits (1 unless cuBLAS insisted)
};

inline int lt_choose(LtUpdate* u, Ctx* c, int i) {
  cublasLtMatmulPreference_t pref = nullptr;
  FT_TRY(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t bytes = c->workspace_bytes;
  int status = (int)cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes);
  cublasLtMatmulHeuristicResult_t found[16];
  int n = 0;
  if (status == 0)
    status = (int)cublasLtMatmulAlgoGetHeuristic(u->lt, u->op, u->x[i], u->g[i], u->w, u->w, pref,
                                                 16, found, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  FT_TRY(status);
  if (n == 0) return (int)CUBLAS_STATUS_NOT_SUPPORTED;
  auto splits = [](const cublasLtMatmulAlgo_t& a) {
    int32_t k = 1;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k, sizeof k,
                                         &written);
    return k;
  };
  for (int j = 0; j < n; ++j)
    if (splits(found[j].algo) == 1) {
      u->algo[i] = found[j].algo;
      u->split_k[i] = 1;
      return 0;
    }
  cublasLtMatmulAlgo_t forced = found[0].algo;
  int32_t one = 1;
  uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulHeuristicResult_t checked;
  if (cublasLtMatmulAlgoConfigSetAttribute(&forced, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one,
                                           sizeof one) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoConfigSetAttribute(&forced, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none,
                                           sizeof none) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoCheck(u->lt, u->op, u->x[i], u->g[i], u->w, u->w, &forced, &checked) ==
          CUBLAS_STATUS_SUCCESS &&
      checked.workspaceSize <= c->workspace_bytes) {
    u->algo[i] = forced;
    u->split_k[i] = 1;
    return 0;
  }
  u->algo[i] = found[0].algo;
  u->split_k[i] = splits(found[0].algo);
  return 0;
}

inline int lt_update_create(LtUpdate* u, Ctx* c) {
  FT_TRY(cublasLtCreate(&u->lt));
  // Plain FP32 compute (no TF32), as the cuBLAS handle's default math mode.
  FT_TRY(cublasLtMatmulDescCreate(&u->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t n = CUBLAS_OP_N, t = CUBLAS_OP_T;
  FT_TRY(cublasLtMatmulDescSetAttribute(u->op, CUBLASLT_MATMUL_DESC_TRANSA, &n, sizeof n));
  FT_TRY(cublasLtMatmulDescSetAttribute(u->op, CUBLASLT_MATMUL_DESC_TRANSB, &t, sizeof t));
  FT_TRY(cublasLtMatrixLayoutCreate(&u->w, CUDA_R_32F, FT_IN, FT_CLASSES, FT_IN));
  u->rows[0] = c->batch;
  u->rows[1] = c->n % c->batch ? c->n % c->batch : c->batch;
  for (int i = 0; i < 2; ++i) {
    FT_TRY(cublasLtMatrixLayoutCreate(&u->x[i], CUDA_R_32F, FT_IN, u->rows[i], FT_IN));
    FT_TRY(cublasLtMatrixLayoutCreate(&u->g[i], CUDA_R_32F, FT_CLASSES, u->rows[i], FT_CLASSES));
    FT_TRY(lt_choose(u, c, i));
  }
  return 0;
}

inline int lt_update_destroy(LtUpdate* u) {
  for (int i = 0; i < 2; ++i) {
    if (u->x[i]) cublasLtMatrixLayoutDestroy(u->x[i]);
    if (u->g[i]) cublasLtMatrixLayoutDestroy(u->g[i]);
  }
  if (u->w) cublasLtMatrixLayoutDestroy(u->w);
  if (u->op) cublasLtMatmulDescDestroy(u->op);
  return u->lt ? (int)cublasLtDestroy(u->lt) : 0;
}

inline int cublas_update(LtUpdate* u, Ctx* c, int B, cudaStream_t s) {
  const int i = B == u->rows[0] ? 0 : 1;  // every batch but the last is full
  const float alpha = -c->lr, one = 1.f;
  FT_TRY(cublasLtMatmul(u->lt, u->op, &alpha, c->xb, u->x[i], c->p, u->g[i], &one, c->W, u->w,
                        c->W, u->w, &u->algo[i], c->workspace, c->workspace_bytes, s));
  sgd_update_kernel<<<1, SGD_THREADS, 0, s>>>(c->W, nullptr, c->b, c->p, B, c->lr);
  return (int)cudaGetLastError();
}

// The handle onto stream s, with our fixed workspace back: cublasSetStream unconditionally resets
// the workspace to cuBLAS's default pool (cuBLAS docs, cublasSetStream), which it would then
// allocate from inside a graph capture.
inline int cublas_bind(cublasHandle_t h, Ctx* c, cudaStream_t s) {
  FT_TRY(cublasSetStream(h, s));
  return (int)cublasSetWorkspace(h, c->workspace, c->workspace_bytes);
}

// A handle in plain FP32 (the default math mode: no TF32, as the rungs are checked against float64
// to fp32 tolerance), with a fixed workspace so that graph capture allocates nothing.
inline int cublas_create(cublasHandle_t* h, Ctx* c) {
  FT_TRY(cublasCreate(h));
  FT_TRY(cublasSetMathMode(*h, CUBLAS_DEFAULT_MATH));
  return (int)cublasSetWorkspace(*h, c->workspace, c->workspace_bytes);
}
