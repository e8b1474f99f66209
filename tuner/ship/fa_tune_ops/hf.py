"""fa-tune as a Hugging Face transformers attention backend (``attn_implementation="fa_tune"``).

transformers calls an attention function as ``fn(module, query, key, value, attention_mask,
scaling=None, dropout=0.0, **kwargs)`` with query [B, Hq, S_q, D] and key/value [B, Hkv, S_k,
D] and expects (output [B, S_q, Hq, D], weights or None). The op reads all three through their
strides (``transpose(1, 2)`` views, no copy): the projections' BSHD memory and the default
DynamicCache's [B, H, S, D] memory alike.

Routing, every call counted in ``fa_tune_ops.stats()``:

* the fa-tune kernel: prefill, causal aligned bottom-right, so a prompt continuing a cached
  prefix (S_q < S_k, inside ``model(...)`` with a DynamicCache or ``generate()``) runs it too;
  and packed sequences (the varlen kernel), in either of transformers' forms: FlashAttention's
  keyword arguments ``cu_seq_lens_q``/``cu_seq_lens_k`` and ``max_length_q``/``max_length_k``
  (``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``; the two may differ), or
  ``position_ids`` that restart, which the mask function below hands on as ``PackedSequences``;
  The models' masks run in the kernel where the library's problem class has them: a sliding
  window (Mistral, Gemma-2's local layers, gpt-oss's windowed ones), the logit softcap
  (``softcap``: Gemma-2) and attention sinks (``s_aux``: gpt-oss);
* a stated fallback (fallback.py: FA3 when it imports, else sdpa; eager for softcap or sinks
  without FA3) for the calls the kernel does not serve: decode steps (S_q < DECODE_THRESHOLD),
  a real attention mask (padding, a static cache's, a model's own overlay: run with that mask,
  never dropped), a window, softcap or sinks the library was built without, dropout, another
  dtype, head dim or mask class than the library's, or lengths no bucket serves.

The registered mask function (``mask``) returns no mask exactly when the causal mask is the
plain bottom-right one the kernel computes (causal mask function, no padding, the queries the
last S_q of the S_k keys: no cache, or a DynamicCache), ``SlidingWindow`` when it is that mask
with transformers' sliding-window overlay (the kernel's window; the mask itself is made only if
a fallback needs it), ``PackedSequences`` for packed sequences, and otherwise sdpa's mask,
always materialised (never sdpa's "use is_causal" None, whose alignment is top-left), so a
padded batch reaches the backend with its mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import fallback, status
from . import op as _op

NAME = "fa_tune"
# Query lengths below this go to the fallback: the kernel computes 64-row query tiles per
# consumer warpgroup with no split over the keys, so a decode step of a few tokens would run
# mostly masked rows on a handful of SMs, where FlashAttention's decode path (or sdpa) splits
# the keys across the GPU.
DECODE_THRESHOLD = 64
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


class SlidingWindow:
    """The mask of a sliding-window layer as this backend's mask function gives it: the plain
    bottom-right causal mask with transformers' overlay of ``window`` keys (a query sees its own
    position and the window - 1 before it), which the kernel computes itself. ``tensor()`` makes
    sdpa's mask for a fallback (once)."""

    def __init__(self, window: int, make: Callable[[], Any]) -> None:
        self.window = window
        self._make = make
        self._mask: Any = None

    def tensor(self) -> Any:
        if self._mask is None:
            self._mask = self._make()
        return self._mask


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


def _window_of(mask_function: Callable[..., Any] | None) -> int | None:
    """W when ``mask_function`` is exactly transformers' sliding-window causal mask,
    ``and_masks(sliding_window_overlay(W), causal_mask_function)``; None for anything else."""
    from transformers import masking_utils as mu

    if getattr(mask_function, "__qualname__", "") != "and_masks.<locals>.and_mask":
        return None
    parts = _closure(mask_function, "mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2 or parts[1] is not mu.causal_mask_function:
        return None
    if getattr(parts[0], "__qualname__", "") != "sliding_window_overlay.<locals>.inner_mask":
        return None
    w = _closure(parts[0], "sliding_window")
    return w if isinstance(w, int) and not isinstance(w, bool) and w >= 1 else None


def _kernel_mask(kwargs: dict[str, Any]) -> int | None:
    """0 when the mask transformers asks for is exactly the kernel's causal one, W when it is
    that with a sliding window of W keys, None otherwise. The kernel's: no other overlay, no
    padding, the queries the last q_length positions of the keys (bottom-right; a sliding
    cache's keys may start past position 0, kv_offset). A static cache (kv_length = its size,
    q_offset a tensor) is not."""
    from transformers import masking_utils as mu

    fn = kwargs.get("mask_function", mu.causal_mask_function)
    window = 0 if fn is mu.causal_mask_function else _window_of(fn)
    if window is None or not kwargs.get("allow_is_causal_skip", True):  # the caller wants
        return None                                                     # the mask itself
    q_len, kv_len = kwargs.get("q_length"), kwargs.get("kv_length")
    q_off, kv_off = kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)
    if not all(isinstance(x, int) for x in (q_len, kv_len, q_off, kv_off)):
        return None
    if q_off + q_len != kv_off + kv_len:
        return None
    pad = kwargs.get("attention_mask")
    if pad is None:
        return window
    if pad.dim() != 2:
        return None
    pad = mu.prepare_padding_mask(pad, kv_len, kv_off)[:, :kv_len]
    tracing = getattr(mu, "is_tracing", None)
    if (tracing(pad) if tracing is not None else torch.compiler.is_compiling()):
        return None  # no data-dependent answer while tracing: the mask itself
    return window if bool(mu.fast_all(pad)) else None  # one sync per forward, as sdpa's own


def mask(*args: Any, **kwargs: Any) -> Any:
    """The backend's AttentionMaskInterface entry: None for the plain bottom-right causal mask,
    SlidingWindow for it with a window, PackedSequences for packed sequences, else sdpa's mask,
    materialised."""
    from transformers.masking_utils import sdpa_mask

    if kwargs.get("attention_mask") is None:
        ids = _packed_sequence_ids(kwargs.get("mask_function"))
        if ids is not None:
            return PackedSequences(ids)
    window = _kernel_mask(kwargs)
    full = {**kwargs, "allow_is_causal_skip": False}
    if window == 0:
        return None
    if window is not None:
        return SlidingWindow(window, lambda: sdpa_mask(*args, **full))
    return sdpa_mask(*args, **full)


def _varlen_args(query: torch.Tensor, kwargs: dict[str, Any], packed: PackedSequences | None,
                 ) -> tuple[torch.Tensor, torch.Tensor, int, int] | None:
    """(cu_seqlens_q, cu_seqlens_k on query's device as int32, max_seqlen_q, max_seqlen_k) of a
    packed batch; None: not one."""
    missing = [k for k in _VARLEN_KWARGS if kwargs.get(k) is None]
    if 0 < len(missing) < len(_VARLEN_KWARGS):
        _fail(f"packed sequences need {', '.join(_VARLEN_KWARGS)}; {', '.join(missing)} "
              f"{'is' if len(missing) == 1 else 'are'} missing")
    if not missing:
        cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
        max_q, max_k = int(kwargs["max_length_q"]), int(kwargs["max_length_k"])
    elif packed is not None:
        cu_q, max_q = packed.varlen()
        cu_k, max_k = cu_q, max_q
    else:
        return None
    same = cu_k is cu_q
    cu_q = cu_q.to(device=query.device, dtype=torch.int32)  # as the op takes them
    cu_k = cu_q if same else cu_k.to(device=query.device, dtype=torch.int32)
    return cu_q, cu_k, max_q, max_k


def _fallback_reason(query: torch.Tensor, key: torch.Tensor, attention_mask: Any,
                     causal: bool, dropout: float, masks: _Masks,
                     varlen: tuple[torch.Tensor, torch.Tensor, int, int] | None) -> str | None:
    """Why the kernel does not serve this call (None: it does)."""
    if attention_mask is not None:
        return "attention mask"
    if dropout:
        return "dropout"
    if query.device.type == "cpu":
        return "CPU tensors"
    lib = _op.library()
    why = masks.missing(lib)
    if why is not None:
        return why
    if query.dtype != torch.bfloat16:
        return f"dtype {query.dtype}"
    if query.shape[-1] != lib.head_dim:
        return f"head dim {query.shape[-1]}"
    if bool(causal) != lib.causal:
        return "causal" if causal else "non-causal"
    Hq, Hkv = query.shape[1], key.shape[1]
    if varlen is None:
        s_q, s_k = query.shape[2], key.shape[2]
        if s_q < DECODE_THRESHOLD:
            return f"decode (S_q={s_q} < {DECODE_THRESHOLD})"
        if lib.bucket_for(Hq, Hkv, s_q, s_k, masks.window) == -1:
            return f"no bucket (Hq={Hq} Hkv={Hkv} S_q={s_q} S_k={s_k})"
        return None
    _, _, max_q, max_k = varlen
    i = lib.bucket_for(Hq, Hkv, max_q, max_k, masks.window)
    if i == -1:
        return f"no bucket (varlen Hq={Hq} Hkv={Hkv} max_seqlen_q={max_q} max_seqlen_k={max_k})"
    if lib.varlen_missing(i) is not None:
        return "no varlen kernel"
    if lib.paged_at(i):  # a paged library's varlen kernel reads block tables only
        return "a paged library"
    return None


class _Masks:
    """The models' masks of one call: the window (keys; 0 none), the cap (0 none), the sinks."""

    def __init__(self, window: int, softcap: float, sinks: torch.Tensor | None) -> None:
        self.window, self.softcap, self.sinks = window, softcap, sinks

    @classmethod
    def of(cls, marker: SlidingWindow | None, kwargs: dict[str, Any]) -> _Masks:
        # The mask's window; else the layer's sliding_window argument, which transformers'
        # own FlashAttention path applies whatever the mask (FA takes none).
        window = marker.window if marker is not None else int(kwargs.get("sliding_window") or 0)
        sinks = kwargs.get("s_aux")
        return cls(window, float(kwargs.get("softcap") or 0.0), sinks)

    def missing(self, lib: Any) -> str | None:
        """Why the library's kernel cannot apply these masks (None: it can)."""
        if self.window and not lib.window:
            return "sliding window"
        if (self.softcap > 0) != lib.softcap:
            return "softcap" if self.softcap > 0 else "no softcap (a softcap library)"
        if self.sinks is not None and not lib.sinks:
            return "attention sinks"
        return None

    def op_args(self) -> tuple[Any, ...]:
        """(window, softcap, sinks) as the op takes them (sinks FP32, one per query head), or
        () when the call has none (the op's defaults)."""
        if not self.window and not self.softcap and self.sinks is None:
            return ()
        sinks = self.sinks
        if sinks is not None and sinks.dtype != torch.float32:
            sinks = sinks.float()
        return self.window, self.softcap, sinks


def _kernel(*args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The op, called by name at call time (tests watch the calls here)."""
    return torch.ops.fa_tune.attention(*args)


def _unpacked(t: torch.Tensor) -> torch.Tensor:
    """A packed batch's [B, H, S, D] tensor as the op's [B * S, H, D] rows (a strided view when
    B is 1 or the memory is BSHD; a copy otherwise)."""
    t = t.transpose(1, 2)
    return t[0] if t.shape[0] == 1 else t.reshape(-1, t.shape[2], t.shape[3])


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Any,
                      scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    packed = attention_mask if isinstance(attention_mask, PackedSequences) else None
    marker = attention_mask if isinstance(attention_mask, SlidingWindow) else None
    mask_t = None if packed is not None or marker is not None else attention_mask
    if mask_t is not None and not isinstance(mask_t, torch.Tensor):
        _fail(f"got a {type(mask_t).__name__} mask; this backend's fallbacks take tensor masks "
              "(a flex BlockMask needs attn_implementation='flex_attention')")
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    varlen = _varlen_args(query, kwargs, packed) if mask_t is None else None
    masks = _Masks.of(marker, kwargs)
    why = _fallback_reason(query, key, mask_t, bool(causal), dropout, masks, varlen)
    if why is not None:
        if varlen is not None:
            _fail(f"packed sequences ({why}) have no fallback here; the kernel serves them "
                  "with BF16, the library's head dim and mask, and a bucket for their lengths")
        if marker is not None:  # the window's mask, made now: the fallback applies it
            mask_t = marker.tensor()
        softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
        sliding = None if mask_t is not None else kwargs.get("sliding_window")
        where = fallback.choose(query, mask_t, dropout, sliding, softcap, sinks)
        if not torch.compiler.is_compiling():  # count calls, not traces of them
            status.count(f"fallback:{where}:{why}")
        out = fallback.run(where, query, key, value, mask_t, bool(causal), scaling, dropout,
                           sliding, softcap, sinks)
        return out, None
    extra = masks.op_args()
    if varlen is None:
        meta = (None,) * 5 if extra else ()  # the op's positions up to seqused_k
        out, _ = _kernel(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                         bool(causal), scaling, *meta, *extra)
        return out, None
    B, H, S, D = query.shape
    cu_q, cu_k, max_q, max_k = varlen
    out, _ = _kernel(_unpacked(query), _unpacked(key), _unpacked(value), bool(causal), scaling,
                     cu_q, cu_k, max_q, max_k, *((None, *extra) if extra else ()))
    return out.view(B, S, H, D), None


def register(name: str = NAME) -> None:
    """Register the backend under ``name`` with transformers, and its mask function (``mask``):
    a plain causal prefill or continuation reaches the backend with no mask, packed sequences
    as PackedSequences, and anything else with its mask (then the fallback runs with it),
    instead of transformers dropping the mask for an unknown backend."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError(f"fa_tune_ops.register_hf needs transformers with AttentionInterface "
                          f"(pip install 'transformers>=4.48'): {e}") from None
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask)
