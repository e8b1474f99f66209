"""Stopping a search (SIGTERM, Ctrl-C): the stop is recorded by the signal handler and taken
where the search polls for it, so it never lands inside a storage call."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState
from study_poll import trials_if_created
from test_search import make, plan, trials_of  # noqa: F401 - plan is a fixture

from tuner.search import session


def test_a_stop_that_lands_inside_a_storage_call_leaves_no_trial_running(
        tmp_path: Path, plan, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """SIGTERM between Optuna's committing a new trial and the search's holding it: a handler
    that raised there left a RUNNING trial no worker owned (CI, 2026-12-06). The stop is only
    recorded; the search finishes the ask, settles and stops."""
    from tuner.search import rdb

    made = {"n": 0}
    real = rdb.ResilientRDBStorage._create_new_trial

    def create_then_signal(self, *args, **kwargs):
        out = real(self, *args, **kwargs)  # committed: the trial is RUNNING in the study
        made["n"] += 1
        if made["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside the ask
        return out

    monkeypatch.setattr(rdb.ResilientRDBStorage, "_create_new_trial", create_then_signal)
    before = signal.getsignal(signal.SIGTERM)
    s = make(tmp_path, {"block_n": [64, 96, 112, 128], "k_stages": [2, 3]}, trials=20)
    summ = s.run()
    assert summ.stopped_by == "interrupted (SIGTERM)"
    assert signal.getsignal(signal.SIGTERM) is before  # the search's handler is gone again
    ts = trials_of(tmp_path)
    assert len(ts) >= 3
    assert not [t for t in ts if t.state == TrialState.RUNNING], [
        (t.number, t.user_attrs) for t in ts if t.state == TrialState.RUNNING]


def test_stop_signals_record_once_and_raise_when_asked_twice() -> None:
    notes: list[str] = []
    stops = session.StopSignals(notes.append)
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a fleet's worker
    try:
        stops.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # left to the fleet's parent
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops.why == "interrupted (SIGTERM)" and len(notes) == 1
        with pytest.raises(session._Stop, match="SIGTERM"):
            stops.check()
        with pytest.raises(session._Stop):
            os.kill(os.getpid(), signal.SIGTERM)  # twice: at once
            time.sleep(1)
    finally:
        stops.restore()
        signal.signal(signal.SIGINT, old_int)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_stop_sent_to_the_whole_process_group_is_no_verdict(tmp_path: Path, plan) -> None:  # noqa: F811
    """systemd and Slurm send SIGTERM to every process of the group: the GPU worker ignores it
    (its parent decides), so the trial it measures fails as "interrupted", not as a config
    that killed its worker."""
    import subprocess
    import sys

    import optuna

    fix = Path(__file__).resolve().parent / "fixtures"
    plan({"block_n=96": "hang"})
    url = f"sqlite:///{tmp_path / 'g.db'}"
    p = subprocess.Popen([sys.executable, str(fix / "run_fake_worker.py"), url, "g",
                          str(tmp_path / "art"), "--timeout", "60", "--seed", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(fix.parents[1])})
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            ts = trials_if_created(url, "g")
            if [t for t in ts if t.state == TrialState.RUNNING
                    and t.params.get("block_n") == 96 and "build" in t.user_attrs]:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the search never reached the hanging config")
        time.sleep(0.5)  # inside the measurement
        os.killpg(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert "SUMMARY interrupted (SIGTERM)" in out, out[-1000:] + err[-2000:]
    ts = optuna.load_study(study_name="g", storage=url).get_trials()
    failed = [t for t in ts if t.state == TrialState.FAIL]
    assert [t.user_attrs.get("fail_reason") for t in failed] == ["interrupted"]
    assert not [t for t in ts if t.state == TrialState.RUNNING]


def test_a_closed_terminal_is_a_stop_too() -> None:
    stops = session.StopSignals(lambda _text: None)
    # As from a terminal, whatever started the tests (under nohup SIGHUP arrives ignored).
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        stops.install()
        os.kill(os.getpid(), signal.SIGHUP)
        assert stops.why == "interrupted (SIGHUP)"
        stops.settling = True
        os.kill(os.getpid(), signal.SIGHUP)  # while settling: noted, not raised
        stops.restore()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        # Started under nohup: a closed terminal stays ignored, as nohup asked.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        stops = session.StopSignals(lambda _text: None)
        stops.install()
        os.kill(os.getpid(), signal.SIGHUP)
        assert stops.why is None
    finally:
        stops.restore()
        signal.signal(signal.SIGHUP, before)


def test_compiles_still_running_at_a_stop_are_killed_not_waited_for(
        tmp_path: Path, plan) -> None:  # noqa: F811
    """SIGTERM while a compile runs: the search kills that compile's whole tree
    (tuner.child_process.kill_running) instead of leaving it to the process's exit, which
    waits for the compile pool's threads. A killed compile is no verdict: its trial waits."""
    import sys
    import threading

    from tuner import child_process
    from tuner.errors import BuildError
    from tuner.kernel.build import KILLED

    sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
    from fake_builder import FakeBuilder

    pid_file = tmp_path / "grandchild.pid"

    class SlowFor112(FakeBuilder):
        def __call__(self, cfg):  # type: ignore[no-untyped-def]
            if cfg.block_n == 112:  # a "compile" as nvcc runs one: a tree of processes
                r = child_process.run(
                    ["bash", "-c", f"sleep 120 & echo $! > {pid_file}; wait"])
                if r.returncode < 0:
                    raise BuildError(f"nvcc for test was {KILLED} signal {-r.returncode}")
            return super().__call__(cfg)

    def stop_once_it_compiles() -> None:
        deadline = time.time() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()) \
                and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGTERM)

    s = make(tmp_path, {"block_n": [112, 128]}, trials=20, sampler="random",
             builder=SlowFor112(tmp_path / "art"))
    threading.Thread(target=stop_once_it_compiles, daemon=True).start()
    t0 = time.monotonic()
    summ = s.run()
    assert time.monotonic() - t0 < 60
    assert summ.stopped_by == "interrupted (SIGTERM)", summ.stopped_by
    pid = int(pid_file.read_text())
    deadline = time.time() + 5
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the compile's grandchild outlived the search"
    assert not child_process._RUNNING
    slow = [t for t in trials_of(tmp_path) if t.params.get("block_n") == 112]
    assert slow and all(t.state == TrialState.WAITING for t in slow), [
        (t.state, t.user_attrs) for t in slow]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]  # a zombie is dead
