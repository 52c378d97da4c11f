// Rungs `cuda-baseline` and `+no-sync`: every operation a hand-written kernel (common.cuh).
// The two rungs differ only in the flags the Python row passes: FT_SYNC_STEP or not.
#include "common.cuh"

struct Library {};

struct KernelOps {
  static int create(Ctx*) { return 0; }
  static int bind(Ctx*, cudaStream_t) { return 0; }
  static int destroy(Ctx*) { return 0; }

  static int forward(Ctx* c, int B, cudaStream_t s) {
    forward_kernel<<<blocks((long)B * FT_CLASSES * 32, 256), 256, 0, s>>>(c->xb, c->W, c->b, B, c->z);
    return (int)cudaGetLastError();
  }
  static int softmax(Ctx* c, int B, cudaStream_t s) {
    softmax_kernel<<<blocks(B, 128), 128, 0, s>>>(c->z, B, c->p);
    return (int)cudaGetLastError();
  }
  static int update(Ctx* c, int B, cudaStream_t s) {
    weight_grad_kernel<<<FT_IN / WG_K, WG_K * WG_R, 0, s>>>(c->p, c->xb, B, c->gW);
    FT_LAUNCHED();
    sgd_update_kernel<<<blocks(FT_CLASSES * FT_IN, SGD_THREADS), SGD_THREADS, 0, s>>>(
        c->W, c->gW, c->b, c->p, B, c->lr);
    return (int)cudaGetLastError();
  }
};

FT_EXPORT_ENTRY_POINTS(KernelOps)
