"""The lab: models of the machine and their measurements, built on the engine and never changing it.

memory (+ batch_size): a step's bytes, part by part, and the fastest batch that fits; scaling: the
data-parallel step on N GPUs (+ layout_choice: which layout; configured: a model of yours
described for both, from one step counted here); profile (+ trace, classify): where a step's time
goes and what bounds it; experiments: the course lab's exercises; doctor: devices and placement;
sampler: NVML over time.
None imports argparse or rich: the commands that print them live in `fasttrain.commands`.
"""
