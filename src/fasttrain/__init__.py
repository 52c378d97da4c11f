"""fasttrain: train neural networks fast on GPUs, correctly on CPUs, and measure what every
optimization buys."""

__version__ = "0.1.0"
