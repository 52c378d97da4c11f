"""`triton-fused`: each SGD step is one fused Triton program — gather of the batch's uint8 pixels,
logits, softmax, loss and accuracy accumulation, weight gradient and update — and the program is
persistent: one launch runs a whole epoch's dependent steps in order, so no host and no launch
gap sits between steps.

- One program (one CTA, one SM): the steps depend on each other, and a single program needs no
  cross-SM synchronization (which Triton does not offer); the multi-SM version is `cuda-epoch`.
- The weights (31 KB fp32) are read and written by this one SM every step, so they live in its
  L1/L2 rather than in DRAM; the pixels stay uint8 (a quarter of float32's bytes) and the 1/255
  scale is folded into the logits and the gradient.
- fp32 everywhere: `tl.dot(..., input_precision="ieee")`, never TF32, so the weights match the
  float64 reference to float32 rounding.
- Loss and accuracy are summed on the device and read every 10 epochs.

Versions (the winner is wired in): v1 one launch per step (469 Python launches an epoch, each
~10-20 µs of launch overhead: launch-bound by construction), v2 persistent, one launch per epoch
(this file). Not yet timed on a GPU.

Tested on the CPU under Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported).

Run alone:  python -m fasttrain bench --impl triton-fused
"""

from __future__ import annotations

import torch

from fasttrain.ladder.common import CLASSES, IN_FEATURES, Impl, LadderConfig, LadderData

try:
    import triton
    import triton.language as tl
except ImportError:  # optional: the row reports itself unavailable
    triton = None

READ_LOSS_EVERY = 10
BLOCK_K = 16  # pixels per chunk: the largest with no register spills at 8 warps (ptxas, sm_90;
# 32 and 64 spill, as do 4 or 16 warps)
BLOCK_C = 16  # classes padded to tl.dot's minimum dimension
NUM_WARPS = 8

if triton is not None:

    @triton.jit
    def sgd_steps_kernel(x_ptr, y_ptr, order_ptr, w_ptr, b_ptr, stats_ptr,
                         n, first, n_steps, batch, lr,
                         K: tl.constexpr, C: tl.constexpr, BLOCK_B: tl.constexpr,
                         BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr):
        """`n_steps` SGD steps from batch `first` of the order, in place on w [C, K], b [C];
        x uint8 [N, K], y int64 [N], order int64 [N]; stats fp32 [2] += (loss sum, correct)."""
        rows = tl.arange(0, BLOCK_B)
        cls = tl.arange(0, BLOCK_C)
        cmask = cls < C
        inv255 = 1.0 / 255.0
        loss_acc = tl.zeros([BLOCK_B], tl.float32)
        correct_acc = tl.zeros([BLOCK_B], tl.float32)
        step = first
        while step < first + n_steps:  # (a while loop: the interpreter cannot range() over it)
            start = step * batch
            nb = tl.minimum(batch, n - start)
            rmask = rows < nb
            idx = tl.load(order_ptr + start + rows, mask=rmask, other=0)
            y = tl.load(y_ptr + idx, mask=rmask, other=0)
            # Logits: z = x_u8 @ Wᵀ, K in chunks, then the 1/255 scale and the bias.
            z = tl.zeros([BLOCK_B, BLOCK_C], tl.float32)
            for k0 in range(0, K, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                kmask = ks < K
                xb = tl.load(x_ptr + idx[:, None] * K + ks[None, :],
                             mask=rmask[:, None] & kmask[None, :], other=0).to(tl.float32)
                wt = tl.load(w_ptr + cls[None, :] * K + ks[:, None],
                             mask=kmask[:, None] & cmask[None, :], other=0.0)  # [BLOCK_K, C]
                z += tl.dot(xb, wt, input_precision="ieee")
            bias = tl.load(b_ptr + cls, mask=cmask, other=0.0)
            z = z * inv255 + bias[None, :]
            z = tl.where(cmask[None, :], z, float("-inf"))
            # Softmax, loss, accuracy; rows past the batch end (the last partial batch) masked.
            zmax = tl.max(z, axis=1)
            e = tl.exp(z - zmax[:, None])
            se = tl.sum(e, axis=1)
            onehot = cls[None, :] == y[:, None]
            zy = tl.sum(tl.where(onehot, z, 0.0), axis=1)
            loss_acc += tl.where(rmask, tl.log(se) + zmax - zy, 0.0)
            correct_acc += tl.where(rmask & (zy == zmax), 1.0, 0.0)
            # d(mean loss)/dz, with the learning rate folded in: lr * (softmax - onehot) / nb.
            g = e / se[:, None] - tl.where(onehot, 1.0, 0.0)
            g = tl.where(rmask[:, None] & cmask[None, :], g, 0.0) * (lr / nb)
            # Every thread has read this step's weights before any thread overwrites them.
            tl.debug_barrier()
            for k0 in range(0, K, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                kmask = ks < K
                xb = tl.load(x_ptr + idx[:, None] * K + ks[None, :],
                             mask=rmask[:, None] & kmask[None, :], other=0).to(tl.float32)
                gw = tl.dot(tl.trans(g), xb, input_precision="ieee")  # [C, BLOCK_K]
                wptr = w_ptr + cls[:, None] * K + ks[None, :]
                wmask = cmask[:, None] & kmask[None, :]
                w = tl.load(wptr, mask=wmask, other=0.0)
                tl.store(wptr, w - gw * inv255, mask=wmask)
            tl.store(b_ptr + cls, bias - tl.sum(g, axis=0), mask=cmask)
            # The update is visible to every thread of the program before the next step reads.
            tl.debug_barrier()
            step += 1
        tl.store(stats_ptr, tl.load(stats_ptr) + tl.sum(loss_acc, axis=0))
        tl.store(stats_ptr + 1, tl.load(stats_ptr + 1) + tl.sum(correct_acc, axis=0))


def sgd_steps(x, y, order, w, b, stats, first: int, n_steps: int, batch: int, lr: float) -> None:
    """Launch `n_steps` fused steps (one program) on tensors of any device Triton runs on."""
    if batch > 128:
        raise ValueError(f"triton-fused keeps a batch in one program: batch ≤ 128, got {batch}")
    sgd_steps_kernel[(1,)](x, y, order, w, b, stats, len(y), first, n_steps, batch, lr,
                           K=IN_FEATURES, C=CLASSES, BLOCK_B=max(16, triton.next_power_of_2(batch)),
                           BLOCK_K=BLOCK_K, BLOCK_C=BLOCK_C, num_warps=NUM_WARPS)


class TritonFused(Impl):
    name = "triton-fused"
    device = "cuda"

    @classmethod
    def unavailable(cls, env, cfg):
        if triton is None:
            return "triton is not installed"
        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        if cfg.batch_size > 128:
            return f"one program holds a batch of at most 128 samples, not {cfg.batch_size}"
        return None

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        dev = torch.device("cuda")
        self.x = torch.from_numpy(data.train_x).to(dev)  # uint8 [N, 784]
        self.y = torch.from_numpy(data.train_y).to(dev)
        self.orders = torch.from_numpy(data.orders).to(dev)
        self.w = torch.from_numpy(data.w0).to(dev).contiguous()
        self.b = torch.from_numpy(data.b0).to(dev)
        self.stats = torch.zeros(2, device=dev)
        self.steps = -(-data.n_train // cfg.batch_size)
        # Compile now (setup time): a whole epoch on scratch weights, since Triton specializes
        # the kernel on its integer arguments' values (== 1, multiple of 16).
        sgd_steps(self.x, self.y, self.orders[0], self.w.clone(), self.b.clone(),
                  self.stats.clone(), 0, self.steps, cfg.batch_size, cfg.lr)
        self.epochs_summed = 0

    def train_epoch(self, epoch: int) -> float | None:
        sgd_steps(self.x, self.y, self.orders[epoch], self.w, self.b, self.stats,
                  0, self.steps, self.cfg.batch_size, self.cfg.lr)
        self.epochs_summed += 1
        if (epoch + 1) % READ_LOSS_EVERY and epoch + 1 != self.cfg.epochs:
            return None
        mean = self.stats[0].item() / (self.data.n_train * self.epochs_summed)  # host read
        self.stats.zero_()
        self.epochs_summed = 0
        return mean

    def params(self):
        return self.w.cpu().numpy().copy(), self.b.cpu().numpy().copy()
