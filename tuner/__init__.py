"""fa-tune: autotuner for FlashAttention prefill forward kernels on Hopper (sm_90a)."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # Read on first use: importlib.metadata costs ~30 ms that every `fa-tune` start would pay
    # before the console script can take Ctrl-C (tuner.entry).
    if name != "__version__":
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    import importlib.metadata

    try:
        return importlib.metadata.version("fa-tune")
    except importlib.metadata.PackageNotFoundError:  # a checkout that is not installed
        return "0.1.0"
