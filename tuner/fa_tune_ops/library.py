"""ctypes binding of a fa-tune kernel library's C ABI v2 (no torch, no fa-tune needed).

The exported package must work where fa-tune is not installed, so it carries this small binding
instead of tuner.runtime.KernelModule (which needs cuda-python). It binds what a workload
library exports (include/fa_tune.h); a single-kernel export lacks the dispatcher's extras
(bucket_for, dispatch_json), which then answer None, and a library from before varlen lacks
forward_varlen and varlen_workspace_bytes (then None, and ``varlen`` False).
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path
from typing import Any

LIB_NAME = "libfa_tune_fwd.so"
ABI_VERSION = 2
_vp, _ci, _cf, _sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_size_t


def default_path() -> Path:
    """$FA_TUNE_LIB, else lib/libfa_tune_fwd.so beside this package (the export's layout)."""
    env = os.environ.get("FA_TUNE_LIB")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent.parent / "lib" / LIB_NAME


class LibraryError(RuntimeError):
    """The library cannot be loaded, or a call into it failed."""


class Library:
    """One loaded kernel library: its problem class and its entry points."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise LibraryError(f"no kernel library at {self.path}: pass fa_tune_ops.load(PATH) "
                               f"or set FA_TUNE_LIB")
        try:
            lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise LibraryError(f"cannot load {self.path}: {e}") from None
        if not hasattr(lib, "fa_tune_abi_version") or lib.fa_tune_abi_version() != ABI_VERSION:
            raise LibraryError(f"{self.path} does not speak the fa-tune C ABI {ABI_VERSION}")
        self._lib = lib
        # Bound once with argtypes: ctypes converts plain ints fastest when told the types.
        self.forward = lib.fa_tune_forward
        self.forward.argtypes = [_vp, _vp, _vp, _vp, _vp, _ci, _ci, _ci, _ci, _cf, _vp]
        self.forward.restype = _ci
        self.prepare = lib.fa_tune_prepare
        self.prepare.argtypes = [_ci, _ci, _ci, _ci, _vp, ctypes.POINTER(ctypes.c_double)]
        self.prepare.restype = _ci
        self.forward_varlen = getattr(lib, "fa_tune_forward_varlen", None)
        if self.forward_varlen is not None:
            # (q, k, v, o, lse, cu_seqlens, num_seqs, total_tokens, max_seqlen, Hq, Hkv,
            #  softmax_scale, workspace, workspace_bytes, stream)
            self.forward_varlen.argtypes = [_vp, _vp, _vp, _vp, _vp, _vp, _ci, _ci, _ci, _ci,
                                            _ci, _cf, _vp, _sz, _vp]
            self.forward_varlen.restype = _ci
        self.varlen_workspace_bytes = getattr(lib, "fa_tune_varlen_workspace_bytes", None)
        if self.varlen_workspace_bytes is not None:
            self.varlen_workspace_bytes.argtypes = [_ci, _ci, _ci, _ci]
            self.varlen_workspace_bytes.restype = _sz
        lib.fa_tune_last_error.restype = ctypes.c_char_p
        lib.fa_tune_problem_class.restype = ctypes.c_char_p
        pc = json.loads(lib.fa_tune_problem_class().decode())
        self.head_dim = int(pc.get("head_dim", 128))
        self.causal = bool(pc.get("causal", True))
        # A workload library says varlen when some bucket serves it; varlen_missing(i) says
        # which do not, and why.
        self.varlen = (bool(pc.get("varlen", False)) and self.forward_varlen is not None
                       and self.varlen_workspace_bytes is not None)
        self._bucket_for = getattr(lib, "fa_tune_bucket_for", None)
        if self._bucket_for is not None:
            self._bucket_for.argtypes = [_ci, _ci, _ci, _ci]
            self._bucket_for.restype = _ci
        self._bucket_varlen = self._read_bucket_varlen() if self._bucket_for is not None else []

    def _read_bucket_varlen(self) -> list[bool]:
        """Each bucket's own problem_class (fa_tune_b<i>_problem_class, exported beside the
        dispatcher's): whether its kernel serves varlen."""
        out = []
        for i in range(int(self._lib.fa_tune_bucket_count())):
            fn = getattr(self._lib, f"fa_tune_b{i}_problem_class", None)
            if fn is None:
                out.append(False)
                continue
            fn.restype = ctypes.c_char_p
            out.append(bool(json.loads(fn().decode()).get("varlen", False)))
        return out

    def varlen_missing(self, index: int | None = None) -> str | None:
        """Why the library (or its bucket ``index``) cannot run varlen; None when it can."""
        if self.forward_varlen is None or self.varlen_workspace_bytes is None:
            return f"{self.path.name} predates the varlen kernel (export it again)"
        if self._bucket_for is None:  # one kernel
            return None if self.varlen else f"{self.path.name} cannot run varlen: {_NO_VARLEN}"
        if index is None:
            return None if self.varlen else (
                f"no bucket of {self.path.name} serves varlen (each was built without the "
                "varlen kernel)")
        if self._bucket_varlen[index]:
            return None
        entry = ((self.dispatch() or {}).get("entries") or [{}] * (index + 1))[index]
        return (f"bucket {entry.get('bucket', index)} of {self.path.name} cannot run varlen: "
                f"{_NO_VARLEN}")

    def last_error(self) -> str:
        raw = self._lib.fa_tune_last_error()
        return raw.decode(errors="replace") if raw else ""

    def bucket_for(self, B: int, Hq: int, Hkv: int, S: int) -> int | None:
        """The serving bucket's index, -1 for none; None for a library without a dispatcher."""
        if self._bucket_for is None:
            return None
        return int(self._bucket_for(B, Hq, Hkv, S))

    def dispatch(self) -> dict[str, Any] | None:
        """The dispatch table compiled in (dispatch.json), or None for a single kernel."""
        fn = getattr(self._lib, "fa_tune_dispatch_json", None)
        if fn is None:
            return None
        fn.restype = ctypes.c_char_p
        return json.loads(fn().decode())

    def serves_text(self) -> str:
        """What the library serves, for error messages."""
        table = self.dispatch()
        if not table:
            return f"head dim {self.head_dim}, {'causal' if self.causal else 'non-causal'}"
        return "; ".join(f"Hq={e['Hq']} Hkv={e['Hkv']} S "
                         + (f"{e['s_min']}..{e['s_max']}" if e["s_max"] is not None
                            else f">= {e['s_min']}") + f" ({e['bucket']})"
                         for e in table.get("entries", []))


# Why a kernel has no varlen kernel: its library says nothing more; the export's README names
# the reason per bucket.
_NO_VARLEN = ("it was built without the varlen kernel (fa-tune export leaves it out where the "
              "config cannot serve varlen: its README says why)")
