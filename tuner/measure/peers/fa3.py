"""FlashAttention-3 through flash-attn-4's CuTe DSL port (its sm90 path).

``flash_attn.cute.interface.flash_attn_func(q, k, v, causal=...)`` takes BSHD tensors, so the
shared inputs go in untouched (a packed varlen batch goes to ``flash_attn_varlen_func`` with
cu_seqlens_q / cu_seqlens_k and max_seqlen_q / max_seqlen_k, its [total, H, D] tensors being
the [1, total, H, D] views without the leading 1): q [B, S_q, Hq, D] and k, v [B, S_k, Hkv, D]
natively (GQA/MQA when Hkv < Hq), head dims 64, 128 and 256, causal or not; with S_q < S_k its
causal mask is aligned bottom-right, as fa-tune's. Strided views (a problem's ``:qkv`` or
``:bhsd`` layout: slices of one fused QKV tensor, k and v over [B, Hkv, S_k, D] memory) go in as
they are: the interface's ``maybe_contiguous`` copies only a tensor whose head dim is not
contiguous (and, since flash-attention PR #2745, one whose strides or address are not 16-byte
aligned), which fa-tune's layouts never are; ``prepare`` declines rather than time such a copy
(``strided_views_reason``). We ask for the LSE too
(``return_lse=True``): fa-tune's kernel writes it by default, and FA3 skips it when no input
needs a gradient, so without the flag FA3 would do less work than the kernel it is compared
with. The first call JIT-compiles the kernel (CuTe DSL -> cubin, seconds; once per head dim,
GQA group and mask); ``prepare`` makes that call, outside the timed region.

The models' masks go in as the interface's own arguments (flash_attn/cute/interface.py,
``flash_attn_func`` / ``flash_attn_varlen_func``): a sliding window of W keys as ``window_size=
(W - 1, 0)`` causal and ``(W - 1, None)`` not (this interface's None is "no limit"; hopper's
``flash_attn_interface`` spells it -1, which here would be a limit of -1), ``softcap=C``, the
sinks as ``learnable_sink`` (FP32 [Hq]: natural-log logits joining each row's denominator, the
LSE including them). Each only when the problem has it, so a plain problem's call is what it was;
an installed version whose function lacks one of those arguments declines the problem at
``prepare``.

A paged KV cache (issue 37) goes to ``flash_attn_varlen_func`` whichever the queries: its
``flash_attn_func`` takes no ``page_table`` (flash-attn-4 4.0.0b36, flash_attn/cute/interface.py).
k and v are the page pools [num_pages, page_size, Hkv, D], ``page_table`` the int32 [B,
max_pages] block table (contiguous rows, as ``_flash_attn_fwd`` asserts), ``seqused_k`` the key
counts and ``max_seqlen_k`` the longest; q is [B, S_q, Hq, D] without cu_seqlens_q (the LSE then
[B, Hq, S_q]) or, packed, [total_q, Hq, D] with cu_seqlens_q / max_seqlen_q. cu_seqlens_k is
never passed with a page table (the interface asserts that too: the keys' offsets are pages).
Every page size fa-tune makes (8 .. 4096 rows) is taken: on sm90 a page of exactly the kernel's
key tile (128 rows at D 64 and 128, never at D 256's 80) loads by TMA, any other size through
cp.async row by row (``paged_kv_non_tma``). The TMA path reads a sequence's whole last page, and
the interface's docstring asks the rows past the sequence's keys to be finite (P = 0 times NaN
is NaN): ``PeerLaunch`` zeroes them once when it binds a paged problem.

Installing without a network: lab/h200/fa3_stage1.sh and fa3_stage2.sh; with ``pip --target`` the
folder ``<target>/nvidia_cutlass_dsl/dsl_packages`` must be on PYTHONPATH as well.
"""

from __future__ import annotations

import inspect
from typing import Any

from tuner.measure.peers.base import (
    Peer,
    PeerMasks,
    PeerPages,
    Unsupported,
    dist_version,
    module_missing,
    problem_reason,
    strided_views_reason,
    torch_cuda_reason,
)


class FA3Peer(Peer):
    name = "fa3"
    label = "FlashAttention-3 (flash-attn-4, sm90)"

    def __init__(self, return_lse: bool = True) -> None:
        self.return_lse = return_lse
        self._fn: Any = None
        self._varlen_fn: Any = None
        self._qkv: tuple[Any, Any, Any] | None = None
        self._varlen: tuple[Any, Any, int, int] | None = None
        self._pages: PeerPages | None = None
        self._causal = True
        self._masks: dict[str, Any] = {}  # the models' masks as the interface's arguments
        self._lse: Any = None

    def available(self) -> tuple[bool, str]:
        reason = torch_cuda_reason() or module_missing("flash_attn")
        if reason:
            return False, reason
        try:
            self._load()
        except Exception as exc:  # an import failure inside the package is a reason, not a crash
            first = str(exc).splitlines()[0] if str(exc) else ""
            return False, (
                f"flash_attn.cute does not import ({type(exc).__name__}: {first}); is "
                "<site>/nvidia_cutlass_dsl/dsl_packages on PYTHONPATH?"
            )
        return True, "ok"

    def _load(self) -> Any:
        if self._fn is None:
            from flash_attn.cute.interface import flash_attn_func, flash_attn_varlen_func

            self._fn = flash_attn_func
            self._varlen_fn = flash_attn_varlen_func
        return self._fn

    def version(self) -> str:
        return (
            f"flash-attn-4 {dist_version('flash-attn-4', 'fa4')}, "
            f"nvidia-cutlass-dsl {dist_version('nvidia-cutlass-dsl')}, "
            f"quack-kernels {dist_version('quack-kernels')}"
        )

    def supports(self, problem: Any) -> str | None:
        return problem_reason(problem, varlen=True, masks=("window", "softcap", "sinks"),
                              paged=True, who=self.name)

    @staticmethod
    def mask_args(causal: bool, masks: PeerMasks | None) -> dict[str, Any]:
        """The interface's arguments for the models' masks (none for a plain problem)."""
        kw: dict[str, Any] = {}
        if masks is None:
            return kw
        if masks.window > 0:  # causal: no key after the diagonal; else none on the right
            kw["window_size"] = (masks.window - 1, 0 if causal else None)
        if masks.softcap > 0:
            kw["softcap"] = float(masks.softcap)
        if masks.sinks is not None:
            kw["learnable_sink"] = masks.sinks
        return kw

    def prepare(self, q: Any, k: Any, v: Any, causal: bool,
                varlen: tuple[Any, Any, int, int] | None = None,
                masks: PeerMasks | None = None, pages: PeerPages | None = None) -> None:
        self._load()
        kw = self.mask_args(causal, masks)
        # Pages: the varlen function, the only one with a page_table (fixed queries too).
        paged = pages is not None
        fn = self._varlen_fn if varlen is not None or paged else self._fn
        params = inspect.signature(fn).parameters
        lacking = [name for name in kw if name not in params]
        if paged:
            lacking += [name for name in ("page_table", "seqused_k") if name not in params]
        if lacking:
            raise Unsupported(f"{self.name}: this flash_attn.cute.interface."
                              f"{getattr(fn, '__name__', 'function')} takes no "
                              f"{', '.join(lacking)} (flash-attn-4 "
                              f"{dist_version('flash-attn-4', 'fa4')})")
        self._masks = kw
        # flash_attn_func makes a tensor contiguous unless it can read it in place: a copy in
        # the timed call would be timed as attention (fused-QKV / KV-cache views: issue 34).
        why = strided_views_reason(self.name, q=q, k=k, v=v)
        if why is not None:
            raise Unsupported(why)
        self._varlen = varlen
        self._pages = pages
        if varlen is not None:  # [1, total, H, D] views -> the packed [total, H, D]
            q = q[0]
            if not paged:  # pages stay [num_pages, page_size, Hkv, D]
                k, v = k[0], v[0]
        self._qkv = (q, k, v)
        self._causal = bool(causal)
        self.run()  # JIT compile now, not in the first warm-up launch

    def run(self) -> Any:
        assert self._qkv is not None, "prepare() first"
        q, k, v = self._qkv
        if self._pages is not None:
            return self._run_paged(q, k, v, self._pages)
        if self._varlen is not None:
            cu_q, cu_k, max_q, max_k = self._varlen
            out, lse = self._varlen_fn(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                       max_seqlen_q=max_q, max_seqlen_k=max_k,
                                       causal=self._causal, return_lse=self.return_lse,
                                       **self._masks)
            # [Hq, total_q] -> [1, Hq, total_q]
            self._lse = None if lse is None else lse.unsqueeze(0)
            return out.unsqueeze(0)
        out, lse = self._fn(q, k, v, causal=self._causal, return_lse=self.return_lse,
                            **self._masks)
        self._lse = lse
        return out

    def _run_paged(self, q: Any, k: Any, v: Any, pages: PeerPages) -> Any:
        """One launch over the page pools: the block table and key counts, no cu_seqlens_k."""
        kw: dict[str, Any] = {}
        if self._varlen is not None:
            cu_q, _, max_q, _ = self._varlen
            kw = {"cu_seqlens_q": cu_q, "max_seqlen_q": max_q}
        out, lse = self._varlen_fn(q, k, v, page_table=pages.page_table,
                                   seqused_k=pages.seqused_k, max_seqlen_k=pages.max_seqlen_k,
                                   causal=self._causal, return_lse=self.return_lse, **kw,
                                   **self._masks)
        if self._varlen is not None:  # packed: [total_q, Hq, D] and [Hq, total_q]
            self._lse = None if lse is None else lse.unsqueeze(0)
            return out.unsqueeze(0)
        self._lse = lse  # [B, Hq, S_q]
        return out

    def lse(self) -> Any | None:
        return self._lse

    def details(self) -> dict[str, Any]:
        fn = ("flash_attn_varlen_func" if self._varlen is not None or self._pages is not None
              else "flash_attn_func")
        out = {"return_lse": self.return_lse, "causal": self._causal,
               "call": f"flash_attn.cute.interface.{fn}"}
        if self._pages is not None:
            out["page_table"] = f"int32 {list(self._pages.page_table.shape)}"
            out["page_size"] = self._pages.page_size
        if "window_size" in self._masks:
            out["window_size"] = list(self._masks["window_size"])
        if "softcap" in self._masks:
            out["softcap"] = self._masks["softcap"]
        if "learnable_sink" in self._masks:
            out["learnable_sink"] = "FP32 [Hq]"
        return out

    def release(self) -> None:
        self._qkv = None
        self._lse = None
        self._varlen = None
        self._pages = None
        self._masks = {}
