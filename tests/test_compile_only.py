"""Compile-only workers (tuner/search/compile_only.py, issue 38): they ask the sampler for new
trials (never the WAITING ones), compile them and hand them back as WAITING trials marked
``precompiled``, which the GPU workers pop first; they stay a bounded backlog ahead.

CPU only: the builder is tests/fixtures/fake_builder.py and the GPU worker
tests/fixtures/fake_gpu_worker.py (clearly named test fixtures); the kernels' trip through the
artifact store is tests/test_shared_artifacts.py's."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_search import (  # noqa: E402
    make,
    plan,  # noqa: E402, F401 - the fixture
    url_for,
)

from tuner.search.compile_only import PRECOMPILED

SPACE = {"block_n": [64, 96, 128], "k_stages": [2, 3]}


def test_compiled_trials_go_to_the_gpu_workers_first(tmp_path: Path, plan) -> None:  # noqa: F811
    plan({})
    (tmp_path / "store").mkdir()
    c = make(tmp_path, SPACE, trials=3, sampler="random", artifacts=str(tmp_path / "store"))
    summ = c.run_compile_only()
    assert summ.trials_run == 3 and summ.stopped_by == "finished"
    st = optuna.load_study(study_name="t", storage=url_for(tmp_path))
    waiting = [t for t in st.get_trials() if t.state == TrialState.WAITING]
    assert len(waiting) == 3
    assert all(t.user_attrs["not_run"] == PRECOMPILED and t.user_attrs["precompiled_by"]
               for t in waiting)
    numbers = {t.number for t in waiting}
    # A GPU worker joins: the precompiled trials are the first it measures.
    g = make(tmp_path, SPACE, trials=3, sampler="random")
    g.run()
    st = optuna.load_study(study_name="t", storage=url_for(tmp_path))
    done = {t.number for t in st.get_trials()
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}
    assert numbers <= done


def test_a_compile_only_worker_stays_a_bounded_backlog_ahead(tmp_path: Path, plan) -> None:  # noqa: F811
    plan({})
    c = make(tmp_path, SPACE, trials=6, sampler="random", timeout_s=3.0)
    c._avg_compile_s = 0.01  # the fixture's compiles: asks fit the 3 s (60 s assumed at first)
    summ = c.run_compile_only(backlog=2)
    assert summ.stopped_by == "timeout" and summ.trials_run == 2
    st = optuna.load_study(study_name="t", storage=url_for(tmp_path))
    assert sum(t.state == TrialState.WAITING for t in st.get_trials()) == 2
    assert not [t for t in st.get_trials() if t.state == TrialState.RUNNING]


def test_a_compile_only_worker_stops_on_an_exhausted_space(tmp_path: Path, plan) -> None:  # noqa: F811
    """Every config measured: the worker says the space is exhausted and adds no trial, rather
    than asking (and recording a duplicate) until its timeout."""
    plan({})
    space = {"block_n": [112, 128]}
    make(tmp_path, space, trials=2, sampler="random").run()
    before = len(optuna.load_study(study_name="t", storage=url_for(tmp_path)).get_trials())
    c = make(tmp_path, space, trials=None, sampler="random", timeout_s=20.0)
    c._avg_compile_s = 0.01  # the fixture's compiles: asks fit the 20 s (60 s assumed at first)
    summ = c.run_compile_only()
    assert "exhausted" in summ.stopped_by
    assert len(optuna.load_study(study_name="t", storage=url_for(tmp_path)).get_trials()) == before


def test_a_compile_only_worker_compiles_each_config_once(tmp_path: Path, plan) -> None:  # noqa: F811
    """The configs it handed over wait in the study: it does not propose them again, and once
    every config waits or is measured it stops (space exhausted) instead of idling to its
    timeout."""
    plan({})
    c = make(tmp_path, {"block_n": [112, 128]}, trials=None, sampler="random", timeout_s=20.0)
    c._avg_compile_s = 0.01
    summ = c.run_compile_only()
    assert "exhausted" in summ.stopped_by
    ts = optuna.load_study(study_name="t", storage=url_for(tmp_path)).get_trials()
    waiting = [t for t in ts if t.state == TrialState.WAITING]
    assert len(waiting) == 2 == len({t.user_attrs["config_id"] for t in waiting})


def test_compile_only_needs_a_store(tmp_path: Path) -> None:
    from cli_helpers import one_error_line
    from typer.testing import CliRunner

    from tuner.cli import app

    url = url_for(tmp_path)
    optuna.create_study(study_name="t", storage=url)
    r = CliRunner().invoke(app, ["worker", "--study", "t", "--storage", url, "--compile-only",
                                 "--trials", "2"])
    assert r.exit_code == 2
    assert "--compile-only needs --artifacts URL" in one_error_line(r.output)


@pytest.mark.parametrize("extra", [["--device", "0"], ["--gpus", "all"]])
def test_compile_only_takes_no_gpu_options(tmp_path: Path, extra: list[str]) -> None:
    from cli_helpers import one_error_line
    from typer.testing import CliRunner

    from tuner.cli import app

    url = url_for(tmp_path)
    optuna.create_study(study_name="t", storage=url)
    r = CliRunner().invoke(app, ["worker", "--study", "t", "--storage", url, "--compile-only",
                                 "--artifacts", str(tmp_path / "s"), "--trials", "2", *extra])
    assert r.exit_code == 2 and "uses no GPU" in one_error_line(r.output)
