// Both GEMMs of a step through cuBLAS, for the families from `+cublas` on.
//
// cuBLAS is column-major; our row-major arrays are their transposes: x [B,784] is xᵀ (784×B, ld
// 784), W [10,784] is Wᵀ (784×10, ld 784), z and g [B,10] are zᵀ, gᵀ (10×B, ld 10).
#pragma once
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

// Weight gradient and update in one GEMM: Wᵀ ← Wᵀ - lr · xᵀ · g (alpha = -lr, beta = 1), so
// the gradient is never stored; then the bias kernel.
inline int cublas_update(cublasHandle_t h, Ctx* c, int B, cudaStream_t s) {
  const float alpha = -c->lr, one = 1.f;
  FT_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, FT_IN, FT_CLASSES, B, &alpha, c->xb, FT_IN, c->p,
                     FT_CLASSES, &one, c->W, FT_IN));
  sgd_update_kernel<<<1, 32, 0, s>>>(c->W, nullptr, c->b, c->p, B, c->lr);
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
