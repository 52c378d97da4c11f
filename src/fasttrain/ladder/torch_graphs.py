"""`torch-graphs`: torch-optimized's epoch — the same static buffers, the same 4-op step — captured
once as ONE CUDA graph and replayed each epoch with no host involvement.

- The graph holds the whole epoch: the shuffle (one gather of the training set into epoch order),
  469 steps of 4 kernels (mm, log_softmax, log_softmax backward = softmax - onehot, addmm_ that
  applies gradient and SGD update in one GEMM), and the epoch's loss sum (3 kernels).
- Each epoch copies its order into the graph's static order buffer (device to device,
  stream-ordered, no host sync) and replays the graph: one host call an epoch.
- The loss is read every 10 epochs, the only host sync.

What limits it: ~4-6 dependent kernels a step (cuBLAS may split a GEMM's K into a GEMM and a
reduction kernel), each ≥ ~1 µs even inside a graph (graph_node_us, measured 1.03 µs on the
H100), plus the GEMMs' own time: in the CUDA rungs on the H100 (cuda_step_profile) cuBLAS took
~16.5 µs a step for the two products at these shapes (a split-K GEMM with its reduction, 12.5 µs,
and a 4 µs one), so the step cannot go much under ~15-20 µs while cuBLAS does the products; the
ops are far too small to fill the GPU. `triton-fused` removes that floor.

Versions: v1 7 kernels a step (gather, mm, log_softmax, loss addcmul, exp, sub, addmm_), 4 graphs
an epoch (H100: 14.7 ms/epoch, 31 µs/step); v2 (this file) 4 ops a step, the gather and the loss
moved to once an epoch, one graph an epoch.

Run alone:  python -m fasttrain bench --impl torch-graphs
"""

from __future__ import annotations

import torch

from fasttrain.ladder.common import Impl, LadderConfig, LadderData
from fasttrain.ladder.torch_optimized import (
    OPS_PER_STEP,
    EpochState,
    read_loss,
    train_epoch_steps,
)


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
        self.state = s = EpochState(data, cfg, dev)
        self.order = torch.empty_like(self.orders[0])  # the graph's static order buffer
        w0 = s.w.clone()
        # Warm up on a side stream (cuBLAS handles and workspaces are created here, not inside
        # the capture), then capture; both train, so the weights and loss are reset afterwards.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.order.copy_(self.orders[0])
            train_epoch_steps(s, self.order)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            train_epoch_steps(s, self.order)
        s.w.copy_(w0)
        s.loss_sum.zero_()
        self.epochs_summed = 0

    def train_epoch(self, epoch: int) -> float | None:
        self.order.copy_(self.orders[epoch])  # device to device, stream-ordered
        self.graph.replay()
        self.epochs_summed += 1
        return read_loss(self, epoch)

    def details(self) -> dict:
        return {"ops_per_step": OPS_PER_STEP, "shuffle": "one gather an epoch", "cuda_graph": True,
                "graphs_per_epoch": 1}

    def params(self):
        return self.state.params()
