"""On the GPU: fa-tune's kernel and its peers on the one measurement path (tuner.measure).

The kernel and every installed peer see the same device buffers, are gated by the same oracle
on every input set and timed by the same loop; a peer that is not installed is reported as
such, never substituted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tuner import build, compare
from tuner.config import Shape, load_preset
from tuner.measure.timing import Protocol

pytestmark = pytest.mark.gpu

QUICK = Protocol(warmup=2, repeat=10, rounds=2, settle_s=0.2, temp_wait_s=5)


def test_compare_kernel_and_peers_on_one_path(tmp_path: Path) -> None:
    so = build.build_config(load_preset("default")).so_path
    payload = compare.run_compare(so, ["2x8x1000", "1x4x4096"], "fa3,cudnn", QUICK,
                                  results_root=tmp_path, log=print)
    rows = {(r["shape"], r["backend"]): r for r in payload["summary"]}
    for shape in ("2x8x1000", "1x4x4096"):
        k = rows[(shape, "fa-tune")]
        assert k["status"] == "ok", k
        assert k["max_abs_err"] < 0.01
    runs = [r for s in payload["shapes"] for r in s["runs"]]
    for r in runs:
        if r["status"] == "unavailable":
            continue
        # Every backend was checked on every input set, then again after timing.
        assert r["status"] == "ok", (r["backend"], r["reason"])
        sets = [m["input_set"] for m in r["gate"]["details"]["sets"]]
        assert sets == ["seed", "rising"], sets
        assert r["gate_after"]["passed"]
        assert len(r["timing"]["rounds"]) == 2
        print(r["backend"], r["gate"]["summary"])
    assert (Path(payload["result_dir"]) / "summary.md").is_file()


def test_peer_sees_the_oracle_inputs() -> None:
    """A peer's torch views alias the bench's buffers: what the oracle generated is what the
    peer reads (checked by reading the views back against the NumPy twin of the generator)."""
    torch = pytest.importorskip("torch")
    from tuner.measure import oracle
    from tuner.measure.bench import Bench
    from tuner.measure.launch import torch_views

    shape = Shape(1, 2, 64)
    bench = Bench(0)
    bufs = bench.load_inputs(shape)
    q, k, v, o, lse = torch_views(bufs)
    hq, hk, hv = oracle.host_inputs(shape, "seed", bench.seed)  # BF16 bit patterns, uint16
    for t, want in ((q, hq), (k, hk), (v, hv)):
        got = t.view(torch.int16).cpu().numpy().view(np.uint16)
        assert (got == want).all()
    assert o.shape == (1, 64, 2, 128) and lse.shape == (1, 2, 64)
    bench.close()
