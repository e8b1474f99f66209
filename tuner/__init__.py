"""fa-tune: autotuner for FlashAttention prefill forward kernels on Hopper (sm_90a)."""

from __future__ import annotations

import importlib.metadata

try:
    __version__ = importlib.metadata.version("fa-tune")
except importlib.metadata.PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0.1.0"
