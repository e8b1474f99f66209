"""The CUDA toolchain fa-tune builds with, found without a GPU: nvcc (CUDA_HOME, PATH, the
nvidia-cuda-nvcc wheel), the tools beside it (cuobjdump, nvdisasm; also from their wheels),
their versions and the CPUs a build may use."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

from tuner.errors import BuildError


def _wheel_bin_dirs() -> list[Path]:
    """bin/ folders of NVIDIA's pip wheels (nvidia/cu13/bin, nvidia/cuda_nvcc/bin, ...)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs: list[Path] = []
    for loc in spec.submodule_search_locations:
        dirs.extend(sorted(p for p in Path(loc).glob("*/bin") if p.is_dir()))
    return dirs


def _candidate_bin_dirs() -> list[Path]:
    dirs: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(Path(os.environ[var]) / "bin")
    dirs.extend(Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p)
    dirs.extend(_wheel_bin_dirs())
    dirs.append(Path("/usr/local/cuda/bin"))
    return dirs


def _is_exe(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers and taskset narrow;
    os.cpu_count() reports the whole host)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# Parallel compiles beyond this many per usable CPU only queue in the scheduler, and each nvcc
# holds about 1-2 GB of memory: a mistyped --jobs would start thousands of them.
JOBS_PER_CPU_MAX = 4


def compile_jobs(jobs: int | None) -> int:
    """How many nvcc run at once: ``jobs`` as given (BuildError beyond JOBS_PER_CPU_MAX per
    usable CPU), or every usable CPU by default."""
    cpus = usable_cpus()
    if jobs is None or jobs == 0:
        return cpus
    if jobs < 1 or jobs > JOBS_PER_CPU_MAX * cpus:
        raise BuildError(f"--jobs {jobs} is outside 1..{JOBS_PER_CPU_MAX * cpus} ({cpus} usable "
                         f"CPUs here, each nvcc takes one and 1-2 GB): give at most "
                         f"{JOBS_PER_CPU_MAX * cpus}, or leave --jobs out for {cpus}")
    return jobs


def find_nvcc() -> Path:
    """nvcc from CUDA_HOME/bin, then PATH, then the nvidia-cuda-nvcc wheel; else BuildError."""
    for d in _candidate_bin_dirs():
        if _is_exe(d / "nvcc"):
            return d / "nvcc"
    raise BuildError(
        "nvcc not found (looked in CUDA_HOME/bin, PATH and the nvidia-cuda-nvcc wheel); install "
        "the CUDA toolkit >= 12.3 and set CUDA_HOME, or `pip install nvidia-cuda-nvcc`"
    )


def _real_cuda_bin(nvcc: Path) -> Path:
    """The toolkit's bin/ behind nvcc, which may be a symlink or a wrapper script."""
    try:
        # --dryrun prints the driver's own folder without compiling anything.
        out = subprocess.run(
            [str(nvcc), "--dryrun", "-c", "fa_tune_probe.cu"],
            capture_output=True, text=True, timeout=60,
        )
        m = re.search(r"#\$ _HERE_=(\S+)", out.stderr + out.stdout)
        if m:
            return Path(m.group(1))
    except (OSError, subprocess.SubprocessError):
        pass
    return nvcc.resolve().parent


def find_tool(name: str, nvcc: Path | None = None) -> Path | None:
    """A CUDA binary (cuobjdump, nvdisasm, ...): next to nvcc first, then the usual places."""
    dirs: list[Path] = []
    if nvcc is not None:
        dirs += [nvcc.parent, _real_cuda_bin(nvcc)]
    dirs += _candidate_bin_dirs()
    for d in dirs:
        if _is_exe(d / name):
            return d / name
    return None


@lru_cache(maxsize=8)
def _nvcc_version_of(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"cannot run {nvcc} --version: {e}") from None
    m = re.search(r"release [\d.]+, V([\d.]+)", out.stdout)
    if not m:
        raise BuildError(f"cannot read the version from `{nvcc} --version`")
    return m.group(1)


def nvcc_version(nvcc: Path | None = None) -> str:
    """Full nvcc version, e.g. '13.0.88'."""
    return _nvcc_version_of(str(nvcc or find_nvcc()))
