"""The kernel library's binding: ``KernelModule``, the one ctypes binding of the C ABI of
cuda_src/fa_tune/fa_tune.h (its version: FA_TUNE_ABI_VERSION; tuner.ship.fa_tune_ops.abi is its
one Python mirror), and the ``status`` words of calls with device metadata.

Split out of tuner/kernel/runtime.py (which re-exports every name here, so ``from
tuner.kernel.runtime import KernelModule`` keeps working); it uses the runtime's device, buffers and
.so loading.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.errors import FaTuneError
from tuner.kernel.runtime import (
    HEAD_DIM,
    AttnBuffers,
    KernelError,
    ShapeLike,
    Stream,
    _check,
    _driver,
    _load_so,
    abi,
    as_problem,
    cuda_error_name,
    problem_dims,
    stream_handle,
    tensor_view,
)
from tuner.kernel.support import unsupported
from tuner.problem import Problem, ProblemClass, dense_strides


# ---- the kernel library (C ABI of cuda_src/fa_tune/fa_tune.h; ctypes mirror: fa_tune_ops/abi) --
class MappedStatus:
    """The ``status`` words of a call with device metadata: int32[2] of pinned, device-mapped
    host memory (cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP), so the device writes what it
    found wrong there and the host reads it after synchronising, without a copy. Needs the
    device's context current (allocated on the first varlen launch)."""

    def __init__(self) -> None:
        drv = _driver()
        self._host = _check(drv.cuMemHostAlloc(8, drv.CU_MEMHOSTALLOC_DEVICEMAP),
                            "cuMemHostAlloc(8 bytes, DEVICEMAP)")
        host_ptr = int(self._host)
        # Under UVA the host pointer is the device pointer; asking costs nothing and is exact.
        self.ptr = int(_check(drv.cuMemHostGetDevicePointer(self._host, 0),
                              "cuMemHostGetDevicePointer"))
        self.words = (ctypes.c_int32 * 2).from_address(host_ptr)
        self.words[0] = self.words[1] = 0

    def free(self) -> None:
        if self._host is not None:
            host, self._host = self._host, None
            self.words = None  # type: ignore[assignment]
            _check(_driver().cuMemFreeHost(host), "cuMemFreeHost")


class HostStatus:
    """``status`` words in ordinary host memory: for stand-in libraries that run on the host
    (tests); a GPU cannot write them."""

    def __init__(self) -> None:
        self.words = (ctypes.c_int32 * 2)()
        self.ptr = ctypes.addressof(self.words)

    def free(self) -> None:
        """Freed with the object."""


# A placeholder for tensors fa_tune_prepare never reads (it builds the schedule of a shape; the
# ABI wants non-null, 16-byte aligned pointers all the same).
_NO_TENSOR = 256


def _args_text(a: abi.Args) -> str:
    """What a call asked for, for error messages (also for values a Problem would refuse)."""
    heads = f"{a.heads_q}" if a.heads_q == a.heads_kv else f"{a.heads_q}/{a.heads_kv}"
    if a.cu_seqlens_q or a.cu_seqlens_k:
        return (f"batch={a.batch}, Hq={a.heads_q}, Hkv={a.heads_kv}, total_q={a.total_q}, "
                f"total_k={a.total_k}, max_seqlen_q={a.seqlen_q}, max_seqlen_k={a.seqlen_k}")
    text = f"{a.batch}x{heads}x{a.seqlen_q}"
    return text + (f":k{a.seqlen_k}" if a.seqlen_k != a.seqlen_q else "")


class KernelModule:
    """A built kernel ``.so``, called through the C ABI of cuda_src/fa_tune/fa_tune.h (version
    3: one ``fa_tune_args`` struct per call; tuner.ship.fa_tune_ops.abi is its one Python mirror).
    Fixed-length problems and, where the library has the varlen kernel (``has_varlen``), packed
    batches with separate cu_seqlens_q / cu_seqlens_k."""

    _REQUIRED = ("forward", "prepare", "workspace_bytes", "last_error", "config_json",
                 "problem_class", "smem_bytes")

    def __init__(self, so_path: str | Path,
                 status_factory: Callable[[], MappedStatus | HostStatus] = MappedStatus) -> None:
        self.path = p = Path(so_path)
        lib = _load_so(p, "kernel library")
        self._lib = lib
        why = abi.version_problem(lib, p)
        if why is not None:
            raise FaTuneError(why)
        self._fn = abi.bind(lib)
        for name in self._REQUIRED:
            if self._fn[name] is None:
                raise FaTuneError(f"{p} does not export fa_tune_{name}(): not a fa-tune build?")
        self._status_factory = status_factory
        self.status: MappedStatus | HostStatus | None = None  # made on the first varlen launch
        self.config: dict[str, Any] = _json_dict(self.config_json())
        raw = self._fn["problem_class"]()
        pc = _json_dict(raw.decode(errors="replace") if raw else "")
        self.causal = bool(pc.get("causal", True))
        self.head_dim = int(pc.get("head_dim", HEAD_DIM))
        self.varlen = bool(pc.get("varlen", False))  # the varlen kernel is compiled in
        self._class = ProblemClass.from_dict(pc)

    @property
    def problem_class(self) -> ProblemClass:
        """The head dim and mask compiled into this library, whether it runs varlen, and the
        models' masks it carries."""
        return self._class

    @property
    def has_varlen(self) -> bool:
        """Whether calls with device metadata (cu_seqlens) run: the varlen kernel compiled in."""
        return self.varlen

    @property
    def writes_lse(self) -> bool:
        """Whether this variant writes LSE (config knob write_lse; absent = yes)."""
        return bool(self.config.get("write_lse", True))

    def last_error(self) -> str:
        raw = self._fn["last_error"]()
        return raw.decode(errors="replace") if raw else ""

    def config_json(self) -> str:
        raw = self._fn["config_json"]()
        return raw.decode(errors="replace") if raw else ""

    def smem_bytes(self) -> int:
        return int(self._fn["smem_bytes"]())

    def unsupported(self, shape: Any) -> str | None:
        """Why this library cannot run ``shape`` (None: it can)."""
        return unsupported(shape, library=self)

    def _fail(self, what: str, rc: int) -> KernelError:
        why = self.last_error()
        return KernelError(
            f"{what} failed with {cuda_error_name(rc)} ({rc})"
            + (f": {why}" if why else "")
            + f" [{self.path.parent.name}/{self.path.name}]",
            code=rc,
        )

    def _refuse(self, shape: Any, what: str) -> None:
        why = self.unsupported(shape)
        if why is not None:
            raise KernelError(f"{what}: {why}")

    # -- the argument struct
    def args_for(self, bufs: AttnBuffers, write_lse: bool | None = None,
                 softmax_scale: float = 0.0, workspace: int | None = None,
                 workspace_bytes: int = 0) -> abi.Args:
        """The call on ``bufs``: q, k, v where the problem's layout puts them (``tensor_view``:
        the dense buffers, or views of the fused QKV tensor / the [B, H, S, D] cache, with their
        strides), o dense; a packed batch with its cu_seqlens_q / cu_seqlens_k, max lengths,
        totals and this module's status words. LSE goes to bufs.lse when the variant writes it
        (or ``write_lse`` says so), else NULL. softmax_scale 0: 1/sqrt(D). workspace None: the
        library's own (not inside a graph capture)."""
        use_lse = self.writes_lse if write_lse is None else write_lse
        p = as_problem(bufs.shape)
        fields = self._shape_fields(p)
        for name in ("q", "k", "v"):
            fields[name], fields[f"{name}_stride"] = tensor_view(bufs, name)
        fields.update(o=bufs.o.ptr, lse=bufs.lse.ptr if use_lse else None,
                      softmax_scale=float(softmax_scale))
        if p.sinks:
            sinks = getattr(bufs, "sinks", None)
            if sinks is None:
                raise KernelError(f"buffers of {p} hold no sinks")
            fields["sinks"] = sinks.ptr
        if p.is_varlen:
            cu_q, cu_k = getattr(bufs, "cu_q", None), getattr(bufs, "cu_k", None)
            if cu_q is None or cu_k is None:
                raise KernelError(f"buffers of {p} hold no cu_seqlens_q / cu_seqlens_k")
            # A paged cache's keys are counted by seqused_k, not packed by cu_seqlens_k.
            fields.update(cu_seqlens_q=cu_q.ptr, cu_seqlens_k=None if p.is_paged else cu_k.ptr)
        if p.is_paged:
            table, used = getattr(bufs, "block_table", None), getattr(bufs, "seqused_k", None)
            if table is None or used is None:
                raise KernelError(f"buffers of {p} hold no block table / seqused_k")
            pages = p.pages
            fields.update(block_table=table.ptr, block_table_stride=pages.max_pages,
                          max_pages=pages.max_pages, page_size=pages.page_size,
                          num_pages=pages.num_pages, seqused_k=used.ptr)
        if p.device_scheduled:
            fields.update(workspace=workspace or None,
                          workspace_bytes=workspace_bytes if workspace else 0,
                          status=self._status_ptr())
        return abi.make_args(**fields)

    def _shape_fields(self, p: Problem) -> dict[str, Any]:
        """The struct's shape fields of a problem (dense strides, which args_for replaces by
        the layout's; a packed batch: its as_fixed rows per tensor, the lengths' maxima and
        totals) and its run-time mask values (prepare checks them against the class, and the
        static scheduler's task lists count the window)."""
        _, hq, hkv, Sq, Sk, D, causal = problem_dims(p)  # a packed batch: the as_fixed rows
        return dict(q_stride=dense_strides(Sq, hq, D), k_stride=dense_strides(Sk, hkv, D),
                    v_stride=dense_strides(Sk, hkv, D), batch=p.B, heads_q=hq, heads_kv=hkv,
                    head_dim=D, seqlen_q=p.S_q, seqlen_k=p.S_k,
                    total_q=p.tokens_q if p.is_varlen else 0,
                    total_k=p.tokens_k if p.is_varlen else 0, causal=1 if causal else 0,
                    window=p.window, softcap=float(p.softcap))

    def _status_ptr(self) -> int:
        if self.status is None:
            self.status = self._status_factory()
        return self.status.ptr

    # -- calls
    def prepare(self, shape: ShapeLike, stream: Stream | int | None = None) -> float:
        """One-time host setup of a fixed-length shape (fa_tune_prepare: the static scheduler's
        task lists); returns the host milliseconds it took. A packed batch needs none (0). The
        stream is unused (the setup is synchronous), kept for the launchable protocol."""
        self._refuse(shape, "fa_tune_prepare")
        p = as_problem(shape)
        if p.device_scheduled:
            return 0.0  # the schedule is built on the device, in every launch
        f = self._shape_fields(p)
        f.update(q=_NO_TENSOR, k=_NO_TENSOR, v=_NO_TENSOR, o=_NO_TENSOR)
        a = abi.make_args(**f)
        ms = ctypes.c_double(0.0)
        rc = self._fn["prepare"](ctypes.byref(a), ctypes.byref(ms))
        if rc != 0:
            raise self._fail(f"fa_tune_prepare({_args_text(a)})", rc)
        return float(ms.value)

    def forward(self, bufs: AttnBuffers, stream: Stream | int | None,
                write_lse: bool | None = None, softmax_scale: float = 0.0,
                workspace: int | None = None, workspace_bytes: int = 0) -> None:
        """Launch once (asynchronous) on ``bufs`` (``args_for``). A packed batch's metadata is
        checked on the device: synchronise, then ``check_status()``."""
        self._refuse(bufs.shape, "fa_tune_forward")  # before launching: D and the mask
        self.forward_args(self.args_for(bufs, write_lse, softmax_scale, workspace,
                                        workspace_bytes), stream)

    def forward_args(self, args: abi.Args, stream: Stream | int | None) -> None:
        """One fa_tune_forward with a filled struct (asynchronous)."""
        rc = self._fn["forward"](ctypes.byref(args), stream_handle(stream) or None)
        if rc != 0:
            raise self._fail(f"fa_tune_forward({_args_text(args)})", rc)

    def workspace_bytes(self, bufs: AttnBuffers) -> int:
        """Device workspace bytes the call on ``bufs`` needs (host only); 0 for a fixed-length
        call (or where the library calls the arguments invalid)."""
        a = self.args_for(bufs)  # the call itself: its views and strides
        return int(self._fn["workspace_bytes"](ctypes.byref(a)))

    def check_status(self) -> None:
        """After a synchronised launch with device metadata: raise KernelError if the device
        rejected the metadata (status[0] != 0; the words are cleared). No varlen launch yet:
        nothing to check."""
        st = self.status
        if st is None:
            return
        bits, seq = int(st.words[0]), int(st.words[1])
        st.words[0] = st.words[1] = 0
        if bits:
            raise KernelError(f"fa_tune_forward: the device rejected the varlen metadata: "
                              f"{abi.bad_metadata_text(bits, seq)} "
                              f"[{self.path.parent.name}/{self.path.name}]", code=1)

    def close(self) -> None:
        """Free the status words (the library itself stays loaded: ctypes cannot unload it)."""
        if self.status is not None:
            st, self.status = self.status, None
            st.free()


def _json_dict(text: str) -> dict[str, Any]:
    try:
        d = json.loads(text) if text else {}
    except ValueError:
        d = {}
    return d if isinstance(d, dict) else {}
