// Rungs `+cublas`, `+report-10` and `+fused-loss`: both GEMMs through cuBLAS, the rest hand-written.
// `+report-10` and `+fused-loss` differ only in the flags the Python row passes (FT_STATS every 10
// epochs, FT_FUSED).
#include "cublas_gemms.cuh"

struct Library {
  cublasHandle_t cublas = nullptr;
};

struct CublasOps {
  static int create(Ctx* c) {
    c->lib = new Library;
    return cublas_create(&c->lib->cublas, c);
  }
  static int bind(Ctx* c, cudaStream_t s) { return cublas_bind(c->lib->cublas, c, s); }
  static int destroy(Ctx* c) {
    int status = c->lib && c->lib->cublas ? (int)cublasDestroy(c->lib->cublas) : 0;
    delete c->lib;
    return status;
  }

  static int forward(Ctx* c, int B, cudaStream_t s) {
    return cublas_forward(c->lib->cublas, c, B, s);
  }
  static int softmax(Ctx* c, int B, cudaStream_t s) {
    softmax_kernel<<<blocks(B, 128), 128, 0, s>>>(c->z, B, c->p);
    return (int)cudaGetLastError();
  }
  static int update(Ctx* c, int B, cudaStream_t s) { return cublas_update(c->lib->cublas, c, B, s); }
};

FT_EXPORT_ENTRY_POINTS(CublasOps)
