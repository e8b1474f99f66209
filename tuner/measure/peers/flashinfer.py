"""FlashInfer's batch prefill (the ``flashinfer-python`` package), over pages and not.

A paged problem (issue 37) goes to ``flashinfer.BatchPrefillWithPagedKVCacheWrapper``: the NHD
page pools [num_pages, page_size, Hkv, D] as its ``(k_cache, v_cache)`` tuple, and the block
table as FlashInfer takes it (``paged_kv_args``): ``paged_kv_indptr`` (each sequence's first
entry in ``paged_kv_indices``), ``paged_kv_indices`` (every sequence's pages in order, those
shared by prefix caching listed under each sequence that reads them) and
``paged_kv_last_page_len`` (the keys in each sequence's last page: 1 .. page_size, 0 for a
sequence without keys). A problem without pages goes to ``BatchPrefillWithRaggedKVCacheWrapper``
with K and V as [total_k, Hkv, D] rows (a fixed batch's [B, S_k, Hkv, D] viewed so: dense or a
fused QKV tensor's slices flatten without a copy; the ``:bhsd`` cache does not, so that layout
is declined). Queries are [total_q, Hq, D] rows with ``qo_indptr`` (a fixed batch: b * S_q).

``plan`` (once, in ``prepare``: host-side scheduling, its copies to the device, and the first
call's JIT build of the kernel with nvcc and ninja, minutes on a fresh host) and ``run`` (the
timed launch, into an output and LSE allocated in ``prepare``, so no allocation or memset is
timed; left to itself ``run`` allocates the output with ``torch.zeros``). The workspace is the
128 MiB the wrappers' docstring recommends. ``backend="auto"`` is FlashInfer's own choice: its
FA3-style sm90 kernel for BF16 on an H200 (``details`` names the one planned).

The masks, as flashinfer/prefill.py (0.6.13) takes them: causal aligned bottom-right (key j of
query i kept when j <= i + kv_len - qo_len: include/flashinfer/attention/hopper/
mainloop_mma.cuh), as fa-tune's; a sliding window of W keys is ``window_left=W - 1`` (keys from
i + kv_len - qo_len - window_left on, causal or not: fa-tune's window); a softcap C is
``logits_soft_cap=C`` (C tanh(s * scale / C): attention/variants.cuh, the softmax scale inside
as in fa-tune). Attention sinks are declined: ``run(sinks=...)`` reaches only the trtllm-gen
backend (Blackwell); the fa2 and fa3 modules drop it without a word.

The LSE: FlashInfer writes it in base 2 (log2 of the sum of exp2(s * scale * log2 e): hopper/
attention_updater.cuh, ``row_max * sm_scale_log2 + log2(sum)``) as [total_q, Hq]; ``lse()``
gives fa-tune's natural-log [B, Hq, S_q] ([1, Hq, total_q] packed), ln 2 times it, computed when
asked (after the timed launches), never in ``run``.

Installing without a network: lab/h200/fetch_device_wheels.sh (here) and
lab/h200/flashinfer_stage.sh (on the GPU host); ``flashinfer-cubin`` (458 MB of trtllm-gen and
cuDNN cubins) is not needed for these wrappers' fa2 / fa3 backends, which build from the sources
in the wheel.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Sequence
from typing import Any

from tuner.measure.peers.base import (
    Peer,
    PeerMasks,
    PeerPages,
    Unsupported,
    dist_version,
    module_missing,
    problem_reason,
    torch_cuda_reason,
)

LN2 = math.log(2.0)
WORKSPACE_BYTES = 128 << 20  # the wrappers' recommended float workspace


def paged_kv_args(table: Sequence[Sequence[int]], used: Sequence[int],
                  page_size: int) -> tuple[list[int], list[int], list[int]]:
    """FlashInfer's (paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len) of a block
    table (one row of page ids per sequence, entries past its pages ignored) and each sequence's
    key count: sequence b's pages are the first ceil(used[b] / page_size) entries of its row."""
    indptr: list[int] = [0]
    indices: list[int] = []
    last: list[int] = []
    for row, keys in zip(table, used, strict=True):
        n = -(-int(keys) // page_size)
        if n > len(row):
            raise ValueError(f"{keys} keys need {n} pages of {page_size} rows; the table row "
                             f"holds {len(row)}")
        indices.extend(int(p) for p in row[:n])
        indptr.append(len(indices))
        last.append(int(keys) - (n - 1) * page_size if n else 0)
    return indptr, indices, last


def toolchain_reason() -> str | None:
    """Why FlashInfer's JIT cannot build here (None: it can). Every wrapper's first plan runs
    ninja, which runs nvcc (even when the module is cached: ninja decides), found as
    flashinfer/jit/cpp_ext.py looks for it: $CUDA_HOME (or $CUDA_PATH), nvcc on PATH, else
    /usr/local/cuda."""
    if shutil.which("ninja") is None:
        return ("flashinfer builds its kernels with the ninja executable, not on PATH (pip "
                "install ninja; lab/h200/flashinfer_stage.sh puts it in .device/fisite/bin)")
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = (os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
            or "/usr/local/cuda/bin/nvcc")
    if not os.path.exists(nvcc):
        return f"flashinfer builds its kernels with nvcc, not found ({nvcc})"
    return None


def _rows(t: Any, what: str) -> Any:
    """A [B, S, H, D] view as the [B * S, H, D] rows FlashInfer reads, without a copy (a copy
    in prepare would hand FlashInfer other memory than the other backends read)."""
    try:
        return t.view(-1, t.shape[-2], t.shape[-1])
    except RuntimeError:
        raise Unsupported(f"flashinfer reads {what} as [total, H, D] rows of one stride; "
                          f"{tuple(t.shape)} strides {tuple(t.stride())} are not") from None


class FlashInferPeer(Peer):
    name = "flashinfer"
    label = "FlashInfer (batch prefill wrappers)"

    def __init__(self, backend: str = "auto", return_lse: bool = True) -> None:
        self.backend = backend
        self.return_lse = return_lse
        self._wrapper: Any = None
        self._args: tuple[Any, ...] = ()  # run()'s positional tensors
        self._out: Any = None  # [total_q, Hq, D]
        self._lse_raw: Any = None  # [total_q, Hq], base 2
        self._shape: tuple[int, int] = (0, 0)  # (B, S_q) as fa-tune lays out O
        self._packed = False
        self._plan: dict[str, Any] = {}

    def available(self) -> tuple[bool, str]:
        reason = torch_cuda_reason() or module_missing("flashinfer") or toolchain_reason()
        if reason:
            return False, reason
        try:
            self._module()
        except Exception as exc:  # a missing dependency inside the package is a reason
            first = str(exc).splitlines()[0] if str(exc) else ""
            return False, f"flashinfer does not import ({type(exc).__name__}: {first})"
        return True, "ok"

    @staticmethod
    def _module() -> Any:
        import flashinfer

        return flashinfer

    def version(self) -> str:
        return (f"flashinfer-python {dist_version('flashinfer-python', 'flashinfer')}, "
                f"apache-tvm-ffi {dist_version('apache-tvm-ffi')}")

    def supports(self, problem: Any) -> str | None:
        why = problem_reason(problem, varlen=True, paged=True, masks=("window", "softcap"),
                             who=self.name)
        if getattr(problem, "layout", "bshd") != "bhsd":
            return why
        cache = ("k and v over [B, Hkv, S_k, D] memory (it reads K and V as [total_k, Hkv, D] "
                 "rows of one stride)")
        return f"{why}; {cache}" if why else f"{self.name} cannot run {problem}: {cache}"

    def slow_first_call(self, problem: Any) -> str | None:
        kind = "paged" if problem.page_size else "ragged"
        return (f"the first {kind} call at head dim {problem.D} with these masks builds "
                "FlashInfer's kernels with nvcc (minutes; cached for later runs)")

    @staticmethod
    def mask_args(masks: PeerMasks | None) -> dict[str, Any]:
        """plan()'s arguments for the models' masks (none for a plain problem)."""
        kw: dict[str, Any] = {}
        if masks is None:
            return kw
        if masks.window > 0:  # left, inclusive: the diagonal key and window - 1 before it
            kw["window_left"] = masks.window - 1
        if masks.softcap > 0:
            kw["logits_soft_cap"] = float(masks.softcap)
        return kw

    def prepare(self, q: Any, k: Any, v: Any, causal: bool,
                varlen: tuple[Any, Any, int, int] | None = None,
                masks: PeerMasks | None = None, pages: PeerPages | None = None) -> None:
        import torch

        if masks is not None and masks.sinks is not None:  # supports() declines them
            raise Unsupported(f"{self.name}: its fa2 / fa3 backends take no attention sinks")
        fi = self._module()
        hq, d = int(q.shape[-2]), int(q.shape[-1])
        hkv = int(k.shape[-2])
        if varlen is not None:  # [1, total, H, D] views; the lengths from cu_seqlens
            cu_q, cu_k = varlen[0], varlen[1]
            qo_indptr = cu_q.to("cpu", torch.int32)
            rows_q = q[0]
            self._shape, self._packed = (1, int(q.shape[1])), True
        else:
            b, s_q = int(q.shape[0]), int(q.shape[1])
            qo_indptr = torch.arange(b + 1, dtype=torch.int32) * s_q
            rows_q = _rows(q, "q")
            self._shape, self._packed = (b, s_q), False
        kw = {"causal": bool(causal), "q_data_type": q.dtype, "kv_data_type": k.dtype,
              **self.mask_args(masks)}
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
        if pages is not None:
            table = pages.page_table.to("cpu").tolist()
            used = pages.seqused_k.to("cpu").tolist()
            indptr, indices, last = paged_kv_args(table, used, pages.page_size)
            wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD",
                                                             backend=self.backend)
            wrapper.plan(qo_indptr, *(torch.tensor(x, dtype=torch.int32)
                                      for x in (indptr, indices, last)),
                         hq, hkv, d, pages.page_size, non_blocking=False, **kw)
            self._args = (rows_q, (k, v))
            call = "BatchPrefillWithPagedKVCacheWrapper"
            kw["page_size"] = pages.page_size
        else:
            if varlen is not None:
                kv_indptr = cu_k.to("cpu", torch.int32)
                rows_k, rows_v = k[0], v[0]
            else:
                kv_indptr = torch.arange(int(k.shape[0]) + 1, dtype=torch.int32) * int(k.shape[1])
                rows_k, rows_v = _rows(k, "k"), _rows(v, "v")
            wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD",
                                                              backend=self.backend)
            wrapper.plan(qo_indptr, kv_indptr, hq, hkv, d, non_blocking=False, **kw)
            self._args = (rows_q, rows_k, rows_v)
            call = "BatchPrefillWithRaggedKVCacheWrapper"
        self._wrapper = wrapper
        total_q = int(rows_q.shape[0])
        self._out = torch.empty((total_q, hq, d), dtype=q.dtype, device=q.device)
        self._lse_raw = (torch.empty((total_q, hq), dtype=torch.float32, device=q.device)
                         if self.return_lse else None)
        self._plan = {"call": f"flashinfer.{call}.run", "kv_layout": "NHD",
                      **{n: (str(x) if n.endswith("data_type") else x) for n, x in kw.items()}}
        self.run()  # the JIT build and first launch now, not in the first warm-up launch

    def run(self) -> Any:
        assert self._wrapper is not None, "prepare() first"
        kw: dict[str, Any] = {"out": self._out}
        if self._lse_raw is not None:
            kw.update(lse=self._lse_raw, return_lse=True)
        self._wrapper.run(*self._args, **kw)
        b, s = self._shape
        return self._out.view(b, s, *self._out.shape[1:])

    def lse(self) -> Any | None:
        """The last run's LSE in natural log, [B, Hq, S_q] ([1, Hq, total_q] packed)."""
        if self._lse_raw is None:
            return None
        lse = self._lse_raw * LN2  # base 2 -> e
        if self._packed:
            return lse.t().unsqueeze(0)
        b, s = self._shape
        return lse.view(b, s, -1).permute(0, 2, 1)

    def details(self) -> dict[str, Any]:
        out = dict(self._plan)
        if self._wrapper is not None:  # what "auto" became (set by plan)
            out["backend"] = getattr(self._wrapper, "_backend", self.backend)
        out["return_lse"] = self.return_lse
        if self.return_lse:
            out["lse"] = "base 2 from FlashInfer, times ln 2 outside the timed launch"
        return out

    def release(self) -> None:
        self._wrapper = None
        self._args = ()
        self._out = self._lse_raw = None
