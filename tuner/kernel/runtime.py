"""cuda-python host runtime: device, primary context, memory, streams, events, built .so files.

Everything goes through the CUDA *driver* API of ``cuda.bindings`` (every call returns a tuple
``(CUresult, *values)``; ``_check`` turns a failure into a one-line ``CudaError``). The kernel and
oracle ``.so`` files link the CUDA runtime statically; a runtime uses the context current on the
calling thread, so we retain the device's *primary* context and make it current before calling
into them (``Device.make_current``): kernels, oracle and cuda-python then share one context and
one address space.

Imports of ``cuda.bindings`` are lazy so that ``import tuner.kernel.runtime`` works on machines
without cuda-python; a missing driver or GPU becomes ``GpuError`` (one line), never a traceback.

The bindings of the built libraries live beside it: ``KernelModule`` in
tuner/kernel/kernel_module.py, ``OracleModule`` in tuner/kernel/oracle_module.py; both names (and
their constants) are still importable
from here. """

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tuner.errors import FaTuneError, GpuError
from tuner.problem import DEFAULT_HEAD_DIM, Problem, TensorView


def _load_abi() -> ModuleType:
    """tuner/ship/fa_tune_ops/abi.py, the C ABI's one Python mirror, without running its package's
    __init__ (which imports torch and registers the op: the tuner runs without torch). Kept in
    sys.modules under its own name, so the package, when imported later, shares this module
    (one ``Args`` class per process: ctypes refuses a struct of another class)."""
    name = "tuner.ship.fa_tune_ops.abi"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).parents[1] / "ship" / "fa_tune_ops" / "abi.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


if TYPE_CHECKING:
    from tuner.ship.fa_tune_ops import abi
else:
    abi = _load_abi()

HEAD_DIM = DEFAULT_HEAD_DIM
BF16_BYTES = 2
F32_BYTES = 4
REQUIRED_CC = (9, 0)


class CudaError(GpuError):
    """A CUDA call failed (bad launch, out of memory, a kernel fault, ...)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class KernelError(CudaError):
    """A built kernel's C ABI returned an error (its fa_tune_last_error() text is included)."""


class ShapeLike(Protocol):
    """A problem as the measurement path reads it (tuner.problem.Problem; duck-typed: an object
    with only B, H, S is MHA, D 128, causal, as many keys as queries)."""

    @property
    def B(self) -> int: ...
    @property
    def H(self) -> int: ...
    @property
    def S(self) -> int: ...


def problem_dims(shape: Any) -> tuple[int, int, int, int, int, int, bool]:
    """(B, Hq, Hkv, S_q, S_k, D, causal) of a problem's tensors, for a Problem or anything
    shaped like one (no validation): Hq from ``Hq`` or ``H``; Hkv defaults to Hq, S_k (``Sk``)
    to S, D to 128, causal to True. Q and O hold B*S_q rows, K and V B*S_k. A packed varlen
    batch's tensors are one batch of all its tokens (``Problem.as_fixed``: B=1, S_q=total_q,
    S_k=total_k): buffers, input generation, poisoning and comparison read them so; the
    reference and the kernel launch follow its sequences (``as_problem(shape).seqlens``)."""
    if isinstance(shape, Problem) and shape.seqlens:
        shape = shape.as_fixed
    hq = int(getattr(shape, "Hq", None) or shape.H)
    hkv = int(getattr(shape, "Hkv", None) or hq)
    sq = int(shape.S)
    return (int(shape.B), hq, hkv, sq, int(getattr(shape, "Sk", None) or sq),
            int(getattr(shape, "D", None) or HEAD_DIM), bool(getattr(shape, "causal", True)))


def as_problem(shape: Any) -> Problem:
    """The Problem for ``shape`` (itself when it already is one)."""
    if isinstance(shape, Problem):
        return shape
    B, hq, hkv, Sq, Sk, D, causal = problem_dims(shape)
    return Problem(B, hq, Sq, Hkv=hkv, D=D, causal=causal, Sk=Sk)


def same_problem(a: Any, b: Any) -> bool:
    return as_problem(a) == as_problem(b)  # a varlen batch's lengths too


# ---- cuda.bindings access -------------------------------------------------------------------
def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise GpuError(
            f"cuda-python is not importable ({e}); install it with `pip install cuda-python`"
        ) from None
    return driver


def _cu_error_text(err: Any) -> str:
    drv = _driver()
    try:
        e1, name = drv.cuGetErrorName(err)
        e2, desc = drv.cuGetErrorString(err)
        name_s = name.decode() if e1 == drv.CUresult.CUDA_SUCCESS and name else str(err)
        desc_s = desc.decode() if e2 == drv.CUresult.CUDA_SUCCESS and desc else ""
    except Exception:  # noqa: BLE001 - error text is best effort; the code is still reported
        return f"CUresult {int(err)}"
    return f"{name_s} ({desc_s})" if desc_s else name_s


def cuda_error_name(code: int) -> str:
    """Name of a cudaError_t (runtime API) value, e.g. 700 -> 'cudaErrorIllegalAddress'."""
    try:
        from cuda.bindings import runtime as rt

        err, name = rt.cudaGetErrorName(rt.cudaError_t(code))
        if err == rt.cudaError_t.cudaSuccess and name:
            return name.decode()
    except Exception:  # noqa: BLE001 - unknown code or no cuda-python: fall back to the number
        pass
    return f"cudaError {code}"


def _check(result: Any, what: str) -> Any:
    """Unpack a cuda.bindings result tuple; raise CudaError on failure.

    Returns None, the single value, or a tuple of values.
    """
    drv = _driver()
    if not isinstance(result, tuple):
        result = (result,)
    err, rest = result[0], result[1:]
    if err != drv.CUresult.CUDA_SUCCESS:
        raise CudaError(f"{what} failed: {_cu_error_text(err)}", code=int(err))
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


# ---- device ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    cc: tuple[int, int]
    sm_count: int
    l2_bytes: int
    total_mem_bytes: int
    cuda_driver_version: int  # e.g. 13000 (the CUDA version the driver supports)
    pci_bus_id: str

    @property
    def cuda_driver_version_str(self) -> str:
        v = self.cuda_driver_version
        return f"{v // 1000}.{(v % 1000) // 10}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cc"] = f"{self.cc[0]}.{self.cc[1]}"
        d["cuda_driver_version_str"] = self.cuda_driver_version_str
        return d


class Device:
    """One CUDA device with its primary context retained (for the life of the process)."""

    _open: dict[int, Device] = {}
    _lock = threading.Lock()

    def __init__(self, index: int, cu_device: Any, ctx: Any, info: DeviceInfo) -> None:
        self.index = index
        self._cu_device = cu_device
        self._ctx = ctx
        self.info = info

    # -- opening
    @classmethod
    def open(cls, index: int = 0, *, require_cc: tuple[int, int] | None = REQUIRED_CC) -> Device:
        """Initialise the driver, retain device ``index``'s primary context, make it current.

        Raises GpuError (one line) when cuda-python, the driver or the device is missing, or
        when the compute capability is not ``require_cc`` (None accepts any).
        """
        with cls._lock:
            dev = cls._open.get(index)
            if dev is None:
                dev = cls._open_new(index)
                cls._open[index] = dev
        if require_cc is not None and dev.info.cc != require_cc:
            raise GpuError(
                f"GPU {index} is {dev.info.name} (sm_{dev.info.cc[0]}{dev.info.cc[1]}); fa-tune "
                f"needs an sm_{require_cc[0]}{require_cc[1]} Hopper GPU (H100/H200)"
            )
        dev.make_current()
        return dev

    @classmethod
    def _open_new(cls, index: int) -> Device:
        drv = _driver()
        try:
            res = drv.cuInit(0)
        except Exception as e:  # noqa: BLE001 - cuda-python raises when libcuda.so is absent
            raise GpuError(
                "no NVIDIA driver: libcuda.so could not be loaded "
                f"({type(e).__name__}); install the NVIDIA driver or run on a GPU host"
            ) from None
        err = res[0]
        if err != drv.CUresult.CUDA_SUCCESS:
            if err == drv.CUresult.CUDA_ERROR_NO_DEVICE:
                vis = os.environ.get("CUDA_VISIBLE_DEVICES")
                hint = f" (CUDA_VISIBLE_DEVICES={vis!r})" if vis is not None else ""
                raise GpuError(f"no CUDA GPU is visible{hint}")
            if err == drv.CUresult.CUDA_ERROR_INSUFFICIENT_DRIVER:
                raise GpuError(
                    "the NVIDIA driver is too old for this cuda-python (CUDA 13 needs driver "
                    ">= 580); update the driver or install a matching cuda-python"
                )
            raise GpuError(f"cuInit failed: {_cu_error_text(err)}")
        count = _check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
        if count < 1:
            raise GpuError("no CUDA GPU is visible")
        if not 0 <= index < count:
            raise GpuError(f"GPU index {index} does not exist ({count} visible)")
        cu_dev = _check(drv.cuDeviceGet(index), "cuDeviceGet")
        attr = drv.CUdevice_attribute

        def get(a: Any) -> int:
            return int(_check(drv.cuDeviceGetAttribute(a, cu_dev), f"cuDeviceGetAttribute({a})"))

        name = _check(drv.cuDeviceGetName(256, cu_dev), "cuDeviceGetName")
        name_s = name.split(b"\0", 1)[0].decode(errors="replace").strip()
        bus = _check(drv.cuDeviceGetPCIBusId(64, cu_dev), "cuDeviceGetPCIBusId")
        bus_s = bus.split(b"\0", 1)[0].decode(errors="replace").strip()
        info = DeviceInfo(
            index=index,
            name=name_s,
            cc=(
                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            ),
            sm_count=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            l2_bytes=get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
            total_mem_bytes=int(_check(drv.cuDeviceTotalMem(cu_dev), "cuDeviceTotalMem")),
            cuda_driver_version=int(_check(drv.cuDriverGetVersion(), "cuDriverGetVersion")),
            pci_bus_id=bus_s,
        )
        ctx = _check(drv.cuDevicePrimaryCtxRetain(cu_dev), "cuDevicePrimaryCtxRetain")
        return cls(index, cu_dev, ctx, info)

    # -- properties (shortcuts into info)
    @property
    def name(self) -> str:
        return self.info.name

    @property
    def cc(self) -> tuple[int, int]:
        return self.info.cc

    @property
    def sm_count(self) -> int:
        return self.info.sm_count

    @property
    def l2_bytes(self) -> int:
        return self.info.l2_bytes

    @property
    def cuda_driver_version(self) -> int:
        return self.info.cuda_driver_version

    def nvidia_driver_version(self) -> str | None:
        """The NVIDIA driver's version string (e.g. '580.159') via NVML; None without NVML."""
        try:
            import pynvml

            pynvml.nvmlInit()
            v = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001 - NVML is optional
            return None
        return v.decode() if isinstance(v, bytes) else str(v)

    def properties(self) -> dict[str, Any]:
        d = self.info.to_dict()
        d["nvidia_driver_version"] = self.nvidia_driver_version()
        return d

    # -- context
    def make_current(self) -> None:
        """Make the primary context current on the calling thread (needed before .so calls)."""
        _check(_driver().cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def synchronize(self) -> None:
        self.make_current()
        _check(_driver().cuCtxSynchronize(), "cuCtxSynchronize")

    def mem_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes."""
        self.make_current()
        free, total = _check(_driver().cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    # -- factories
    def alloc(self, nbytes: int) -> DeviceBuffer:
        return DeviceBuffer(self, nbytes)

    def stream(self) -> Stream:
        return Stream(self)

    def event(self) -> Event:
        return Event(self)


# ---- memory ---------------------------------------------------------------------------------
class DeviceBuffer:
    """``nbytes`` of device memory (cuMemAlloc: 256-byte aligned). Free with ``free()`` or
    ``with``; the finalizer frees as a last resort."""

    def __init__(self, dev: Device, nbytes: int) -> None:
        if not isinstance(nbytes, int) or nbytes < 1:
            raise ValueError(f"DeviceBuffer size must be a positive int (got {nbytes!r})")
        self.dev = dev
        self.nbytes = nbytes
        dev.make_current()
        self._dptr = _check(_driver().cuMemAlloc(nbytes), f"cuMemAlloc({nbytes} bytes)")
        self.ptr: int = int(self._dptr)

    def free(self) -> None:
        if self.ptr:
            self.dev.make_current()
            ptr, self.ptr = self._dptr, 0
            _check(_driver().cuMemFree(ptr), "cuMemFree")

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # noqa: BLE001 - at interpreter exit the driver may already be gone
            pass

    def _span(self, nbytes: int, offset: int) -> None:
        if not self.ptr:
            raise ValueError("DeviceBuffer used after free()")
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(
                f"copy of {nbytes} bytes at offset {offset} exceeds the buffer ({self.nbytes})"
            )

    def copy_from_host(self, arr: np.ndarray, offset: int = 0) -> None:
        """Synchronous host -> device copy of a C-contiguous array into [offset, offset+size)."""
        a = np.ascontiguousarray(arr)
        self._span(a.nbytes, offset)
        self.dev.make_current()
        _check(_driver().cuMemcpyHtoD(self.ptr + offset, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")

    def copy_to_host(self, dtype: Any = np.uint8, count: int | None = None,
                     offset: int = 0) -> np.ndarray:
        """Synchronous device -> host copy of ``count`` items of ``dtype`` (default: all)."""
        dt = np.dtype(dtype)
        if count is None:
            count = (self.nbytes - offset) // dt.itemsize
        out = np.empty(count, dtype=dt)
        self._span(out.nbytes, offset)
        self.dev.make_current()
        _check(_driver().cuMemcpyDtoH(out.ctypes.data, self.ptr + offset, out.nbytes),
               "cuMemcpyDtoH")
        return out

    def copy_from_device(self, src: DeviceBuffer, nbytes: int | None = None) -> None:
        n = min(self.nbytes, src.nbytes) if nbytes is None else nbytes
        self._span(n, 0)
        src._span(n, 0)
        self.dev.make_current()
        _check(_driver().cuMemcpyDtoD(self.ptr, src.ptr, n), "cuMemcpyDtoD")

    def memset_u8(self, value: int) -> None:
        self.dev.make_current()
        _check(_driver().cuMemsetD8(self.ptr, value & 0xFF, self.nbytes), "cuMemsetD8")


# ---- streams and events ---------------------------------------------------------------------
def stream_handle(stream: Stream | int | None) -> int:
    """The raw CUstream (as int, 0 = legacy default stream) of a Stream, an int or None."""
    if stream is None:
        return 0
    if isinstance(stream, Stream):
        return stream.handle
    return int(stream)


class Stream:
    """A blocking stream (it synchronises with the legacy default stream, so a kernel .so that
    touches the default stream in its host launcher still orders correctly)."""

    def __init__(self, dev: Device) -> None:
        drv = _driver()
        self.dev = dev
        dev.make_current()
        self._s = _check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_DEFAULT), "cuStreamCreate")
        self.handle: int = int(self._s)

    @property
    def cu(self) -> Any:
        return self._s

    def synchronize(self) -> None:
        _check(_driver().cuStreamSynchronize(self._s), "cuStreamSynchronize")

    def destroy(self) -> None:
        if self.handle:
            self.dev.make_current()
            s, self.handle = self._s, 0
            _check(_driver().cuStreamDestroy(s), "cuStreamDestroy")

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __del__(self) -> None:
        try:
            self.destroy()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class Event:
    """A timing-enabled CUDA event."""

    def __init__(self, dev: Device) -> None:
        drv = _driver()
        self.dev = dev
        dev.make_current()
        self._e = _check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
        self.alive = True

    def record(self, stream: Stream) -> None:
        _check(_driver().cuEventRecord(self._e, stream.cu), "cuEventRecord")

    def synchronize(self) -> None:
        _check(_driver().cuEventSynchronize(self._e), "cuEventSynchronize")

    @staticmethod
    def elapsed_ms(start: Event, end: Event) -> float:
        return float(_check(_driver().cuEventElapsedTime(start._e, end._e), "cuEventElapsedTime"))

    def destroy(self) -> None:
        if self.alive:
            self.dev.make_current()
            self.alive = False
            _check(_driver().cuEventDestroy(self._e), "cuEventDestroy")

    def __del__(self) -> None:
        try:
            self.destroy()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


# ---- attention buffers ----------------------------------------------------------------------
def elems_bshd(shape: ShapeLike) -> int:
    """Elements of Q or O: B*S_q*Hq*D."""
    B, hq, _, Sq, _, D, _ = problem_dims(shape)
    return B * Sq * hq * D


def elems_kv(shape: ShapeLike) -> int:
    """Elements of K or V: B*S_k*Hkv*D."""
    B, _, hkv, _, Sk, D, _ = problem_dims(shape)
    return B * Sk * hkv * D


def elems_lse(shape: ShapeLike) -> int:
    """Elements of LSE: B*Hq*S_q."""
    B, hq, _, Sq, _, _, _ = problem_dims(shape)
    return B * hq * Sq


class BufferGroup:
    """Device buffers allocated together and freed together (also when an allocation fails)."""

    def __init__(self, dev: Device) -> None:
        self.dev = dev
        self._bufs: list[DeviceBuffer] = []

    def _alloc(self, nbytes: int) -> DeviceBuffer:
        b = self.dev.alloc(nbytes)
        self._bufs.append(b)
        return b

    def free(self) -> None:
        for b in self._bufs:
            b.free()
        self._bufs.clear()


def tensor_view(bufs: Any, name: str) -> tuple[int, tuple[int, int, int]]:
    """(device pointer, element strides (batch, sequence, head)) of tensor ``name`` ("q", "k",
    "v", "o") of ``bufs`` under its problem's layout (``Problem.view``): what a launchable reads.
    The buffer is one of ``bufs.layout_bufs`` (the fused QKV tensor, the [B, H, S, D] cache) or
    the dense ``bufs.q`` / ``.k`` / ``.v`` / ``.o``; stand-in buffers without ``layout_bufs``
    (tests) are dense. AttnBuffers work theirs out once (``_views``): the timing loop asks on
    every launch."""
    cached = getattr(bufs, "_views", None)
    if cached:
        return cached[name]
    tv = as_problem(bufs.shape).view(name)
    buf = (getattr(bufs, "layout_bufs", None) or {}).get(tv.buffer) or getattr(bufs, tv.buffer)
    return int(buf.ptr) + tv.offset * BF16_BYTES, tv.strides


class AttnBuffers(BufferGroup):
    """Q, O ([B, S_q, Hq, D] BF16), K, V ([B, S_k, Hkv, D] BF16) and LSE ([B, Hq, S_q] FP32) for
    one problem. ``shape`` is the Problem; ``n`` the elements of Q/O, ``n_kv`` of K/V, ``n_lse``
    of LSE. A packed varlen batch: Q/O [total_q, Hq, D], K/V [total_k, Hkv, D], LSE [Hq, total_q]
    (problem_dims), and ``cu_q`` / ``cu_k``, its cu_seqlens_q / cu_seqlens_k (int32, num_seqs +
    1 each) on the device; both are None otherwise (``cu`` is ``cu_q``). A problem with
    attention sinks also has ``sinks`` (FP32 [Hq]); None otherwise. A paged problem has its
    ``block_table`` ([B, max_pages] int32) and ``seqused_k`` ([B] int32) on the device, and its
    pages as the layout buffers "k_pages" and "v_pages"; None otherwise.

    A problem with another layout than dense BSHD (``Problem.layout``) also gets that layout's
    buffers (``layout_bufs``: "qkv", or "k_cache" and "v_cache"). The generators, the FP32
    reference and ``inputs_to_host`` work on the dense Q, K, V; after every fill the oracle
    mirrors them into the layout buffers (tuner.measure.oracle.fill_inputs), and launchables
    read q, k, v where ``view(name)`` says."""

    def __init__(self, dev: Device, problem: ShapeLike) -> None:
        super().__init__(dev)
        self.shape = as_problem(problem)
        self.n = elems_bshd(self.shape)
        self.n_kv = elems_kv(self.shape)
        self.n_lse = elems_lse(self.shape)
        try:
            self.q = self._alloc(self.n * BF16_BYTES)
            self.k = self._alloc(self.n_kv * BF16_BYTES)
            self.v = self._alloc(self.n_kv * BF16_BYTES)
            self.o = self._alloc(self.n * BF16_BYTES)
            self.lse = self._alloc(self.n_lse * F32_BYTES)
            self.cu_q: DeviceBuffer | None = None
            self.cu_k: DeviceBuffer | None = None
            if self.shape.is_varlen:
                self.cu_q = self._alloc(4 * (self.shape.B + 1))
                self.cu_q.copy_from_host(np.asarray(self.shape.cu_seqlens(), dtype=np.int32))
                self.cu_k = self._alloc(4 * (self.shape.B + 1))
                self.cu_k.copy_from_host(np.asarray(self.shape.cu_seqlens_k(), dtype=np.int32))
            # A paged KV cache: the block table and every sequence's key count (the pages
            # themselves are layout buffers; tuner.paging).
            self.block_table: DeviceBuffer | None = None
            self.seqused_k: DeviceBuffer | None = None
            if self.shape.is_paged:
                table = self.shape.pages.block_table
                self.block_table = self._alloc(4 * table.size)
                self.block_table.copy_from_host(table)
                lens = self.shape.seqlens_k or (self.shape.Sk,) * self.shape.B
                self.seqused_k = self._alloc(4 * self.shape.B)
                self.seqused_k.copy_from_host(np.asarray(lens, dtype=np.int32))
            # Attention sinks: one FP32 logit per query head (the inputs' generator fills it).
            self.sinks: DeviceBuffer | None = (self._alloc(F32_BYTES * self.shape.Hq)
                                               if self.shape.sinks else None)
            self.layout_bufs: dict[str, DeviceBuffer] = {
                name: self._alloc(n * BF16_BYTES)
                for name, n in self.shape.layout_buffers().items()}
            if self.shape.is_paged:
                # Rows of a last page past its sequence's keys are never mirrored into, but
                # kernels that load whole pages multiply them by P = 0: zero, not whatever the
                # allocation held (a freed buffer's NaN poison gives NaN).
                for name in ("k_pages", "v_pages"):
                    self.layout_bufs[name].memset_u8(0)
            # Worked out once: every launch of the timing loop asks for them.
            self._views = {name: tensor_view(self, name) for name in ("q", "k", "v", "o")}
        except BaseException:
            self.free()
            raise

    @property
    def problem(self) -> Problem:
        return self.shape

    def view(self, name: str) -> tuple[int, tuple[int, int, int]]:
        """(pointer, element strides (batch, sequence, head)) of q, k, v or o as launchables
        read it: dense for bshd, the layout buffer's view otherwise (``tensor_view``)."""
        return tensor_view(self, name)

    def mirrored(self) -> list[tuple[str, TensorView]]:
        """The tensors whose launch view is not their dense buffer, with that view: what the
        oracle copies the dense inputs into after each fill (none for bshd)."""
        out = []
        for name in ("q", "k", "v"):
            tv = self.shape.view(name)
            if tv.buffer != name:
                out.append((name, tv))
        return out

    @property
    def cu(self) -> DeviceBuffer | None:
        """cu_seqlens_q (the name from before separate key lengths)."""
        return self.cu_q

    def __enter__(self) -> AttnBuffers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()


# ---- built .so files ------------------------------------------------------------------------
_c_int = ctypes.c_int
_c_ll = ctypes.c_longlong
_c_ull = ctypes.c_ulonglong
_c_float = ctypes.c_float
_vp = ctypes.c_void_p


def _load_so(path: Path, what: str) -> ctypes.CDLL:
    if not path.is_file():
        raise FaTuneError(f"{what} not found: {path}")
    try:
        return ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        raise FaTuneError(f"cannot load {what} {path}: {e}") from None


def _bind(lib: ctypes.CDLL, path: Path, name: str, restype: Any, argtypes: Sequence[Any]) -> Any:
    try:
        fn = getattr(lib, name)
    except AttributeError:
        raise FaTuneError(f"{path} does not export {name}(): not a fa-tune build?") from None
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


# ---- re-exports: the kernel and oracle bindings live in their own modules --------------------
# They import this module, so they are loaded on first use (PEP 562), not at import: either
# module, or this one, may be imported first.
_MOVED = {
    "HostStatus": "tuner.kernel.kernel_module", "KernelModule": "tuner.kernel.kernel_module",
    "MappedStatus": "tuner.kernel.kernel_module",
    "ORACLE_ABI_VERSION": "tuner.kernel.oracle_module",
    "ORACLE_ROW_BLOCK": "tuner.kernel.oracle_module",
    "ORACLE_STATS_BYTES": "tuner.kernel.oracle_module",
    "OracleModule": "tuner.kernel.oracle_module",
}

if TYPE_CHECKING:  # "X as X": re-exported names, for type checkers and linters
    from tuner.kernel.kernel_module import HostStatus as HostStatus
    from tuner.kernel.kernel_module import KernelModule as KernelModule
    from tuner.kernel.kernel_module import MappedStatus as MappedStatus
    from tuner.kernel.oracle_module import ORACLE_ABI_VERSION as ORACLE_ABI_VERSION
    from tuner.kernel.oracle_module import ORACLE_ROW_BLOCK as ORACLE_ROW_BLOCK
    from tuner.kernel.oracle_module import ORACLE_STATS_BYTES as ORACLE_STATS_BYTES
    from tuner.kernel.oracle_module import OracleModule as OracleModule


def __getattr__(name: str) -> Any:
    where = _MOVED.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where), name)
