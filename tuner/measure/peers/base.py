"""What every peer backend of ``fa-tune compare`` looks like.

A peer wraps one attention implementation behind a few calls so that ``tuner.analysis.compare`` can
time them all with one protocol: ``available()`` says whether it can run here (and why not),
``supports(problem)`` whether it can run one problem of the family (tuner.problem.Problem: GQA,
head dim, mask, S_q queries over S_k keys; None = yes, else a one-line reason), ``version()``
names what was measured, ``prepare(q, k, v, causal)`` binds the shared BSHD inputs (q [B, S_q,
Hq, D], k and v [B, S_k, Hkv, D]; Hkv < Hq is GQA/MQA) and the mask, and does one-time work
(allocation, JIT, autotuning) outside the timed region, and ``run()`` launches one forward on
torch's current stream and returns the output as a [B, S_q, Hq, D] tensor (a view is fine).
``lse()`` returns the [B, Hq, S_q] log-sum-exp of the last run when the backend produces it.
q, k and v are views in the problem's layout (``Problem.layout``): dense, slices of one fused
QKV tensor, or k and v over [B, Hkv, S_k, D] memory; a backend reads them through their strides
or declines (``Unsupported``), never copies them inside the timed call unannounced.
The causal mask is FlashAttention's, aligned bottom-right (query i sees keys 0 .. i + S_k -
S_q): a backend that aligns it otherwise must build that mask or decline the problem, never be
timed on another mask. The models' masks (a sliding window, a logit softcap, attention sinks:
``Problem.window`` / ``softcap`` / ``sinks``) reach ``prepare`` as ``masks`` (``PeerMasks``, the
sinks an FP32 [Hq] tensor on the device); a peer that cannot express one exactly declines the
problem in ``supports`` (``problem_reason(masks=...)`` names those it can), never computes
another. A paged problem (issue 37, ``Problem.page_size``: K and V in pages read through a
block table) reaches ``prepare`` with k and v the page pools [num_pages, page_size, Hkv, D] and
``pages`` (``PeerPages``: the block table and every sequence's key count on the device); a peer
that reads no paged cache declines it in ``supports`` (``problem_reason(paged=...)``). A peer that
finds at
``prepare`` that it cannot run the inputs raises ``Unsupported`` (a ValueError) with the reason:
the measurement path reports it as "unavailable" for that problem, not as an error.

Nothing here imports torch: ``tuner`` and its CLI must import on machines without it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any


def module_missing(name: str) -> str | None:
    """A one-line reason if ``name`` cannot be imported, else None (without importing it)."""
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"python package '{name}' is not installed"


def torch_cuda_reason() -> str | None:
    """Why torch cannot run CUDA kernels here, or None when it can."""
    missing = module_missing("torch")
    if missing:
        return missing
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (9, 0):
        return f"needs sm_90 or newer, found sm_{major}{minor}"
    return None


def dist_version(*names: str) -> str:
    """The installed version of the first distribution found among ``names``, or 'unknown'."""
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


class Unsupported(ValueError):
    """The peer cannot run this problem (the message says why): a row status, not a failure."""


@dataclass(frozen=True)
class PeerMasks:
    """The models' masks of a problem as a peer gets them (issue 36; tuner/problem.py):
    ``window`` keys (a query sees its diagonal key and the window - 1 before it; 0: none),
    ``softcap`` (scores s become C tanh(s / C); 0: none), ``sinks`` (an FP32 [Hq] torch tensor
    of logits joining each row's softmax denominator; None: none)."""

    window: int = 0
    softcap: float = 0.0
    sinks: Any = None

    @property
    def any(self) -> bool:
        return self.window > 0 or self.softcap > 0 or self.sinks is not None


@dataclass(frozen=True)
class PeerPages:
    """A paged KV cache as a peer gets it (issue 37; tuner/paging.py): ``page_size`` rows per
    page; ``page_table`` the block table, an int32 [B, max_pages] torch tensor on the device
    (sequence b's key j is row j % page_size of page page_table[b, j // page_size]; entries past
    a sequence's pages are 0); ``seqused_k`` the int32 [B] key counts on the device;
    ``max_seqlen_k`` the longest of them (a host int, as serving engines pass it). The k and v
    handed to ``prepare`` beside it are the page pools [num_pages, page_size, Hkv, D]."""

    page_size: int
    page_table: Any
    seqused_k: Any
    max_seqlen_k: int


# The models' masks: Problem attribute -> what a reason calls it.
MASK_NAMES: dict[str, str] = {"window": "a sliding window", "softcap": "logit softcapping",
                              "sinks": "attention sinks"}


def _masks_of(problem: Any) -> list[str]:
    """The models' masks a problem has (MASK_NAMES' keys)."""
    return [name for name in MASK_NAMES if getattr(problem, name, 0)]


def problem_reason(problem: Any, *, gqa: bool = True, head_dims: tuple[int, ...] = (64, 128, 256),
                   causal_only: bool = False, varlen: bool = False, kv_len: str = "any",
                   masks: tuple[str, ...] = (), paged: bool = False,
                   who: str = "this peer") -> str | None:
    """A supports() answer from a peer's scope: GQA/MQA or not, head dims, causal only, packed
    varlen batches or not, which key lengths (``kv_len``): "any" S_q, S_k; "noncausal"
    S_q != S_k only without a causal mask (the backend cannot align it bottom-right); "equal"
    S_q = S_k only; which of the models' masks it expresses exactly (``masks``: "window",
    "softcap", "sinks"; none by default); and whether it reads a paged KV cache (``paged``)."""
    hq = getattr(problem, "Hq", None) or problem.H
    hkv = getattr(problem, "Hkv", None) or hq
    d = getattr(problem, "D", 128)
    causal = getattr(problem, "causal", True)
    sq = problem.S
    sk = getattr(problem, "Sk", None) or sq
    lens_differ = sq != sk or tuple(getattr(problem, "seqlens_k", ()) or ()) != tuple(
        getattr(problem, "seqlens", ()) or ())
    why = []
    if not varlen and bool(getattr(problem, "seqlens", ())):
        why.append("a packed varlen batch (fixed-length batches only)")
    if not paged and bool(getattr(problem, "page_size", 0)):
        why.append("a paged KV cache (it reads K and V as tensors, not pages through a block "
                   "table)")
    if lens_differ and (kv_len == "equal" or (kv_len == "noncausal" and causal)):
        why.append(f"{sq} queries over {sk} keys"
                   + (" with a bottom-right causal mask" if kv_len == "noncausal" else "")
                   + " (S_q = S_k only" + (" when causal)" if kv_len == "noncausal" else ")"))
    if not gqa and hkv != hq:
        why.append(f"Hkv={hkv} != Hq={hq} (no GQA/MQA)")
    if d not in head_dims:
        why.append(f"head dim {d} (supports {', '.join(map(str, head_dims))})")
    if causal_only and not causal:
        why.append("non-causal (causal only)")
    missing = [MASK_NAMES[m] for m in _masks_of(problem) if m not in masks]
    if missing:
        why.append(f"{' and '.join(missing)} (it cannot express "
                   f"{'them' if len(missing) > 1 else 'it'} exactly)")
    return f"{who} cannot run {problem}: {'; '.join(why)}" if why else None


def strided_views_reason(who: str, **tensors: Any) -> str | None:
    """Why a backend that reads strided BF16 tensors only when their head dim is contiguous and
    their other strides and address are 16-byte aligned (FlashAttention-3's rule: it copies any
    other tensor to a contiguous one first) would copy one of ``tensors`` (None: it reads them
    all in place). A copy inside the timed call would time a layout change, not attention, so
    such a peer declines instead. fa-tune's layouts never trip it (every stride is a multiple of
    the head dim); the check makes sure of it."""
    bad = []
    for name, t in tensors.items():
        strides = tuple(t.stride())
        if (strides[-1] != 1 or any(s % 8 for s in strides[:-1])
                or t.data_ptr() % 16):
            bad.append(f"{name} {tuple(t.shape)} strides {strides}")
    if not bad:
        return None
    return (f"{who} would copy {', '.join(bad)} to contiguous memory first (it reads a strided "
            "tensor in place only with a contiguous head dim and 16-byte aligned strides)")


class Peer:
    """Base class; subclasses set ``name``/``label`` and implement the calls."""

    name: str = "peer"  # short key used on the command line and in results
    label: str = "peer"  # human name used in tables and charts

    def available(self) -> tuple[bool, str]:
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def supports(self, problem: Any) -> str | None:
        """None when this peer can run ``problem`` (a tuner.problem.Problem), else why not."""
        return None

    def slow_first_call(self, problem: Any) -> str | None:
        """What a first call on ``problem`` may spend minutes on (a JIT build), said before it
        starts so a long silence is explained; None when nothing."""
        return None

    def prepare(self, q: Any, k: Any, v: Any, causal: bool,
                varlen: tuple[Any, Any, int, int] | None = None,
                masks: PeerMasks | None = None, pages: PeerPages | None = None) -> None:
        """Bind the inputs (BSHD views) and do the one-time work. ``varlen``: (cu_seqlens_q,
        cu_seqlens_k (int32 CUDA tensors), max_seqlen_q, max_seqlen_k) of a packed batch, whose
        views are then [1, total_q, Hq, D] and [1, total_k, Hkv, D]; only peers whose
        supports() accepts varlen problems are given one. ``masks``: the models' masks (None:
        none); only those supports() accepts are given. ``pages``: a paged problem's block table
        and key counts (None: K and V are tensors); k and v are then the page pools [num_pages,
        page_size, Hkv, D] (q stays [B, S_q, Hq, D], or [1, total_q, Hq, D] with ``varlen``);
        only peers whose supports() accepts paged problems are given one."""
        raise NotImplementedError

    def run(self) -> Any:
        raise NotImplementedError

    def lse(self) -> Any | None:
        """[B, Hq, S_q] FP32 log-sum-exp (natural log) of the last run ([1, Hq, total_q] for a
        packed batch), or None."""
        return None

    def details(self) -> dict[str, Any]:
        """Extra facts worth storing with the results (chosen autotune config, host setup)."""
        return {}

    def release(self) -> None:
        """Drop references to device buffers so the next backend gets the memory."""
