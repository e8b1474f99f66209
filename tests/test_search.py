"""Search plumbing on the CPU: a real SQLite study, the fake builder and the fake GPU worker.

The GPU side is tests/fixtures/fake_gpu_worker.py (a clearly named test fixture that returns
canned timings or crashes/hangs on command); the builder is tests/fixtures/fake_builder.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState
from study_poll import trials_if_created

from tuner.analysis import show
from tuner.errors import SearchError, ShapeError
from tuner.measure import timing
from tuner.problem import Problem, as_problem
from tuner.search import loop as search
from tuner.search import policy, sampler, session, worker_client
from tuner.search.space import space_from_dict
from tuner.search.study import load_existing_study, open_storage, storage_url
from tuner.search.trials import GATE_CONSTRAINT, SPILL_CONSTRAINT

FIX = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIX))
from fake_builder import FakeBuilder  # noqa: E402

WORKER = f"{FIX / 'fake_gpu_worker.py'}:main"
SHAPES = [Problem(1, 2, 512), Problem(1, 2, 256)]


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
    assert session.parse_duration("90s") == 90
    assert session.parse_duration("10m") == 600
    assert session.parse_duration("1h30m") == 5400
    assert session.parse_duration("45") == 45
    assert session.parse_duration(None) is None
    for bad in ("ten minutes", "0", "5x", "-3m"):
        with pytest.raises(SearchError):
            session.parse_duration(bad)


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
    # Every request keeps the fake GPU busy for 0.5 s. The next trials must be asked while it
    # is (not between requests, when the GPU would idle), and GPU-busy time is what the worker
    # reports, cooling waits included and counted apart. (0.3 s let a heavily loaded 2-core
    # host, three test runs at once, ask two of five in the spans.)
    log = plan({})
    monkeypatch.setenv("FAKE_GPU_WORKER_DELAY_S", "0.5")
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
    # Confirmed with FULL, the protocol of `fa-tune run` and `compare` (settle phase included),
    # whose rounds stop near 4 s (CONFIRM): these short kernels keep every launch.
    assert conf["protocol"] == timing.CONFIRM.to_dict()
    assert {k: v for k, v in conf["protocol"].items() if k != "max_round_s"} == {
        k: v for k, v in timing.FULL.to_dict().items() if k != "max_round_s"}
    assert conf["protocol"]["settle_s"] > 0
    assert set(conf["shapes"]) == {"1x2x512", "1x2x256"}
    assert Path(conf["results_dir"], "results.json").is_file()
    # Screening ran on the cheapest shape, and the value is the geometric mean over shapes.
    assert ts[0].user_attrs["screen"]["shape"] == "1x2x256"
    rows = ts[0].user_attrs["shapes"]
    assert ts[0].value == pytest.approx(session.geomean([r["tflops"] for r in rows.values()]))
    lines = log.read_text().splitlines()
    full = f"repeat=200 rounds=3 settle_s={timing.FULL.settle_s:g} temp_wait_s=60"
    assert sum(full in ln for ln in lines) >= 2  # full protocol, both shapes
    # Screens and surveys: the short protocols, no settle phase, short temperature waits.
    assert sum("repeat=30 rounds=1 settle_s=0 temp_wait_s=10" in ln for ln in lines) >= 1
    assert sum("repeat=100 rounds=1 settle_s=0 temp_wait_s=10" in ln for ln in lines) >= 2
    results = json.loads(Path(conf["results_dir"], "results.json").read_text())
    assert results["protocol"] == timing.CONFIRM.to_dict()
    # Every per-problem entry: the problem's dict (H = Hq for old readers) and its text form.
    by_name = {e["shape"]: e for e in results["shapes"]}
    expect = {"B": 1, "H": 2, "Hq": 2, "Hkv": 2, "S": 512, "D": 128, "causal": True}
    assert {k: by_name["1x2x512"].get(k) for k in expect} == expect
    assert by_name["1x2x256"]["flops"] == Problem(1, 2, 256).flops
    st = optuna.load_study(study_name="t", storage=url_for(tmp_path))
    assert st.user_attrs["shapes"] == ["1x2x512", "1x2x256"]
    assert st.user_attrs["sessions"][-1]["trials"] == summ.trials_run
    assert summ.trials_run - summ.duplicates == 6


def test_static_rejects_never_compile(tmp_path: Path, plan) -> None:
    b = FakeBuilder(tmp_path / "art")
    # block_n 192 with overlap needs ~244 registers per consumer thread: rejected statically.
    s = make(tmp_path, {"block_n": [128, 192], "hint_o": ["none", "evict_first"]}, trials=3,
             sampler="grid", builder=b)
    summ = s.run()
    ts = trials_of(tmp_path)
    rejected = [t for t in ts if t.params.get("block_n") == 192]
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
    assert 0 < policy.PRUNE_SLOWER_FRACTION < 0.5


def test_grid_waits_for_its_last_points_instead_of_asking_them_again(tmp_path: Path,
                                                                      plan) -> None:
    # GridSampler hands out a running point again once every point has started: with more
    # trials open than the grid has points, each such ask became a duplicate trial of one in
    # flight (or, after a failure, of a failed one). The search waits for the verdicts.
    b = FakeBuilder(tmp_path / "art", delay_s=0.3)
    s = search.Search(
        study="t", space=space_from_dict({"block_n": [96, 112, 128]}, "test-space"),
        shapes=SHAPES, storage=url_for(tmp_path), n_trials=None, sampler="grid", seed=0,
        jobs=6, builder=b, worker_entry=WORKER, results_root=tmp_path / "results",
        policy=policy.SearchPolicy(final_top=0))
    summ = s.run()
    ts = trials_of(tmp_path)
    # The default config (block_n 128) is seeded first; the grid's 128 is its duplicate.
    assert sorted(t.system_attrs.get("grid_id", -1) for t in ts) == [-1, 0, 1, 2]
    assert summ.duplicates == 1 and summ.stopped_by == "every point of the grid has been asked"


def test_failures_are_isolated(tmp_path: Path, plan, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_client, "WATCHDOG_BASE_S", 3.0)
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
    assert reason[192].startswith("build:")
    # The gate's refusal is the config's own: a failure to the user (its reason, counted in
    # summ.failed, `show`'s "failed"), told PRUNED with a violated constraint so TPE learns it.
    refused = next(t for t in ts if t.params["block_n"] == 112)
    assert refused.state == TrialState.PRUNED and refused.constraints == {GATE_CONSTRAINT: 1.0}
    assert "gate failed" in refused.user_attrs["fail_reason"]
    assert show.state_counts(ts)["failed"] == 5
    # A kernel with local memory is not a failure: pruned, infeasible for the sampler.
    spill = next(t for t in ts if t.params["block_n"] == 144)
    assert spill.state == TrialState.PRUNED and "local memory" in spill.user_attrs["prune_reason"]
    assert spill.constraints == {SPILL_CONSTRAINT: 1.0}
    good = [t for t in ts if t.state == TrialState.COMPLETE]
    assert {t.params["block_n"] for t in good} == {128}
    assert summ.best is not None and summ.failed == 5 and summ.spilled == 1
    assert s.worker.restarts >= 3  # hang, crash and fault each cost a worker


def tpe_worst(tmp: Path) -> list[int]:
    """block_n of the trials TPE puts alone in its "above" (worst) group of the study "t"."""
    from optuna.samplers._tpe.sampler import _split_trials

    st = optuna.load_study(study_name="t", storage=url_for(tmp))
    done = st.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    _, above = _split_trials(st, done, n_below=len(done) - 1)
    return [t.params["block_n"] for t in above]


def ask_again(tmp: Path, block_n: int) -> None:
    optuna.load_study(study_name="t", storage=url_for(tmp)).enqueue_trial(
        {"block_n": block_n, "intra_wg_overlap": False})


def test_spilled_kernels_teach_tpe_to_avoid_them(tmp_path: Path, plan) -> None:
    # TPE models COMPLETE and PRUNED trials only: a spill told FAIL (as before) left its region
    # as likely as ever (39 of 137 trials of a D 256 softcap search spilled, docs/PERF.md step
    # 62). Told PRUNED with a violated constraint, TPE ranks it with the worst.
    b = FakeBuilder(tmp_path / "art", local_memory_block_n=144)
    s = make(tmp_path, {"block_n": [64, 80, 96, 112, 128, 144], "intra_wg_overlap": [False]},
             trials=6, sampler="grid", builder=b)
    summ = s.run()
    assert summ.spilled == 1 and summ.failed == 0
    assert tpe_worst(tmp_path) == [144]
    # A second ask of the same config is told like the first (a duplicate, still infeasible).
    ask_again(tmp_path, 144)
    s2 = make(tmp_path, {"block_n": [64, 80, 96, 112, 128, 144], "intra_wg_overlap": [False]},
              trials=1, sampler="random", builder=b)
    assert s2.run().spilled == 1
    again = [t for t in trials_of(tmp_path) if t.params["block_n"] == 144]
    assert len(again) == 2 and all(t.constraints == {SPILL_CONSTRAINT: 1.0} for t in again)
    # `fa-tune show` counts them apart from the pruned and the failed.
    counts = show.state_counts(trials_of(tmp_path))
    assert counts["spilled"] == 2 and "failed" not in counts
    assert {r["state"] for r in show.trial_rows(again)} == {"SPILLED"}


def test_gate_refusals_teach_tpe_and_stay_failures(tmp_path: Path, plan) -> None:
    # A config the gate refuses on the study's problems is as infeasible as a spill: told FAIL,
    # TPE never saw it and kept proposing the refused knobs (docs/PERF.md step 78: 10 of 82
    # trials of a window bucket). Told PRUNED with GATE_CONSTRAINT, TPE ranks it with the worst;
    # to the user it is still a failure, with its reason.
    plan({"block_n=96": "gate_fail"})
    space = {"block_n": [64, 80, 96, 112, 128], "intra_wg_overlap": [False]}
    summ = make(tmp_path, space, trials=5, sampler="grid").run()
    assert summ.failed == 1 and summ.spilled == 0
    assert tpe_worst(tmp_path) == [96]
    # Asked again, the same config is a duplicate of the refusal: still infeasible, a failure.
    ask_again(tmp_path, 96)
    assert make(tmp_path, space, trials=1, sampler="random").run().failed == 1
    again = [t for t in trials_of(tmp_path) if t.params["block_n"] == 96]
    assert len(again) == 2 and all(t.constraints == {GATE_CONSTRAINT: 1.0} for t in again)
    assert all("gate failed" in t.user_attrs["fail_reason"] for t in again)
    rows = show.trial_rows(again)
    assert {r["state"] for r in rows} == {"FAIL"}
    assert all("gate failed" in r["reason"] for r in rows)
    assert show.state_counts(trials_of(tmp_path))["failed"] == 2


def test_planned_worker_recycles_are_not_counted_as_restarts(
        tmp_path: Path, plan, monkeypatch: pytest.MonkeyPatch) -> None:
    # The worker is replaced after WORKER_MAX_KERNELS libraries (each stays mapped in it):
    # that is bookkeeping, not a failure, and the progress says which is which (a search on
    # the H200 showed "worker restarts 2" with no trial failed, 2026-12-02).
    monkeypatch.setattr(worker_client, "WORKER_MAX_KERNELS", 2)
    plan({})
    s = make(tmp_path, {"block_n": [64, 80, 96, 112, 128]}, trials=5, sampler="grid")
    summ = s.run()
    assert summ.failed == 0
    assert s.worker.recycles >= 1 and s.worker.restarts == 0


def test_duplicates_reuse_verdict_and_exhaustion_stops(tmp_path: Path, plan,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "MAX_IDLE_ASKS", 15)
    b = FakeBuilder(tmp_path / "art")
    s = make(tmp_path, {"block_n": [112, 128]}, trials=20, sampler="random", builder=b)
    summ = s.run()
    assert "exhausted" in summ.stopped_by
    ts = trials_of(tmp_path)
    assert len(set(b.calls)) == len(b.calls) == 2  # each distinct config compiled once
    # The asks stopped once no config was left: no trial was created only to repeat a verdict.
    assert not [t for t in ts if "duplicate_of" in t.user_attrs]
    # A trial enqueued with a measured config (a retry, a seed) takes that verdict, uncompiled;
    # the re-run then finds the space exhausted before any other ask.
    st = optuna.load_study(study_name="t", storage=url_for(tmp_path, "t"))
    st.enqueue_trial({"block_n": 112}, skip_if_exists=False)
    again = make(tmp_path, {"block_n": [112, 128]}, trials=20, sampler="random", builder=b)
    assert "exhausted" in again.run().stopped_by
    after = trials_of(tmp_path)
    dups = [t for t in after if "duplicate_of" in t.user_attrs]
    assert len(after) == len(ts) + 1 and len(dups) == 1 and len(b.calls) == 2
    assert dups[0].state in (TrialState.COMPLETE, TrialState.PRUNED)


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited (its parent, killed, cannot reap it)


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
            ts = trials_if_created(url, "r")  # never races the search creating it
            running = [t for t in ts if t.state == TrialState.RUNNING
                       and t.params.get("block_n") == 96 and "build" in t.user_attrs]
            if running:
                time.sleep(0.5)
                return p
            time.sleep(0.2)
        p.kill()
        raise AssertionError("the search never reached the hanging config")

    # 1) SIGTERM: the process settles every open trial before it exits. The one cut on the
    # GPU fails as interrupted; any asked ahead of it goes back to WAITING, not to FAIL.
    p = start_and_wait_for_hang()
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    assert "SUMMARY interrupted (SIGTERM)" in out, out[-2000:]
    ts = optuna.load_study(study_name="r", storage=url).get_trials()
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    interrupted = [t for t in ts if t.user_attrs.get("fail_reason") == "interrupted"]
    assert [t.params["block_n"] for t in interrupted] == [96]
    assert [t.state for t in ts if t.state == TrialState.FAIL] == [TrialState.FAIL]
    assert all(t.user_attrs["not_run"] == "interrupted (SIGTERM)"
               for t in ts if t.state == TrialState.WAITING)
    n_complete = len([t for t in ts if t.state == TrialState.COMPLETE])
    assert n_complete >= 1  # completed trials kept

    # 2) SIGKILL: RUNNING trials are left behind; the next run settles them first (the one
    # that reached the GPU fails as interrupted, the others go back to WAITING) and then
    # measures what waits before anything new.
    p = start_and_wait_for_hang()
    workers = _children(p.pid)  # the GPU worker, hung in its kernel
    assert workers
    p.kill()
    p.wait(timeout=30)
    # The hung worker leaves with its search (it would hold the GPU otherwise).
    deadline = time.time() + 10
    while [w for w in workers if _alive(w)] and time.time() < deadline:
        time.sleep(0.2)
    assert not [w for w in workers if _alive(w)], workers
    ts = optuna.load_study(study_name="r", storage=url).get_trials()
    killed = [t for t in ts if t.state == TrialState.RUNNING]
    assert killed
    plan({})  # the hang is gone; the same command resumes
    p = subprocess.run(cmd[:4] + ["6", cmd[5]], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ts = optuna.load_study(study_name="r", storage=url).get_trials()
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    by_number = {t.number: t for t in ts}
    for t in killed:
        now = by_number[t.number]
        if "build" in t.user_attrs:
            assert now.state == TrialState.FAIL and now.user_attrs["fail_reason"] == "interrupted"
        else:
            assert now.state in (TrialState.COMPLETE, TrialState.PRUNED), now.user_attrs
    assert not [t for t in ts if t.state == TrialState.WAITING and "not_run" in t.user_attrs]
    assert len([t for t in ts if t.state == TrialState.COMPLETE]) >= n_complete
    # The interrupted config was re-enqueued and measured this time.
    requeued = [t for t in ts if "requeued_from" in t.user_attrs]
    assert requeued and any(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in requeued)
    # Presets are enqueued once per study, not per invocation.
    assert len([t for t in ts if t.user_attrs.get("source") == "preset:default"]) == 1


def test_resume_with_other_shapes_is_refused(tmp_path: Path, plan) -> None:
    make(tmp_path, {"block_n": [128]}, trials=1).run()
    with pytest.raises(SearchError, match="searches shapes"):
        make(tmp_path, {"block_n": [128]}, trials=1, shapes=[Problem(1, 2, 256)])
    with pytest.raises(SearchError, match="another search space"):
        make(tmp_path, {"block_n": [128, 112]}, trials=1)
    assert len(trials_of(tmp_path)) >= 1  # nothing lost


def test_study_from_before_a_new_knob_still_resumes(tmp_path: Path, plan) -> None:
    """A study recorded before a knob existed (its space lacks it) resumes under a space that
    pins the new knob to its default; one that searches the new knob is another space."""
    make(tmp_path, {"block_n": [128], "write_lse": [True]}, trials=1).run()
    st = optuna.load_study(study_name="t", storage=url_for(tmp_path))
    old = dict(st.user_attrs["space"])
    del old["write_lse"]  # as if write_lse had come after the study
    st.set_user_attr("space", old)
    make(tmp_path, {"block_n": [128], "write_lse": [True]}, trials=1).run()  # not refused
    with pytest.raises(SearchError, match="another search space"):
        make(tmp_path, {"block_n": [128], "write_lse": [True, False]}, trials=1)


def test_search_refuses_problems_the_kernel_cannot_run(tmp_path: Path, plan) -> None:
    for extra, needle in (([Problem.parse("1x2x256:d64")], "mix head dims"),
                          ([Problem.parse("1x32/8x8192:d256")], "mix head dims"),
                          ([Problem.parse("1x2x256:full")], "mix causal and non-causal"),
                          ([Problem.parse("1x32/8x8192"), Problem.parse("1x32/8x8192:full")],
                           "mix causal and non-causal")):
        with pytest.raises(ShapeError, match=needle):
            make(tmp_path, {"block_n": [128]}, trials=1, shapes=[Problem(1, 2, 512), *extra])
    assert not (tmp_path / "t.db").exists()  # refused before the study was opened


@pytest.mark.parametrize("texts", [["1x2x512", "1x32/8x8192"], ["1x8/1x256"],
                                   ["4x32x8192:full"], ["1x2x512:full", "1x32/8x1024:full"],
                                   ["1x32/8x8192:d64"], ["4x16x8192:d256:full"]])
def test_search_accepts_gqa_and_non_causal_problems(tmp_path: Path, plan, texts) -> None:
    """GQA/MQA (Hkv a run-time argument) and one shared problem class (head dim and mask) are
    searched."""
    s = make(tmp_path, {"block_n": [128]}, trials=1, shapes=[Problem.parse(t) for t in texts])
    assert [str(p) for p in s.shapes] == texts
    assert (tmp_path / "t.db").exists()
    # Without a builder, every candidate is built for the problems' mask.
    real = search.Search(study="u", space=space_from_dict({"block_n": [128]}, "test-space"),
                         shapes=[Problem.parse(t) for t in texts], storage=url_for(tmp_path, "u"),
                         n_trials=1, sampler="random", seed=0, jobs=1, worker_entry=WORKER)
    want = Problem.parse(texts[0]).problem_class
    # ... and without the varlen kernel (the problems are fixed-length): exports add it.
    from tuner.kernel import build

    assert real.builder.func is build.build_config and real.builder.keywords == {"pclass": want}


def test_old_study_shape_names_still_resume(tmp_path: Path, plan) -> None:
    """A study's ``shapes`` attr holds text forms; today's MHA names are the old names, and a
    spelling the old parser took (upper-case X) reads as the same problem."""
    make(tmp_path, {"block_n": [128]}, trials=1).run()
    st = optuna.load_study(study_name="t", storage=url_for(tmp_path))
    assert st.user_attrs["shapes"] == [str(s) for s in SHAPES] == ["1x2x512", "1x2x256"]
    st.set_user_attr("shapes", ["1X2X512", "1x2x256"])
    make(tmp_path, {"block_n": [128]}, trials=1).run()  # not refused as other shapes


def test_worker_request_carries_the_problem_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    w = worker_client.GpuWorker()
    sent: list[dict] = []
    monkeypatch.setattr(w, "request", lambda msg, timeout_s, what: sent.append(msg) or {})
    prob = Problem(2, 16, 1024)
    w.measure("k.so", prob, timing.SCREEN, gate=True, seed=7)
    [msg] = sent
    assert msg["shape"] == prob.to_dict()
    assert as_problem(msg["shape"]) == prob  # what tuner/search/gpu_worker.py reads it back with
    assert as_problem([2, 16, 1024]) == prob  # a request of a worker before problems


def test_storage_urls(tmp_path: Path, plan) -> None:
    # An explicit SQLite URL works like the default; unreachable or malformed URLs are one line.
    url = f"sqlite:///{tmp_path / 'sub' / 'explicit.db'}"
    s = search.Search(study="x", space=space_from_dict({"block_n": [128]}), shapes=SHAPES,
                      storage=url, n_trials=1, builder=FakeBuilder(tmp_path / "art"),
                      worker_entry=WORKER, results_root=tmp_path / "res")
    s.run()
    assert optuna.load_study(study_name="x", storage=url).best_trial.number == 0
    for bad in ("postgresql://u:secret@127.0.0.1:1/nodb", "nosuchdb://x", "sqlite:////proc/x/y.db"):
        with pytest.raises(SearchError) as e:
            open_storage(bad)
        assert "\n" not in str(e.value) and "secret" not in str(e.value)


def test_sqlite_storage_uses_wal(tmp_path: Path) -> None:
    # Every connection of a study file runs in WAL mode with synchronous=NORMAL (one fsync per
    # checkpoint instead of per commit: Optuna commits ~30 times per trial).
    import sqlite3

    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'w.db'}"
    st = open_storage(url)
    optuna.create_study(study_name="w", storage=st)
    with st.engine.connect() as c:
        assert c.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
    con = sqlite3.connect(tmp_path / "w.db")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # stored in the file
    con.close()
    assert optuna.load_study(study_name="w", storage=url).study_name == "w"


def test_default_storage_is_under_studies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FA_TUNE_STUDIES", str(tmp_path))
    assert storage_url("abc", None) == f"sqlite:///{tmp_path / 'abc.db'}"
    with pytest.raises(SearchError):
        storage_url("../evil", None)


def test_unknown_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA_TUNE_STUDIES", str(tmp_path))
    with pytest.raises(SearchError, match="unknown study 'nope'"):
        load_existing_study("nope", None)


def test_sampler_choices(tmp_path: Path) -> None:
    sp = space_from_dict({"block_n": [64, 128]})
    for name in ("tpe", "random", "grid"):
        assert sampler.make_sampler(name, 0, sp) is not None
    with pytest.raises(SearchError, match="unknown sampler"):
        sampler.make_sampler("annealing", 0, sp)
    from tuner.search.space import load_space

    with pytest.raises(SearchError, match="grid sampler"):
        sampler.make_sampler("grid", 0, load_space("default"))


def test_a_timeout_too_short_for_one_compile_says_so(tmp_path: Path, plan) -> None:
    # No compile starts with less than half of one left (60 s is the first guess), so a 10 s
    # search asks nothing; it said "finished" with 0 trials, now why and what to do.
    s = make(tmp_path, {"block_n": [96, 128]}, trials=None, timeout_s=10.0)
    summ = s.run()
    assert summ.trials_run == 0
    assert "--timeout" in summ.stopped_by and "longer" in summ.stopped_by, summ.stopped_by
    # The CLI prints the summary with that reason and exits 2, as for other bad input.
    import typer

    from tuner.cli.search_cmds import _exit_if_stopped

    with pytest.raises(typer.Exit) as e:
        _exit_if_stopped(summ.stopped_by)
    assert e.value.exit_code == 2
    _exit_if_stopped("timeout")  # a search that ran out its --timeout exits 0


def test_deadline_leaves_unrun_trials_waiting_and_resume_runs_them_first(
        tmp_path: Path, plan, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each request keeps the fake GPU busy 0.5 s, so the deadline comes while candidates asked
    # ahead are still queued. They must not be FAIL: they wait (params fixed) and the next
    # search measures them before anything new; `show trials` counts them as waiting. 6 s
    # measure at most 12 of the 16 points, and leave a loaded CI machine (the 2026-12-03 run
    # found none waiting at 4 s) time to start the worker and ask ahead before the deadline.
    monkeypatch.setenv("FAKE_GPU_WORKER_DELAY_S", "0.5")
    space = {"block_n": [64, 96, 112, 128], "k_stages": [2, 3], "v_stages": [2, 3]}
    s = make(tmp_path, space, trials=None, timeout_s=6.0)
    s._avg_compile_s = 0.01  # the fake builder compiles at once (the first guess is 60 s)
    # The search itself stops asking once the queued GPU work fills the time left (its own
    # test is below); how close it cuts depends on the machine's speed, so here it asks up to
    # the lookahead until the deadline: trials are then surely queued when it comes.
    monkeypatch.setattr(s, "_may_ask", lambda asked: not s._exhausted
                        and time.monotonic() < s.progress.deadline)
    summ = s.run()
    assert summ.stopped_by == "timeout"
    ts = trials_of(tmp_path)
    waiting = [t for t in ts if t.state == TrialState.WAITING]
    assert waiting and summ.not_run == len(waiting)
    assert not [t for t in ts if t.state in (TrialState.FAIL, TrialState.RUNNING)]
    for t in waiting:
        assert t.user_attrs["not_run"] == "timeout"
        assert t.system_attrs["fixed_params"] == t.params  # as an enqueued trial
    st = optuna.load_study(study_name="t", storage=url_for(tmp_path))
    assert st.user_attrs["sessions"][-1]["not_run"] == len(waiting)

    from typer.testing import CliRunner

    from tuner.cli import app

    r = CliRunner().invoke(app, ["show", "trials", "--study", "t", "--storage",
                                 url_for(tmp_path)], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert f"{len(waiting)} waiting" in r.output and "failed" not in r.output
    assert "not run yet" in r.output

    monkeypatch.setenv("FAKE_GPU_WORKER_DELAY_S", "0")
    before = {t.number for t in ts}
    make(tmp_path, space, trials=len(waiting) + 2).run()
    now = {t.number: t for t in trials_of(tmp_path)}
    for t in waiting:  # the same trials, measured now
        assert now[t.number].state in (TrialState.COMPLETE, TrialState.PRUNED)
    new = [t for n, t in now.items() if n not in before]
    assert new
    assert max(now[t.number].datetime_start for t in waiting) <= min(
        t.datetime_start for t in new)


def test_no_asks_beyond_what_the_gpu_can_measure_before_the_deadline(tmp_path: Path,
                                                                     plan) -> None:
    s = make(tmp_path, {"block_n": [128]}, trials=None, timeout_s=100.0)
    s._avg_compile_s = 0.0
    assert s._may_ask(0)
    s._avg_eval_s = 30.0  # each candidate holds the GPU 30 s
    s.queue.extend([object()] * 3)  # 90 s of GPU work queued, ~100 s left: one more fits
    assert s._may_ask(0)
    s.queue.append(object())  # 120 s queued: anything asked now would only wait
    assert not s._may_ask(0)


def test_watchdog_covers_settle_and_temperature_waits() -> None:
    shape = Problem(1, 2, 256)
    bare = dataclasses.replace(timing.FULL, settle_s=0.0, temp_wait_s=0.0)
    extra = (worker_client.watchdog_s(shape, timing.FULL, False)
             - worker_client.watchdog_s(shape, bare, False))
    full = timing.FULL
    assert extra == pytest.approx(full.rounds * (full.settle_s + full.temp_wait_s))


def test_policy_prunes_and_confirms() -> None:
    pol = policy.SearchPolicy()
    assert (pol.screen, pol.survey, pol.confirm) == (timing.SCREEN, timing.SURVEY, timing.CONFIRM)
    inc = SimpleNamespace(number=3, user_attrs={"screen": {"median_ms": 1.0},
                                                "confirmed": {"geomean_tflops": 500.0}})
    assert pol.prune_reason({"shape": "1x2x256", "median_ms": 1.05}, inc) is None
    why = pol.prune_reason({"shape": "1x2x256", "median_ms": 1.2}, inc)
    assert why is not None and "20.0% slower than trial 3" in why and "1x2x256" in why
    assert pol.prune_reason({"median_ms": 9.0}, None) is None  # no incumbent yet
    assert pol.needs_confirming(1.0, None)
    assert pol.needs_confirming(501.0, inc) and not pol.needs_confirming(499.0, inc)
    done = SimpleNamespace(number=4, user_attrs={"confirmed": {"geomean_tflops": 510.0}})
    assert pol.is_new_best(done, inc) and not pol.is_new_best(inc, done)
    # Calibrated: surveys read 4 % over the full protocol here, so 515 is a likely 494.4 and
    # not confirmed; 520 (499.2) is within the 1 % margin of 500 and is.
    assert pol.needs_confirming(515.0, inc, [0.95, 0.96, 0.97]) is False
    assert pol.needs_confirming(520.0, inc, [0.95, 0.96, 0.97])
    assert pol.needs_confirming(501.0, inc, [0.96, 0.96])  # too few ratios: uncalibrated


def test_a_calibrated_screen_reference_replaces_a_lucky_incumbent_screen() -> None:
    """The incumbent screened at 1.0 ms on a cool card but runs 1.2 ms by the full protocol; the
    study's screens read 0.92 of the full protocol, so its reference is 1.104 ms: a candidate
    screened at 1.1 ms (10 % over the lucky screen) goes on, one at 1.25 ms is pruned."""
    from tuner.search.trials import screen_ratio, screen_ratios

    pol = policy.SearchPolicy()
    conf = {"geomean_tflops": 500.0, "shapes": {"1x2x256": {"median_ms": 1.2}}}
    inc = SimpleNamespace(number=3, user_attrs={"screen": {"shape": "1x2x256", "median_ms": 1.0},
                                                "confirmed": conf})
    cand = {"shape": "1x2x256", "median_ms": 1.1}
    assert pol.prune_reason(cand, inc) is not None  # against its own screen: pruned
    ratios = [0.90, 0.92, 0.95]
    assert pol.prune_reason(cand, inc, ratios) is None
    why = pol.prune_reason({"shape": "1x2x256", "median_ms": 1.25}, inc, ratios)
    assert why is not None and "1.1040 ms (confirmed time" in why
    assert pol.prune_reason(cand, inc, ratios[:2]) is not None  # too few: its screen again
    # Another screen shape than the incumbent's confirmed ones: its screen again.
    assert pol.prune_reason({"shape": "1x2x512", "median_ms": 1.1}, inc, ratios) is not None
    assert screen_ratio(inc.user_attrs) == pytest.approx(1.0 / 1.2)
    assert screen_ratio({"screen": {"shape": "1x2x256", "median_ms": 1.0}}) is None
    other = SimpleNamespace(user_attrs={**inc.user_attrs, "gpu": {"name": "NVIDIA H200"}})
    assert screen_ratios([inc, other], "NVIDIA H100 80GB HBM3") == pytest.approx([1.0 / 1.2])


def test_confirm_ratios_read_the_studys_confirmed_trials() -> None:
    from optuna.trial import TrialState

    from tuner.search.trials import confirm_ratios

    def t(state: TrialState, value: float | None, conf: float | None) -> SimpleNamespace:
        attrs = {"confirmed": {"geomean_tflops": conf}} if conf else {}
        return SimpleNamespace(state=state, value=value, user_attrs=attrs)

    ts = [t(TrialState.COMPLETE, 500.0, 480.0), t(TrialState.COMPLETE, 400.0, None),
          t(TrialState.PRUNED, None, None), t(TrialState.COMPLETE, 600.0, 594.0)]
    assert confirm_ratios(ts) == pytest.approx([0.96, 0.99])
    # A study mixing GPU models (--allow-mixed-gpus): each worker calibrates on its own.
    ts[0].user_attrs["gpu"] = {"name": "NVIDIA H100 80GB HBM3"}
    ts[3].user_attrs["gpu"] = {"name": "NVIDIA H200"}
    assert confirm_ratios(ts, "NVIDIA H200") == pytest.approx([0.99])


def test_a_workloads_class_builds_its_candidates(tmp_path: Path) -> None:
    """`tune --workload` hands each bucket's search the library's class: a full-attention kind's
    problems are then built with the window class they are served by; a class that cannot run
    the problems is one ShapeError line."""
    from tuner.problem import ProblemClass

    pc = ProblemClass(128, True, window=True, sinks=True)
    s = make(tmp_path, {"block_n": [128]}, trials=1, shapes=[Problem(1, 2, 256, sinks=True)],
             problem_class=pc)
    assert s.pclass == pc
    with pytest.raises(ShapeError, match="without sinks"):
        make(tmp_path, {"block_n": [128]}, trials=1, study="u",
             shapes=[Problem(1, 2, 256, sinks=True)],
             problem_class=ProblemClass(128, True, window=True))


@pytest.mark.parametrize("shape,first", [
    ("1x64/8x2048:d64:sinks", ["preset:d64-wgskip", "preset:d64+static128+sumpv+lazy"]),
    ("1x64/8x2048:d64:w128:sinks", ["preset:d64-window-shared", "preset:d64-window-packed"]),
])
def test_a_workloads_buckets_lead_with_their_own_problems_seeds(tmp_path: Path, shape: str,
                                                               first: list[str]) -> None:
    """gpt-oss-20b's library has the window class, but its full-attention bucket measures the
    full seeds first: led by the window presets, a 75 s bucket at 32k tokens measured one
    trial, the packed window kernel, at 0.77x FA3 (docs/PERF.md step 80)."""
    from tuner.problem import ProblemClass
    from tuner.search.space import load_space

    problems = [Problem.parse(shape)]
    s = search.Search(
        study="b", space=load_space("d64").for_class(problems[0].problem_class),
        shapes=problems, storage=url_for(tmp_path, "b"), n_trials=1, seed=0, jobs=2,
        builder=FakeBuilder(tmp_path / "art"), worker_entry=WORKER,
        results_root=tmp_path / "results",
        problem_class=ProblemClass(64, True, window=True, sinks=True))
    assert s.pclass.window  # built as the library builds it
    s.prepare()
    sources = [t.user_attrs.get("source") for t in trials_of(tmp_path, "b")]
    assert sources[:len(first)] == first


def test_first_near_best_times_the_first_confirmed_within_1pct() -> None:
    from datetime import datetime, timedelta, timezone

    from tuner.search.trials import first_near_best

    t0 = datetime(2026, 12, 5, 19, 0, 0, tzinfo=timezone.utc)

    def t(n: int, s: float, conf: float | None) -> SimpleNamespace:
        attrs = {"confirmed": {"geomean_tflops": conf}} if conf else {}
        return SimpleNamespace(number=n, datetime_complete=t0 + timedelta(seconds=s),
                               user_attrs=attrs)

    ts = [t(0, -5.0, 700.0), t(1, 20.0, 600.0), t(2, 82.0, 678.0), t(3, 90.0, None),
          t(4, 346.0, 683.4)]
    assert first_near_best(ts, t0, 683.4) == (2, 82.0)  # trial 0 came before this run
    assert first_near_best(ts, t0, 683.4, within=0.001) == (4, 346.0)
    assert first_near_best(ts, t0, 800.0) is None
