"""fa_tune_ops: a fa-tune kernel library as a PyTorch op and a transformers attention backend.

Shipped in every workload export (``fa-tune export --workload``) beside ``lib/``; its source
lives in fa-tune as ``tuner/ship/fa_tune_ops``. Importing it registers
``torch.ops.fa_tune.attention`` (op.py: fixed length with S_q <= S_k, packed batches with
separate cu_seqlens_q / cu_seqlens_k, caches with per-sequence lengths, paged caches through a
block table, strided inputs); ``register_hf()`` registers ``attn_implementation="fa_tune"``
(hf.py); the library is ``lib/libfa_tune_fwd.so`` beside this package, ``$FA_TUNE_LIB``, or
``load(PATH)``. One copy of the package per process (the op's name is global).

Bad device metadata (cu_seqlens, seqused_k, block table entries) never faults: the kernel finds
it, its call's out and lse are NaN, and the op raises ValueError at the next call on that
device, at ``check()``, or at once with ``set_sync_check(True)`` / ``FA_TUNE_OPS_SYNC_CHECK=1``
(status.py). ``stats()`` counts where calls went: the fa-tune kernel, or the transformers
backend's stated fallbacks.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - exercised where torch is absent
    raise ImportError("fa_tune_ops needs PyTorch: pip install torch") from None

from .checks import CopyWarning
from .hf import attention_forward as hf_attention_forward
from .hf import register as register_hf
from .library import Library, LibraryError, default_path
from .op import attention, check_inputs, library, load
from .status import check, reset_stats, set_sync_check, stats

__all__ = ["CopyWarning", "Library", "LibraryError", "attention", "check", "check_inputs",
           "default_path", "hf_attention_forward", "library", "load", "register_hf",
           "reset_stats", "set_sync_check", "stats"]
