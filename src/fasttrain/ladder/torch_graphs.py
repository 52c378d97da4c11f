"""`torch-graphs`: plain PyTorch ops on static device buffers, a whole epoch captured as CUDA
graphs and replayed with no host involvement.

- Every training sample is stored once on the device as one float32 row
  `[x / 255 (784) | 1 | one-hot label (10)]`: one gather per step fetches the batch's pixels, the
  bias input and the targets. The bias is column 784 of an augmented weight `[10, 785]`, so the
  forward is one matrix product and the weight *and* bias update is one `addmm_`.
- The gradient is written out, not taken by autograd (dL/dz = softmax(z) - onehot for mean
  cross-entropy): a step is 7 kernels (gather, mm, log_softmax, loss accumulate, exp, subtract,
  addmm_ update) where autograd + optimizer would launch ~20.
- The per-sample losses are accumulated element-wise into a `[B, 10]` buffer (one kernel, no
  reduction per step) and reduced only when the loss is read, every 10 epochs.
- The epoch's steps are captured once at setup over a static order buffer; each epoch copies its
  order into that buffer (device to device, no host sync) and replays the graphs. An epoch is
  captured as a few graphs of STEPS_PER_GRAPH steps, since capture time grows with graph size.

What limits it: ~7 dependent kernels per step, each a few µs of launch-to-launch gap even inside a
graph; the ops are far too small to fill the GPU.

Run alone:  python -m fasttrain bench --impl torch-graphs
"""

from __future__ import annotations

import torch

from fasttrain.ladder.common import CLASSES, IN_FEATURES, Impl, LadderConfig, LadderData, batches

READ_LOSS_EVERY = 10
STEPS_PER_GRAPH = 128  # an epoch of 469 steps = 4 graphs
ROW = IN_FEATURES + 1 + CLASSES  # [pixels | 1 | one-hot]


class EpochState:
    """The static buffers one epoch of steps reads and writes, on any device."""

    def __init__(self, data: LadderData, cfg: LadderConfig, device: torch.device):
        n = data.n_train
        rows = torch.zeros(n, ROW, dtype=torch.float32)
        rows[:, :IN_FEATURES] = torch.from_numpy(data.train_x).float() / 255
        rows[:, IN_FEATURES] = 1.0
        rows[torch.arange(n), IN_FEATURES + 1 + torch.from_numpy(data.train_y)] = 1.0
        self.rows = rows.to(device)  # float32 [N, 795]
        w = torch.cat([torch.from_numpy(data.w0), torch.from_numpy(data.b0)[:, None]], dim=1)
        self.w = w.to(device).contiguous()  # float32 [10, 785]: weight | bias
        self.order = torch.zeros(n, dtype=torch.int64, device=device)  # this epoch's order
        self.loss_acc = torch.zeros(cfg.batch_size, CLASSES, device=device)  # sum of -onehot*logp
        self.lr = cfg.lr
        self.spans = batches(n, cfg.batch_size)


def train_steps(s: EpochState, spans) -> None:
    """SGD steps over `s.order[start:stop]` for each span, in place: the code CUDA graphs capture.
    Only fixed-shape views of static buffers and ops without host syncs, so it replays as is."""
    for start, stop in spans:
        nb = stop - start
        batch = s.rows.index_select(0, s.order[start:stop])  # [nb, 795]
        x, target = batch[:, : IN_FEATURES + 1], batch[:, IN_FEATURES + 1 :]
        logp = torch.log_softmax(x @ s.w.T, dim=1)  # [nb, 10]
        s.loss_acc[:nb].addcmul_(logp, target, value=-1.0)
        grad_z = logp.exp_().sub_(target)  # softmax - onehot = d(sum of losses)/dz
        s.w.addmm_(grad_z.T, x, alpha=-s.lr / nb)  # mean over the batch folded into alpha


class TorchGraphs(Impl):
    name = "torch-graphs"
    device = "cuda"

    @classmethod
    def unavailable(cls, env, cfg):
        return None if torch.cuda.is_available() else "needs a CUDA GPU (CUDA graphs)"

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        dev = torch.device("cuda")
        self.orders = torch.from_numpy(data.orders).to(dev)
        self.state = EpochState(data, cfg, dev)
        self.w0 = self.state.w.clone()
        spans = self.state.spans
        chunks = [spans[i : i + STEPS_PER_GRAPH] for i in range(0, len(spans), STEPS_PER_GRAPH)]
        # Warm up on a side stream (cuBLAS handles and workspaces are created here, not inside
        # the capture), then capture; both train, so the weights are reset afterwards.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.state.order.copy_(self.orders[0])
            train_steps(self.state, spans)
        torch.cuda.current_stream().wait_stream(side)
        self.graphs = []
        pool = torch.cuda.graph_pool_handle()
        for chunk in chunks:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                train_steps(self.state, chunk)
            self.graphs.append(g)
        self.state.w.copy_(self.w0)
        self.state.loss_acc.zero_()
        self.epochs_summed = 0

    def train_epoch(self, epoch: int) -> float | None:
        self.state.order.copy_(self.orders[epoch])  # device to device, stream-ordered
        for g in self.graphs:
            g.replay()
        self.epochs_summed += 1
        if (epoch + 1) % READ_LOSS_EVERY and epoch + 1 != self.cfg.epochs:
            return None
        # The one host read in 10 epochs.
        mean = self.state.loss_acc.sum().item() / (self.data.n_train * self.epochs_summed)
        self.state.loss_acc.zero_()
        self.epochs_summed = 0
        return mean

    def params(self):
        w = self.state.w.detach().cpu().numpy()
        return w[:, :IN_FEATURES].copy(), w[:, IN_FEATURES].copy()
