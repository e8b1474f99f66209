"""Scale-out (issue 16): many workers on one study, on a real PostgreSQL server and on SQLite.

Each worker is a real search process (tests/fixtures/run_fake_worker.py) whose GPU side is the
test fixture tests/fixtures/fake_gpu_worker.py and whose builder is tests/fixtures/
fake_builder.py; storage, heartbeat, dedupe, the heterogeneity guard and the fleet are the
product's. The PostgreSQL server (tests/pg_server.py) runs on 127.0.0.1 in a temporary folder;
those tests are skipped, saying why, only where its binaries (or psycopg2) are absent.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pg_server
import pytest
from cli_helpers import one_error_line
from optuna.trial import TrialState
from study_poll import study_exists
from typer.testing import CliRunner

from tuner.cli import app
from tuner.errors import SearchError
from tuner.kernel.config import KernelConfig
from tuner.problem import Problem
from tuner.search import fleet, rdb
from tuner.search import loop as search
from tuner.search.space import space_from_dict
from tuner.search.study import driver_url

FIX = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIX))
from fake_builder import FakeBuilder  # noqa: E402

WORKER_SCRIPT = FIX / "run_fake_worker.py"
GPU_ENTRY = f"{FIX / 'fake_gpu_worker.py'}:main"
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
SCREEN = "repeat=30 rounds=1"  # how a screen request shows in the fake GPU worker's log
_NO_PG = pg_server.missing()
needs_pg = pytest.mark.skipif(_NO_PG is not None, reason=f"no PostgreSQL here: {_NO_PG}")


@pytest.fixture(scope="module")
def pg() -> pg_server.PgServer:
    server = pg_server.PgServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def pg_url(pg: pg_server.PgServer) -> str:
    """A fresh database on the module's server (a plain postgresql:// URL, as users write)."""
    return pg.create_database(f"t{uuid.uuid4().hex[:12]}")


def start_worker(url: str, study: str, art: Path, *args: str, session: bool = False,
                 **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER_SCRIPT), url, study, str(art), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**ENV, **env},
        start_new_session=session)


def finish(p: subprocess.Popen, timeout: float = 90) -> tuple[str, str]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"exit {p.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    return out, err


def trials(url: str, study: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials through plain Optuna, as optuna-dashboard reads them (the URL names
    the installed driver); the connection is closed again (tests poll: no pile of them)."""
    storage = optuna.storages.RDBStorage(driver_url(url))
    try:
        return optuna.load_study(study_name=study, storage=storage).get_trials()
    finally:
        storage.engine.dispose()


def wait_for(what: str, cond, timeout: float = 60.0, every: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def create_study(url: str, study: str, tmp: Path) -> None:
    """`fa-tune search --create-only`: the study's problems, space and known-good points."""
    space = tmp / "space.yaml"
    space.write_text("block_n: [64, 96, 112, 128]\nk_stages: [2, 3]\nv_stages: [2, 3]\n")
    r = CliRunner().invoke(app, ["search", "--study", study, "--storage", url, "--create-only",
                                 "--shape", "1x2x256", "--shape", "1x2x512",
                                 "--space", str(space)])
    assert r.exit_code == 0, r.output
    assert f"fa-tune worker --study {study}" in r.output


def assert_each_built_once(builds: list[str], workers: int, configs: int = 16) -> None:
    """Every config of the space built, each once over all workers; the default config also
    once more per worker at most: each asks for it as the yardstick of err_vs_default (a cache
    hit of the content-addressed cache in a real build; this fixture logs every request)."""
    counts = collections.Counter(builds)
    default = KernelConfig().config_id()
    assert len(counts) == configs, counts.most_common(3)
    assert all(n == 1 for cid, n in counts.items() if cid != default), counts.most_common(3)
    assert counts[default] <= 1 + workers, counts[default]


# ---- PostgreSQL ------------------------------------------------------------------------------
@needs_pg
def test_concurrent_workers_share_one_postgres_study(pg_url: str, tmp_path: Path) -> None:
    create_study(pg_url, "big", tmp_path)
    ts = trials(pg_url, "big")
    assert {t.state for t in ts} == {TrialState.WAITING}  # the known-good points, enqueued once
    art = tmp_path / "art"
    procs = [start_worker(pg_url, "big", art, "--join", "--timeout", "40", "--seed", str(i),
                          "--delay", "0.05") for i in range(3)]
    outs = [finish(p) for p in procs]
    ts = trials(pg_url, "big")
    assert not [t for t in ts if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # Every valid config of the space was measured, each compiled and screened once over all.
    assert_each_built_once((art / "builds.log").read_text().split(), workers=len(procs))
    screens = collections.Counter(ln.split()[0] for ln in (art / "gpu.log").read_text()
                                  .splitlines() if SCREEN in ln)
    assert set(screens.values()) == {1} and len(screens) == 16
    owners = {t.user_attrs["owner"] for t in ts if "build" in t.user_attrs}
    assert len(owners) >= 2, owners  # the work was shared
    assert all("space exhausted" in out for out, _ in outs)
    measured = [t for t in ts if "build" in t.user_attrs and "duplicate_of" not in t.user_attrs]
    for t in measured:
        g = t.user_attrs["gpu"]
        assert g["name"] == "fake GPU (test fixture)" and g["sm_count"] == 132
        assert g["driver_version"] and g["host"] and "nvcc_version" in g
    # A plain Optuna study: what optuna-dashboard reads.
    st = optuna.load_study(study_name="big", storage=driver_url(pg_url))
    assert st.best_trial.value == max(t.value for t in ts if t.value is not None)
    assert [s.study_name for s in optuna.get_all_study_summaries(driver_url(pg_url))] == ["big"]
    assert len([k for k in st.user_attrs if k.startswith("session ")]) == 3
    # And fa-tune show reads it from the server.
    r = CliRunner().invoke(app, ["show", "trials", "--study", "big", "--storage", pg_url],
                           env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output


@needs_pg
def test_worker_killed_mid_trial_is_failed_by_heartbeat_and_remeasured(
        pg_url: str, tmp_path: Path) -> None:
    plan = tmp_path / "hang.json"
    plan.write_text('{"block_n=96": "hang"}')  # worker A sits in a hung kernel on block_n 96
    a = start_worker(pg_url, "hb", tmp_path / "art", "--timeout", "60", "--plan", str(plan),
                     "--heartbeat", "1", "--grace", "2", session=True)
    b: subprocess.Popen | None = None
    try:
        hung = wait_for("worker A to reach block_n 96 on its GPU", lambda: [
            t for t in trials(pg_url, "hb") if t.state == TrialState.RUNNING
            and t.params.get("block_n") == 96 and "build" in t.user_attrs] if _exists(
                pg_url, "hb") else None)[0]
        b = start_worker(pg_url, "hb", tmp_path / "art", "--join", "--timeout", "60",
                         "--heartbeat", "1", "--grace", "2", "--delay", "0.1")
        # B is up: its recover() ran while A was alive, so A's trials are left to the
        # heartbeat (a dead owner on this host would be settled by recover() at once).
        wait_for("worker B's first trial", lambda: [
            t for t in trials(pg_url, "hb") if t.user_attrs.get("owner", "").endswith(
                f":{b.pid}")])
        os.killpg(a.pid, signal.SIGKILL)  # A and its GPU worker: as if its host were lost
        a.wait(10)

        def remeasured() -> list:
            ts = trials(pg_url, "hb")
            return [t for t in ts if t.user_attrs.get("retry_of") == hung.number
                    and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]

        [retry] = wait_for("the heartbeat to fail trial and B to measure it again", remeasured,
                           timeout=45)
    except BaseException:
        if b is not None and b.poll() is None:
            b.kill()
        raise
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
    signalled = b.poll() is None
    if signalled:
        b.send_signal(signal.SIGTERM)  # B settles its own trials and stops (or it is done)
    out, err = b.communicate(timeout=60)
    # B may have finished the space and printed its summary just before the signal landed: the
    # search had restored the default SIGTERM action, so the exit is -15 with nothing left open.
    done_first = signalled and b.returncode == -signal.SIGTERM and "SUMMARY no valid config" in out
    assert b.returncode == 0 or done_first, f"exit {b.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    assert "SUMMARY interrupted (SIGTERM)" in out or "SUMMARY no valid config" in out, out
    ts = {t.number: t for t in trials(pg_url, "hb")}
    lost = ts[hung.number]
    assert lost.state == TrialState.FAIL and rdb.stale_failed(lost)  # told by no worker
    assert retry.user_attrs["config_id"] == lost.user_attrs["config_id"]
    assert retry.params == lost.params
    assert retry.user_attrs["owner"] != lost.user_attrs["owner"]
    assert retry.user_attrs["retry_reason"].startswith("no heartbeat from")
    assert retry.system_attrs["failed_trial"] == hung.number  # Optuna's own retry record
    assert "shapes" in retry.user_attrs or "prune_reason" in retry.user_attrs
    assert not [t for t in ts.values() if t.state == TrialState.RUNNING]


def _exists(url: str, study: str) -> bool:
    return study_exists(url, study)  # read-only: never races the worker creating it


@needs_pg
def test_a_worker_on_another_gpu_model_refuses_to_join(pg_url: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    finish(start_worker(pg_url, "het", tmp_path / "art", "--trials", "1"))
    before = trials(pg_url, "het")
    st = optuna.load_study(study_name="het", storage=driver_url(pg_url))
    assert st.user_attrs["gpu_model"] == {"name": "fake GPU (test fixture)", "sm_count": 132}

    monkeypatch.setenv("FAKE_GPU_WORKER_NAME", "fake H100 (test fixture)")
    r = CliRunner().invoke(app, ["worker", "--study", "het", "--storage", pg_url,
                                 "--worker", GPU_ENTRY, "--trials", "1"])
    assert r.exit_code == 2, r.output
    line = one_error_line(r.output)
    assert "fake H100 (test fixture)" in line and "fake GPU (test fixture)" in line
    assert "--allow-mixed-gpus" in line
    assert not [ln for ln in r.output.splitlines() if ln.strip() and ln != line]  # alone
    assert len(trials(pg_url, "het")) == len(before)  # nothing asked

    # Same name, another SM count (a cut-down part): another model too.
    monkeypatch.setenv("FAKE_GPU_WORKER_NAME", "fake GPU (test fixture)")
    monkeypatch.setenv("FAKE_GPU_WORKER_SMS", "114")
    r = CliRunner().invoke(app, ["worker", "--study", "het", "--storage", pg_url,
                                 "--worker", GPU_ENTRY, "--trials", "1"])
    assert r.exit_code == 2 and "114 SMs" in r.output, r.output

    # Told to, it joins; its trials say which GPU measured them.
    finish(start_worker(pg_url, "het", tmp_path / "art", "--join", "--trials", "2",
                        "--allow-mixed", FAKE_GPU_WORKER_NAME="fake H100 (test fixture)"))
    new = [t for t in trials(pg_url, "het") if t.number >= len(before) and "gpu" in t.user_attrs]
    assert new and all(t.user_attrs["gpu"]["name"] == "fake H100 (test fixture)" for t in new)
    st = optuna.load_study(study_name="het", storage=driver_url(pg_url))
    assert st.user_attrs["gpu_model"]["name"] == "fake GPU (test fixture)"  # the study's own


@needs_pg
def test_a_dead_postgres_connection_is_retried_and_nothing_is_lost(tmp_path: Path) -> None:
    server = pg_server.PgServer().start()  # its own: this test restarts it
    url = server.url
    err_file = tmp_path / "worker.err"  # read while it runs: the outage lasts until it notices
    with err_file.open("w") as err_out:
        p = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT), url, "down", str(tmp_path / "art"), "--timeout",
             "60", "--delay", "0.2", "--heartbeat", "1", "--grace", "20"],
            stdout=subprocess.PIPE, stderr=err_out, text=True, env=ENV)
    try:
        def finished() -> list:
            if not _exists(url, "down"):
                return []
            done = [t for t in trials(url, "down") if t.state.is_finished()]
            return done if len(done) >= 2 else []

        before = wait_for("two finished trials", finished)
        server.stop("fast")  # every client connection is cut
        # Down until the worker has met the dead connection (a fixed sleep raced a busy host).
        wait_for("the worker to report the outage",
                 lambda: "unreachable" in err_file.read_text(), timeout=60)
        time.sleep(1)
        server.start()
        out, _ = p.communicate(timeout=90)
        err = err_file.read_text()
        assert p.returncode == 0, f"exit {p.returncode}\n{out[-2000:]}\n{err[-3000:]}"
        assert "Traceback" not in err, err[-3000:]
        after = {t.number: t for t in trials(url, "down")}
    finally:
        if p.poll() is None:
            p.kill()
        server.cleanup()
    assert "unreachable" in err and "retrying every" in err, err[-2000:]
    assert "answers again after" in err
    assert "SUMMARY no valid config" in out  # it went on to the end of the space
    for t in before:  # every trial told before the outage is there, as it was
        assert after[t.number].state == t.state and after[t.number].value == t.value
    assert not [t for t in after.values() if t.state == TrialState.RUNNING]
    assert len([t for t in after.values() if t.state.is_finished()]) > len(before)


# ---- one host, several GPUs: the fleet -----------------------------------------------------
def test_fleet_shares_one_sqlite_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fa-tune search --gpus 0,1` on the default storage (SQLite, several writer processes)."""
    monkeypatch.setenv("FA_TUNE_STUDIES", str(tmp_path / "studies"))
    # Busy enough that each GPU gets work before the other has measured the whole space.
    monkeypatch.setenv("FAKE_GPU_WORKER_DELAY_S", "0.15")
    monkeypatch.setenv("FAKE_GPU_WORKER_LOG", str(tmp_path / "gpu.log"))
    space = {"block_n": [64, 96, 112, 128], "k_stages": [2, 3], "v_stages": [2, 3]}
    seen: list[fleet.FleetProgress] = []
    f = fleet.Fleet([0, 1], dict(
        study="two", space=space_from_dict(space, "test-space"),
        shapes=[Problem(1, 2, 256), Problem(1, 2, 512)], n_trials=40, timeout_s=40.0,
        sampler="random", seed=3, jobs=4, results_root=tmp_path / "res",
        builder=FakeBuilder(tmp_path / "art", log=tmp_path / "builds.log"),
        worker_entry=GPU_ENTRY, heartbeat_s=1, grace_s=15), progress_cb=seen.append)
    assert f.jobs == [2, 2] and f.trials == [20, 20]
    assert [f.worker_kwargs(i)["seed"] for i in (0, 1)] == [3, 4]
    summ = f.run()
    assert [w.device for w in summ.workers] == [0, 1]
    assert all(w.error is None and w.summary is not None for w in summ.workers)
    assert {w.summary.device for w in summ.workers} == {0, 1}
    assert all(w.summary.trials_run > 0 for w in summ.workers)  # both GPUs measured
    assert summ.trials_run == sum(w.summary.trials_run for w in summ.workers)
    assert_each_built_once((tmp_path / "builds.log").read_text().split(), workers=2)
    st = optuna.load_study(study_name="two",
                           storage=f"sqlite:///{tmp_path / 'studies' / 'two.db'}")
    ts = st.get_trials()
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    assert {t.user_attrs["gpu"]["device"] for t in ts if "gpu" in t.user_attrs} == {0, 1}
    assert summ.best is not None and summ.best["trial"] == st.best_trial.number
    assert seen and {d for p in seen for d, w in p.workers.items() if w.progress} == {0, 1}


def test_two_workers_that_take_the_same_config_at_once_measure_it_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the sampler's filter cannot see: both store the config, then each looks; the
    one that sees the other waits for its verdict, and when both see each other the lower
    trial number measures."""
    monkeypatch.setenv("FA_TUNE_STUDIES", str(tmp_path / "studies"))
    kw = dict(study="race", space=space_from_dict({"block_n": [128]}, "test-space"),
              shapes=[Problem(1, 2, 256)], n_trials=1, builder=FakeBuilder(tmp_path / "art"),
              worker_entry=GPU_ENTRY, results_root=tmp_path / "res")
    a, b = search.Search(**kw), search.Search(**kw)
    ta, tb = a.study.ask(), b.study.ask()
    for s, t in ((a, ta), (b, tb)):
        s.open[t.number] = t
        t.set_user_attr("config_id", "same")
    assert a._elsewhere(ta.number, "same") == (None, tb.number)
    assert b._elsewhere(tb.number, "same") == (None, ta.number)
    for s, t, other in ((a, ta, tb), (b, tb, ta)):
        t.set_user_attr("waits_for", other.number)
        s.waiting[t.number] = (t, search.KernelConfig(), other.number)
    promoted: list[int] = []
    for s in (a, b):
        s._promote = lambda trial, cfg, _p=promoted: _p.append(trial.number)  # type: ignore
        s._sync()
    assert promoted == [min(ta.number, tb.number)]
    assert b.waiting or a.waiting  # the other one still waits for that verdict


def _pop_waiting(url: str) -> list[int]:
    """A worker process's share of the study's enqueued trials (ask pops one at a time)."""
    from tuner.search.study import open_storage

    st = optuna.load_study(study_name="pop", storage=open_storage(url))
    got = []
    while st.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        t = st.ask()
        if t.number >= 40:  # none left: a fresh trial
            st.tell(t, state=TrialState.FAIL)
            break
        got.append(t.number)
    return got


def test_sqlite_study_pops_each_enqueued_trial_once(tmp_path: Path) -> None:
    """Optuna pops a WAITING trial by reading its state, then setting RUNNING; on SQLite with
    pysqlite's deferred BEGIN, processes popped the same one (12 of 60, six processes). The
    storage fa-tune opens begins every transaction IMMEDIATE."""
    import multiprocessing as mp

    from tuner.search.study import open_storage

    url = f"sqlite:///{tmp_path / 'pop.db'}"
    st = optuna.create_study(study_name="pop", storage=open_storage(url))
    for i in range(40):
        st.enqueue_trial({"x": i})
    with mp.get_context("spawn").Pool(4) as pool:
        got = [n for share in pool.map(_pop_waiting, [url] * 4) for n in share]
    assert sorted(got) == list(range(40))


# ---- options and the pieces they use -----------------------------------------------------
def test_parse_gpus_and_core_shares() -> None:
    assert fleet.parse_gpus("0,1") == [0, 1]
    assert fleet.parse_gpus(" 3 , 1 ") == [3, 1]
    assert fleet.parse_gpus("all", visible=lambda: [0, 1, 2]) == [0, 1, 2]
    for bad in ("0,0", "x", "", "0,-1", "1.5"):
        with pytest.raises(SearchError):
            fleet.parse_gpus(bad)
    assert fleet.share(16, 2) == [8, 8]
    assert fleet.share(5, 2) == [3, 2]
    assert fleet.share(1, 3) == [1, 1, 1]  # every worker compiles, on an oversubscribed host


def test_cli_refuses_device_with_gpus_and_unknown_study(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA_TUNE_STUDIES", str(tmp_path))
    runner = CliRunner()
    r = runner.invoke(app, ["search", "--trials", "1", "--device", "1", "--gpus", "0,1"])
    assert r.exit_code == 2 and "give --device or --gpus, not both" in r.output
    r = runner.invoke(app, ["search", "--trials", "1", "--gpus", "0,0"])
    assert r.exit_code == 2 and "listed twice" in r.output
    r = runner.invoke(app, ["worker", "--study", "nope", "--trials", "1"])
    assert r.exit_code == 2 and "unknown study 'nope'" in r.output


def test_storage_errors_are_classified() -> None:
    from sqlalchemy import exc as sa

    dead = sa.OperationalError("SELECT 1", {}, Exception("server closed the connection\nmore"))
    assert rdb.connection_lost(dead) == "server closed the connection"
    wrapped = optuna.exceptions.StorageInternalError("commit failed")
    wrapped.__cause__ = dead
    assert rdb.connection_lost(wrapped) == "server closed the connection"
    assert rdb.connection_lost(ValueError("bad value")) is None
    assert driver_url("postgresql://u:p@h/db").startswith("postgresql+psycopg")
    assert driver_url("sqlite:///x.db") == "sqlite:///x.db"
