// Rungs `+cudnn-softmax` and `+cuda-graphs`: cuBLAS GEMMs, cuDNN's softmax, loss and accuracy fused.
// `+cuda-graphs` differs only in the flag the Python row passes (FT_GRAPH: the epoch is captured
// once per stats setting and replayed).
#include <cudnn.h>

#include "cublas_gemms.cuh"

struct Library {
  CublasGemms gemms;  // the cublasLt handle, both GEMMs' layouts and chosen algorithms
  cudnnHandle_t cudnn = nullptr;
  // z and p as N×C×1×1 tensors: one descriptor for full batches, one for the last partial batch.
  cudnnTensorDescriptor_t full = nullptr, last = nullptr;
};

struct CudnnOps {
  static int create(Ctx* c) {
    Library* L = c->lib = new Library;
    FT_TRY(cublas_gemms_create(&L->gemms, c));
    FT_TRY(cudnnCreate(&L->cudnn));
    FT_TRY(cudnnCreateTensorDescriptor(&L->full));
    FT_TRY(cudnnCreateTensorDescriptor(&L->last));
    int tail = c->n % c->batch ? c->n % c->batch : c->batch;
    FT_TRY(cudnnSetTensor4dDescriptor(L->full, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, c->batch,
                                      FT_CLASSES, 1, 1));
    return (int)cudnnSetTensor4dDescriptor(L->last, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, tail,
                                           FT_CLASSES, 1, 1);
  }
  static int bind(Ctx* c, cudaStream_t s) { return (int)cudnnSetStream(c->lib->cudnn, s); }
  static int destroy(Ctx* c) {
    Library* L = c->lib;
    if (L == nullptr) return 0;
    if (L->full) cudnnDestroyTensorDescriptor(L->full);
    if (L->last) cudnnDestroyTensorDescriptor(L->last);
    if (L->cudnn) cudnnDestroy(L->cudnn);
    int status = cublas_gemms_destroy(&L->gemms);
    delete L;
    return status;
  }

  static int forward(Ctx* c, int B, cudaStream_t s) {
    return cublas_forward(&c->lib->gemms, c, B, s);
  }
  static int softmax(Ctx* c, int B, cudaStream_t) {
    const float one = 1.f, zero = 0.f;
    cudnnTensorDescriptor_t d = B == c->batch ? c->lib->full : c->lib->last;
    return (int)cudnnSoftmaxForward(c->lib->cudnn, CUDNN_SOFTMAX_ACCURATE,
                                    CUDNN_SOFTMAX_MODE_INSTANCE, &one, d, c->z, &zero, d, c->p);
  }
  static int update(Ctx* c, int B, cudaStream_t s) { return cublas_update(&c->lib->gemms, c, B, s); }
};

FT_EXPORT_ENTRY_POINTS(CudnnOps)
FT_EXPORT_GEMM_CHOICE
