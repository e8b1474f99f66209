"""`fa-tune export --workload` for real: its build.sh compiles two bucket kernels for sm_90a and
links them behind the dispatcher (about a minute on 2 cores); the library exports the fa_tune_
C ABI plus each bucket's prefixed one and answers host-only calls without a GPU; the shipped
Python package imports from the folder and finds the library."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dispatch_stub import TWO
from typer.testing import CliRunner

from tuner.cli import app
from tuner.config import load_preset
from tuner.dispatch import DispatchTable

runner = CliRunner()

ABI = ("abi_version", "forward", "prepare", "last_error", "config_json", "problem_class",
       "smem_bytes")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wexport")
    wfile = tmp / "two.yaml"
    wfile.write_text(yaml.safe_dump(TWO))
    out = tmp / "two-lib"
    r = runner.invoke(app, ["export", "--workload", str(wfile), "--bucket",
                            "short=preset:default", "--bucket", "long=preset:multicast",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.slow
def test_built_library_exports_the_abi(exported: Path) -> None:
    so = exported / "lib" / "libfa_tune_fwd.so"
    assert so.is_file() and not (exported / "build").exists()
    syms = set(subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True,
                              text=True, check=True).stdout.split())
    for prefix in ("fa_tune_", "fa_tune_b0_", "fa_tune_b1_"):
        assert {prefix + n for n in ABI} <= syms, prefix
    assert {"fa_tune_forward_varlen", "fa_tune_bucket_for", "fa_tune_bucket_count",
            "fa_tune_dispatch_json"} <= syms
    lib = ctypes.CDLL(str(so))
    for fn in ("fa_tune_last_error", "fa_tune_dispatch_json", "fa_tune_b1_config_json"):
        getattr(lib, fn).restype = ctypes.c_char_p
    table = DispatchTable.load(exported / "dispatch.json")
    assert json.loads(lib.fa_tune_dispatch_json()) == json.loads(table.dumps())
    assert [lib.fa_tune_bucket_for(1, 32, 8, s) for s in (1, 2048, 2049, 10**6)] == [0, 0, 1, 1]
    assert lib.fa_tune_bucket_for(1, 64, 8, 100) == -1
    # Each bucket is the config it was given, built for the workload's class.
    assert json.loads(lib.fa_tune_b1_config_json()) == json.loads(
        load_preset("multicast").canonical_json())
    vp, ci = ctypes.c_void_p, ctypes.c_int
    lib.fa_tune_forward.argtypes = [vp] * 5 + [ci] * 4 + [ctypes.c_float, vp]
    assert lib.fa_tune_forward(None, None, None, None, None, 1, 64, 8, 100, 0.0, None) == 801
    assert lib.fa_tune_last_error().startswith(b"no bucket of this library serves")
    # The bucket's own argument check runs before any CUDA call: no GPU needed.
    assert lib.fa_tune_forward(None, None, None, None, None, 1, 32, 8, 100, 0.0, None) == 1
    assert lib.fa_tune_last_error() == b"bucket short: Q, K, V and O must be non-null"


@pytest.mark.slow
def test_shipped_package_finds_the_library(exported: Path) -> None:
    pytest.importorskip("torch", reason="fa_tune_ops needs PyTorch (pip install torch)")
    code = (
        "import torch, fa_tune_ops\n"
        "lib = fa_tune_ops.library()\n"
        "print(lib.path.name, lib.head_dim, lib.causal)\n"
        "q = torch.empty(1, 4096, 32, 128, dtype=torch.bfloat16, device='meta')\n"
        "k = torch.empty(1, 4096, 8, 128, dtype=torch.bfloat16, device='meta')\n"
        "out, lse = torch.ops.fa_tune.attention(q, k, k, True, None)\n"
        "print(tuple(out.shape), tuple(lse.shape))\n"
        "print('native:', fa_tune_ops.native.status())\n"
        "try:\n"
        "    torch.ops.fa_tune.attention(q.float(), k, k, True, None)\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FA_TUNE_LIB")}
    p = subprocess.run([sys.executable, "-c", code], cwd=exported, capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0] == "libfa_tune_fwd.so 128 True"
    assert lines[1] == "(1, 4096, 32, 128) (1, 32, 4096)"
    # build.sh built the op's C++ launch path for this python's torch, beside the library.
    import torch

    assert (exported / "lib" / f"libfa_tune_torch.{torch.__version__}.so").is_file()
    assert lines[2] == "native: active"
    assert "q is torch.float32; the kernel takes torch.bfloat16 only" in lines[3]
