"""--cuda-graphs: the whole optimizer step captured in one CUDA graph, then replayed.

    run = build(TrainConfig(precision="bf16", compile=True, cuda_graphs=True))  # attached here
    fit(run)  # steps 1-3 eager (the warm-up), step 4 captured and replayed, then 1 replay a step

What the graph holds (`graph_step`, a plain function over static buffers that also runs
eagerly): the step's micro-batches gathered by index from the dataset on the device (the
indices: a static buffer), forward, loss and backward of each (gradients summed, the detached
loss added to run.loss_sum on the device: loop.accumulate itself), gradient clipping (the norm
stays on the device) and the optimizer's update (the fused AdamW/SGD kernel, which reads the
learning rate from a device tensor). Around each replay the host does only: one device-to-device
copy of the step's indices into the static buffer, one fill of the lr tensor with the schedule's
value, the replay (one launch), and the schedule's step (Python arithmetic). Nothing reads the
device: no host sync.

PyTorch's recipe for capturing a whole network (torch.cuda.graphs, "whole-network capture"):
a few eager iterations on a side stream first (lazy initialisation: cuBLAS and cuDNN handles,
the optimizer's state, torch.compile's compilation and autotuning), gradients set to None before
capture (the captured backward allocates them in the graph's private memory pool and every
replay writes them there), the optimizer marked capturable while it is captured, and inputs
that are static tensors overwritten in place before each replay. The warm-up steps are real
training steps: `graph_step` computes what loop.step computes (tests/engine/test_graphed.py:
bit for bit).

Static tensors, read and written by every replay at the addresses captured: the parameters and
their gradients, the optimizer's state (exp_avg, exp_avg_sq, step counts, momentum buffers),
BatchNorm's buffers, run.loss_sum, and the index and lr buffers here. They must only ever be
updated in place: the logger zeroes loss_sum in place, checkpoint.restore loads the model with
load_state_dict (copy_) and the optimizer's state with optim.load_state (copy_ into the tensors
it holds), the schedule's lr reaches the graph through the lr tensor.

Eligible (the whole step in one graph): one process on CUDA; fp32, tf32 or bf16 (fp16's
GradScaler decides on the host whether to skip a step: refused at config time); data in memory
and on the device; the default step loss(model(x), y); the built-in optimizer and schedule; any
--accum-steps (the accumulated step is one graph); --grad-clip; --channels-last; --compile (the
model compiled in torch.compile's default mode, called inside the captured step). The in-memory
path has no partial batch (an epoch's remainder is dropped: every step has the same shapes).
Otherwise `why_not` names the reason, and the run takes CUDA graphs per module instead:
torch.compile's reduce-overhead mode around the model (what --cuda-graphs did before), the loss,
optimizer and schedule eager; the start line says which path was taken and why.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

WARMUP_STEPS = 3  # eager steps before the capture (torch's whole-network example takes 3)


def why_not(run) -> str | None:
    """Why this run cannot capture its whole step, or None when it can."""
    from fasttrain.engine.optim import BUILTIN_OPTIMIZERS

    cfg, batches = run.cfg, run.batches
    if run.world.size > 1:  # refused at config time (collectives inside a graph): kept honest
        return "more than one process"
    if not hasattr(batches, "step_indices"):
        return ("the data is streamed (a Dataset or DataLoader): each batch comes from the "
                "host, not gathered on the device inside the step")
    if not batches.on_device:
        return ("the data is held on the host (--data-on-device auto found it larger than a "
                "quarter of the free GPU memory): each batch is copied in, not gathered on "
                "the device")
    if cfg.augment:
        return "--augment seeds each batch's random draws on the host"
    if cfg.step:
        return ("a step of yours may do host work (a .item(), Python state) that a replay "
                "would not repeat")
    if cfg.optimizer not in BUILTIN_OPTIMIZERS:
        return ("an optimizer of yours: the captured update needs the built-in fused AdamW or "
                "SGD, which read the learning rate from the device")
    if cfg.scheduler:
        return ("a scheduler of yours may set more than the learning rate (OneCycleLR cycles "
                "the betas), which a replay would freeze")
    if cfg.activation_checkpointing:
        return ("activation checkpointing saves and restores the random state on the host "
                "around each recomputation")
    return None


class GraphStep:
    """The static buffers of the whole-step graph, the graph once captured, and the step
    functions fit calls (`run.step_inputs`, `run.train_step`). `capture=False` never captures:
    every step runs `graph_step` eagerly (the CPU tests)."""

    def __init__(self, run, capture: bool):
        self.run = run
        b = run.batches
        self.idx = torch.zeros((b.accum, b.micro), dtype=torch.int64, device=b.device)
        # The fused kernels read a tensor lr as float32 on CUDA and as a double on the CPU: what
        # each computes with from a Python float, so the tensor changes no bit of the update.
        dtype = torch.float32 if run.device.type == "cuda" else torch.float64
        self.lr = torch.zeros((), dtype=dtype, device=run.device)
        self.capture = capture
        self.side = torch.cuda.Stream(run.device) if capture else None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.steps_to_capture = WARMUP_STEPS + 1  # the warm-up, then the capturing step
        self.warm = 0  # steps run eagerly
        self.replays = 0  # replays since the last log: the train record's graph_replays
        # A resumed checkpoint brings its optimizer flags (load_state_dict takes the saved
        # groups' settings): the captured update needs the fused kernel, which takes the lr as
        # a tensor. One lr for all groups: the built-in groups differ in weight decay only.
        for g in run.opt.param_groups:
            g["fused"], g["foreach"] = True, None

    def inputs(self, run, epoch: int):
        """Each remaining step of `epoch`: its sample indices [accum, micro], on the device."""
        return iter(run.batches.step_indices(epoch, run.step_in_epoch))

    def _load(self, run, idx: torch.Tensor) -> None:
        """The step's inputs into the static buffers: two launches, no sync."""
        self.idx.copy_(idx, non_blocking=True)  # device to device
        self.lr.fill_(run.opt.param_groups[0]["lr"])  # what the schedule set for this step

    def eager_step(self, run, idx: torch.Tensor) -> None:
        """`run.train_step` until the capture: graph_step run eagerly (on a side stream on
        CUDA, as the recipe warms up), gradients dropped, the schedule stepped."""
        if self.capture and self.warm >= WARMUP_STEPS:
            return self._capture_and_replay(run, idx)
        self._load(run, idx)
        side = self.side
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(run.device))
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            graph_step(self)
            run.opt.zero_grad(set_to_none=True)
        if side is not None:
            torch.cuda.current_stream(run.device).wait_stream(side)
        run.sched.step()
        self.warm += 1

    def _capture_and_replay(self, run, idx: torch.Tensor) -> None:
        run.opt.zero_grad(set_to_none=True)  # the captured backward allocates them in the pool
        # Adam's step refuses to be captured unless its groups say capturable. The fused kernel
        # is the same either way (its step counts are on the device already), and the flag is
        # put back so that checkpoints carry the optimizer's settings as built.
        flags = [g.get("capturable") for g in run.opt.param_groups]
        for g in run.opt.param_groups:
            if "capturable" in g:
                g["capturable"] = True
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph):  # syncs the device before and after: once, setup
                graph_step(self)
        except RuntimeError as e:
            # Nothing captured ran (a capture records kernels, it does not execute them), so the
            # weights are as the warm-up left them: go on with the same step, eagerly, and say
            # so — a --cuda-graphs run that cannot capture must not stop, nor pass for graphed.
            self.graph, self.capture = None, False
            run.graph_why = f"the capture failed ({type(e).__name__}: {str(e)[:200]})"
            warnings.warn(f"--cuda-graphs: {run.graph_why}; the whole step runs eagerly from "
                          f"here on (no CUDA graphs)", RuntimeWarning, stacklevel=2)
            run.opt.zero_grad(set_to_none=True)
            return self.eager_step(run, idx)
        finally:
            for g, flag in zip(run.opt.param_groups, flags, strict=True):
                if flag is not None:
                    g["capturable"] = flag
        run.train_step = self.replay_step
        self.replay_step(run, idx)

    def replay_step(self, run, idx: torch.Tensor) -> None:
        """`run.train_step` once captured: the inputs in place, one replay, the schedule."""
        self._load(run, idx)
        self.graph.replay()
        self.replays += 1
        run.sched.step()

    def take_replays(self) -> int:
        n, self.replays = self.replays, 0
        return n


def graph_step(s: GraphStep) -> None:
    """One optimizer step on the samples in s.idx, reading and writing static tensors only:
    gather, forward, loss and backward of each micro-batch (run.forward_backward: loop.accumulate,
    which sums the loss into run.loss_sum), clipping, the update with the lr from s.lr. What is
    captured; gradients are left in place (the eager caller drops them) and the schedule is
    stepped outside, on the host."""
    run = s.run
    run.forward_backward(run, [run.batches.gather(i) for i in s.idx])
    run.clip()
    groups = run.opt.param_groups
    held = [g["lr"] for g in groups]  # the schedule's floats: saved, logged, resumed as before
    for g in groups:
        g["lr"] = s.lr
    try:
        run.opt.step()
    finally:
        for g, lr in zip(groups, held, strict=True):
            g["lr"] = lr


def attach(run, capture: bool | None = None) -> GraphStep:
    """Make `run` train through the whole-step graph (after its checkpoint was restored);
    `capture` defaults to whether the run is on CUDA."""
    s = GraphStep(run, run.device.type == "cuda" if capture is None else capture)
    run.graph, run.step_inputs, run.train_step = s, s.inputs, s.eager_step
    return s


def model_graphs_only(run, module) -> None:
    """The other path: the model's forward and backward run as torch.compile's CUDA graphs
    (reduce-overhead), whose outputs live in the graphs' memory pool and are overwritten by the
    next replay. So each micro-batch begins a new graph step (steps.marking_steps), and the
    gradients exist before the first backward and are zeroed in place (run.grads_to_none):
    autograd then adds the backward's outputs into them instead of taking the pool's tensor as
    .grad, which the next micro-batch's replay would overwrite (pytorch#169545)."""
    from fasttrain.engine import steps

    run.compute_loss = steps.marking_steps(run.compute_loss)
    run.evaluate_loss = steps.marking_steps(run.evaluate_loss)
    for p in module.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    run.grads_to_none = False


def describe(run) -> str:
    """The start line's account of the step under --cuda-graphs ('' without it)."""
    if not run.cfg.cuda_graphs:
        return ""
    if run.graph is not None:
        return (f"; step: one CUDA graph of the whole step (gather, forward, loss, backward, "
                f"{'clip, ' if run.cfg.grad_clip else ''}{run.cfg.optimizer} update), "
                f"replayed after {WARMUP_STEPS} eager warm-up steps")
    return (f"; step: CUDA graphs of the model only (torch.compile reduce-overhead; loss, "
            f"optimizer and schedule eager), not the whole step: {run.graph_why}")
