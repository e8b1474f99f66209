"""scripts/time_to_tie.py: which trials it plays against the search's pick, and one line for a
study that does not exist. (The play itself is tuner.search.final's, timed on a GPU.)"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "time_to_tie.py"


@pytest.fixture(scope="module")
def tool():
    return load_script(SCRIPT)


def _trial(n: int, s: float | None, conf: float | None, cid: str) -> SimpleNamespace:
    t0 = dt.datetime(2026, 12, 5, 21, 0, tzinfo=dt.timezone.utc)
    attrs = {"config_id": cid, **({"confirmed": {"geomean_tflops": conf}} if conf else {})}
    return SimpleNamespace(number=n, user_attrs=attrs,
                           datetime_complete=None if s is None else t0 + dt.timedelta(seconds=s))


def test_the_candidates_are_the_near_confirmed_ones_before_the_pick(tool) -> None:  # noqa: ANN001
    pick = _trial(9, 300, 700.0, "p")
    trials = [_trial(1, 40, 680.0, "a"),    # 2.9 % under: in
              _trial(2, 50, 660.0, "b"),    # 5.7 % under: out
              _trial(3, 60, None, "c"),     # not confirmed: out
              _trial(4, 70, 690.0, "a"),    # the same config as trial 1: out
              _trial(5, 80, 705.0, "d"),    # faster: in
              _trial(6, 90, 695.0, "p"),    # the pick's config: out
              _trial(7, 400, 699.0, "e"),   # after the pick: out
              _trial(8, None, 699.0, "f"),  # not complete: out
              pick]
    assert [t.number for t in tool.candidates(trials, pick, 0.03, 6)] == [1, 5]
    assert [t.number for t in tool.candidates(trials, pick, 0.03, 1)] == [1]
    assert [t.number for t in tool.candidates(trials, pick, 0.10, 6)] == [1, 2, 5]


def test_a_missing_study_is_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--study", "nope", "--storage",
                        f"sqlite:///{tmp_path / 'x.db'}"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("time_to_tie: ") and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("args,what", [(["--max", "0"], "--max"), (["--within", "1.5"], "--within"),
                                       (["--turns", "1"], "--turns")])
def test_bad_options_are_one_line(args: list[str], what: str) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--study", "s", *args],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and what in r.stderr, r.stderr


BAND = ROOT / "scripts" / "final_band.py"


def test_final_band_reports_each_prefix_of_the_turns(capsys: pytest.CaptureFixture[str]) -> None:
    band = load_script(BAND)
    # Two configs whose turns share the clock's swings: their ratio is steady (1.02 every
    # turn), so the pair's band is the 1 % floor while each config's own spread is 10 %.
    a = [600.0, 660.0, 630.0, 610.0, 650.0, 620.0, 640.0, 600.0]
    b = [x / 1.02 for x in a]
    rows = band.report({0: a, 1: b}, {0: "fast", 1: "slow"}, [4, 8])
    assert [r["turns"] for r in rows] == [4, 8]
    assert rows[1]["median"]["fast"] / rows[1]["median"]["slow"] == pytest.approx(1.02)
    assert rows[1]["spread"]["fast"] == pytest.approx(60.0 / 625.0)
    assert rows[1]["lead_band"]["slow"] == pytest.approx((0.02, 0.01))
    out = capsys.readouterr().out
    assert "-- first 4 turns: trial 0 beats trial 1 by 2.0 %" in out
    assert "the fastest leads by 2.0 % (band 1.0 %)" in out


def test_final_band_without_a_study_is_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(BAND), "--study", "nope", "--storage",
                        f"sqlite:///{tmp_path / 'x.db'}"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 2 and r.stderr.startswith("final_band: "), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


def test_final_band_json_in_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(BAND), "--study", "s", "--json",
                        str(tmp_path / "no" / "x.json")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--json" in r.stderr, r.stderr
