"""scripts/sass_snapshot.py on SASS cuobjdump printed for real: the `default` preset's kernel
before and after issue 35's kernel refactor (its parameters moved in the constant bank, its
instructions did not), the first 120 instructions of its first kernel, captured 2026-12-04 with
the CUDA 13.0 cuobjdump; and one clear line for bad input."""

from __future__ import annotations

import lzma
import subprocess
import sys
from pathlib import Path

import pytest
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "sass_snapshot.py"
DATA = ROOT / "tests" / "data"


@pytest.fixture(scope="module")
def snap():
    return load_script(SCRIPT)


def _sass(side: str) -> str:
    return lzma.decompress((DATA / f"cuobjdump_default_{side}.sass.xz").read_bytes()).decode()


def test_moved_parameters_read_as_the_same_code(snap, capsys) -> None:
    before, after = snap.sass_entry(_sass("before")), snap.sass_entry(_sass("after"))
    # One kernel, paired by position although its mangled name (anonymous namespace, the
    # parameter type) changed; 120 instructions each.
    assert list(before["functions"]) == list(after["functions"])
    (name,) = before["functions"]
    assert name.startswith("0 _ZN7fa_tune20attention_fwd_kernel")
    assert before["instructions"][name] == after["instructions"][name] == 120
    assert before["functions"] != after["functions"]  # the constant-bank offsets differ
    assert before["masked"] == after["masked"]
    assert snap.compare_indexes({"default": before}, {"default": after}) == 1
    assert "the same but for constant-bank offsets" in capsys.readouterr().out
    assert snap.compare_indexes({"default": before}, {"default": before}) == 0
    assert "same SASS (1 functions)" in capsys.readouterr().out


def test_masking_keeps_real_differences(snap) -> None:
    text = _sass("before")
    other = text.replace("S2R R0, SR_TID.X", "S2R R3, SR_TID.X", 1)
    assert other != text
    assert snap.sass_entry(other)["masked"] != snap.sass_entry(text)["masked"]


@pytest.mark.parametrize("args", [["--compare", "/nonexistent", "/nonexistent"],
                                  ["--out", "/tmp/x", "no-such-preset"], [],
                                  ["--out", "/tmp/x", "--shape", "4x32/bad"],
                                  ["--out", "/tmp/x", "--shape", "1x32/8x2048:k8192:p128", "d64"],
                                  ["--out", "/tmp/x", "--shape", "4x32x2048:k8192:p64", "llama3"]])
def test_bad_input_is_one_line(args: list[str]) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                       cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sass_snapshot: error: "), r.stderr
