// Rungs `+cublas`, `+report-10` and `+fused-loss`: both GEMMs through cuBLAS (cublasLt, their
// algorithms chosen at setup: cublas_gemms.cuh), the rest hand-written.
// `+report-10` and `+fused-loss` differ only in the flags the Python row passes (FT_STATS every 10
// epochs, FT_FUSED).
#include "cublas_gemms.cuh"

struct Library {
  CublasGemms gemms;  // the cublasLt handle, both GEMMs' layouts and chosen algorithms
};

struct CublasOps {
  static int create(Ctx* c) {
    c->lib = new Library;
    return cublas_gemms_create(&c->lib->gemms, c);
  }
  static int bind(Ctx*, cudaStream_t) { return 0; }  // cublasLt takes the stream at each call
  static int destroy(Ctx* c) {
    if (c->lib == nullptr) return 0;
    int status = cublas_gemms_destroy(&c->lib->gemms);
    delete c->lib;
    return status;
  }

  static int forward(Ctx* c, int B, cudaStream_t s) {
    return cublas_forward(&c->lib->gemms, c, B, s);
  }
  static int softmax(Ctx* c, int B, cudaStream_t s) {
    softmax_kernel<<<blocks(B, 128), 128, 0, s>>>(c->z, B, c->p);
    return (int)cudaGetLastError();
  }
  static int update(Ctx* c, int B, cudaStream_t s) { return cublas_update(&c->lib->gemms, c, B, s); }
};

FT_EXPORT_ENTRY_POINTS(CublasOps)
FT_EXPORT_GEMM_CHOICE
