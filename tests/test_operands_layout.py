"""The kernel's hand-written operand mappings against CuTe's, which the kernel used before
(tests/data/operands_driver.cu): the epilogue's stmatrix (cuda_src/fa_tune/o_stage.cuh), Q's
ldmatrix into the QK's A registers (q_in_regs), and the shared-memory descriptors of Q, K and
V^T per k-block and stage (cuda_src/fa_tune/operands.cuh). Each is replayed on the host with
the instruction's semantics: every element must land where the MMA or the tile expects it, for
several block_m, block_n, head dims and stage counts. CuTe's layout algebra runs on the host
too, so the host compiler builds the driver (nvcc where the toolkit's headers are not found).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cutlass_headers import cutlass_include

from tuner.errors import BuildError
from tuner.kernel import toolchain

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests/data/operands_driver.cu"
CASES = ["64 128 128", "128 96 64", "128 128 256", "192 64 128"]  # block_m block_n head_dim


def _compile_command(exe: Path) -> list[str]:
    try:
        nvcc = toolchain.find_nvcc()
    except BuildError as e:
        pytest.skip(str(e))
    cutlass = cutlass_include()
    if cutlass is None:
        pytest.skip("CuTe's headers not found: pip install nvidia-cutlass (a test dependency)")
    inc = toolchain._real_cuda_bin(nvcc).parent / "include"
    cxx = shutil.which("g++")
    common = ["-std=c++17", "-O0", f"-I{cutlass}", f"-I{ROOT / 'cuda_src'}", "-o", str(exe)]
    if cxx and (inc / "cuda_runtime_api.h").is_file() and (inc / "cccl").is_dir():
        # CuTe's host code with the host compiler alone: half of nvcc's time.
        return [cxx, "-x", "c++", str(DRIVER), f"-I{inc}", f"-I{inc / 'cccl'}", *common]
    return [str(nvcc), "--expt-relaxed-constexpr", str(DRIVER), *common]


def test_operands_match_cute(tmp_path: Path) -> None:
    exe = tmp_path / "operands_driver"
    subprocess.run(_compile_command(exe), check=True, capture_output=True, timeout=600)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout
    # CuTe's own replay must pass too: it shows the replay models the instructions right.
    what = ["stsm-cute", "stsm", "ldsm-cute", "ldsm", "desc"]
    expected = sorted(f"ok {w} {c}" for w in what for c in CASES)
    assert sorted(line for line in out.stdout.splitlines() if line.startswith(("ok", "FAIL"))) \
        == expected, out.stdout
