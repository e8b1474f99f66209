"""fa-tune's own kernel as a peer: a built ``.so`` called through its C ABI on torch tensors.

The timed entry point is exactly the one the tuner and the export use (docs/ARCHITECTURE.md):
``fa_tune_forward(q, k, v, o, lse, B, H, S, stream)`` on the tensors' ``data_ptr()`` and torch's
current stream, so the kernel runs in the same stream order as every torch-based peer and the
same CUDA events bracket it. ``fa_tune_prepare`` (one-time host setup per shape) runs in
``prepare``, outside the timed region, and its host time is kept in ``details``.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
from pathlib import Path
from typing import Any

from tuner.peers.base import Peer, torch_cuda_reason

HEAD_DIM = 128


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class FaTuneKernelError(RuntimeError):
    """The kernel's C ABI returned an error code."""


class FaTunePeer(Peer):
    def __init__(self, so_path: str | Path, label: str | None = None, write_lse: bool = True):
        self.so_path = Path(so_path)
        self.name = "fa-tune" if label is None else f"fa-tune:{label}"
        self.label = "fa-tune" if label is None else f"fa-tune ({label})"
        self.write_lse = write_lse
        self._lib: Any = None
        self._call: tuple[Any, ...] | None = None
        self._out: Any = None
        self._lse: Any = None
        self._host_ms: float | None = None
        self._forward: Any = None

    # -- loading -------------------------------------------------------------------------
    def _load(self) -> Any:
        if self._lib is not None:
            return self._lib
        lib = ctypes.CDLL(str(self.so_path.resolve()))
        vp, i = ctypes.c_void_p, ctypes.c_int
        lib.fa_tune_forward.argtypes = [vp, vp, vp, vp, vp, i, i, i, vp]
        lib.fa_tune_forward.restype = i
        lib.fa_tune_prepare.argtypes = [i, i, i, vp, ctypes.POINTER(ctypes.c_double)]
        lib.fa_tune_prepare.restype = i
        lib.fa_tune_last_error.argtypes = []
        lib.fa_tune_last_error.restype = ctypes.c_char_p
        for opt, restype in (("fa_tune_config_json", ctypes.c_char_p), ("fa_tune_smem_bytes", i)):
            if hasattr(lib, opt):  # optional extras; older builds may lack them
                getattr(lib, opt).argtypes = []
                getattr(lib, opt).restype = restype
        self._lib = lib
        return lib

    def available(self) -> tuple[bool, str]:
        if not self.so_path.is_file():
            return False, f"kernel library {self.so_path} does not exist"
        reason = torch_cuda_reason()
        if reason:
            return False, reason
        try:
            self._load()
        except (OSError, AttributeError) as exc:
            return False, f"cannot load {self.so_path.name} through its C ABI: {exc}"
        return True, "ok"

    def version(self) -> str:
        return f"{self.so_path.name} sha256 {sha256_file(self.so_path)[:16]}"

    def config_json(self) -> dict[str, Any] | None:
        lib = self._load()
        if not hasattr(lib, "fa_tune_config_json"):
            return None
        raw = lib.fa_tune_config_json()
        try:
            return json.loads(raw.decode()) if raw else None
        except ValueError:
            return {"unparsed": raw.decode(errors="replace")}

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self._lib.fa_tune_last_error()
            why = msg.decode(errors="replace") if msg else "no message"
            raise FaTuneKernelError(f"{what} returned {rc}: {why}")

    # -- running -------------------------------------------------------------------------
    def prepare(self, q: Any, k: Any, v: Any) -> None:
        import torch

        lib = self._load()
        B, S, H, D = q.shape
        if D != HEAD_DIM:
            raise ValueError(f"head dim must be {HEAD_DIM}, got {D}")
        for t in (q, k, v):
            if not t.is_contiguous() or t.dtype != torch.bfloat16:
                raise ValueError("fa-tune's kernel takes contiguous BF16 [B, S, H, 128] tensors")
        # NaN poison: a kernel that skips part of O fails the gate instead of passing on stale data.
        self._out = torch.full_like(q, float("nan"))
        cfg = self.config_json() or {}
        # A config built with write_lse=false ignores the pointer; comparing its (poisoned) LSE
        # would only report NaN.
        wants_lse = self.write_lse and bool(cfg.get("write_lse", True))
        self._lse = (
            torch.full((B, H, S), float("nan"), device=q.device, dtype=torch.float32)
            if wants_lse
            else None
        )
        stream = torch.cuda.current_stream().cuda_stream
        host_ms = ctypes.c_double(0.0)
        self._check(lib.fa_tune_prepare(B, H, S, stream, ctypes.byref(host_ms)), "fa_tune_prepare")
        self._host_ms = host_ms.value
        lse_ptr = self._lse.data_ptr() if self._lse is not None else None
        self._call = (
            q.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            self._out.data_ptr(),
            lse_ptr,
            B,
            H,
            S,
        )
        self._forward = lib.fa_tune_forward

    def run(self) -> Any:
        import torch

        assert self._call is not None, "prepare() first"
        # The stream is read per call so a caller that switches streams is still honoured.
        rc = self._forward(*self._call, torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            self._check(rc, "fa_tune_forward")
        return self._out

    def lse(self) -> Any | None:
        return self._lse

    def details(self) -> dict[str, Any]:
        info: dict[str, Any] = {"so_path": str(self.so_path), "sha256": sha256_file(self.so_path)}
        if self._host_ms is not None:
            info["prepare_host_ms"] = self._host_ms
        try:
            info["config"] = self.config_json()
            if hasattr(self._load(), "fa_tune_smem_bytes"):
                info["smem_bytes"] = int(self._lib.fa_tune_smem_bytes())
        except OSError:
            pass
        return info

    def release(self) -> None:
        self._call = None
        self._out = None
        self._lse = None
