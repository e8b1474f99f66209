"""The kernel library's C ABI as ctypes sees it: a mirror of ``fa_tune.h`` (no torch, no fa-tune).

``fa_tune.h`` (cuda_src/fa_tune/ in the tool, include/ in an export) is the definition; this is
its one Python mirror, used by the exported op (library.py) and by the tuner
(tuner/kernel/runtime.py). tests/test_abi.py compiles the header and checks the version, the
struct's size and every field's offset against this file.
"""

from __future__ import annotations

import ctypes
from typing import Any

ABI_VERSION = 5
_i32, _i64, _vp = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p

# status[0] bits (FA_TUNE_BAD_*): what was wrong with a call's device metadata.
BAD_METADATA = {
    1: "cu_seqlens_q does not run from 0, non-decreasing, within the query rows",
    2: "cu_seqlens_k does not run from 0, non-decreasing, within the key rows",
    4: "seqused_k is negative or exceeds the keys its sequence holds",
    8: "a query length exceeds max_seqlen_q",
    16: "a key length exceeds max_seqlen_k",
    32: "a block table entry lies outside the KV cache's pages",
}


class Args(ctypes.Structure):
    """``fa_tune_args``: one attention call (fa_tune.h documents every field)."""

    _fields_ = [
        ("abi_version", _i32),
        ("struct_bytes", _i32),
        ("q", _vp),
        ("k", _vp),
        ("v", _vp),
        ("o", _vp),
        ("lse", _vp),
        ("q_stride", _i64 * 3),
        ("k_stride", _i64 * 3),
        ("v_stride", _i64 * 3),
        ("batch", _i32),
        ("heads_q", _i32),
        ("heads_kv", _i32),
        ("head_dim", _i32),
        ("seqlen_q", _i32),
        ("seqlen_k", _i32),
        ("total_q", _i32),
        ("total_k", _i32),
        ("cu_seqlens_q", _vp),
        ("cu_seqlens_k", _vp),
        ("seqused_k", _vp),
        ("softmax_scale", ctypes.c_float),
        ("causal", _i32),
        ("workspace", _vp),
        ("workspace_bytes", ctypes.c_size_t),
        ("status", _vp),
        ("window", _i32),
        ("softcap", ctypes.c_float),
        ("sinks", _vp),
        ("block_table", _vp),
        ("block_table_stride", _i32),
        ("max_pages", _i32),
        ("page_size", _i32),
        ("num_pages", _i32),
    ]


def make_args(**fields: Any) -> Args:
    """An ``Args`` with its version and size filled in; pointers and counts from ``fields``
    (strides as 3-tuples of elements: batch, sequence, head)."""
    a = Args()
    a.abi_version = ABI_VERSION
    a.struct_bytes = ctypes.sizeof(Args)
    for name, value in fields.items():
        if name in ("q_stride", "k_stride", "v_stride"):
            getattr(a, name)[:] = [int(x) for x in value]
        else:
            setattr(a, name, value)
    return a


def bad_metadata_text(bits: int, seq: int) -> str:
    """status[] as one sentence: what was wrong, and the first sequence it was found in."""
    what = "; ".join(text for bit, text in BAD_METADATA.items() if bits & bit) or f"code {bits}"
    return f"{what} (first at sequence {seq})"


def bind(lib: ctypes.CDLL) -> dict[str, Any]:
    """The C ABI's functions of a loaded library, with their types (None where absent: the
    dispatcher's extras in a single-kernel library)."""
    pa = ctypes.POINTER(Args)
    sig: dict[str, tuple[Any, list[Any]]] = {
        "abi_version": (ctypes.c_int, []),
        "forward": (ctypes.c_int, [pa, _vp]),
        "prepare": (ctypes.c_int, [pa, ctypes.POINTER(ctypes.c_double)]),
        "workspace_bytes": (ctypes.c_size_t, [pa]),
        "last_error": (ctypes.c_char_p, []),
        "config_json": (ctypes.c_char_p, []),
        "problem_class": (ctypes.c_char_p, []),
        "smem_bytes": (ctypes.c_int, []),
        "bucket_count": (ctypes.c_int, []),
        "bucket_for": (ctypes.c_int, [pa]),
        "dispatch_json": (ctypes.c_char_p, []),
    }
    out: dict[str, Any] = {}
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, f"fa_tune_{name}", None)
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes
        out[name] = fn
    return out


def version_problem(lib: ctypes.CDLL, path: Any) -> str | None:
    """Why ``lib`` cannot be used by this binding (its ABI is another), or None."""
    fn = getattr(lib, "fa_tune_abi_version", None)
    if fn is None:
        return f"{path} has no fa_tune_abi_version(): it predates the fa-tune C ABI; rebuild it"
    fn.restype = ctypes.c_int
    found = int(fn())
    if found != ABI_VERSION:
        fix = "rebuild or re-export the library" if found < ABI_VERSION else "update fa_tune_ops"
        return f"{path} speaks fa-tune C ABI {found}, this binding speaks {ABI_VERSION}: {fix}"
    return None
