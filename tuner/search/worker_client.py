"""The GPU worker from the parent's side: start it, send measure requests, watchdog, restart.

The worker itself (the subprocess, and the request/reply protocol it speaks) is
tuner/search/gpu_worker.py. A worker that dies, hangs past its watchdog deadline or reports a CUDA
fault raises ``WorkerFailure`` here (the search fails that one trial with the reason) and is
replaced on the next request.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from tuner.errors import SearchError
from tuner.measure.timing import Protocol
from tuner.problem import Problem
from tuner.search.gpu_worker import DEFAULT_ENTRY

# Watchdog: a request may take BASE + launches x (time at WATCHDOG_MIN_TFLOPS) + per round the
# protocol's temperature wait and settle phase. BASE covers loading a kernel and the reference
# of a new shape (well under 5 s on the H200). It was 120 s until a hung candidate held the GPU
# idle for 36% of a 7-minute search (docs/PERF.md, 2026-11-29).
WATCHDOG_BASE_S = 30.0
WATCHDOG_MIN_TFLOPS = 20.0
# The worker's start may wait for the oracle's nvcc build (FA_TUNE_NVCC_TIMEOUT) on a new host.
WORKER_START_TIMEOUT_S = float(os.environ.get("FA_TUNE_NVCC_TIMEOUT", "1800")) + 120.0
# Recycle the worker after this many distinct kernels (each loaded .so stays mapped).
WORKER_MAX_KERNELS = 64


class WorkerFailure(Exception):
    """The worker died, hung, or reported a CUDA fault: the trial fails with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def watchdog_s(shape: Problem, protocol: Protocol, gate: bool) -> float:
    """How long one measure request may take before the worker counts as hung."""
    launches = (protocol.warmup + protocol.repeat) * protocol.rounds + (4 if gate else 0)
    per_launch = shape.flops / (WATCHDOG_MIN_TFLOPS * 1e12)
    per_round = float(protocol.temp_wait_s) + float(protocol.settle_s)
    return WATCHDOG_BASE_S + launches * per_launch + protocol.rounds * per_round


class GpuWorker:
    """One worker subprocess (spawned); ``measure`` with a watchdog; restarted on failure.

    ``background``, when set, is called while a request is in flight and nothing has arrived
    yet; it does one short piece of the parent's own work (the search asks its next trial) and
    returns whether it did any. The parent's CPU work then overlaps the GPU's instead of
    holding it idle between requests.
    """

    def __init__(self, entry: str = DEFAULT_ENTRY, device_index: int = 0,
                 tick: Callable[[], None] | None = None,
                 background: Callable[[], bool] | None = None) -> None:
        self.entry = entry
        self.device_index = device_index
        self.tick = tick or (lambda: None)
        self.background = background
        self.proc: Any = None
        self.conn: Any = None
        self.gpu: dict[str, Any] = {}
        self.kernels: set[str] = set()
        self.restarts = 0  # fresh workers after one died, hung or faulted
        self.recycles = 0  # planned: fresh workers after WORKER_MAX_KERNELS libraries
        self.busy_s = 0.0  # the worker's own time on requests (its "worker_s"), else wall time
        self.wall_s = 0.0  # wall time of requests as the parent saw them

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def start(self) -> None:
        from tuner.search.gpu_worker import bootstrap

        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=bootstrap,
                           args=(self.entry, child, self.device_index, os.getpid()),
                           name="fa-tune-gpu-worker", daemon=True)
        proc.start()
        child.close()  # so a dead worker reads as EOF here
        self.proc, self.conn, self.kernels = proc, parent, set()
        try:
            reply = self._wait(WORKER_START_TIMEOUT_S, "starting")
        except WorkerFailure as e:
            self.kill()
            raise SearchError(f"the GPU worker did not start: {e.reason}") from None
        if reply.get("status") != "ready":
            self.kill()
            raise SearchError(f"the GPU worker did not start: {reply.get('reason', reply)}")
        self.gpu = dict(reply.get("gpu") or {})

    def measure(self, so_path: str, shape: Problem, protocol: Protocol, *, gate: bool,
                seed: int, default_so: str | None = None) -> dict[str, Any]:
        """Gate (optionally) and time one kernel on one problem; the worker's reply. With
        ``default_so`` the gate also records the error against that library's (the default
        config's; the worker gates it once per problem)."""
        msg: dict[str, Any] = {"op": "measure", "so_path": so_path, "shape": shape.to_dict(),
                               "gate": gate, "seed": seed, "protocol": protocol.to_dict()}
        timeout = watchdog_s(shape, protocol, gate)
        if gate and default_so:
            msg["default_so"] = default_so
            timeout += 4 * shape.flops / (WATCHDOG_MIN_TFLOPS * 1e12)  # its gate's launches
        what = f"{'gating and ' if gate else ''}timing {shape}"
        return self.request(msg, timeout, what)

    def request(self, msg: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
        recycle = (msg.get("so_path") not in self.kernels
                   and len(self.kernels) >= WORKER_MAX_KERNELS and self.alive)
        if recycle:
            self.stop()  # every loaded .so stays mapped in the worker
        if not self.alive:
            if self.proc is not None:
                self._reap()
            self.start()
            if recycle:
                self.recycles += 1
            else:
                self.restarts += 1
        t0 = time.monotonic()
        try:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):
                code = self._reap()
                raise WorkerFailure(f"the GPU worker died ({_exit_text(code)})") from None
            reply = self._wait(timeout_s, what)
        except BaseException:
            self.busy_s += time.monotonic() - t0  # hung or dead: the GPU was held all along
            self.wall_s += time.monotonic() - t0
            raise
        wall = time.monotonic() - t0
        self.wall_s += wall
        own = reply.get("worker_s") if isinstance(reply, dict) else None
        self.busy_s += min(float(own), wall) if isinstance(own, (int, float)) else wall
        self.kernels.add(str(msg.get("so_path")))
        status = reply.get("status")
        if status == "cuda_error":
            self._reap()  # it exits after a CUDA fault; a fresh one comes on the next request
            raise WorkerFailure(str(reply.get("reason", "CUDA error")))
        return reply

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.conn.send({"op": "stop"})
        except (OSError, ValueError):
            pass
        self.proc.join(5)
        self.kill()

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
        self._drop()

    # -- internals
    def _wait(self, timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 and not self._has_reply():
                # (A reply that came while the parent was busy, e.g. in an ask that waited out
                # a storage outage, is not a hang.)
                self.kill()
                raise WorkerFailure(f"watchdog: the GPU worker did not answer within "
                                    f"{timeout_s:.0f} s while {what} (hung kernel?); killed")
            try:
                ready = self.conn.poll(0)
                if not ready and not (self.background is not None and self.background()):
                    ready = self.conn.poll(min(0.25, left))
            except (OSError, EOFError):
                ready = True
            if ready:
                try:
                    return self.conn.recv()
                except (EOFError, OSError):
                    code = self._reap()
                    raise WorkerFailure(
                        f"the GPU worker died while {what} ({_exit_text(code)})"
                    ) from None
            self.tick()

    def _has_reply(self) -> bool:
        try:
            return bool(self.conn.poll(0))
        except (OSError, EOFError):
            return True  # dead: the recv below says so

    def _reap(self) -> int | None:
        if self.proc is None:
            return None
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        code = self.proc.exitcode
        self._drop()
        return code

    def _drop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
        self.proc, self.conn = None, None


def _exit_text(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
