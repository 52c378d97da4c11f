"""Temp (session 15): each kernel's GPU time in v7's epoch, from the profiler."""
import torch
from torch.profiler import ProfilerActivity, profile

from fasttrain.data import load_dataset
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from fasttrain.ladder.cuda_epoch import EpochKernel

cfg = LadderConfig(epochs=8)
data = make_ladder_data(load_dataset("mnist", None, seed=0), cfg)
k = EpochKernel(data, cfg, version=7)
for e in range(3):
    k.run(e)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for e in range(3, 8):
        k.run(e, check_signals=False)
    torch.cuda.synchronize()
k.check_signals()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
