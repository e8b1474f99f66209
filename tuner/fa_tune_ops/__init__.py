"""fa_tune_ops: a fa-tune kernel library as a PyTorch op and a transformers attention backend.

Shipped in every workload export (``fa-tune export --workload``) beside ``lib/``; its source
lives in fa-tune as ``tuner/fa_tune_ops``. Importing it registers ``torch.ops.fa_tune.attention``
(op.py); ``register_hf()`` registers ``attn_implementation="fa_tune"`` (hf.py); the library is
``lib/libfa_tune_fwd.so`` beside this package, ``$FA_TUNE_LIB``, or ``load(PATH)``. One copy of
the package per process (the op's name is global).
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - exercised where torch is absent
    raise ImportError("fa_tune_ops needs PyTorch: pip install torch") from None

from .hf import attention_forward as hf_attention_forward
from .hf import register as register_hf
from .library import Library, LibraryError, default_path
from .op import attention, check_inputs, library, load

__all__ = ["Library", "LibraryError", "attention", "check_inputs", "default_path",
           "hf_attention_forward", "library", "load", "register_hf"]
