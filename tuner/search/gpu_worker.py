"""The GPU worker: a subprocess that loads candidate ``.so`` files, gates and times them.

The search (tuner/search/loop.py) never touches the GPU itself. It starts this worker with
``multiprocessing`` (spawn), sends it requests over a pipe, and waits with a watchdog. A kernel
that hangs, faults (illegal address, launch failure) or poisons the CUDA context takes only this
process down; the search records why, starts a fresh worker and goes on.

Which function runs in the subprocess is a parameter of the search (``worker_entry``:
``"package.module:function"`` or ``"/path/to/file.py:function"``), so tests can plug in a test
fixture worker. Every worker speaks the same protocol, documented here:

* the parent starts ``function(conn, device_index)``; the worker first sends
  ``{"status": "ready", "gpu": {...}}`` or ``{"status": "init_failed", "reason": str}``
  (the product's ``gpu`` is ``Bench.gpu_info()``; the search reads its ``name``, ``sm_count``
  and ``driver_version``: the study's GPU-model guard and each trial's ``gpu`` record);
* then, per request ``{"op": "measure", "so_path": str, "shape": dict, "gate": bool,
  "seed": int, "protocol": tuner.measure.timing.Protocol.to_dict()}`` it replies
  ``{"status": "ok", "gate": dict | None, "timing": dict}``, or
  ``{"status": "gate_failed", "reason": str, "gate": dict}``, or
  ``{"status": "cuda_error", "reason": str}`` (and exits: the context may be unusable), or
  ``{"status": "error", "reason": str}``; the product's worker adds ``"worker_s"`` to each
  reply, the seconds from receiving the request to replying (the search's GPU-busy time;
  without it the search counts the request's wall time);
* an optional ``"default_so"`` in a gated request names the default config's library: the
  gate then records the candidate's error against its error on the same inputs
  (``err_vs_default``; the worker gates it once per problem and seed, tuner.measure.bench);
* ``{"op": "stop"}`` (or a closed pipe) ends it; so does the parent's death, even while a
  kernel hangs (``bootstrap`` watches the parent: a SIGKILLed search must not leave a process
  holding the GPU).

The request's ``"shape"`` is the problem as ``tuner.problem.Problem.to_dict()``:
``{"B", "H", "Hq", "Hkv", "S", "D", "causal"}`` (``H`` = ``Hq``; plus ``"Sk"`` for queries
over more keys, ``"seqlens"`` / ``"seqlens_k"`` for a packed batch), read back with
``tuner.problem.as_problem`` (which also takes the text form ``"1x32/8x2048:k8192"`` and the
``[B, H, S]`` list of workers before problems; a worker that cannot read it replies
``"error"``). The parent sends only problems the kernel runs (support.check_problem).

With ``gate`` false the seed inputs are generated afresh before timing (the buffers may hold
another candidate's gate inputs or nothing yet).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

DEFAULT_ENTRY = "tuner.search.gpu_worker:main"


def resolve_entry(entry: str) -> Any:
    """``module:function`` or ``/path/file.py:function`` -> the function."""
    mod_name, sep, fn_name = entry.rpartition(":")
    if not sep or not mod_name or not fn_name:
        raise ValueError(f"worker entry must be 'module:function' (got {entry!r})")
    if mod_name.endswith(".py"):
        path = Path(mod_name)
        spec = importlib.util.spec_from_file_location(f"_fa_tune_worker_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot load worker file {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(mod_name)
    return getattr(mod, fn_name)


PARENT_POLL_S = 1.0


def exit_with_parent(parent: int, poll_s: float = PARENT_POLL_S) -> None:
    """Leave at once when the process that started this one is gone (SIGKILL, OOM): the pipe's
    EOF reaches the worker only between requests, and a hung kernel never returns to read it."""
    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="fa-tune-parent-watch", daemon=True).start()


def bootstrap(entry: str, conn: Any, device_index: int, parent: int | None = None) -> None:
    """Subprocess target: ignore Ctrl-C, SIGTERM and SIGHUP (the parent decides: a stop sent to the
    whole process group, as systemd and Slurm send it, must not kill the measurement the parent
    then fails as the config's verdict), leave with the parent, then run the named worker.
    ``parent``: the starting process's pid (default: the parent now). A parent gone mid-request
    ends the worker quietly (its pipe closed: nothing to answer)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal: the same
    exit_with_parent(os.getppid() if parent is None else parent)
    try:
        fn = resolve_entry(entry)
    except Exception as e:  # noqa: BLE001 - report, do not traceback into the terminal
        with contextlib.suppress(OSError, EOFError):
            conn.send({"status": "init_failed", "reason": f"cannot load worker {entry}: {e}"})
        return
    try:
        fn(conn, device_index)
    except (BrokenPipeError, EOFError, ConnectionResetError):
        return


def main(conn: Any, device_index: int) -> None:
    """The product's worker: the one measurement path (tuner.measure.bench) on a real GPU."""
    from tuner.errors import FaTuneError
    from tuner.kernel import runtime
    from tuner.measure.bench import Bench
    from tuner.measure.launch import KernelLaunch
    from tuner.measure.timing import Protocol
    from tuner.problem import as_problem

    try:
        bench = Bench(device_index)
    except FaTuneError as e:
        conn.send({"status": "init_failed", "reason": str(e)})
        return
    conn.send({"status": "ready", "gpu": bench.gpu_info()})

    kernels: dict[str, KernelLaunch] = {}
    t_request = time.monotonic()
    default: dict[str, str | None] = {"so": None}  # the default config's library, if named

    def load(so: str) -> KernelLaunch:
        kernel = kernels.get(so)
        if kernel is None:
            kernel = kernels[so] = KernelLaunch(so)
        return kernel

    def default_launch(problem: Any) -> Any:
        so = default["so"]
        if so is None:
            return None
        launch = load(so)
        return None if launch.supports(problem) else launch

    bench.default_launch = default_launch

    def reply(d: dict[str, Any]) -> None:
        conn.send({**d, "worker_s": time.monotonic() - t_request})

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if not isinstance(msg, dict) or msg.get("op") == "stop":
            return
        t_request = time.monotonic()
        try:
            kernel = load(str(msg["so_path"]))
            default["so"] = str(msg["default_so"]) if msg.get("default_so") else None
            shape = as_problem(msg["shape"])
            bench.seed = int(msg.get("seed", bench.seed))
            proto = Protocol.from_dict(msg["protocol"])
            m = bench.measure(kernel, shape, proto, gate=bool(msg.get("gate")))
            d = m.to_dict()
            if m.status != "ok":
                reply({"status": "gate_failed", "gate": d["gate"],
                       "reason": f"gate failed on {shape}: {m.reason}"})
                continue
            reply({"status": "ok", "gate": d["gate"], "timing": d["timing"]})
        except runtime.CudaError as e:
            # Illegal address, launch failure, ...: the context may be poisoned. Report, exit.
            reply({"status": "cuda_error", "reason": str(e)})
            return
        except FaTuneError as e:
            reply({"status": "error", "reason": str(e)})
        except Exception as e:  # noqa: BLE001 - a bug here must still fail only this trial
            reply({"status": "error", "reason": f"{type(e).__name__}: {e}"})
            return
