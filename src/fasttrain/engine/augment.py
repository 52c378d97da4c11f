"""On-device image augmentation for the in-memory path: `--augment flip,crop:4`.

    aug = Augment("flip,crop:4", seed=0, device=torch.device("cuda"))
    x = aug(x, epoch, index)   # x: float [B, C, H, W], already scaled to [0, 1]

What fast CIFAR trainers do (airbench): the dataset stays on the device and each batch is
flipped and shifted there, with no per-sample Python and no host round trip.
- flip: each image mirrored left-right with probability 1/2.
- crop:P: each image translated by (dy, dx), each uniform over the integers [-P, P], the pixels
  moved in from outside being zeros (a random P-padded crop of the same size).
The draws of a batch come from a device generator seeded from (seed, epoch, index of the
micro-batch in the epoch, rank), so a resumed run draws exactly what the uninterrupted one did
and the draws depend on no other random stream (not on dropout, not on how many batches came
before). Across processes each rank draws for its own share: N processes augment as one does
in distribution, not sample for sample.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fasttrain.errors import UserError


def parse(spec: str) -> tuple[bool, int]:
    """`flip,crop:4` → (flip, pad): one line naming the fix for anything else."""
    flip, pad = False, 0
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, arg = part.partition(":")
        if name == "flip" and not arg:
            flip = True
        elif name == "crop" and arg.isdigit() and int(arg) > 0:
            pad = int(arg)
        else:
            raise UserError(f"--augment {spec!r}: {part!r} is not an augmentation; give flip "
                            f"and/or crop:P (P pixels, ≥ 1), e.g. --augment flip,crop:4")
    if not (flip or pad):
        raise UserError(f"--augment {spec!r}: name flip and/or crop:P, e.g. flip,crop:4")
    return flip, pad


class Augment:
    """Random flips and translations of NCHW float batches, drawn on the device."""

    def __init__(self, spec: str, seed: int, device: torch.device, rank: int = 0):
        self.flip, self.pad = parse(spec)
        self.seed, self.rank = seed, rank
        self.generator = torch.Generator(device=device)

    def draw(self, batch: int, epoch: int, index: int):
        """(flip [B] bool, dy [B], dx [B] int64) for micro-batch `index` of `epoch`. Seeding a
        generator is host work: no sync."""
        from fasttrain.engine.sampling import mix

        g, dev = self.generator, self.generator.device
        g.manual_seed(mix(self.seed, epoch, index, self.rank))
        flip = (torch.rand(batch, generator=g, device=dev) < 0.5 if self.flip
                else torch.zeros(batch, dtype=torch.bool, device=dev))
        shift = torch.randint(-self.pad, self.pad + 1, (2, batch), generator=g, device=dev)
        return flip, shift[0], shift[1]

    def __call__(self, x: torch.Tensor, epoch: int, index: int) -> torch.Tensor:
        return apply(x, *self.draw(len(x), epoch, index), self.pad)


def apply(x: torch.Tensor, flip: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor,
          pad: int) -> torch.Tensor:
    """Image b mirrored if flip[b], then out[b, :, i, j] = x[b, :, i - dy[b], j - dx[b]] (zero
    outside): one gather over a zero-padded copy, for the whole batch at once."""
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    if not pad:
        return x
    b, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))  # [B, C, H+2P, W+2P]
    rows = torch.arange(h, device=x.device) + pad - dy[:, None]  # [B, H]
    cols = torch.arange(w, device=x.device) + pad - dx[:, None]  # [B, W]
    batch = torch.arange(b, device=x.device)[:, None, None]
    # Advanced indices around a slice: the result is [B, H, W, C], returned as an NCHW view
    # (NHWC in memory: the caller makes it the memory format it wants).
    return padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def for_task(spec: str | None, task, seed: int, device: torch.device, rank: int):
    """The Augment of an in-memory image task, or None; refused for other data."""
    if spec is None:
        return None
    x = getattr(task, "train_x", None)
    if x is None or task.train_y is None or x.dim() != 4:
        shape = list(x.shape[1:]) if x is not None else "streamed"
        raise UserError(f"--augment flips and shifts images [N, C, H, W] held in memory; this "
                        f"data's inputs are {shape}: drop --augment (a streamed Dataset "
                        f"augments in its own transform)")
    return Augment(spec, seed, device, rank)
