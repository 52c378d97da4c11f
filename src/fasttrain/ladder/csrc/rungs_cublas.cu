// Rungs `+cublas`, `+report-10` and `+fused-loss`: both GEMMs through cuBLAS (the weight gradient's
// through cublasLt, its algorithm chosen: cublas_gemms.cuh), the rest hand-written.
// `+report-10` and `+fused-loss` differ only in the flags the Python row passes (FT_STATS every 10
// epochs, FT_FUSED).
#include "cublas_gemms.cuh"

struct Library {
  cublasHandle_t cublas = nullptr;
  LtUpdate update;  // the weight-gradient GEMM's cublasLt handle, layouts and chosen algorithms
};

struct CublasOps {
  static int create(Ctx* c) {
    c->lib = new Library;
    FT_TRY(cublas_create(&c->lib->cublas, c));
    return lt_update_create(&c->lib->update, c);
  }
  static int bind(Ctx* c, cudaStream_t s) { return cublas_bind(c->lib->cublas, c, s); }
  static int destroy(Ctx* c) {
    if (c->lib == nullptr) return 0;
    int lt = lt_update_destroy(&c->lib->update);
    int status = c->lib->cublas ? (int)cublasDestroy(c->lib->cublas) : 0;
    delete c->lib;
    if (status == 0) status = lt;
    return status;
  }

  static int forward(Ctx* c, int B, cudaStream_t s) {
    return cublas_forward(c->lib->cublas, c, B, s);
  }
  static int softmax(Ctx* c, int B, cudaStream_t s) {
    softmax_kernel<<<blocks(B, 128), 128, 0, s>>>(c->z, B, c->p);
    return (int)cudaGetLastError();
  }
  static int update(Ctx* c, int B, cudaStream_t s) { return cublas_update(&c->lib->update, c, B, s); }
};

FT_EXPORT_ENTRY_POINTS(CublasOps)
