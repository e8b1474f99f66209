"""The custom op ``fa_tune::attention`` (torch.library): registration, fake and CUDA kernels.

Schema (FlashAttention-3's ``flash_attn_varlen_func`` names)::

    fa_tune::attention(Tensor q, Tensor k, Tensor v, bool causal=True, float? softmax_scale=None,
                       Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None,
                       SymInt? max_seqlen_q=None, SymInt? max_seqlen_k=None,
                       Tensor? seqused_k=None, int window=0, float softcap=0.0,
                       Tensor? sinks=None, Tensor? block_table=None) -> (Tensor out, Tensor lse)

BF16 CUDA tensors, head dim the library's, its mask; causal is aligned bottom-right (query i of
a sequence with s_q queries and s_k keys sees keys 0 .. i + s_k - s_q).

* Fixed length: q [B, S_q, Hq, D], k/v [B, S_k, Hkv, D] (S_q <= S_k when causal); out [B, S_q,
  Hq, D], lse [B, Hq, S_q] FP32.
* Packed (varlen): cu_seqlens_q with max_seqlen_q for q [total_q, Hq, D] (out alike, lse [Hq,
  total_q]); cu_seqlens_k with max_seqlen_k for k/v [total_k, Hkv, D]. A packed k needs its
  own cu_seqlens_k: with cu_seqlens_q alone, k and v are a cache [num_seqs, S_cache, Hkv, D].
* A cache: seqused_k [B] int32 (``cache_seqlens`` in ``attention()``, as flash_attn_with_kvcache):
  sequence b attends to its first seqused_k[b] keys of k/v [B, S_cache, Hkv, D].
* A paged KV cache: block_table [B, max_pages] int32 (FA3's ``page_table``; ``page_table=`` in
  ``attention()``), k/v [num_pages, page_size, Hkv, D] (page_size a power of two, 8 to 4096):
  sequence b's key j is row j % page_size of page block_table[b, j // page_size]; seqused_k [B]
  its keys (None: max_seqlen_k each), q fixed [B, S_q, Hq, D] or packed with cu_seqlens_q;
  no cu_seqlens_k; max_seqlen_k at most, and by default, max_pages * page_size. The table may
  be a view of a wider one (unit stride along the pages; its row stride is passed as is).
  Needs a library built for pages (``Library.paged``), whose device-scheduled kernel then takes
  only paged calls (its fixed-length calls are plain). Entries are checked by the kernel as
  other device metadata is: one out of range raises at the next call (below), naming it.
* Strides: q, k and v may be strided views (batch, sequence and head strides; the head dim
  contiguous): fused-QKV views, transformers' cache [B, H, S, D] transposed to BSHD. Where TMA
  cannot read one as it is (a stride not a multiple of 8 elements, a pointer off 16 bytes) the
  op copies it and warns once (checks.CopyWarning). out is always dense.

The models' masks (each needs a library whose problem class has it: ``Library.window`` etc.):
``window`` a sliding window of that many keys (transformers' ``sliding_window``; query i sees its
diagonal key and the window - 1 before it; 0: none); ``softcap`` scores s become softcap *
tanh(s / softcap) (Gemma-2; 0: none); ``sinks`` FP32 [Hq], one logit per query head joining each
row's softmax denominator (gpt-oss; lse includes it).

Metadata tensors are int32, 1-D, contiguous, on q's device (the block table 2-D); their values
are checked by the kernel, never read on the host (status.py: a bad batch raises at the next
call, at ``fa_tune_ops.check()``, or at once under ``FA_TUNE_OPS_SYNC_CHECK=1``). Anything else the
library cannot run is one ValueError sentence, decided from metadata alone (checks.py), so the
fake implementation runs the same checks and torch.compile(fullgraph=True) traces the op.

The CUDA implementation runs in C++ where the extension beside the library was built for this
torch (native.py; ``native.status()`` says whether), in Python otherwise: same checks and
results. It allocates out, lse (and the workspace of a call with device metadata) with torch's
caching allocator, so CUDA graph pools work, and launches on torch's current stream without
synchronising the host; only a fixed-length shape's first call does its one-time setup, a
synchronous upload of the scheduler's task lists: run each shape once before a CUDA graph
capture (calls with device metadata build their schedule on the device and need none).
Forward only (no autograd formula).

CUDA graphs and device metadata: a captured call holds the addresses of cu_seqlens, seqused_k
and the block table, and the kernel reads their values at each replay: update them in place
(``table.copy_(new)``, same shape) between replays, and each replay attends through the table it
finds then. Nothing about their values is kept on the host (not by this op, not by the
library), so a changed table needs no new capture; a new tensor (another address) or another
shape does (max_pages and the row stride are in the captured arguments).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from . import abi, checks, native, status
from .checks import Call
from .library import Library, LibraryError, default_path

NAMESPACE = "fa_tune"
SCHEMA = ("attention(Tensor q, Tensor k, Tensor v, bool causal=True, float? softmax_scale=None, "
          "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, SymInt? max_seqlen_q=None, "
          "SymInt? max_seqlen_k=None, Tensor? seqused_k=None, int window=0, float softcap=0.0, "
          "Tensor? sinks=None, Tensor? block_table=None) -> (Tensor out, Tensor lse)")
MAX_ELEMS = checks.MAX_ELEMS

_lib: Library | None = None
# Fixed-length shapes whose one-time setup (fa_tune_prepare) ran: (device, B, Hq, Hkv, Sq, Sk,
# window; the static scheduler's task lists count a window's tiles).
_prepared: set[tuple[int, int, int, int, int, int, int]] = set()


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


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                 softmax_scale: float | None = None, cu_seqlens_q: torch.Tensor | None = None,
                 cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: Any = None,
                 max_seqlen_k: Any = None, seqused_k: torch.Tensor | None = None,
                 window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                 lib: Library | None = None, block_table: torch.Tensor | None = None) -> Call:
    """Raise ValueError (one sentence) for input the library cannot run (metadata only: no data
    access, no sync); else the call's form (checks.Call)."""
    return checks.check(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k,
                        max_seqlen_q, max_seqlen_k, seqused_k, lib or library(), window, softcap,
                        sinks, block_table)


def _raw_stream(device: int) -> int:
    try:  # what torch.compile's generated code uses: no Stream object
        return torch._C._cuda_getCurrentRawStream(device)
    except AttributeError:
        return torch.cuda.current_stream(device).cuda_stream


def _current_device() -> int:
    try:  # torch.cuda.current_device() without its lazy-init check (the op runs on CUDA)
        return torch._C._cuda_getDevice()
    except AttributeError:
        return torch.cuda.current_device()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _launch_failed(lib: Library, rc: int, what: str = "fa_tune_forward") -> None:
    raise RuntimeError(f"fa_tune::attention: {what} failed with CUDA error {rc}: "
                       f"{lib.last_error()}")


def _prepare(lib: Library, args: abi.Args, key: tuple[int, ...]) -> None:
    """A fixed-length shape's one-time setup (cudaMalloc + a synchronous upload of task lists):
    never inside a CUDA graph capture, where those calls are illegal."""
    if torch.cuda.is_current_stream_capturing():
        checks.fail(f"shape B={key[1]} Hq={key[2]} Hkv={key[3]} S_q={key[4]} S_k={key[5]} is "
                    "first run inside a CUDA graph capture; run it once before capturing (its "
                    "one-time setup uploads the scheduler's task lists)")
    ms = ctypes.c_double(0.0)
    rc = lib.prepare(ctypes.byref(args), ctypes.byref(ms))
    if rc != 0:
        _launch_failed(lib, rc, "fa_tune_prepare")
    _prepared.add(key)  # type: ignore[arg-type]


def build_args(lib: Library, call: Call, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out: torch.Tensor, lse: torch.Tensor, strides: tuple[tuple[int, int, int], ...],
               softmax_scale: float | None = None, cu_seqlens_q: torch.Tensor | None = None,
               cu_seqlens_k: torch.Tensor | None = None, seqused_k: torch.Tensor | None = None,
               window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None,
               block_table: torch.Tensor | None = None) -> abi.Args:
    """The C ABI's argument struct of a checked call (the pointers of q, k and v as given, in
    layouts TMA reads; ``strides`` their kernel strides). No status words and no workspace: the
    caller adds those. The C++ launch path (attention_op.cpp) fills the same fields alike."""
    qs, ks, vs = strides
    args = abi.make_args(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(), lse=lse.data_ptr(),
        q_stride=qs, k_stride=ks, v_stride=vs, batch=int(call.batch), heads_q=q.shape[-2],
        heads_kv=k.shape[-2], head_dim=lib.head_dim, seqlen_q=int(call.seqlen_q),
        seqlen_k=int(call.seqlen_k), total_q=int(call.total_q), total_k=int(call.total_k),
        cu_seqlens_q=_ptr(cu_seqlens_q), cu_seqlens_k=_ptr(cu_seqlens_k),
        seqused_k=_ptr(seqused_k), softmax_scale=softmax_scale or 0.0, causal=int(lib.causal),
        window=int(window), softcap=float(softcap), sinks=_ptr(sinks))
    if call.pages is not None:  # the table's address only: the kernel reads its values
        pg = call.pages
        args.block_table = _ptr(block_table)
        args.block_table_stride = int(pg.table_stride)
        args.max_pages = int(pg.max_pages)
        args.page_size = int(pg.page_size)
        args.num_pages = int(pg.num_pages)
    return args


def _cuda_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
               softmax_scale: float | None = None, cu_seqlens_q: torch.Tensor | None = None,
               cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: Any = None,
               max_seqlen_k: Any = None, seqused_k: torch.Tensor | None = None,
               window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None,
               block_table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    lib = _lib or library()
    dev = q.get_device()
    if dev >= 0 and _current_device() != dev:  # the library launches on the current device
        with torch.cuda.device(dev):
            return _cuda_impl(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q, max_seqlen_k, seqused_k, window, softcap, sinks,
                              block_table)
    if dev >= 0:
        status.raise_pending(dev)
    call = checks.check(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k,
                        max_seqlen_q, max_seqlen_k, seqused_k, lib, window, softcap, sinks,
                        block_table)
    if dev < 0:
        checks.fail(f"q, k and v must be CUDA tensors; got {q.device}")
    # Made on the device's first call of any kind (usually before a graph capture), so the C++
    # path can look for a pending bad batch on every call.
    status_words = status.status_ptr(dev)
    q, qs = checks.kernel_tensor(q, "q")
    k, ks = checks.kernel_tensor(k, "k")
    v, vs = checks.kernel_tensor(v, "v")
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(call.lse_shape(q), dtype=torch.float32, device=q.device)
    args = build_args(lib, call, q, k, v, out, lse, (qs, ks, vs), softmax_scale, cu_seqlens_q,
                      cu_seqlens_k, seqused_k, window, softcap, sinks, block_table)
    workspace = None
    if call.device_metadata:
        args.status = status_words
        nbytes = int(lib.workspace_bytes(ctypes.byref(args)))
        if nbytes == 0:  # the library's word for arguments it refuses
            checks.fail(f"the kernel library refuses this call: "
                        f"{lib.last_error() or 'fa_tune_workspace_bytes() is 0'}")
        # Freed when this returns: the caching allocator reuses it only in stream order after
        # the kernel, and a CUDA graph capture keeps it in the graph's pool.
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
        args.workspace, args.workspace_bytes = workspace.data_ptr(), nbytes
    else:
        key = (dev, int(call.batch), q.shape[-2], k.shape[-2], int(call.seqlen_q),
               int(call.seqlen_k), int(window))
        if key not in _prepared:
            _prepare(lib, args, key)
    rc = lib.forward(ctypes.byref(args), _raw_stream(dev))
    if rc != 0:
        _launch_failed(lib, rc)
    status.count("fa_tune")
    if call.device_metadata:
        status.after_launch(dev)
    return out, lse


def _cpu_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
              softmax_scale: float | None = None, cu_seqlens_q: torch.Tensor | None = None,
              cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: Any = None,
              max_seqlen_k: Any = None, seqused_k: torch.Tensor | None = None,
              window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None,
              block_table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    check_inputs(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k, seqused_k, window, softcap, sinks, block_table=block_table)
    checks.fail(f"q, k and v must be CUDA tensors; got {q.device}")
    raise AssertionError  # unreachable: fail raised


def _fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
          softmax_scale: float | None = None, cu_seqlens_q: torch.Tensor | None = None,
          cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: Any = None,
          max_seqlen_k: Any = None, seqused_k: torch.Tensor | None = None,
          window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None,
          block_table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    call = check_inputs(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k,
                        max_seqlen_q, max_seqlen_k, seqused_k, window, softcap, sinks,
                        block_table=block_table)
    out = q.new_empty(q.shape)  # dense, whatever q's strides
    return out, q.new_empty(call.lse_shape(q), dtype=torch.float32)


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
    # the steady state and hands everything else (checks, errors, copies, one-time setup) to it.
    lib.define(SCHEMA.replace("attention(", "_attention_py(", 1))
    lib.impl("_attention_py", _cuda_impl, "CUDA")
    lib.impl("attention", _cpu_impl, "CPU")
    torch.library.register_fake(f"{NAMESPACE}::attention", _fake, lib=lib)
    torch.library.register_fake(f"{NAMESPACE}::_attention_py", _fake, lib=lib)
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
              softmax_scale: float | None = None, cu_seqlens_q: torch.Tensor | None = None,
              cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: int | None = None,
              max_seqlen_k: int | None = None, seqused_k: torch.Tensor | None = None, *,
              cache_seqlens: torch.Tensor | int | None = None, window: int = 0,
              softcap: float = 0.0, sinks: torch.Tensor | None = None,
              block_table: torch.Tensor | None = None, page_table: torch.Tensor | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.ops.fa_tune.attention (the module docstring has every form): (out, lse).

    ``cache_seqlens`` is flash_attn_with_kvcache's name for ``seqused_k``: q [B, S_q, Hq, D]
    over caches k/v [B, S_cache, Hkv, D], each batch entry attending to its first
    cache_seqlens[b] keys (causal: bottom-right against that length); an int means the same
    length for every entry. ``page_table`` is FA3's name for ``block_table``: k/v are then a
    paged cache [num_pages, page_size, Hkv, D], as ``flash_attn_with_kvcache(q, k_cache,
    v_cache, cache_seqlens=..., page_table=...)`` and ``flash_attn_varlen_func(q, k, v,
    cu_seqlens_q, max_seqlen_q=..., seqused_k=..., page_table=...)`` take them."""
    if page_table is not None:
        if block_table is not None:
            checks.fail("give block_table or page_table (its other name), not both")
        block_table = page_table
    if cache_seqlens is not None:
        if seqused_k is not None:
            checks.fail("give seqused_k or cache_seqlens (its other name), not both")
        if isinstance(cache_seqlens, int):
            batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
            cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32,
                                       device=q.device)
        seqused_k = cache_seqlens
    return torch.ops.fa_tune.attention(q, k, v, causal, softmax_scale, cu_seqlens_q,
                                       cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                                       window, softcap, sinks, block_table)
