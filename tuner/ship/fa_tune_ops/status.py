"""Bad device metadata, caught without a host sync; and where the calls went (``stats``).

A call with device metadata (cu_seqlens_q, cu_seqlens_k, seqused_k, a block table) hands the
kernel a status pointer: int32[2] of pinned host memory, one per device (under unified
addressing its host pointer is device-accessible). The kernel's schedule checks the metadata
where it reads it anyway (a block table's entries too: FA_TUNE_BAD_BLOCK_TABLE, abi.py's text);
a bad batch computes nothing, fills out and lse with NaN and writes FA_TUNE_BAD_* bits and the
first bad sequence there. The op never reads device metadata on the host; it reads the
status words:

* by default at the start of the next call on that device (no sync: the bad call may still be
  running then, in which case a later call sees it), raising ValueError that names what was
  wrong and says that the earlier call's out and lse are NaN;
* ``check()``: synchronise every device the op ran metadata calls on, and raise at once;
* ``set_sync_check(True)`` or ``FA_TUNE_OPS_SYNC_CHECK=1``: every call with device metadata
  synchronises its stream and raises before returning (not inside a CUDA graph capture, where
  a sync is illegal: there the default applies).

After raising, the words are cleared. ``stats()`` counts the calls served by the fa-tune kernel
("fa_tune") and those the transformers backend sent elsewhere ("fallback:<where>:<why>").
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import Counter

import torch

from . import abi, native

_lock = threading.Lock()
# device -> (the pinned tensor, kept alive forever; its two words as ctypes ints)
_status: dict[int, tuple[torch.Tensor, ctypes.Array]] = {}
_sync_check = os.environ.get("FA_TUNE_OPS_SYNC_CHECK", "0") not in ("", "0")
_counts: Counter[str] = Counter()


def status_ptr(dev: int) -> int:
    """The status words' address for calls on device ``dev`` (made on first use: outside a
    CUDA graph capture, as any pinned allocation)."""
    got = _status.get(dev)
    if got is None:
        with _lock:
            got = _status.get(dev)
            if got is None:
                with torch.cuda.device(dev):
                    t = torch.zeros(2, dtype=torch.int32, pin_memory=True)
                words = (ctypes.c_int32 * 2).from_address(t.data_ptr())
                got = _status[dev] = (t, words)
                native.set_status(dev, t.data_ptr())
    return got[0].data_ptr()


def _raise_if_set(dev: int, words: ctypes.Array, when: str) -> None:
    bits, seq = int(words[0]), int(words[1])
    if bits == 0:
        return
    words[0] = words[1] = 0  # raised once; the next call starts clean
    raise ValueError(f"fa_tune::attention: {when} on cuda:{dev} had bad device metadata: "
                     f"{abi.bad_metadata_text(bits, seq)}; its out and lse are NaN (the kernel "
                     "read nothing out of bounds)")


def raise_pending(dev: int) -> None:
    """Raise for a bad batch an earlier call on ``dev`` found (no sync; cheap)."""
    got = _status.get(dev)
    if got is not None and got[1][0]:
        _raise_if_set(dev, got[1], "an earlier call")


def after_launch(dev: int) -> None:
    """In sync-check mode: wait for this call and raise if its metadata was bad."""
    if not _sync_check or torch.cuda.is_current_stream_capturing():
        return
    torch.cuda.current_stream(dev).synchronize()
    got = _status.get(dev)
    if got is not None:
        _raise_if_set(dev, got[1], "this call")


def check() -> None:
    """Synchronise every device the op ran calls with device metadata on, and raise ValueError
    if one of them had bad metadata (fa_tune_ops.check())."""
    for dev, (_, words) in list(_status.items()):
        torch.cuda.synchronize(dev)
        _raise_if_set(dev, words, "a call")


def set_sync_check(on: bool) -> None:
    """Make every call with device metadata synchronise and raise at once (True), or check at
    the next call (False, the default; FA_TUNE_OPS_SYNC_CHECK=1 starts it on)."""
    global _sync_check
    _sync_check = bool(on)
    native.set_sync_check(_sync_check)


def sync_check() -> bool:
    return _sync_check


def count(key: str) -> None:
    """One call, served by ``key`` ("fa_tune", or "fallback:<where>:<why>")."""
    _counts[key] += 1


def stats() -> dict[str, int]:
    """Calls per destination since the last reset_stats(): "fa_tune" (the kernel, whichever
    launch path ran it) and the transformers backend's fallbacks with their reasons, e.g.
    {"fa_tune": 640, "fallback:fa3:decode (S_q=1 < 64)": 31}. CUDA graph replays launch without
    a call and are not counted."""
    out = dict(_counts)
    n = native.calls()
    if n:
        out["fa_tune"] = out.get("fa_tune", 0) + n
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "fa_tune", kv[0])))


def reset_stats() -> None:
    _counts.clear()
    native.reset_calls()


native.set_sync_check(_sync_check)
