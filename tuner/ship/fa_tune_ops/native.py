"""The op's C++ launch path (csrc/attention_op.cpp): building it, loading it, binding it.

The compiled extension is ``libfa_tune_torch.<torch version>.abi<N>.so`` beside the kernel
library (an export's ``lib/``; build.sh builds it when ``python3`` has torch). It holds
PyTorch's C++ ABI and the fa-tune C ABI N it was compiled against (fa_tune.h: include/ in an
export, cuda_src/fa_tune/ in fa-tune), so it is used only by the torch version and the
fa_tune_ops it was built for (its static registration runs when it is loaded: a mismatched one
must never be, hence both in its name); without it the op runs its
Python implementation (the same results, more host time per call). ``FA_TUNE_OPS_NATIVE=0``
turns it off.

    python3 -m fa_tune_ops.build_ext OUT_DIR   # build it into OUT_DIR for this python's torch
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent / "csrc" / "attention_op.cpp"
BUILD_TIMEOUT_S = 600.0
HEADER = "fa_tune.h"


class NativeBuildError(RuntimeError):
    """The extension did not compile (the message says why, with the compiler's first error)."""


def ext_name() -> str:
    """The extension's file name for this process's torch and this package's C ABI."""
    from . import abi

    return f"libfa_tune_torch.{torch.__version__}.abi{abi.ABI_VERSION}.so"


def _cuda_include() -> Path | None:
    """A folder with cuda_runtime_api.h (c10/cuda's headers include it)."""
    cands = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(Path(os.environ[env]) / "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(Path(nvcc).resolve().parent.parent / "include")
    cands.append(Path("/usr/local/cuda/include"))
    try:  # the CUDA runtime pip wheels torch depends on carry the headers too
        import nvidia

        for root in nvidia.__path__:
            cands += sorted(Path(root).glob("cu*/include"))
            cands.append(Path(root) / "cuda_runtime" / "include")
    except ImportError:
        pass
    return next((c for c in cands if (c / "cuda_runtime_api.h").is_file()), None)


def header_dir() -> Path | None:
    """The folder with the C ABI's header: include/ beside this package in an export,
    cuda_src/fa_tune/ in the fa-tune repository (this package is tuner/ship/fa_tune_ops there)."""
    here = Path(__file__).resolve().parent
    for cand in (here.parent / "include", here.parents[2] / "cuda_src" / "fa_tune"):
        if (cand / HEADER).is_file():
            return cand
    return None


def compile_command(out: Path) -> list[str]:
    """The g++ command that builds the extension against this process's torch."""
    torch_dir = Path(torch.__file__).resolve().parent
    incs = [torch_dir / "include", torch_dir / "include" / "torch" / "csrc" / "api" / "include"]
    cuda_inc = _cuda_include()
    if cuda_inc is None:
        raise NativeBuildError("no CUDA headers (cuda_runtime_api.h) found: set CUDA_HOME")
    abi_inc = header_dir()
    if abi_inc is None:
        raise NativeBuildError(f"no {HEADER} beside the package (../include) or in fa-tune's "
                               "cuda_src/fa_tune/")
    incs.append(abi_inc)
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    lib_dir = torch_dir / "lib"
    return [os.environ.get("CXX", "g++"), "-O2", "-std=c++20", "-shared", "-fPIC",
            "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *[f"-I{p}" for p in incs], f"-I{cuda_inc}", str(SOURCE), f"-L{lib_dir}",
            f"-Wl,-rpath,{lib_dir}", "-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch",
            "-o", str(out)]


def build(out_dir: Path) -> Path:
    """Compile the extension into out_dir (atomically: a failed build leaves nothing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / ext_name()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = compile_command(tmp)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeBuildError(f"{cmd[0]}: {e}") from None
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        err = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[-300:])
        raise NativeBuildError(f"{cmd[0]} failed: {err.strip()}")
    os.replace(tmp, out)
    return out


# ---- loading and binding ----------------------------------------------------------------------
_loaded: ctypes.CDLL | None = None
_status = "not loaded"
# What the extension is told once loaded (status.py sets these before or after loading).
_status_words: dict[int, int] = {}
_sync_check = False


def status() -> str:
    """'active', or why the op runs its Python implementation."""
    return _status


def loaded() -> bool:
    return _loaded is not None


def find(lib_path: Path) -> Path | None:
    """The extension beside the kernel library, if there is one for this torch and it is
    wanted (status() says why not)."""
    global _status
    if os.environ.get("FA_TUNE_OPS_NATIVE", "1") == "0":
        _status = "off (FA_TUNE_OPS_NATIVE=0)"
        return None
    ext = Path(lib_path).parent / ext_name()
    if not ext.is_file():
        _status = f"no {ext.name} beside {lib_path} (build.sh builds it where python3 has torch)"
        return None
    return ext


def load(ext: Path) -> bool:
    """Load the extension once per process: its static registration makes it the CUDA kernel
    of fa_tune::attention (op.py drops its Python one first). False, with status(), on failure.
    Its name carries the C ABI (ext_name), so one of another ABI is never found."""
    global _loaded, _status
    try:
        torch.ops.load_library(str(ext))
        _loaded = ctypes.CDLL(str(ext))
    except (OSError, RuntimeError) as e:
        _status = f"{ext} did not load: {e}"
        return False
    from . import abi

    version = int(_loaded.fa_tune_torch_abi_version())
    if version != abi.ABI_VERSION:  # a renamed file: refuse to launch through it
        _loaded = None
        _status = (f"{ext.name} was compiled against C ABI {version}, this package speaks "
                   f"{abi.ABI_VERSION}: rebuild it (python3 -m fa_tune_ops.build_ext DIR)")
        return False
    vp, ci = ctypes.c_void_p, ctypes.c_int
    _loaded.fa_tune_torch_bind.argtypes = [vp] * 4 + [ci, ci]
    _loaded.fa_tune_torch_set_status.argtypes = [ci, vp]
    _loaded.fa_tune_torch_set_sync_check.argtypes = [ci]
    _loaded.fa_tune_torch_set_sync_check.restype = None
    _loaded.fa_tune_torch_calls.restype = ctypes.c_longlong
    _loaded.fa_tune_torch_reset_calls.restype = None
    for dev, ptr in _status_words.items():
        _loaded.fa_tune_torch_set_status(dev, ptr)
    _loaded.fa_tune_torch_set_sync_check(int(_sync_check))
    _status = "loaded, not bound yet"
    return True


def bind(lib: object) -> None:
    """Point the extension at a loaded Library (op.load calls this); no-op when not loaded."""
    global _status
    if _loaded is None:
        return
    fn = lib.fn  # type: ignore[attr-defined]

    def addr(name: str) -> int | None:
        f = fn.get(name)
        return None if f is None else ctypes.cast(f, ctypes.c_void_p).value

    _loaded.fa_tune_torch_bind(addr("forward"), addr("workspace_bytes"), addr("bucket_for"),
                               addr("last_error"), int(lib.head_dim),  # type: ignore[attr-defined]
                               int(lib.causal))  # type: ignore[attr-defined]
    _status = "active"


def set_status(dev: int, ptr: int) -> None:
    """Device ``dev``'s status words (status.py): the fast path reads and passes them."""
    _status_words[dev] = ptr
    if _loaded is not None:
        _loaded.fa_tune_torch_set_status(dev, ptr)


def set_sync_check(on: bool) -> None:
    global _sync_check
    _sync_check = bool(on)
    if _loaded is not None:
        _loaded.fa_tune_torch_set_sync_check(int(on))


def calls() -> int:
    """Kernel launches the C++ path made since the last reset_calls()."""
    return int(_loaded.fa_tune_torch_calls()) if _loaded is not None else 0


def reset_calls() -> None:
    if _loaded is not None:
        _loaded.fa_tune_torch_reset_calls()
