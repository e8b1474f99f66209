"""Running an external tool whose own children must not outlive it.

nvcc runs cicc, ptxas and gcc under a shell, ncu runs the profiled Python process, an export's
build.sh runs nvcc: ``subprocess.run`` kills only the process it started, on a timeout or when
the caller is interrupted (Ctrl-C, SIGTERM unwinding), and the grandchildren go on, orphaned: a
hung cicc keeps its core, a profiled process keeps the GPU. ``run`` kills the whole tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from typing import Any


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``, parents before their children (empty without /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            out.append(child)
            todo.append(child)
    return out


def kill_pid_tree(pid: int) -> None:
    """SIGKILL process ``pid`` and everything below it. It is stopped first, so that it
    starts no new child between the listing and the kill."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return
    for child in reversed(_descendants(pid)):
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """``kill_pid_tree`` for a process we started, unless it has ended (and been reaped)."""
    if proc.poll() is None:
        kill_pid_tree(proc.pid)


# The tools running now, from any thread (the search compiles on a pool of them).
_RUNNING: set[subprocess.Popen[str]] = set()
_LOCK = threading.Lock()


def kill_running() -> int:
    """Kill every tool ``run`` is waiting for, in any thread (their ``run`` returns with the
    signal's negative status); returns how many. A search that stops calls it: the compiles
    it no longer needs would otherwise hold the process's exit until they finish."""
    with _LOCK:
        procs = list(_RUNNING)
    for proc in procs:
        kill_tree(proc)
    return len(procs)


def run(cmd: Sequence[str], *, timeout: float | None = None,
        **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=...)``, except that a
    timeout or an exception in the caller kills the tool's whole tree before it propagates."""
    with subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kwargs) as proc:
        with _LOCK:
            _RUNNING.add(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # a process that left the tree holds the pipes
                out, err = "", ""
            raise subprocess.TimeoutExpired(proc.args, timeout or 0.0, out, err) from None
        except BaseException:
            kill_tree(proc)
            raise
        finally:
            with _LOCK:
                _RUNNING.discard(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
