"""What fa_tune::attention accepts: its checks (metadata only), the call forms, and the strides.

Every refusal is one ValueError sentence ("fa_tune::attention: ..."), decided from shapes,
dtypes, devices and the library's dispatch table alone: no data access, no host sync, so the
fake implementation (torch.compile's tracing) runs the same checks. The values inside device
metadata (cu_seqlens_q/k, seqused_k, a block table's entries) are the kernel's to check (op.py's
status words).

Call forms (``Call``):

* fixed length: q [B, S_q, Hq, D], k/v [B, S_k, Hkv, D]; causal needs S_q <= S_k (the mask is
  aligned bottom-right: query i sees keys 0 .. i + S_k - S_q);
* with device metadata (any of cu_seqlens_q, cu_seqlens_k, seqused_k): q packed [total_q, Hq,
  D] with cu_seqlens_q (and max_seqlen_q), else [B, S_q, Hq, D]; k/v packed [total_k, Hkv, D]
  with cu_seqlens_k (and max_seqlen_k), else a cache [B, S_cache, Hkv, D] (max_seqlen_k at
  most S_cache, default S_cache); seqused_k [B]: each sequence's filled keys;
* a paged KV cache (block_table [B, max_pages] int32, a library built for pages): k/v
  [num_pages, page_size, Hkv, D], seqused_k the keys per sequence, q fixed or packed with
  cu_seqlens_q, no cu_seqlens_k; max_seqlen_k at most (default) max_pages * page_size. A paged
  library's device-scheduled kernel takes only such calls (its fixed-length one stays plain).

Strides: q, k and v may be any strided views whose head dim is contiguous; the kernel reads
their batch, sequence and head strides through TMA, which wants 16-byte aligned rows: a stride
that is not a multiple of 8 elements, or a data pointer off 16 bytes, makes the op copy that
tensor (``kernel_tensor``, said once per process).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from .library import Library

MAX_ELEMS = 2**31 - 1  # the kernel's element offsets into q, k, v, o are 32-bit
_BF16 = torch.bfloat16


class CopyWarning(UserWarning):
    """fa_tune::attention copied an input whose layout TMA cannot read."""


def fail(msg: str) -> None:
    raise ValueError(f"fa_tune::attention: {msg}")


def shape_text(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


@dataclass(frozen=True)
class Pages:
    """A paged call's cache and table as the C ABI takes them (fa_tune.h, ABI 5): rows per page,
    pages in k and v, table entries per sequence, and elements between two sequences' rows of
    the table (max_pages for one sequence, whose row stride nothing reads)."""

    page_size: Any
    num_pages: Any
    max_pages: Any
    table_stride: Any


@dataclass(frozen=True)
class Call:
    """A checked call: how many sequences, the lengths the dispatcher picks the bucket by
    (seqlen_q / seqlen_k: S_q / S_k, or max_seqlen_q / max_seqlen_k with device metadata; a
    SymInt while tracing) and which tensors are packed."""

    batch: Any
    seqlen_q: Any
    seqlen_k: Any
    total_q: Any  # rows of packed q (0 when not packed)
    total_k: Any  # rows of packed k/v (0 when not packed)
    packed_q: bool = False
    packed_k: bool = False
    device_metadata: bool = False
    pages: Pages | None = None  # a paged KV cache's geometry (block_table given)

    def lse_shape(self, q: torch.Tensor) -> tuple[Any, ...]:
        """lse: [B, Hq, S_q], or [Hq, total_q] with packed q (FlashAttention's layouts)."""
        if self.packed_q:
            return (q.shape[1], q.shape[0])
        return (q.shape[0], q.shape[2], q.shape[1])


def _ints(*xs: Any) -> bool:
    return all(isinstance(x, int) for x in xs)


def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
          softmax_scale: float | None, cu_seqlens_q: torch.Tensor | None,
          cu_seqlens_k: torch.Tensor | None, max_seqlen_q: Any, max_seqlen_k: Any,
          seqused_k: torch.Tensor | None, lib: Library, window: int = 0, softcap: float = 0.0,
          sinks: torch.Tensor | None = None, block_table: torch.Tensor | None = None) -> Call:
    """Raise ValueError (one sentence) for input the library cannot run; else the call's form."""
    if block_table is not None:
        call = _check_paged(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k,
                            max_seqlen_q, max_seqlen_k, seqused_k, block_table, lib, window)
    elif cu_seqlens_q is None and cu_seqlens_k is None and seqused_k is None:
        if max_seqlen_q is not None or max_seqlen_k is not None:
            fail("max_seqlen_q and max_seqlen_k go with cu_seqlens_q / cu_seqlens_k (varlen) or "
                 "seqused_k; a fixed-length call takes its lengths from q and k")
        call = _check_fixed(q, k, v, causal, softmax_scale, lib, window)
    else:
        call = _check_scheduled(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k,
                                max_seqlen_q, max_seqlen_k, seqused_k, lib, window)
    _check_masks(q, window, softcap, sinks, lib)
    return call


def _check_masks(q: torch.Tensor, window: int, softcap: float, sinks: torch.Tensor | None,
                 lib: Library) -> None:
    """The models' masks (fa_tune.h, ABI 4) against what the library's kernel carries."""
    if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= 2**30:
        fail(f"window must be a number of keys from 1 to 2^30 (transformers' sliding_window), "
             f"or 0 for none; got {window!r}")
    if window and not lib.window:
        fail(f"window={window}: {lib.path.name} is built without sliding windows (export one "
             "for a problem class with :w)")
    if not (softcap >= 0 and math.isfinite(softcap)):
        fail(f"softcap must be finite and >= 0 (0: none); got {softcap}")
    if (softcap > 0) != lib.softcap:
        fail(f"softcap={softcap}: {lib.path.name} is built "
             + ("for softcapped scores; pass the model's cap (> 0)" if lib.softcap
                else "without softcapping (export one for a problem class with :cap)"))
    if sinks is None:
        return
    if not lib.sinks:
        fail(f"sinks given: {lib.path.name} is built without attention sinks (export one for a "
             "problem class with :sinks)")
    Hq = q.shape[-2]
    if sinks.dim() != 1 or (_ints(sinks.shape[0], Hq) and sinks.shape[0] != Hq):
        fail(f"sinks must be 1-D [Hq] = [{Hq}], one logit per query head; got "
             f"{shape_text(sinks)}")
    if sinks.dtype != torch.float32:
        fail(f"sinks is {sinks.dtype}; the kernel takes torch.float32 (sinks.float())")
    if sinks.device != q.device:
        fail(f"sinks must be on q's device {q.device}; got {sinks.device}")
    if sinks.shape[0] > 1 and sinks.stride(0) != 1:
        fail(f"sinks with stride {tuple(sinks.stride())} is not contiguous")


def _check_fixed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 softmax_scale: float | None, lib: Library, window: int = 0) -> Call:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        fail(f"q, k and v must be 4-D BSHD [batch, seq, heads, head_dim]; got q {shape_text(q)}, "
             f"k {shape_text(k)}, v {shape_text(v)} (packed rows need cu_seqlens_q / "
             "cu_seqlens_k)")
    B, Sq, Hq, D = q.shape
    if B < 1 or Sq < 1 or Hq < 1:
        fail(f"q {shape_text(q)} is empty; B, S and Hq must be at least 1")
    if tuple(k.shape) != tuple(v.shape) or k.shape[0] != B or k.shape[3] != D:
        fail(f"k and v must be [{B}, S_k, Hkv, {D}] for q {shape_text(q)}; got k "
             f"{shape_text(k)}, v {shape_text(v)}")
    Sk, Hkv = k.shape[1], k.shape[2]
    if Sk < 1:
        fail(f"k {shape_text(k)} has no keys; S_k must be at least 1")
    _check_common(q, k, v, causal, softmax_scale, lib)
    if causal and _ints(Sq, Sk) and Sq > Sk:
        fail(f"causal with S_q={Sq} queries over S_k={Sk} keys: the mask is aligned bottom-right "
             f"(query i sees keys 0 .. i + S_k - S_q), so {Sq - Sk} query rows would see no key; "
             "pass at least as many keys as queries, or causal=False")
    if _ints(Hq, Hkv, Sq, Sk, window) and lib.bucket_for(Hq, Hkv, Sq, Sk, window) == -1:
        win = f" window={window}" if window else ""
        fail(f"no bucket of {lib.path.name} serves B={B} Hq={Hq} Hkv={Hkv} S_q={Sq} S_k={Sk}"
             f"{win}; it serves {lib.serves_text()}")
    return Call(B, Sq, Sk, 0, 0)


def _check_common(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  softmax_scale: float | None, lib: Library) -> None:
    """The checks every form shares, once the ranks are right."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != _BF16:
            fail(f"{name} is {t.dtype}; the kernel takes torch.bfloat16 only")
    if k.device != q.device or v.device != q.device:
        fail(f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    if q.shape[-1] != lib.head_dim:
        fail(f"head dim {q.shape[-1]}: this library is built for head dim {lib.head_dim}")
    Hq, Hkv = q.shape[-2], k.shape[-2]
    if Hkv < 1 or Hq % Hkv != 0:
        fail(f"Hq={Hq} must be a multiple of Hkv={Hkv}")
    if bool(causal) != lib.causal:
        fail(f"causal={bool(causal)}: this library is built "
             f"{'causal' if lib.causal else 'non-causal'} only")
    if softmax_scale is not None and not (softmax_scale > 0 and math.isfinite(softmax_scale)):
        fail(f"softmax_scale must be finite and > 0 (None: 1/sqrt(head_dim)); got {softmax_scale}")
    for name, t in (("q", q), ("k", k)):
        if t.numel() > MAX_ELEMS:
            fail(f"{name} {shape_text(t)} has 2^31 elements or more; the kernel's offsets are "
                 "32-bit")


def _check_meta(t: torch.Tensor, name: str, entries: Any, what: str, q: torch.Tensor) -> None:
    """An int32 metadata vector of ``entries`` entries on q's device, contiguous."""
    if t.dim() != 1:
        fail(f"{name} must be 1-D [{what}]; got {shape_text(t)}")
    if t.dtype != torch.int32:
        fail(f"{name} is {t.dtype}; the kernel takes torch.int32 ({name}.to(torch.int32))")
    if t.device != q.device:
        fail(f"{name} must be on q's device {q.device} (the kernel reads it there); got "
             f"{t.device}")
    if t.shape[0] > 1 and t.stride(0) != 1:
        fail(f"{name} with stride {tuple(t.stride())} is not contiguous")
    if _ints(entries, t.shape[0]) and t.shape[0] != entries:
        fail(f"{name} must have {what} = {entries} entries; got {shape_text(t)}")


def _max_len(value: Any, name: str) -> None:
    if isinstance(value, int):  # a SymInt while tracing: checked when it runs
        if value < 1:
            fail(f"{name} must be at least 1 (the longest sequence's length); got {value}")
        if value > MAX_ELEMS:
            fail(f"{name} {value} exceeds the kernel's 32-bit lengths")


def _q_form(q: torch.Tensor, cu_q: torch.Tensor | None, max_q: Any) -> tuple[Any, Any, Any]:
    """(sequences, rows of packed q or 0, max_seqlen_q) of a device-scheduled call's q."""
    if cu_q is not None:
        if q.dim() != 3:
            fail(f"with cu_seqlens_q, q is packed [total_q, Hq, head_dim]; got q {shape_text(q)}")
        if cu_q.dim() != 1 or cu_q.shape[0] < 2:
            fail(f"cu_seqlens_q must be 1-D [num_seqs + 1] with at least 2 entries; got "
                 f"{shape_text(cu_q)}")
        if max_q is None:
            fail("cu_seqlens_q needs max_seqlen_q (the longest query sequence, as "
                 "flash_attn_varlen_func's)")
        return cu_q.shape[0] - 1, q.shape[0], max_q
    if q.dim() != 4:
        fail(f"q {shape_text(q)} is packed [total_q, Hq, head_dim]: pass cu_seqlens_q and "
             "max_seqlen_q too" if q.dim() == 3 else
             f"q must be 4-D [batch, seq, heads, head_dim] or packed with cu_seqlens_q; got "
             f"{shape_text(q)}")
    if max_q is not None and not (_ints(max_q, q.shape[1]) and max_q == q.shape[1]):
        fail(f"max_seqlen_q goes with cu_seqlens_q; q {shape_text(q)} is fixed length "
             f"(S_q = {q.shape[1]})")
    return q.shape[0], 0, q.shape[1]


def _check_scheduled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                     softmax_scale: float | None, cu_q: torch.Tensor | None,
                     cu_k: torch.Tensor | None, max_q: Any, max_k: Any,
                     seqused_k: torch.Tensor | None, lib: Library, window: int = 0) -> Call:
    """check() for a call with device metadata (their values are the kernel's to check)."""
    batch, total_q, seqlen_q = _q_form(q, cu_q, max_q)
    if k.dim() != (3 if cu_k is not None else 4) or tuple(k.shape) != tuple(v.shape):
        if cu_k is None and k.dim() == 3:
            fail(f"k and v {shape_text(k)} are packed [total_k, Hkv, head_dim]: pass "
                 "cu_seqlens_k and max_seqlen_k too (without them, k and v are a cache "
                 "[batch, seqlen_k, Hkv, head_dim])")
        form = ("packed [total_k, Hkv, head_dim]" if cu_k is not None
                else "a cache [batch, seqlen_k, Hkv, head_dim]")
        fail(f"k and v must be {form}, alike; got k {shape_text(k)}, v {shape_text(v)}")
    if k.shape[-1] != q.shape[-1]:
        fail(f"k and v must have q's head dim {q.shape[-1]}; got k {shape_text(k)}")
    if cu_k is not None:
        if max_k is None:
            fail("cu_seqlens_k needs max_seqlen_k (the longest key sequence, as "
                 "flash_attn_varlen_func's)")
        total_k, seqlen_k = k.shape[0], max_k
    else:
        if _ints(k.shape[0], batch) and k.shape[0] != batch:
            fail(f"k and v {shape_text(k)} must hold one cache row per sequence ({batch})")
        if max_k is not None and _ints(max_k) and max_k > k.shape[1]:
            fail(f"max_seqlen_k {max_k} exceeds the cache's {k.shape[1]} rows")
        total_k, seqlen_k = 0, k.shape[1] if max_k is None else max_k
    _scheduled_tail(q, k, v, causal, softmax_scale, cu_q, cu_k, seqused_k, lib, window, batch,
                    total_q, seqlen_q, seqlen_k, max_q, max_k, paged=False)
    return Call(batch, seqlen_q, seqlen_k, total_q, total_k, cu_q is not None,
                cu_k is not None, True)


def _scheduled_tail(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    softmax_scale: float | None, cu_q: torch.Tensor | None,
                    cu_k: torch.Tensor | None, seqused_k: torch.Tensor | None, lib: Library,
                    window: int, batch: Any, total_q: Any, seqlen_q: Any, seqlen_k: Any,
                    max_q: Any, max_k: Any, paged: bool) -> None:
    """What every device-scheduled call shares, once q, k and v have their forms: the metadata
    vectors, the common checks, the lengths and the bucket (and its kind: paged or not)."""
    if cu_q is not None:
        _check_meta(cu_q, "cu_seqlens_q", batch + 1, "num_seqs + 1", q)
    if cu_k is not None:
        _check_meta(cu_k, "cu_seqlens_k", batch + 1,
                    "num_seqs + 1" if cu_q is not None else "batch + 1", q)
    if seqused_k is not None:
        _check_meta(seqused_k, "seqused_k", batch, "num_seqs" if cu_q is not None else "batch",
                    q)
    rows_q = total_q if cu_q is not None else batch * seqlen_q
    if q.shape[-2] < 1 or (_ints(rows_q) and rows_q < 1):
        fail(f"q {shape_text(q)} is empty; its rows and Hq must be at least 1")
    if _ints(k.numel()) and k.numel() < 1:
        fail(f"k {shape_text(k)} has no keys")
    _check_common(q, k, v, causal, softmax_scale, lib)
    _max_len(max_q, "max_seqlen_q")
    _max_len(max_k, "max_seqlen_k")
    why = lib.varlen_missing()
    if why is not None:
        fail(why)
    Hq, Hkv = q.shape[-2], k.shape[-2]
    i = None
    if _ints(Hq, Hkv, seqlen_q, seqlen_k, window):
        i = lib.bucket_for(Hq, Hkv, seqlen_q, seqlen_k, window)
        lens = f"max_seqlen_q={seqlen_q} max_seqlen_k={seqlen_k}"
        if i == -1:
            fail(f"no bucket of {lib.path.name} serves {'paged' if paged else 'varlen'} "
                 f"Hq={Hq} Hkv={Hkv} {lens}; it serves {lib.serves_text()}")
        if i is not None:
            why = lib.varlen_missing(i)
            if why is not None:
                fail(f"{why} ({lens} picks it)")
    _check_paged_kind(lib, i, paged)


def _check_paged_kind(lib: Library, index: int | None, paged: bool) -> None:
    """A paged kernel's device-scheduled calls read a paged cache only, an unpaged one's never
    (fa_tune.h): the call's kind against its bucket's (or the library's)."""
    has = lib.paged_at(index)
    if has is None or has == paged:  # None: buckets differ and symbolic lengths pick one later
        return
    where = lib.where(index)
    if paged:
        fail(f"block_table given: {where} is built without a paged KV cache (export one for a "
             "problem class with :pP)")
    fail(f"{where} is built for a paged KV cache: its device-scheduled kernel (cu_seqlens_q, "
         "cu_seqlens_k, seqused_k) reads k and v through block_table only; pass the block "
         "table, or use a library built without pages")


def _check_paged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 softmax_scale: float | None, cu_q: torch.Tensor | None,
                 cu_k: torch.Tensor | None, max_q: Any, max_k: Any,
                 seqused_k: torch.Tensor | None, table: torch.Tensor, lib: Library,
                 window: int = 0) -> Call:
    """check() for a call with a block table (FA3's page_table): k and v [num_pages,
    page_size, Hkv, D], seqused_k the keys per sequence; the entries are the kernel's to check."""
    if not lib.paged:
        _check_paged_kind(lib, None, True)
    if cu_k is not None:
        fail("cu_seqlens_k and block_table together: a paged cache's keys per sequence are "
             "seqused_k (cache_seqlens), as with FlashAttention's page_table")
    batch, total_q, seqlen_q = _q_form(q, cu_q, max_q)
    if k.dim() != 4 or tuple(k.shape) != tuple(v.shape):
        fail(f"with block_table, k and v are a paged cache [num_pages, page_size, Hkv, "
             f"head_dim], alike; got k {shape_text(k)}, v {shape_text(v)}")
    if k.shape[-1] != q.shape[-1]:
        fail(f"k and v must have q's head dim {q.shape[-1]}; got k {shape_text(k)}")
    if table.dim() != 2:
        fail(f"block_table must be 2-D [batch, max_pages]; got {shape_text(table)}")
    if table.dtype != torch.int32:
        fail(f"block_table is {table.dtype}; the kernel takes torch.int32 "
             "(block_table.to(torch.int32))")
    if table.device != q.device:
        fail(f"block_table must be on q's device {q.device} (the kernel reads it there); got "
             f"{table.device}")
    n_seq, max_pages = table.shape
    if _ints(n_seq, batch) and n_seq != batch:
        fail(f"block_table must have one row per sequence: [{batch}, max_pages]; got "
             f"{shape_text(table)}")
    if _ints(max_pages) and max_pages < 1:
        fail(f"block_table {shape_text(table)} has no entries per sequence")
    if max_pages > 1 and table.stride(1) != 1:
        fail(f"block_table with strides {tuple(table.stride())} is not contiguous along its "
             "pages (a row's entries must be adjacent; rows may be strided)")
    # One sequence: its row stride is never read (and a size-1 dim's stride is arbitrary).
    row_stride = table.stride(0) if n_seq > 1 else max_pages
    if _ints(row_stride, max_pages) and row_stride < max_pages:
        fail(f"block_table's rows overlap (row stride {row_stride} < {max_pages} entries); "
             "pass block_table.contiguous()")
    if _ints(row_stride) and row_stride > MAX_ELEMS:
        fail(f"block_table's row stride {row_stride} exceeds the kernel's 32-bit strides")
    num_pages, page_size = k.shape[0], k.shape[1]
    if _ints(page_size) and not (8 <= page_size <= 4096 and page_size & (page_size - 1) == 0):
        fail(f"page size {page_size} (k.shape[1]) must be a power of two from 8 to 4096 rows")
    if _ints(num_pages) and num_pages < 1:
        fail(f"k {shape_text(k)} has no pages")
    if _ints(num_pages) and num_pages > MAX_ELEMS:
        fail(f"k {shape_text(k)} has 2^31 pages or more; the table's entries are int32")
    cap = max_pages * page_size
    if max_k is not None and _ints(max_k, cap) and max_k > cap:
        fail(f"max_seqlen_k {max_k} exceeds the {cap} keys a block_table row holds "
             f"(max_pages {max_pages} x page_size {page_size})")
    if max_k is None and _ints(cap) and cap > MAX_ELEMS:
        fail(f"block_table rows of {max_pages} pages of {page_size} keys exceed the kernel's "
             "32-bit lengths; pass max_seqlen_k (the longest sequence's keys)")
    seqlen_k = cap if max_k is None else max_k
    _scheduled_tail(q, k, v, causal, softmax_scale, cu_q, None, seqused_k, lib, window, batch,
                    total_q, seqlen_q, seqlen_k, max_q, max_k, paged=True)
    return Call(batch, seqlen_q, seqlen_k, total_q, 0, cu_q is not None, False, True,
                Pages(page_size, num_pages, max_pages, row_stride))


# ---- strides ------------------------------------------------------------------------------------
_DIMS = {4: ("batch", "sequence", "head"), 3: ("row", "head")}


def _layout(t: torch.Tensor) -> tuple[tuple[int, int, int] | None, str, str]:
    """(kernel strides, "", "") or (None, what breaks TMA's rule, why in words)."""
    sizes, strides = t.shape, t.stride()
    n = t.dim()
    if sizes[-1] > 1 and strides[-1] != 1:
        return None, "head-dim stride", f"its head dim has stride {strides[-1]}, not 1"
    if t.data_ptr() % 16:
        return None, "alignment", (f"its data pointer is {t.data_ptr() % 16} bytes past a "
                                   f"16-byte boundary (storage offset {t.storage_offset()})")
    out = [0, 0, 0]
    dense = sizes[-1]
    for d in range(n - 2, -1, -1):
        s = dense if sizes[d] == 1 else strides[d]
        if s < 1 or s % 8:
            return None, f"{_DIMS[n][d]} stride", (
                f"its {_DIMS[n][d]} stride {s} is not a positive multiple of 8 elements")
        out[3 - (n - 1 - d)] = s
        dense *= sizes[d]
    return (out[0], out[1], out[2]), "", ""


def kernel_strides(t: torch.Tensor) -> tuple[tuple[int, int, int] | None, str]:
    """The (batch, sequence, head) element strides the kernel reads ``t`` [B, S, H, D] or packed
    [rows, H, D] with (batch 0 for packed), or (None, why it must be copied first). A dimension
    of size 1 gets the stride a dense tensor would have: TMA never steps along it, but the
    library checks every stride (the op's C++ launch path does the same, attention_op.cpp)."""
    strides, _, why = _layout(t)
    return strides, why


_warned: set[str] = set()


def kernel_tensor(t: torch.Tensor, name: str) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``t`` and its kernel strides, or a dense copy where TMA cannot read it as it is (with a
    CopyWarning the first time per tensor name and cause in this process)."""
    strides, kind, why = _layout(t)
    if strides is not None:
        return t, strides
    if f"{name}:{kind}" not in _warned:
        _warned.add(f"{name}:{kind}")
        warnings.warn(f"fa_tune::attention copies {name} {shape_text(t)} (strides "
                      f"{tuple(t.stride())}) on every such call: {why}, and TMA reads 16-byte "
                      "aligned rows; lay it out so to skip the copy (said once per process)",
                      CopyWarning, stacklevel=4)
    t = t.clone(memory_format=torch.contiguous_format)
    strides, _, _ = _layout(t)
    assert strides is not None  # a fresh dense tensor from torch's allocator is aligned
    return t, strides
