"""The epilogue's hand-written stmatrix mapping (cuda_src/fa_tune/o_stage.cuh) against CuTe's STSM
tiled copy of the same accumulator, which the kernel used before: both replayed on the host with
stmatrix's semantics must put every accumulator element of every thread where the swizzled O
tile keeps it (tests/data/stsm_layout_driver.cu). CuTe's layout algebra runs on the host too,
so the host compiler builds the driver; nvcc where the toolkit's headers are not found.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tuner.errors import BuildError
from tuner.kernel import toolchain

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests/data/stsm_layout_driver.cu"


def _compile_command(exe: Path) -> list[str]:
    try:
        nvcc = toolchain.find_nvcc()
        cutlass = toolchain.cutlass_include()
    except BuildError as e:
        pytest.skip(str(e))
    inc = toolchain._real_cuda_bin(nvcc).parent / "include"
    cxx = shutil.which("g++")
    common = ["-std=c++17", "-O0", f"-I{cutlass}", f"-I{ROOT / 'cuda_src'}", "-o", str(exe)]
    if cxx and (inc / "cuda_runtime_api.h").is_file() and (inc / "cccl").is_dir():
        # CuTe's host code with the host compiler alone: half of nvcc's time.
        return [cxx, "-x", "c++", str(DRIVER), f"-I{inc}", f"-I{inc / 'cccl'}", *common]
    return [str(nvcc), "--expt-relaxed-constexpr", str(DRIVER), *common]


def test_stsm_mapping_matches_cute(tmp_path: Path) -> None:
    exe = tmp_path / "stsm_layout_driver"
    subprocess.run(_compile_command(exe), check=True, capture_output=True, timeout=600)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stdout
    # every block_m (1-3 consumer warpgroups) and head dim (1, 2, 4 swizzle atoms) once
    assert sorted(lines) == sorted(["ok 64 128", "ok 128 64", "ok 128 256", "ok 192 128"])
