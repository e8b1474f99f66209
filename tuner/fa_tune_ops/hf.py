"""fa-tune as a Hugging Face transformers attention backend (``attn_implementation="fa_tune"``).

transformers calls an attention function as ``fn(module, query, key, value, attention_mask,
scaling=None, dropout=0.0, **kwargs)`` with query [B, Hq, S, D] and key/value [B, Hkv, S, D]
and expects (output [B, S, Hq, D], weights or None). The op takes BSHD: ``transpose(1, 2)``
gives it without a copy when the memory is BSHD already, as Llama's projections leave it.

Packed sequences (several sequences in one row, FlashAttention's "padding-free" batches) go to
the op's varlen path, flattened to [B * S, H, D] (a view), in either of transformers' two forms:

* FlashAttention's keyword arguments ``cu_seq_lens_q``/``cu_seq_lens_k`` (equal: query length =
  key length per sequence) and ``max_length_q``/``max_length_k``, as
  ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` makes them;
* ``position_ids`` that restart, which transformers' mask creation detects (no cache, no padding
  mask). The registered mask function (``mask``) is sdpa's, except that for exactly that case
  (the causal mask of packed sequences, nothing else) it returns ``PackedSequences`` instead of
  materialising a [B, 1, S, S] mask; the backend takes cu_seqlens from it.

Anything else that needs a mask (padding, overlays of a model's own) reaches the backend as
sdpa's mask and is refused, so nothing is silently computed without its mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import op as _op  # noqa: F401 - registers torch.ops.fa_tune.attention

NAME = "fa_tune"
_VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _fail(msg: str) -> None:
    raise ValueError(f"attn_implementation='{NAME}': {msg}")


class PackedSequences:
    """The mask of packed sequences as this backend's mask function gives it: transformers'
    [B, S] sequence ids (tokens of one sequence share an id, in order). cu_seqlens and
    max_seqlen are computed on the first layer's call (one host sync per forward, not per
    layer) and reused by the others, which get the same object."""

    def __init__(self, sequence_ids: torch.Tensor) -> None:
        self.sequence_ids = sequence_ids
        self._varlen: tuple[torch.Tensor, int] | None = None

    def varlen(self) -> tuple[torch.Tensor, int]:
        """(cu_seqlens int32 [num_seqs + 1] over the B * S flattened tokens, max_seqlen)."""
        if self._varlen is None:
            ids = self.sequence_ids
            starts = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
            starts[:, 1:] = ids[:, 1:] != ids[:, :-1]  # a row's first token starts one too
            first = starts.reshape(-1).nonzero().reshape(-1)
            cu = torch.cat([first, first.new_full((1,), ids.numel())]).to(torch.int32)
            self._varlen = (cu, int((cu[1:] - cu[:-1]).max()))
        return self._varlen


def _closure(fn: Any, name: str) -> Any:
    """The value a nested function closed over as ``name`` (None: no such variable)."""
    code = getattr(fn, "__code__", None)
    if code is None or name not in code.co_freevars or fn.__closure__ is None:
        return None
    return fn.__closure__[code.co_freevars.index(name)].cell_contents


def _packed_sequence_ids(mask_function: Callable[..., Any] | None) -> torch.Tensor | None:
    """The [B, S] sequence ids when ``mask_function`` is exactly transformers' causal mask of
    packed sequences, ``and_masks(causal_mask_function [remapped to position_ids],
    packed_sequence_mask_function(ids))``; None for anything else (an overlay, a window, another
    transformers version's composition), which then gets sdpa's mask."""
    from transformers import masking_utils as mu

    if getattr(mask_function, "__qualname__", "") != "and_masks.<locals>.and_mask":
        return None
    parts = _closure(mask_function, "mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2:
        return None
    base, packed = parts
    if getattr(packed, "__qualname__", "") != "packed_sequence_mask_function.<locals>.inner_mask":
        return None
    remap = "remap_positions_for_packed_sequence.<locals>.inner_mask"
    if getattr(base, "__qualname__", "") == remap:
        base = _closure(base, "mask_function")  # causal on positions = causal within a sequence
    if base is not mu.causal_mask_function:
        return None
    ids = _closure(packed, "packed_sequence_mask")
    return ids if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None


def mask(*args: Any, **kwargs: Any) -> Any:
    """The backend's AttentionMaskInterface entry: sdpa's mask (None for a causal prefill
    without padding), or PackedSequences for packed sequences and nothing else."""
    from transformers.masking_utils import sdpa_mask

    if kwargs.get("attention_mask") is None:
        ids = _packed_sequence_ids(kwargs.get("mask_function"))
        if ids is not None:
            return PackedSequences(ids)
    return sdpa_mask(*args, **kwargs)


# The last (cu_seq_lens_q, cu_seq_lens_k) pair found equal, with their versions: every layer
# gets the same two tensors, and comparing them costs a host sync.
_same_pair: tuple[torch.Tensor, torch.Tensor, int, int] | None = None


def _same_lengths(cu_q: torch.Tensor, cu_k: torch.Tensor) -> bool:
    global _same_pair
    if cu_q is cu_k:
        return True
    if cu_q.shape != cu_k.shape:
        return False
    p = _same_pair
    if p is not None and p[0] is cu_q and p[1] is cu_k and (p[2], p[3]) == (cu_q._version,
                                                                           cu_k._version):
        return True
    if torch.compiler.is_compiling():  # no data-dependent branch in a graph: trusted
        return True
    if not torch.equal(cu_q, cu_k.to(cu_q.device)):
        return False
    _same_pair = (cu_q, cu_k, cu_q._version, cu_k._version)
    return True


def _varlen_args(query: torch.Tensor, kwargs: dict[str, Any],
                 packed: PackedSequences | None) -> tuple[torch.Tensor, int] | None:
    """(cu_seqlens on query's device as int32, max_seqlen) of a packed batch; None: not one."""
    missing = [k for k in _VARLEN_KWARGS if kwargs.get(k) is None]
    if 0 < len(missing) < len(_VARLEN_KWARGS):
        _fail(f"packed sequences need {', '.join(_VARLEN_KWARGS)}; {', '.join(missing)} "
              f"{'is' if len(missing) == 1 else 'are'} missing")
    if not missing:
        cu, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
        if not _same_lengths(cu, cu_k):
            _fail("cu_seq_lens_q != cu_seq_lens_k: fa_tune serves packed prefill with query "
                  "length = key length per sequence")
        max_seqlen = max(int(kwargs["max_length_q"]), int(kwargs["max_length_k"]))
    elif packed is not None:
        cu, max_seqlen = packed.varlen()
    else:
        return None
    return cu.to(device=query.device, dtype=torch.int32), max_seqlen  # as the op takes it


def _flat(x: torch.Tensor, name: str) -> torch.Tensor:
    """[B, H, S, D] (a view of BSHD memory) -> [B * S, H, D] packed rows, without a copy."""
    t = x.transpose(1, 2)
    if not t.is_contiguous():
        _fail(f"{name} {list(x.shape)} with strides {tuple(x.stride())} is not a view of BSHD "
              "memory; packed sequences are read as [tokens, heads, head_dim] rows")
    return t.reshape(-1, t.shape[2], t.shape[3])


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Any,
                      scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    packed = attention_mask if isinstance(attention_mask, PackedSequences) else None
    if attention_mask is not None and packed is None:
        _fail("got an attention mask; fa_tune serves causal prefill without padding (pass no "
              "padded batch, or pack its sequences: cu_seq_lens_q/k and max_length_q/k)")
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
    varlen = _varlen_args(query, kwargs, packed)
    if varlen is None:
        out, _ = torch.ops.fa_tune.attention(query.transpose(1, 2), key.transpose(1, 2),
                                             value.transpose(1, 2), bool(causal), scaling)
        return out, None
    B, H, S, D = query.shape
    out, _ = torch.ops.fa_tune.attention(_flat(query, "query"), _flat(key, "key"),
                                         _flat(value, "value"), bool(causal), scaling, *varlen)
    return out.view(B, S, H, D), None


def register(name: str = NAME) -> None:
    """Register the backend under ``name`` with transformers, and its mask function (``mask``):
    a causal prefill without padding then reaches the backend with no mask, packed sequences
    as PackedSequences, and a padded batch with a mask (refused), instead of transformers
    dropping the mask for an unknown backend."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError(f"fa_tune_ops.register_hf needs transformers with AttentionInterface "
                          f"(pip install 'transformers>=4.48'): {e}") from None
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask)
