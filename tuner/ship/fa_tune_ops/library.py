"""ctypes binding of a fa-tune kernel library's C ABI (no torch, no fa-tune needed).

The exported package must work where fa-tune is not installed, so it carries this small binding
instead of tuner.kernel.runtime.KernelModule (which needs cuda-python); both take the argument
struct from abi.py, the one Python mirror of fa_tune.h. It binds what a workload library exports
(include/fa_tune.h); a single-kernel export lacks the dispatcher's extras (bucket_for,
dispatch_json): then ``bucket_for`` answers None. A library of another ABI version is refused
in one line.
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path
from typing import Any

from . import abi

LIB_NAME = "libfa_tune_fwd.so"
ABI_VERSION = abi.ABI_VERSION
# The kernel's entry points every library exports (the dispatcher's extras may be absent).
_REQUIRED = ("forward", "prepare", "workspace_bytes", "last_error", "problem_class")


def default_path() -> Path:
    """$FA_TUNE_LIB, else lib/libfa_tune_fwd.so beside this package (the export's layout)."""
    env = os.environ.get("FA_TUNE_LIB")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent.parent / "lib" / LIB_NAME


class LibraryError(RuntimeError):
    """The library cannot be loaded, or a call into it failed."""


def _range(lo: int, hi: int | None) -> str:
    return f"{lo}..{hi}" if hi is not None else f">= {lo}"


class Library:
    """One loaded kernel library: its problem class and its entry points (``forward``,
    ``prepare``, ``workspace_bytes``: ctypes functions taking ``ctypes.byref(abi.Args)``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise LibraryError(f"no kernel library at {self.path}: pass fa_tune_ops.load(PATH) "
                               f"or set FA_TUNE_LIB")
        try:
            lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise LibraryError(f"cannot load {self.path}: {e}") from None
        why = abi.version_problem(lib, self.path)
        if why is not None:
            raise LibraryError(why)
        self._lib = lib
        self.fn = abi.bind(lib)  # bound once with argtypes: ctypes converts fastest when told
        missing = [n for n in _REQUIRED if self.fn[n] is None]
        if missing:
            raise LibraryError(f"{self.path} does not export fa_tune_{missing[0]}(): not a "
                               "fa-tune build?")
        self.forward = self.fn["forward"]
        self.prepare = self.fn["prepare"]
        self.workspace_bytes = self.fn["workspace_bytes"]
        pc = json.loads(self.fn["problem_class"]().decode())
        self.head_dim = int(pc.get("head_dim", 128))
        self.causal = bool(pc.get("causal", True))
        # A workload library says varlen when some bucket serves calls with device metadata;
        # varlen_missing(i) says which do not, and why.
        self.varlen = bool(pc.get("varlen", False))
        # The models' masks its kernel carries (ABI 4): a window library also runs calls
        # without a window and a sinks library calls without sinks; a softcap one needs a cap.
        self.window = bool(pc.get("window", False))
        self.softcap = bool(pc.get("softcap", False))
        self.sinks = bool(pc.get("sinks", False))
        self._bucket_for = self.fn["bucket_for"]
        classes = self._read_bucket_classes() if self._bucket_for is not None else []
        self._bucket_varlen = [bool(c.get("varlen", False)) for c in classes]
        # A paged KV cache (ABI 5): the device-scheduled calls of a paged kernel take a block
        # table, and only those; its fixed-length calls are plain. A workload library is paged
        # where its buckets are (the dispatcher's own class predates the flag).
        self._bucket_paged = [bool(c.get("paged", False)) for c in classes]
        self.paged = bool(pc.get("paged", False)) or any(self._bucket_paged)
        self._table: dict[str, Any] | None = None
        # (Hq, Hkv, S_q, S_k, window) -> bucket index: the dispatcher's answer never changes.
        self._buckets: dict[tuple[int, int, int, int, int], int] = {}

    def _read_bucket_classes(self) -> list[dict[str, Any]]:
        """Each bucket's own problem_class (fa_tune_b<i>_problem_class, exported beside the
        dispatcher's): whether its kernel serves calls with device metadata, and with pages."""
        out: list[dict[str, Any]] = []
        for i in range(int(self.fn["bucket_count"]())):
            fn = getattr(self._lib, f"fa_tune_b{i}_problem_class", None)
            if fn is None:
                out.append({})
                continue
            fn.restype = ctypes.c_char_p
            out.append(json.loads(fn().decode()))
        return out

    def paged_at(self, index: int | None = None) -> bool | None:
        """Whether the device-scheduled kernel of bucket ``index`` (None: the library's own)
        reads a paged KV cache, and so needs a block table; None where index is None and the
        buckets differ (the lengths pick one)."""
        if not self._bucket_paged:
            return self.paged
        if index is not None:
            return self._bucket_paged[index]
        return self._bucket_paged[0] if len(set(self._bucket_paged)) == 1 else None

    def where(self, index: int | None = None) -> str:
        """'bucket NAME of lib.so' for a dispatcher's bucket, else the library's file name."""
        if index is None or self._bucket_for is None:
            return self.path.name
        entries = (self.dispatch() or {}).get("entries") or []
        name = entries[index].get("bucket", index) if index < len(entries) else index
        return f"bucket {name} of {self.path.name}"

    def varlen_missing(self, index: int | None = None) -> str | None:
        """Why the library (or its bucket ``index``) cannot run calls with device metadata
        (cu_seqlens_q/k, seqused_k); None when it can."""
        if self._bucket_for is None:  # one kernel
            return None if self.varlen else f"{self.path.name} cannot run varlen: {_NO_VARLEN}"
        if index is None:
            return None if self.varlen else (
                f"no bucket of {self.path.name} serves varlen (each was built without the "
                "varlen kernel)")
        if self._bucket_varlen[index]:
            return None
        return f"{self.where(index)} cannot run varlen: {_NO_VARLEN}"

    def last_error(self) -> str:
        raw = self.fn["last_error"]()
        return raw.decode(errors="replace") if raw else ""

    def bucket_for(self, Hq: int, Hkv: int, S_q: int, S_k: int | None = None,
                   window: int = 0) -> int | None:
        """The index of the bucket serving S_q queries over S_k keys (None: S_q; device
        metadata: max_seqlen_q and max_seqlen_k) with this window (a workload with kinds of
        layers has buckets per window), -1 for none; None for a library without a
        dispatcher."""
        if self._bucket_for is None:
            return None
        key = (Hq, Hkv, S_q, S_q if S_k is None else S_k, window)
        i = self._buckets.get(key)
        if i is None:
            a = abi.make_args(heads_q=Hq, heads_kv=Hkv, seqlen_q=key[2], seqlen_k=key[3],
                              batch=1, head_dim=self.head_dim, causal=int(self.causal),
                              window=window)
            i = self._buckets[key] = int(self._bucket_for(ctypes.byref(a)))
        return i

    def dispatch(self) -> dict[str, Any] | None:
        """The dispatch table compiled in (dispatch.json), or None for a single kernel."""
        if self._table is None:
            fn = self.fn["dispatch_json"]
            if fn is None:
                return None
            self._table = json.loads(fn().decode())
        return self._table

    def serves_text(self) -> str:
        """What the library serves, for error messages."""
        table = self.dispatch()
        if not table:
            return f"head dim {self.head_dim}, {'causal' if self.causal else 'non-causal'}"
        out = []
        for e in table.get("entries", []):
            text = f"Hq={e['Hq']} Hkv={e['Hkv']} S {_range(e['s_min'], e['s_max'])}"
            if e.get("k_min") is not None:
                text += f" k {_range(e['k_min'], e.get('k_max'))}"
            if e.get("window") is not None:
                text += f" window {e['window']}" if e["window"] else " no window"
            out.append(f"{text} ({e['bucket']})")
        return "; ".join(out)


# Why a kernel has no varlen kernel: its library says nothing more; the export's README names
# the reason per bucket.
_NO_VARLEN = ("it was built without the varlen kernel (fa-tune export leaves it out where the "
              "config cannot serve varlen: its README says why)")
