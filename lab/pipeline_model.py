#!/usr/bin/env python3
"""The search's pipeline on the CPU, no GPU, no nvcc: the real loop (tuner.search.loop.Search:
TPE, SQLite, the worker protocol, the final off) with the test fixtures in place of the compiler
and the GPU (tests/fixtures/fake_builder.py sleeps --compile-s per config, as one nvcc of a
16-core host takes; tests/fixtures/fake_gpu_worker.py sleeps --gpu-s per request). Sleeps use no
core, so a 2-core machine models a 16-core host's --jobs compiles; what it measures is the
parent's own work and the pipeline's rule. Prints trials per hour, the fake GPU's busy share and
the compiles in flight, sampled every 0.5 s, the parent's time per ask and per tell, and where
the fake GPU's idle time went (lab/search_timed.py's split, docs/PERF.md step 72).

    python3 lab/pipeline_model.py [--lookahead N] [--seconds 180] [--jobs 16] [--compile-s 5.7]
        [--gpu-s 0.2] [--storage sqlite|pg]

--storage pg: the study on a PostgreSQL 15 server started in a temporary folder
(tests/pg_server.py), where every storage read is a round trip (step 71 timed
lab/patches/trials-read-once.patch on it).

--lookahead: open trials at most (the search's: --jobs). docs/PERF.md step 70 ran it with the
rule of commit 64014b9 too (jobs + 4 open, compiles capped at jobs; reverted).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

from fake_builder import FakeBuilder  # noqa: E402
from search_timed import idle_split, loop_times, record_timeline  # noqa: E402

from tuner.kernel import toolchain  # noqa: E402
from tuner.problem import as_problem  # noqa: E402
from tuner.search import loop  # noqa: E402
from tuner.search.policy import SearchPolicy  # noqa: E402
from tuner.search.space import load_space  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lookahead", type=int)
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--compile-s", type=float, default=5.7)
    ap.add_argument("--gpu-s", type=float, default=0.2)
    ap.add_argument("--shape", default="1x32/8x8192")
    ap.add_argument("--storage", choices=("sqlite", "pg"), default="sqlite")
    a = ap.parse_args()
    # The model's compiles are sleeps: --jobs is the modelled host's, not this machine's cores.
    toolchain.compile_jobs = lambda jobs: jobs or a.jobs  # type: ignore[assignment]
    tmp = Path(tempfile.mkdtemp(prefix="pipeline_model."))
    log = tmp / "worker.log"
    os.environ["FAKE_GPU_WORKER_LOG"] = str(log)
    os.environ["FAKE_GPU_WORKER_DELAY_S"] = str(a.gpu_s)
    pg = None
    storage = f"sqlite:///{tmp / 'model.db'}"
    if a.storage == "pg":
        sys.path.insert(0, str(ROOT / "tests"))
        from pg_server import PgServer, missing

        if why := missing():
            print(f"pipeline_model.py: --storage pg: {why}", file=sys.stderr)
            return 2
        pg = PgServer().start()
        storage = pg.create_database("model")
    s = loop.Search(
        study="model", space=load_space("default"), shapes=[as_problem(a.shape)],
        storage=storage, n_trials=None, timeout_s=a.seconds,
        sampler="tpe", seed=0, jobs=a.jobs, builder=FakeBuilder(tmp / "art", delay_s=a.compile_s),
        worker_entry=f"{ROOT / 'tests' / 'fixtures' / 'fake_gpu_worker.py'}:main",
        results_root=tmp / "results", policy=SearchPolicy(final_top=0))
    if a.lookahead:
        s.lookahead = a.lookahead
    record_timeline()
    samples: list[tuple[int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            try:
                samples.append((s._compiling(), len(s.open)))
            except RuntimeError:  # the queue changed under the count: skip this sample
                pass

    threading.Thread(target=sample, daemon=True).start()
    try:
        summ = s.run()
    finally:
        done.set()
        if pg is not None:
            pg.cleanup()
    spans = [tuple(float(x) for x in ln.split()[-2:]) for ln in log.read_text().splitlines()]
    busy = sum(t1 - t0 for t0, t1 in spans)
    steady = samples[len(samples) // 6:]  # past the first sixth (the seeds' start)
    ms = {k: 1e3 * statistics.mean(v) for k, v in loop_times().items() if v}
    print(f"lookahead {s.lookahead}: {summ.trials_run} trials in {summ.wall_s:.0f} s "
          f"({summ.trials_per_hour:.0f}/h), {len(spans)} GPU requests, fake GPU busy "
          f"{100 * busy / summ.wall_s:.0f} %, compiles in flight mean "
          f"{statistics.mean(c for c, _ in steady):.1f} (max {max(c for c, _ in steady)}), "
          f"open mean {statistics.mean(o for _, o in steady):.1f}; an ask {ms['ask']:.0f} ms, "
          f"a tell {ms['tell']:.0f} ms; jobs {a.jobs}, compile "
          f"{a.compile_s} s, GPU {a.gpu_s} s a request, {a.storage}")
    print("the fake GPU's time to its last request: " + ", ".join(
        f"{k} {v:.1f} s" for k, v in idle_split().items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
