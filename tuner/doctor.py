"""Environment probes for ``fa-tune doctor`` and the test suite's GPU check.

Every probe returns a result instead of raising: a missing driver, library or tool is a finding,
and each finding carries how to get the missing piece. Each check says what needs it:

* ``build`` (every command; ``fa-tune build`` needs nothing else): nvcc, nvcc compiling sm_90a,
  cuobjdump (the SASS check), the kernel template;
* ``run`` (run, search, compare, profile, export's timing): cuda-python, the NVIDIA driver, an
  sm_90 GPU, NVML (temperature waits and the GPU state stored with every result);
* ``optional``: Nsight Compute (``fa-tune profile`` only).

``summarize`` turns the checks into the doctor's exit code and summary line.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import FaTuneError
from tuner.kernel.gpus import GpuInfo, GpuProbe, has_sm90_gpu, one_line, probe_gpus

__all__ = ["GpuInfo", "GpuProbe", "has_sm90_gpu", "probe_gpus"]  # re-exported: the doctor's probe

BUILD, RUN, OPTIONAL = "build", "run", "optional"
NEEDED_FOR = {BUILD: "build and everything else", RUN: "run/search/compare/profile",
              OPTIONAL: "profile"}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""  # how to get it, when not ok
    need: str = RUN  # BUILD, RUN or OPTIONAL: what fails without it


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


_PROBE_KERNEL = r"""
extern "C" __global__ void fa_tune_probe(float* o) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  o[threadIdx.x] = 1.0f;
}
"""


def probe_nvcc_sm90a() -> tuple[bool, str]:
    """Compile a tiny kernel with a wgmma fence for sm_90a (no GPU needed)."""
    from tuner.kernel import build, toolchain

    try:
        nvcc = toolchain.find_nvcc()
    except FaTuneError as e:
        return False, str(e)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "probe.cu"
        src.write_text(_PROBE_KERNEL)
        cmd = [str(nvcc), build.ARCH_FLAG, "-cubin", "-o", str(Path(d) / "probe.cubin"), str(src)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            return False, one_line(e)
        if p.returncode != 0:
            lines = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
            return False, (lines[0] if lines else f"exit code {p.returncode}")[:200]
    return True, "compiles sm_90a (wgmma) code"


def run_checks() -> list[Check]:
    """Everything fa-tune needs, in the order a user would fix it."""
    from tuner import _paths
    from tuner.kernel import toolchain

    checks: list[Check] = []
    cp = _version("cuda-python") or _version("cuda-bindings")
    checks.append(
        Check("cuda-python", cp is not None, cp or "not installed", "pip install cuda-python",
              RUN)
    )
    gp = probe_gpus()
    checks.append(
        Check(
            "driver",
            gp.driver_version is not None,
            f"CUDA driver {gp.driver_version}" if gp.driver_version else (gp.error or "none"),
            "install the NVIDIA driver (>= 580 for CUDA 13 and cuda-python 13); "
            "`nvidia-smi` must work",
        )
    )
    if gp.gpus:
        desc = "; ".join(f"{g.index}: {g.name}, sm_{g.cc[0]}{g.cc[1]}, {g.sm_count} SMs"
                         for g in gp.gpus)
    else:
        desc = "no GPU visible" + (f" ({gp.error})" if gp.error and gp.driver_version else "")
    checks.append(
        Check(
            "GPU (sm_90)",
            bool(gp.sm90),
            desc,
            "run on a Hopper GPU (H100/H200/H800, compute capability 9.0); "
            "building works without one",
        )
    )
    try:
        nvcc = toolchain.find_nvcc()
        checks.append(Check("nvcc", True, f"{nvcc} ({toolchain.nvcc_version(nvcc)})", need=BUILD))
        ok, detail = probe_nvcc_sm90a()
        checks.append(
            Check("nvcc sm_90a", ok, detail, "use CUDA >= 12.3 (13.0 is tested); set CUDA_HOME",
                  BUILD)
        )
        cuobjdump = toolchain.find_tool("cuobjdump", nvcc)
        checks.append(
            Check(
                "cuobjdump",
                cuobjdump is not None,
                str(cuobjdump) if cuobjdump else "not found (SASS checks are skipped)",
                "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm",
                BUILD,
            )
        )
    except FaTuneError as e:
        checks.append(
            Check("nvcc", False, str(e),
                  "install the CUDA toolkit or `pip install nvidia-cuda-nvcc`", BUILD)
        )
    checks.append(_nvml_check())
    tpl = _paths.kernel_template()
    checks.append(
        Check(
            "kernel template",
            tpl.is_file(),
            str(tpl) if tpl.is_file() else f"missing: {tpl}",
            "reinstall fa-tune (pip install .) or run from a source checkout",
            BUILD,
        )
    )
    checks.append(_ncu_check())
    return checks


def _ncu_check() -> Check:
    from tuner.analysis.ncu_report import ProfileError
    from tuner.analysis.profile import find_ncu

    try:
        return Check("Nsight Compute", True, str(find_ncu()), need=OPTIONAL)
    except ProfileError:
        return Check("Nsight Compute", False, "not found (only `fa-tune profile` needs it)",
                     "install Nsight Compute (part of the CUDA toolkit); put ncu on PATH",
                     OPTIONAL)


def summarize(checks: list[Check], build_only: bool = False) -> tuple[int, str]:
    """(exit code, one summary line): 0 when everything required is there, else 1 and what is
    missing, grouped by what it is needed for. With ``build_only`` only the build checks count
    (a machine that compiles but never runs kernels)."""
    missing = {need: [c.name for c in checks if c.need == need and not c.ok]
               for need in (BUILD, RUN, OPTIONAL)}
    counted = (BUILD,) if build_only else (BUILD, RUN)
    parts = [f"missing: {', '.join(missing[n])} (needed for {NEEDED_FOR[n]})"
             for n in counted if missing[n]]
    code = 1 if parts else 0
    if not missing[BUILD]:
        parts.append("build works" if parts or build_only else "everything required is there")
    if build_only and missing[RUN]:
        parts.append(f"not needed to build: {', '.join(missing[RUN])}")
    if missing[OPTIONAL]:
        parts.append(f"optional, missing: {', '.join(missing[OPTIONAL])} "
                     f"(needed for {NEEDED_FOR[OPTIONAL]})")
    return code, "; ".join(parts)


def _nvml_check() -> Check:
    ver = _version("nvidia-ml-py")
    try:
        import pynvml
    except Exception as e:
        fix = ("pip install nvidia-ml-py" if ver is None else
               f"reinstall nvidia-ml-py (pip install --force-reinstall nvidia-ml-py=={ver})")
        return Check("NVML", False, f"nvidia-ml-py not importable: {one_line(e)}", fix, RUN)
    # The binding is there: NVML itself (libnvidia-ml.so) is the NVIDIA driver's.
    fix = ("install or repair the NVIDIA driver: NVML (libnvidia-ml.so) comes with it, and "
           "`nvidia-smi` must work")
    try:
        pynvml.nvmlInit()
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            drv = drv.decode() if isinstance(drv, bytes) else drv
            return Check("NVML", True, f"nvidia-ml-py {ver}, driver {drv}", need=RUN)
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:
        return Check("NVML", False, f"nvidia-ml-py {ver}; {one_line(e)}", fix, RUN)


def gpu_summary() -> dict[str, Any]:
    gp = probe_gpus()
    return {
        "driver_version": gp.driver_version,
        "gpus": [vars(g) for g in gp.gpus],
        "error": gp.error,
    }
