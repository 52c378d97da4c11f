"""The lab: commands that measure and explain rather than train.

`doctor` (what devices this machine has and whether tensors land where they should), `profile`
(where a training step's time goes and what limits it), `sampler` (GPU utilization and memory
over time, from NVML). They build on the engine and never change it.
"""
