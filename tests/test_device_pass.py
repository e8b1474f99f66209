"""The launcher's host pass reads none of the kernel's body (cuda_src/fa_tune/device_pass.cuh;
docs/PERF.md step 49), and neither pass reads CuTe or CUTLASS: the kernel's operands, wgmma
shapes and barriers are its own (operands.cuh, step 53; wgmma_atoms.cuh and sm90.cuh, step 57).
nvcc's own preprocessing steps of a rendered template, run alone (about a second each, no
compile). The device pass still reads the kernel's body: every build's SASS says so."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from tuner.kernel import build, toolchain
from tuner.kernel.config import load_preset
from tuner.problem import ProblemClass


def _host_pass(tmp_path: Path, extra: tuple[str, ...] = (), device: bool = False) -> str:
    """The host pass's (or the device pass's) preprocessed source of the default preset's
    library (both kernels)."""
    src = tmp_path / "kernel.cu"
    src.write_text(build.render(load_preset("default"), pclass=ProblemClass(128, True, True)))
    nvcc = toolchain.find_nvcc()
    flags = [*build._resolve_flags(build.KERNEL_FLAGS), *extra]
    dry = subprocess.run([str(nvcc), *flags, "--dryrun", "-o", str(tmp_path / "k.so"), str(src)],
                         capture_output=True, text=True, check=True, cwd=tmp_path)
    # --dryrun lists nvcc's steps ("#$ command"); the host pass preprocesses without
    # __CUDA_ARCH__, the device pass with it.
    steps = [ln[3:] for ln in dry.stderr.splitlines() if ln.startswith("#$ ")]
    host = next(s for s in steps if " -E " in s and ("-D__CUDA_ARCH__=" in s) == device)
    argv = shlex.split(host)
    out = tmp_path / "host.ii"
    argv[argv.index("-o") + 1] = str(out)
    subprocess.run(argv, check=True, capture_output=True, cwd=tmp_path)
    return out.read_text()


_LIBRARIES = ("/cute/", "/cutlass/")


def test_host_pass_reads_the_launcher_without_cute(tmp_path: Path) -> None:
    text = _host_pass(tmp_path)
    assert "Launcher" in text and "attention_fwd_kernel" in text and "varlen_prepare_kernel" in text
    for device_only in ("fa_tune/mainloop.cuh", "fa_tune/softmax.cuh", "fa_tune/epilogue.cuh",
                        "fa_tune/traits.cuh", "fa_tune/wgmma_atoms.cuh", *_LIBRARIES):
        assert device_only not in text, device_only


def test_host_pass_reads_everything_when_asked(tmp_path: Path) -> None:
    # The escape hatch for a toolchain whose device registration names other constants.
    text = _host_pass(tmp_path, ("-DFA_TUNE_DEVICE_PASS=1",))
    assert "fa_tune/wgmma_atoms.cuh" in text and "fa_tune/mainloop.cuh" in text


def test_device_pass_reads_no_cute_or_cutlass(tmp_path: Path) -> None:
    # CuTe's layout algebra was most of a candidate's front-end time (step 53), and CUTLASS's
    # MMA and barrier headers over half of what was left (step 57).
    text = _host_pass(tmp_path, device=True)
    assert "fa_tune/mainloop.cuh" in text and "fa_tune/wgmma_atoms.cuh" in text
    for library in _LIBRARIES:
        assert library not in text, library


def test_wgmma_atoms_header_is_the_generators_output() -> None:
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "scripts" / "gen_wgmma_atoms.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
