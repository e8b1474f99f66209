"""Where the transformers backend sends the calls the fa-tune kernel does not serve.

In order of preference:

* ``fa3``: FlashAttention-3's CuTe port, ``flash_attn.cute.interface.flash_attn_func`` (when it
  imports; CUDA, BF16/FP16): BSHD views of transformers' [B, H, S, D] tensors, causal aligned
  bottom-right like the kernel, softcap and attention sinks (``learnable_sink``) too. Calls
  without an explicit mask only: FA3 takes no mask tensor.
* ``sdpa``: torch's scaled_dot_product_attention with the mask transformers made, or for a
  causal call with S_q != S_k the bottom-right mask built here (sdpa's own is_causal is aligned
  top-left); a single query (a decode step) sees every key, so it takes none. Sliding windows
  as transformers defines them (keys within the last ``sliding_window`` positions).
* ``eager``: the attention written out in FP32 (softcap and sinks where FA3 is absent: sdpa can
  express neither).

``FA_TUNE_HF_FALLBACK=sdpa`` skips FA3.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

_fa3: Callable[..., Any] | None = None
_fa3_checked = False


def fa3() -> Callable[..., Any] | None:
    """flash_attn.cute.interface.flash_attn_func, or None where it does not import (asked
    once per process)."""
    global _fa3, _fa3_checked
    if not _fa3_checked:
        _fa3_checked = True
        if os.environ.get("FA_TUNE_HF_FALLBACK", "auto") != "sdpa":
            try:
                from flash_attn.cute.interface import flash_attn_func

                _fa3 = flash_attn_func
            except Exception:  # noqa: BLE001 - any import failure means: not available
                _fa3 = None
    return _fa3


def choose(query: torch.Tensor, mask: torch.Tensor | None, dropout: float,
           sliding_window: int | None, softcap: float | None, sinks: torch.Tensor | None) -> str:
    """The fallback for a call: 'fa3', 'sdpa' or 'eager'."""
    special = bool(softcap) or sinks is not None
    fa3_ok = (fa3() is not None and query.is_cuda and query.dtype in (torch.bfloat16,
                                                                      torch.float16)
              and query.shape[-1] <= 256 and mask is None and not dropout
              and sliding_window is None)
    if fa3_ok:
        return "fa3"
    return "eager" if special else "sdpa"


def bottom_right_mask(s_q: int, s_k: int, device: torch.device,
                      sliding_window: int | None = None) -> torch.Tensor:
    """[S_q, S_k] bool, True = attend: query i sees keys 0 .. i + S_k - S_q (FlashAttention's
    causal alignment), and with a window only the last ``sliding_window`` of those."""
    pos = torch.arange(s_q, device=device)[:, None] + (s_k - s_q)  # each query's position
    kv = torch.arange(s_k, device=device)[None, :]
    keep = kv <= pos
    if sliding_window is not None:
        keep &= kv > pos - sliding_window
    return keep


def _mask_for(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, causal: bool,
              sliding_window: int | None) -> tuple[torch.Tensor | None, bool]:
    """(attn_mask, is_causal) for sdpa: the given mask, else sdpa's own causal flag where it
    is right (S_q = S_k), else an explicit bottom-right mask; none for one query."""
    s_q, s_k = query.shape[2], key.shape[2]
    if mask is not None:
        return mask[:, :, :, :s_k], False
    if sliding_window is not None:
        return bottom_right_mask(s_q, s_k, query.device, sliding_window), False
    if not causal or s_q == 1:
        return None, False
    if s_q == s_k:
        return None, True
    return bottom_right_mask(s_q, s_k, query.device), False


def run(where: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        mask: torch.Tensor | None, causal: bool, scaling: float | None, dropout: float = 0.0,
        sliding_window: int | None = None, softcap: float | None = None,
        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of query [B, Hq, S_q, D] over key/value [B, Hkv, S_k, D] by ``where``; the
    output [B, S_q, Hq, D] as transformers expects it."""
    if where == "fa3":
        fn = fa3()
        assert fn is not None
        kw: dict[str, Any] = {"softmax_scale": scaling, "causal": bool(causal)}
        if softcap:
            kw["softcap"] = float(softcap)
        if sinks is not None:
            kw["learnable_sink"] = sinks.to(torch.bfloat16)
        out = fn(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), **kw)
        return out[0] if isinstance(out, tuple) else out
    attn_mask, is_causal = _mask_for(query, key, mask, causal, sliding_window)
    if where == "sdpa":
        gqa = query.shape[1] != key.shape[1]
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                             dropout_p=dropout, is_causal=is_causal,
                                             scale=scaling, enable_gqa=gqa)
        return out.transpose(1, 2).contiguous()
    return _eager(query, key, value, attn_mask, is_causal, scaling, dropout, softcap, sinks)


def _eager(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           attn_mask: torch.Tensor | None, is_causal: bool, scaling: float | None,
           dropout: float, softcap: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax(q k^T) v in FP32, with softcap and a sink logit per head where given."""
    group = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(group, dim=1).float()
    v = value.repeat_interleave(group, dim=1).float()
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = query.float() @ k.transpose(-1, -2) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if is_causal:
        attn_mask = bottom_right_mask(scores.shape[-2], scores.shape[-1], scores.device)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.float()
    if sinks is not None:
        sink = sinks.float().reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    if dropout:
        probs = F.dropout(probs, p=dropout)
    return (probs @ v).to(query.dtype).transpose(1, 2).contiguous()
