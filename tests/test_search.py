"""Search plumbing on the CPU: a real SQLite study, the fake builder and the fake GPU worker.

The GPU side is tests/fixtures/fake_gpu_worker.py (a clearly named test fixture that returns
canned timings or crashes/hangs on command); the builder is tests/fixtures/fake_builder.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner import search
from tuner.config import Shape
from tuner.space import space_from_dict

FIX = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIX))
from fake_builder import FakeBuilder  # noqa: E402

WORKER = f"{FIX / 'fake_gpu_worker.py'}:main"
SHAPES = [Shape(1, 2, 512), Shape(1, 2, 256)]


def url_for(tmp: Path, name: str = "t") -> str:
    return f"sqlite:///{tmp / f'{name}.db'}"


def make(tmp: Path, space: dict, *, study: str = "t", trials: int = 6, sampler: str = "random",
         builder: FakeBuilder | None = None, shapes=SHAPES, **kw) -> search.Search:
    return search.Search(
        study=study, space=space_from_dict(space, "test-space"), shapes=shapes,
        storage=url_for(tmp, study), n_trials=trials, sampler=sampler, seed=0, jobs=2,
        builder=builder or FakeBuilder(tmp / "art"), worker_entry=WORKER,
        results_root=tmp / "results", **kw,
    )


def trials_of(tmp: Path, study: str = "t") -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=url_for(tmp, study)).get_trials()


@pytest.fixture
def plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "plan.json"
    log = tmp_path / "worker.log"
    monkeypatch.setenv("FAKE_GPU_WORKER_PLAN", str(path))
    monkeypatch.setenv("FAKE_GPU_WORKER_LOG", str(log))

    def set_plan(d: dict[str, str]) -> Path:
        path.write_text(json.dumps(d))
        return log

    set_plan({})
    return set_plan


def test_parse_duration() -> None:
    assert search.parse_duration("90s") == 90
    assert search.parse_duration("10m") == 600
    assert search.parse_duration("1h30m") == 5400
    assert search.parse_duration("45") == 45
    assert search.parse_duration(None) is None
    for bad in ("ten minutes", "0", "5x", "-3m"):
        with pytest.raises(search.SearchError):
            search.parse_duration(bad)


def test_gpu_takes_whichever_compile_finishes_first(tmp_path: Path, plan) -> None:
    # The first seed point compiles slowly; the second, asked after it, is ready first and
    # must be measured while the first still compiles (not wait behind it in ask order).
    plan({})
    slow = FakeBuilder(tmp_path / "art",
                       delay_for=lambda c: 2.0 if (c.k_stages, c.v_stages) == (2, 2) else 0.0)
    s = make(tmp_path, {"block_n": [128], "k_stages": [2, 3], "v_stages": [2, 3]}, trials=2,
             builder=slow)
    s.run()
    ts = {t.number: t for t in trials_of(tmp_path)}
    assert ts[0].user_attrs["source"] == "preset:default"
    assert ts[0].state == ts[1].state == TrialState.COMPLETE
    assert ts[1].datetime_complete < ts[0].datetime_complete


def test_asks_overlap_gpu_work_and_busy_is_the_workers_time(
        tmp_path: Path, plan, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every request keeps the fake GPU busy for 0.3 s. The next trials must be asked while it
    # is (not between requests, when the GPU would idle), and GPU-busy time is what the worker
    # reports, cooling waits included and counted apart.
    log = plan({})
    monkeypatch.setenv("FAKE_GPU_WORKER_DELAY_S", "0.3")
    monkeypatch.setenv("FAKE_GPU_WORKER_TEMP_WAIT_S", "0.05")
    # block_m 64 with pingpong is a static reject: asks that give no candidate.
    s = make(tmp_path, {"block_m": [64, 128], "block_n": [64, 96, 128], "k_stages": [2, 3]},
             trials=6)
    summ = s.run()
    spans = []
    for ln in log.read_text().splitlines():
        t0, t1 = (float(x) for x in ln.split()[-2:])
        spans.append((t0, t1))
    asked = [t.datetime_start.timestamp() for t in trials_of(tmp_path)
             if "source" not in t.user_attrs]
    during = [a for a in asked if any(t0 < a < t1 for t0, t1 in spans)]
    assert len(during) >= 3, (len(asked), len(during))
    gpu_s = sum(t1 - t0 for t0, t1 in spans)
    assert summ.gpu_busy_s == pytest.approx(gpu_s, rel=0.1, abs=0.2)
    assert summ.gpu_busy_s <= s.worker.wall_s + 1e-6
    assert summ.temp_wait_s == pytest.approx(0.05 * len(spans))
    st = optuna.load_study(study_name="t", storage=url_for(tmp_path))
    assert st.user_attrs["sessions"][-1]["temp_wait_s"] == pytest.approx(summ.temp_wait_s, abs=0.01)


def test_search_seeds_first_confirms_best(tmp_path: Path, plan) -> None:
    log = plan({})
    s = make(tmp_path, {"block_n": [64, 96, 128], "k_stages": [2, 3], "v_stages": [2, 3]},
             trials=6)
    summ = s.run()
    ts = trials_of(tmp_path)
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    # Known-good points first: FA3's heuristic (the default preset), then its 3/3-stage twin.
    assert ts[0].user_attrs["source"] == "preset:default"
    assert ts[1].user_attrs["source"] == "preset:default+k3v3"
    assert ts[0].params == {"block_n": 128, "k_stages": 2, "v_stages": 2}
    assert ts[0].state == TrialState.COMPLETE
    # The sweet spot of the fake timings is the default preset: it is the confirmed best.
    assert summ.best is not None and summ.best["trial"] == 0
    conf = ts[0].user_attrs["confirmed"]
    assert conf["protocol"] == search.CONFIRM_PROTOCOL
    assert set(conf["shapes"]) == {"1x2x512", "1x2x256"}
    assert Path(conf["results_dir"], "results.json").is_file()
    # Screening ran on the cheapest shape, and the value is the geometric mean over shapes.
    assert ts[0].user_attrs["screen"]["shape"] == "1x2x256"
    rows = ts[0].user_attrs["shapes"]
    assert ts[0].value == pytest.approx(search.geomean([r["tflops"] for r in rows.values()]))
    lines = log.read_text().splitlines()
    assert sum("repeat=200" in ln for ln in lines) >= 2  # full protocol, both shapes
    st = optuna.load_study(study_name="t", storage=url_for(tmp_path))
    assert st.user_attrs["shapes"] == ["1x2x512", "1x2x256"]
    assert st.user_attrs["sessions"][-1]["trials"] == summ.trials_run
    assert summ.trials_run - summ.duplicates == 6


def test_static_rejects_never_compile(tmp_path: Path, plan) -> None:
    b = FakeBuilder(tmp_path / "art")
    # block_n 176 with overlap needs ~268 registers per consumer thread: rejected statically.
    s = make(tmp_path, {"block_n": [128, 176], "hint_o": ["none", "evict_first"]}, trials=3,
             sampler="grid", builder=b)
    summ = s.run()
    ts = trials_of(tmp_path)
    rejected = [t for t in ts if t.params.get("block_n") == 176]
    # Told PRUNED with a violated constraint, so TPE's model sees where invalid configs lie.
    assert rejected and all(t.state == TrialState.PRUNED for t in rejected)
    assert all(t.user_attrs["prune_reason"].startswith("static check:") for t in rejected)
    assert all(t.constraints == {"static_check": 1.0} for t in rejected)
    built = set(b.calls)
    assert all(t.user_attrs["config_id"] not in built for t in rejected)
    assert summ.rejected == len(rejected)
    assert not [t for t in ts if t.state == TrialState.RUNNING]


def test_pruning_against_incumbent(tmp_path: Path, plan) -> None:
    # block_n 64 is 50% slower than the incumbent (block_n 128) on the screen: pruned.
    # k_stages 3 is 2% slower: it survives and is timed on every shape.
    s = make(tmp_path, {"block_n": [64, 128], "k_stages": [2, 3]}, trials=4, sampler="grid")
    s.run()
    ts = trials_of(tmp_path)
    by = {(t.params["block_n"], t.params["k_stages"]): t for t in ts
          if t.state != TrialState.FAIL}
    assert by[(64, 2)].state == TrialState.PRUNED
    assert "slower than trial 0" in by[(64, 2)].user_attrs["prune_reason"]
    assert by[(64, 2)].intermediate_values  # the screening number was reported
    assert by[(128, 3)].state == TrialState.COMPLETE
    assert "shapes" in by[(128, 3)].user_attrs
    assert 0 < search.PRUNE_SLOWER_FRACTION < 0.5


def test_failures_are_isolated(tmp_path: Path, plan, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "WATCHDOG_BASE_S", 3.0)
    plan({"block_n=64": "hang", "block_n=80": "crash", "block_n=96": "illegal_address",
          "block_n=112": "gate_fail"})
    b = FakeBuilder(tmp_path / "art", local_memory_block_n=144, fail_block_n=192)
    s = make(tmp_path, {"block_n": [64, 80, 96, 112, 128, 144, 192],
                        "intra_wg_overlap": [False]}, trials=8, sampler="grid", builder=b)
    summ = s.run()
    ts = trials_of(tmp_path)
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    reason = {t.params["block_n"]: t.user_attrs.get("fail_reason", "") for t in ts
              if t.state == TrialState.FAIL}
    assert "watchdog" in reason[64]
    assert "died" in reason[80] and "exit code 7" in reason[80]
    assert "cudaErrorIllegalAddress" in reason[96]
    assert "gate failed" in reason[112]
    assert "local memory" in reason[144]
    assert reason[192].startswith("build:")
    good = [t for t in ts if t.state == TrialState.COMPLETE]
    assert {t.params["block_n"] for t in good} == {128}
    assert summ.best is not None and summ.failed == 6
    assert s.worker.restarts >= 3  # hang, crash and fault each cost a worker


def test_duplicates_reuse_verdict_and_exhaustion_stops(tmp_path: Path, plan,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "MAX_IDLE_ASKS", 15)
    b = FakeBuilder(tmp_path / "art")
    s = make(tmp_path, {"block_n": [112, 128]}, trials=20, sampler="random", builder=b)
    summ = s.run()
    assert "exhausted" in summ.stopped_by
    ts = trials_of(tmp_path)
    assert len(set(b.calls)) == len(b.calls) == 2  # each distinct config compiled once
    dups = [t for t in ts if "duplicate_of" in t.user_attrs]
    assert dups and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in dups)


def test_resume_after_sigterm_and_sigkill(tmp_path: Path, plan) -> None:
    plan({"block_n=96": "hang"})  # the run sits in a hung kernel when we stop it
    url = url_for(tmp_path, "r")
    cmd = [sys.executable, str(FIX / "run_fake_search.py"), url, "r", "50", str(tmp_path / "art")]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def start_and_wait_for_hang() -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                ts = optuna.load_study(study_name="r", storage=url).get_trials()
            except KeyError:  # not created yet
                time.sleep(0.2)
                continue
            running = [t for t in ts if t.state == TrialState.RUNNING
                       and t.params.get("block_n") == 96 and "build" in t.user_attrs]
            if running:
                time.sleep(0.5)
                return p
            time.sleep(0.2)
        p.kill()
        raise AssertionError("the search never reached the hanging config")

    # 1) SIGTERM: the process tells every open trial before it exits.
    p = start_and_wait_for_hang()
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    assert "SUMMARY interrupted (SIGTERM)" in out, out[-2000:]
    ts = optuna.load_study(study_name="r", storage=url).get_trials()
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    interrupted = [t for t in ts if t.user_attrs.get("fail_reason") == "interrupted"]
    assert interrupted
    n_complete = len([t for t in ts if t.state == TrialState.COMPLETE])
    assert n_complete >= 1  # completed trials kept

    # 2) SIGKILL: RUNNING trials are left behind; the next run fails them first.
    p = start_and_wait_for_hang()
    p.kill()
    p.wait(timeout=30)
    ts = optuna.load_study(study_name="r", storage=url).get_trials()
    assert [t for t in ts if t.state == TrialState.RUNNING]
    plan({})  # the hang is gone; the same command resumes
    p = subprocess.run(cmd[:4] + ["3", cmd[5]], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ts = optuna.load_study(study_name="r", storage=url).get_trials()
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    assert len([t for t in ts if t.state == TrialState.COMPLETE]) >= n_complete
    # The interrupted config was re-enqueued and measured this time.
    requeued = [t for t in ts if "requeued_from" in t.user_attrs]
    assert requeued and any(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in requeued)
    # Presets are enqueued once per study, not per invocation.
    assert len([t for t in ts if t.user_attrs.get("source") == "preset:default"]) == 1


def test_resume_with_other_shapes_is_refused(tmp_path: Path, plan) -> None:
    make(tmp_path, {"block_n": [128]}, trials=1).run()
    with pytest.raises(search.SearchError, match="searches shapes"):
        make(tmp_path, {"block_n": [128]}, trials=1, shapes=[Shape(1, 2, 256)])
    with pytest.raises(search.SearchError, match="another search space"):
        make(tmp_path, {"block_n": [128, 112]}, trials=1)
    assert len(trials_of(tmp_path)) >= 1  # nothing lost


def test_storage_urls(tmp_path: Path, plan) -> None:
    # An explicit SQLite URL works like the default; unreachable or malformed URLs are one line.
    url = f"sqlite:///{tmp_path / 'sub' / 'explicit.db'}"
    s = search.Search(study="x", space=space_from_dict({"block_n": [128]}), shapes=SHAPES,
                      storage=url, n_trials=1, builder=FakeBuilder(tmp_path / "art"),
                      worker_entry=WORKER, results_root=tmp_path / "res")
    s.run()
    assert optuna.load_study(study_name="x", storage=url).best_trial.number == 0
    for bad in ("postgresql://u:secret@127.0.0.1:1/nodb", "nosuchdb://x", "sqlite:////proc/x/y.db"):
        with pytest.raises(search.SearchError) as e:
            search.open_storage(bad)
        assert "\n" not in str(e.value) and "secret" not in str(e.value)


def test_sqlite_storage_uses_wal(tmp_path: Path) -> None:
    # Every connection of a study file runs in WAL mode with synchronous=NORMAL (one fsync per
    # checkpoint instead of per commit: Optuna commits ~30 times per trial).
    import sqlite3

    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'w.db'}"
    st = search.open_storage(url)
    optuna.create_study(study_name="w", storage=st)
    with st.engine.connect() as c:
        assert c.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
    con = sqlite3.connect(tmp_path / "w.db")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # stored in the file
    con.close()
    assert optuna.load_study(study_name="w", storage=url).study_name == "w"


def test_default_storage_is_under_studies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FA_TUNE_STUDIES", str(tmp_path))
    assert search.storage_url("abc", None) == f"sqlite:///{tmp_path / 'abc.db'}"
    with pytest.raises(search.SearchError):
        search.storage_url("../evil", None)


def test_unknown_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA_TUNE_STUDIES", str(tmp_path))
    with pytest.raises(search.SearchError, match="unknown study 'nope'"):
        search.load_existing_study("nope", None)


def test_sampler_choices(tmp_path: Path) -> None:
    sp = space_from_dict({"block_n": [64, 128]})
    for name in ("tpe", "random", "grid"):
        assert search.make_sampler(name, 0, sp) is not None
    with pytest.raises(search.SearchError, match="unknown sampler"):
        search.make_sampler("annealing", 0, sp)
    from tuner.space import load_space

    with pytest.raises(search.SearchError, match="grid sampler"):
        search.make_sampler("grid", 0, load_space("default"))
