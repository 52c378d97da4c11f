"""fasttrain: train neural networks fast on GPUs, correctly on CPUs, and measure what every
optimization buys.

    import fasttrain
    run = fasttrain.build(model=net, data=(x, y), loss=torch.nn.functional.mse_loss, epochs=5)
    fasttrain.fit(run)

The public API (`build`, `fit`, `step`, `load`, `TrainConfig`, `EarlyStop`, `Run`) is imported on
first use: `import fasttrain` stays cheap.
"""

__version__ = "0.1.0"

_API = ("build", "fit", "step", "load", "TrainConfig", "EarlyStop", "Run", "Preempted",
        "Diverged")


def __getattr__(name: str):
    if name in _API:
        import fasttrain.engine

        return getattr(fasttrain.engine, name)
    raise AttributeError(f"module 'fasttrain' has no attribute {name!r}")


__all__ = [*_API, "__version__"]
