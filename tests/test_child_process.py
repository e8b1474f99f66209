"""tuner.child_process.run: a tool's own children go with it on a timeout or an interruption
(real processes: bash starting a grandchild that would outlive it)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tuner import child_process


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie is dead, waiting for a parent that reaps it


def _tree_cmd(pid_file: Path) -> list[str]:
    # bash -> bash -> sleep: two levels below the process run() starts.
    return ["bash", "-c", f"bash -c 'sleep 300 & echo $! > {pid_file}; wait' & wait"]


def _grandchild(pid_file: Path) -> int:
    deadline = time.time() + 10
    while time.time() < deadline:
        text = pid_file.read_text().strip() if pid_file.exists() else ""
        if text:
            return int(text)
        time.sleep(0.02)
    raise AssertionError("the tree never started")


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.time() + within_s
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_output_and_status_as_subprocess_run(tmp_path: Path) -> None:
    r = child_process.run(["bash", "-c", "echo out; echo err >&2; exit 3"], cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")


def test_a_timeout_kills_the_grandchildren(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        child_process.run(_tree_cmd(pid_file), timeout=1.0)
    assert _gone(_grandchild(pid_file))


def test_an_interrupted_caller_kills_the_grandchildren(tmp_path: Path) -> None:
    """Ctrl-C or SIGTERM unwinding the caller (here an alarm raising in the main thread)."""
    class Stop(Exception):
        pass

    def raise_stop(signum: int, frame: object) -> None:
        raise Stop()

    pid_file = tmp_path / "pid"
    old = signal.signal(signal.SIGALRM, raise_stop)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(Stop):
            child_process.run(_tree_cmd(pid_file))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert _gone(_grandchild(pid_file))


def test_plain_subprocess_run_would_leave_them(tmp_path: Path) -> None:
    """The reason for the module: subprocess.run kills only its own child."""
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(_tree_cmd(pid_file), capture_output=True, timeout=1.0)
    pid = _grandchild(pid_file)
    try:
        assert _alive(pid)
    finally:
        os.kill(pid, signal.SIGKILL)


def test_kill_running_ends_the_tools_other_threads_wait_for(tmp_path: Path) -> None:
    """What a stopping search calls: every tree run() waits on, in any thread, is killed and
    that run() returns the signal's negative status."""
    import threading

    pid_file = tmp_path / "pid"
    got: list[subprocess.CompletedProcess[str]] = []
    t = threading.Thread(target=lambda: got.append(child_process.run(_tree_cmd(pid_file))))
    t.start()
    grandchild = _grandchild(pid_file)
    assert child_process.kill_running() == 1
    t.join(timeout=10)
    assert not t.is_alive()
    assert got[0].returncode == -signal.SIGKILL
    assert _gone(grandchild)
    assert child_process.kill_running() == 0  # none left to kill
