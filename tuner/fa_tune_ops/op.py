"""The custom op ``fa_tune::attention`` (torch.library): checks, fake and CUDA implementations.

Schema::

    fa_tune::attention(Tensor q, Tensor k, Tensor v, bool causal=True, float? softmax_scale=None,
                       Tensor? cu_seqlens=None, SymInt? max_seqlen=None) -> (Tensor out, Tensor lse)

Fixed length: q [B, S, Hq, D], k/v [B, S, Hkv, D]: BF16, contiguous, one CUDA device; out like
q, lse [B, Hq, S] FP32. Varlen (packed sequences, as FA3's flash_attn_varlen_func), with
cu_seqlens and max_seqlen: q [total, Hq, D], k/v [total, Hkv, D], cu_seqlens int32 [num_seqs +
1] on q's device (0, non-decreasing, total), max_seqlen an int at least every sequence's length
(not checked: that would read cu_seqlens, a host sync); out like q, lse [Hq, total] FP32; causal
or not per sequence; the bucket is the one serving (Hq, Hkv, max_seqlen).

The CUDA implementation runs in C++ where the extension beside the library was built for this
torch (native.py; ``native.status()`` says whether), in Python otherwise: same checks and
results. It allocates the outputs (and varlen's workspace) with torch (its caching
allocator, so CUDA graph pools work) and launches on torch's current stream without
synchronising the host (only a fixed-length shape's first call does its one-time setup, a
synchronous upload of the scheduler's task lists: run each shape once before a CUDA graph
capture; varlen builds its schedule on the device and needs none); the fake implementation
gives the same shapes from metadata alone, so torch.compile(fullgraph=True) traces through the
op. Forward only (no autograd formula).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import native
from .library import Library, LibraryError, default_path

NAMESPACE = "fa_tune"
SCHEMA = ("attention(Tensor q, Tensor k, Tensor v, bool causal=True, float? softmax_scale=None, "
          "Tensor? cu_seqlens=None, SymInt? max_seqlen=None) -> (Tensor out, Tensor lse)")
MAX_ELEMS = 2**31 - 1  # the kernel's offsets into Q/K/V/O are 32-bit
_BF16 = torch.bfloat16

_lib: Library | None = None
# Shapes whose one-time setup (fa_tune_prepare) ran: (device, B, Hq, Hkv, S).
_prepared: set[tuple[int, int, int, int, int]] = set()


def load(path: str | None = None) -> Library:
    """Load the kernel library the op calls (default: $FA_TUNE_LIB, else ../lib beside this
    package); replaces the one loaded before."""
    global _lib
    lib = Library(path if path is not None else default_path())
    _lib = lib
    _prepared.clear()
    _use_native_beside(lib.path)
    native.bind(lib)
    return lib


def library() -> Library:
    """The loaded library (loading the default one on first use)."""
    if _lib is None:
        try:
            return load()
        except LibraryError as e:
            raise ValueError(f"fa_tune::attention: {e}") from None
    return _lib


def _fail(msg: str) -> None:
    raise ValueError(f"fa_tune::attention: {msg}")


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 softmax_scale: float | None, cu_seqlens: torch.Tensor | None = None,
                 max_seqlen: Any = None, lib: Library | None = None) -> None:
    """Raise ValueError (one sentence) for input the library cannot run; metadata only (no
    data access, no sync), so the fake implementation runs it too."""
    lib = lib or library()
    if cu_seqlens is not None or max_seqlen is not None:
        _check_varlen(q, k, v, causal, softmax_scale, cu_seqlens, max_seqlen, lib)
        return
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        _fail(f"q, k and v must be 4-D BSHD [batch, seq, heads, head_dim]; got q {_shape(q)}, "
              f"k {_shape(k)}, v {_shape(v)}")
    B, S, Hq, D = q.shape
    if B < 1 or S < 1 or Hq < 1:
        _fail(f"q {_shape(q)} is empty; B, S and Hq must be at least 1")
    if tuple(k.shape) != tuple(v.shape) or k.shape[0] != B or k.shape[1] != S or k.shape[3] != D:
        _fail(f"k and v must be [{B}, {S}, Hkv, {D}] for q {_shape(q)}; got k {_shape(k)}, "
              f"v {_shape(v)} (query length = key length: prefill only)")
    _check_common(q, k, v, causal, softmax_scale, lib,
                  "BSHD (a [B, H, S, D] tensor's .transpose(1, 2) is BSHD only if its memory "
                  "is laid out so)")
    Hkv = k.shape[2]
    dims = (B, Hq, Hkv, S)
    if all(isinstance(x, int) for x in dims) and lib.bucket_for(*dims) == -1:
        _fail(f"no bucket of {lib.path.name} serves B={B} Hq={Hq} Hkv={Hkv} S={S}; it serves "
              f"{lib.serves_text()}")


def _check_common(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  softmax_scale: float | None, lib: Library, layout: str) -> None:
    """The checks fixed length and varlen share, once the ranks are right."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != _BF16:
            _fail(f"{name} is {t.dtype}; the kernel takes torch.bfloat16 only")
    if k.device != q.device or v.device != q.device:
        _fail(f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    if q.shape[-1] != lib.head_dim:
        _fail(f"head dim {q.shape[-1]}: this library is built for head dim {lib.head_dim}")
    Hq, Hkv = q.shape[-2], k.shape[-2]
    if Hkv < 1 or Hq % Hkv != 0:
        _fail(f"Hq={Hq} must be a multiple of Hkv={Hkv}")
    if bool(causal) != lib.causal:
        _fail(f"causal={bool(causal)}: this library is built "
              f"{'causal' if lib.causal else 'non-causal'} only")
    if softmax_scale is not None and not (softmax_scale > 0 and math.isfinite(softmax_scale)):
        _fail(f"softmax_scale must be finite and > 0 (None: 1/sqrt(head_dim)); got {softmax_scale}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_contiguous():
            _fail(f"{name} {_shape(t)} with strides {tuple(t.stride())} is not contiguous; the "
                  f"kernel reads dense {layout}")
    if q.numel() > MAX_ELEMS:
        _fail(f"q {_shape(q)} has 2^31 elements or more; the kernel's offsets are 32-bit")


def _check_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  softmax_scale: float | None, cu_seqlens: torch.Tensor | None, max_seqlen: Any,
                  lib: Library) -> None:
    """check_inputs for packed sequences (metadata only: cu_seqlens' values are the kernel's)."""
    if cu_seqlens is None:
        _fail("max_seqlen goes with cu_seqlens (varlen); pass both, or neither")
    if max_seqlen is None:
        _fail("varlen needs max_seqlen (the longest sequence's length, as "
              "flash_attn_varlen_func's max_seqlen_q) beside cu_seqlens")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        _fail(f"with cu_seqlens, q, k and v are 3-D packed [total_tokens, heads, head_dim]; got "
              f"q {_shape(q)}, k {_shape(k)}, v {_shape(v)}")
    total, Hq, D = q.shape
    if total < 1 or Hq < 1:
        _fail(f"q {_shape(q)} is empty; total_tokens and Hq must be at least 1")
    if tuple(k.shape) != tuple(v.shape) or k.shape[0] != total or k.shape[2] != D:
        _fail(f"k and v must be [{total}, Hkv, {D}] for q {_shape(q)}; got k {_shape(k)}, "
              f"v {_shape(v)} (query length = key length per sequence: prefill only)")
    _check_common(q, k, v, causal, softmax_scale, lib,
                  "packed [total_tokens, heads, head_dim] rows")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        _fail(f"cu_seqlens must be 1-D [num_seqs + 1] with at least 2 entries; got "
              f"{_shape(cu_seqlens)}")
    if cu_seqlens.dtype != torch.int32:
        _fail(f"cu_seqlens is {cu_seqlens.dtype}; the kernel takes torch.int32 "
              "(cu_seqlens.to(torch.int32))")
    if cu_seqlens.device != q.device:
        _fail(f"cu_seqlens must be on q's device {q.device} (the kernel reads it there); got "
              f"{cu_seqlens.device}")
    if not cu_seqlens.is_contiguous():
        _fail(f"cu_seqlens with stride {tuple(cu_seqlens.stride())} is not contiguous")
    Hkv = k.shape[1]
    if isinstance(max_seqlen, int):  # a SymInt while tracing: checked when it runs
        if max_seqlen < 1:
            _fail(f"max_seqlen must be at least 1 (the longest sequence's length); got "
                  f"{max_seqlen}")
        if max_seqlen > MAX_ELEMS:
            _fail(f"max_seqlen {max_seqlen} exceeds the kernel's 32-bit lengths")
    why = lib.varlen_missing()
    if why is not None:
        _fail(why)
    if isinstance(max_seqlen, int) and isinstance(Hq, int) and isinstance(Hkv, int):
        i = lib.bucket_for(1, Hq, Hkv, max_seqlen)
        if i == -1:
            _fail(f"no bucket of {lib.path.name} serves varlen Hq={Hq} Hkv={Hkv} max_seqlen="
                  f"{max_seqlen}; it serves {lib.serves_text()}")
        if i is not None:
            why = lib.varlen_missing(i)
            if why is not None:
                _fail(f"{why} (max_seqlen={max_seqlen} picks it)")


def _fast_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
             lib: Library) -> bool:
    """The common case in one expression (the launch path's budget is microseconds);
    check_inputs explains anything else."""
    qs, ks = q.shape, k.shape
    return (q.dtype == _BF16 and k.dtype == _BF16 and v.dtype == _BF16 and len(qs) == 4
            and len(ks) == 4 and ks == v.shape and qs[0] == ks[0] and qs[1] == ks[1]
            and qs[3] == lib.head_dim and ks[3] == qs[3] and ks[2] > 0 and qs[2] % ks[2] == 0
            and qs[0] > 0 and qs[1] > 0
            and bool(causal) == lib.causal and q.is_contiguous() and k.is_contiguous()
            and v.is_contiguous() and k.get_device() == q.get_device() == v.get_device())


def _raw_stream(device: int) -> int:
    try:  # what torch.compile's generated code uses: no Stream object
        return torch._C._cuda_getCurrentRawStream(device)
    except AttributeError:
        return torch.cuda.current_stream(device).cuda_stream


def _prepare(lib: Library, key: tuple[int, int, int, int, int], stream: int) -> None:
    """A shape's one-time setup (cudaMalloc + a synchronous upload of task lists): never inside
    a CUDA graph capture, where those calls are illegal."""
    import ctypes

    if torch.cuda.is_current_stream_capturing():
        _fail(f"shape B={key[1]} Hq={key[2]} Hkv={key[3]} S={key[4]} is first run inside a CUDA "
              "graph capture; run it once before capturing (its one-time setup uploads the "
              "scheduler's task lists)")
    ms = ctypes.c_double(0.0)
    rc = lib.prepare(key[1], key[2], key[3], key[4], stream, ctypes.byref(ms))
    if rc != 0:
        raise RuntimeError(f"fa_tune::attention: fa_tune_prepare failed with CUDA error {rc}: "
                           f"{lib.last_error()}")
    _prepared.add(key)


def _current_device() -> int:
    try:  # torch.cuda.current_device() without its lazy-init check (the op runs on CUDA)
        return torch._C._cuda_getDevice()
    except AttributeError:
        return torch.cuda.current_device()


def _cuda_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
               softmax_scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
               max_seqlen: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    lib = _lib or library()
    if cu_seqlens is not None or max_seqlen is not None:
        return _cuda_varlen(q, k, v, causal, softmax_scale, cu_seqlens, max_seqlen, lib)
    dev = q.get_device()
    if (dev < 0 or not _fast_ok(q, k, v, causal, lib)
            or (softmax_scale is not None
                and not (softmax_scale > 0 and math.isfinite(softmax_scale)))):
        check_inputs(q, k, v, causal, softmax_scale, lib=lib)
        if dev < 0:
            _fail(f"q, k and v must be CUDA tensors; got {q.device}")
    if _current_device() != dev:  # the library launches on the current device
        with torch.cuda.device(dev):
            return _cuda_impl(q, k, v, causal, softmax_scale)
    B, S, Hq, _ = q.shape
    Hkv = k.shape[2]
    stream = _raw_stream(dev)
    key = (dev, B, Hq, Hkv, S)
    if key not in _prepared:
        if lib.bucket_for(B, Hq, Hkv, S) == -1:
            check_inputs(q, k, v, causal, softmax_scale, lib=lib)  # says what it serves
        _prepare(lib, key, stream)
    out = torch.empty_like(q)
    lse = torch.empty((B, Hq, S), dtype=torch.float32, device=q.device)
    rc = lib.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                     B, Hq, Hkv, S, softmax_scale or 0.0, stream)
    if rc != 0:
        raise RuntimeError(f"fa_tune::attention: fa_tune_forward failed with CUDA error {rc}: "
                           f"{lib.last_error()}")
    return out, lse


def _cuda_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 softmax_scale: float | None, cu_seqlens: torch.Tensor | None, max_seqlen: Any,
                 lib: Library) -> tuple[torch.Tensor, torch.Tensor]:
    """The varlen launch: every check each call (no one-time setup to key a fast path on),
    outputs and workspace from torch's allocator, no host sync."""
    check_inputs(q, k, v, causal, softmax_scale, cu_seqlens, max_seqlen, lib)
    dev = q.get_device()
    if dev < 0:
        _fail(f"q, k and v must be CUDA tensors; got {q.device}")
    if _current_device() != dev:  # the library launches on the current device
        with torch.cuda.device(dev):
            return _cuda_varlen(q, k, v, causal, softmax_scale, cu_seqlens, max_seqlen, lib)
    assert cu_seqlens is not None  # check_inputs refused None
    total, Hq, _ = q.shape
    Hkv = k.shape[1]
    num_seqs, max_seqlen = cu_seqlens.shape[0] - 1, int(max_seqlen)
    nbytes = int(lib.varlen_workspace_bytes(num_seqs, Hq, total, max_seqlen))
    if nbytes == 0:  # the library's word for invalid arguments (never its own workspace here)
        _fail(f"the kernel library refuses varlen num_seqs={num_seqs} Hq={Hq} "
              f"total_tokens={total} max_seqlen={max_seqlen}")
    out = torch.empty_like(q)
    lse = torch.empty((Hq, total), dtype=torch.float32, device=q.device)
    # Freed when this returns: the caching allocator reuses it only in stream order after the
    # kernel, and a CUDA graph capture keeps it in the graph's pool.
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
    rc = lib.forward_varlen(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                            lse.data_ptr(), cu_seqlens.data_ptr(), num_seqs, total, max_seqlen,
                            Hq, Hkv, softmax_scale or 0.0, workspace.data_ptr(), nbytes,
                            _raw_stream(dev))
    if rc != 0:
        raise RuntimeError(f"fa_tune::attention: fa_tune_forward_varlen failed with CUDA error "
                           f"{rc}: {lib.last_error()}")
    return out, lse


def _cpu_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
              softmax_scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
              max_seqlen: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    check_inputs(q, k, v, causal, softmax_scale, cu_seqlens, max_seqlen)
    _fail(f"q, k and v must be CUDA tensors; got {q.device}")
    raise AssertionError  # unreachable: _fail raised


def _fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
          softmax_scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
          max_seqlen: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    check_inputs(q, k, v, causal, softmax_scale, cu_seqlens, max_seqlen)
    if cu_seqlens is not None:  # varlen: q [total, Hq, D], lse [Hq, total]
        return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    B, S, Hq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, Hq, S), dtype=torch.float32)


def _register() -> Any:
    try:
        lib = torch.library.Library(NAMESPACE, "DEF")
    except RuntimeError:
        raise ImportError(
            f"the op {NAMESPACE}::attention is registered already in this process (another copy "
            "of fa_tune_ops was imported first); import one copy per process"
        ) from None
    lib.define(SCHEMA)
    # The Python implementation under its own name too: the C++ launch path (native.py) runs
    # the steady state and hands everything else (checks, errors, one-time setup) to it.
    lib.define(SCHEMA.replace("attention(", "_attention_py(", 1))
    lib.impl("_attention_py", _cuda_impl, "CUDA")
    lib.impl("attention", _cpu_impl, "CPU")
    torch.library.register_fake(f"{NAMESPACE}::attention", _fake, lib=lib)
    return lib


def _python_cuda_kernel() -> Any:
    """The Python CUDA kernel of fa_tune::attention, in a registration of its own, so the C++
    one can replace it."""
    lib = torch.library.Library(NAMESPACE, "IMPL")
    lib.impl("attention", _cuda_impl, "CUDA")
    return lib


def _use_native_beside(lib_path: Any) -> None:
    """Switch the op's CUDA kernel to the C++ launch path if its extension is beside the kernel
    library (once per process; native.status() says what happened)."""
    global _PY_CUDA
    if native.loaded():
        return
    ext = native.find(lib_path)
    if ext is None:
        return
    if _PY_CUDA is not None:
        _PY_CUDA._destroy()  # the extension's static registration takes the CUDA key
        _PY_CUDA = None
    if not native.load(ext):
        _PY_CUDA = _python_cuda_kernel()


_TORCH_LIBRARY = _register()  # held: the registration lives as long as this object
_PY_CUDA: Any = _python_cuda_kernel()
_use_native_beside(default_path())


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
              softmax_scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
              max_seqlen: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.ops.fa_tune.attention: (out [B, S, Hq, D], lse [B, Hq, S] FP32), or with
    cu_seqlens and max_seqlen (varlen) (out [total, Hq, D], lse [Hq, total] FP32)."""
    return torch.ops.fa_tune.attention(q, k, v, causal, softmax_scale, cu_seqlens, max_seqlen)
