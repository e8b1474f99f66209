"""lab/h200/sass_profile.py on source pages ncu printed on the H200 (tests/data/ncu_h200):
the sums docs/PERF.md step 42 reports, and one clear line for bad input."""

from __future__ import annotations

import lzma
import subprocess
import sys
from pathlib import Path

import pytest
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "lab" / "h200" / "sass_profile.py"
DATA = ROOT / "tests" / "data" / "ncu_h200"
OURS = DATA / "ncu_source_sass_h200_2025.3.1_d64-sumpv.csv.xz"
FA3 = DATA / "ncu_source_sass_h200_2025.3.1_fa3_d64.csv.xz"


@pytest.fixture(scope="module")
def sp():
    return load_script(SCRIPT)


def test_phase_shares_of_the_captured_pages(sp) -> None:
    ours = sp.summarize(lzma.open(OURS, "rt").read())
    fa3 = sp.summarize(lzma.open(FA3, "rt").read())
    for page in (ours, fa3):
        assert page.samples == "Warp Stall Sampling (All Samples)"
        assert sum(page.share(n) for n in page.by_phase) == pytest.approx(1.0)
        assert page.share("wgmma wait (0x0 pending)") < 0.001  # the PV wait: no samples
    # As step 42 reports them: MUFU 40.1 % of ours, 30.2 % of FA3's; the row max 12.8 / 14.0 %.
    assert ours.share("MUFU (exp2)") == pytest.approx(0.401, abs=0.001)
    assert fa3.share("MUFU (exp2)") == pytest.approx(0.302, abs=0.001)
    assert ours.share("row max (FMNMX, SHFL)") == pytest.approx(0.128, abs=0.001)
    assert fa3.share("row max (FMNMX, SHFL)") == pytest.approx(0.140, abs=0.001)
    # sum_in_pv: our page has no row-sum FADDs in the steady loop, FA3's does.
    assert ours.by_op["FADD"][ours.samples] < fa3.by_op["FADD"][fa3.samples] / 5


def test_predicates_and_phases(sp) -> None:
    assert sp.opcode("@!P0 BRA 0x7f5b3f7aa380") == "BRA"
    assert sp.phase("@!P0 BRA 0x10", 100, 100) == "mbarrier wait (K/V full)"
    assert sp.phase("BRA 0x10", 100, 100) == "other"  # an unguarded branch waits for nothing
    assert sp.phase("WARPGROUP.DEPBAR.LE gsb0, 0x1", 100, 100) == "wgmma wait (0x1 pending)"
    assert sp.phase("MUFU.EX2 R28, R28", 5, 100) == "producer, prologue, epilogue"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_summarize_prints_the_table() -> None:
    p = run("--summarize", str(OURS))
    assert p.returncode == 0, p.stderr
    assert "by phase:" in p.stdout and "MUFU (exp2)                       40.1%" in p.stdout


@pytest.mark.parametrize("args, rc, says", [
    ((), 2, "usage:"),
    (("--summarize",), 2, "usage:"),
    (("--summarize", "README.md"), 1, "not ncu's source page"),
    (("--summarize", "no/such.csv"), 1, "No such file"),
    (("lab/h200/variants/s14_d64.txt", "4x32:d64"), 1, "malformed problem"),
    (("lab/h200/variants/s14_d64.txt", "4x32x8192:d64", "9"), 1, "has 5 variants"),
])
def test_bad_input_is_one_line(args, rc, says) -> None:
    p = run(*args)
    assert p.returncode == rc and says in p.stderr, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
