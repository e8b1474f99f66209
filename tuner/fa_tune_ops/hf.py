"""fa-tune as a Hugging Face transformers attention backend (``attn_implementation="fa_tune"``).

transformers calls an attention function as ``fn(module, query, key, value, attention_mask,
scaling=None, dropout=0.0, **kwargs)`` with query [B, Hq, S, D] and key/value [B, Hkv, S, D]
and expects (output [B, S, Hq, D], weights or None). The op takes BSHD: ``transpose(1, 2)``
gives it without a copy when the memory is BSHD already, as Llama's projections leave it.
"""

from __future__ import annotations

from typing import Any

import torch

from . import op as _op  # noqa: F401 - registers torch.ops.fa_tune.attention

NAME = "fa_tune"


def _fail(msg: str) -> None:
    raise ValueError(f"attn_implementation='{NAME}': {msg}")


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    if attention_mask is not None:
        _fail("got an attention mask; fa_tune serves causal prefill without padding (pass no "
              "padded batch; varlen is not built yet)")
    if dropout:
        _fail(f"dropout {dropout} > 0 is not supported (inference only)")
    for arg in ("softcap", "sliding_window", "s_aux"):
        if kwargs.get(arg) is not None:
            _fail(f"{arg} is not supported")
    if query.shape[2] != key.shape[2]:
        _fail(f"query length {query.shape[2]} != key length {key.shape[2]} (decoding with a KV "
              "cache); fa_tune serves prefill only: use another backend for decoding")
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    out, _ = torch.ops.fa_tune.attention(query.transpose(1, 2), key.transpose(1, 2),
                                         value.transpose(1, 2), bool(causal), scaling)
    return out, None


def register(name: str = NAME) -> None:
    """Register the backend under ``name`` with transformers, and sdpa's mask function for it:
    a causal prefill without padding then reaches the backend with no mask, and a padded batch
    with one (refused), instead of transformers dropping the mask for an unknown backend."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        raise ImportError(f"fa_tune_ops.register_hf needs transformers with AttentionInterface "
                          f"(pip install 'transformers>=4.48'): {e}") from None
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)

