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
from tuner.kernel.config import load_preset
from tuner.kernel.runtime import abi
from tuner.ship.dispatch import DispatchTable

runner = CliRunner()

ABI = ("abi_version", "forward", "prepare", "workspace_bytes", "last_error", "config_json",
       "problem_class", "smem_bytes")


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
    # The minutes of compiling are announced before they start, not after.
    lines = r.output.splitlines()
    assert lines[0].startswith("compiling 2 bucket kernel(s) for packed batches on "), r.output
    assert lines[1].startswith("building the library with the export's build.sh: 2 bucket(s)")
    assert lines[-1].startswith("exported workload "), r.output
    return out


@pytest.mark.slow
def test_built_library_exports_the_abi(exported: Path) -> None:
    so = exported / "lib" / "libfa_tune_fwd.so"
    assert so.is_file() and not (exported / "build").exists()
    syms = set(subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True,
                              text=True, check=True).stdout.split())
    for prefix in ("fa_tune_", "fa_tune_b0_", "fa_tune_b1_"):
        assert {prefix + n for n in ABI} <= syms, prefix
    assert {"fa_tune_bucket_for", "fa_tune_bucket_count", "fa_tune_dispatch_json"} <= syms
    lib = ctypes.CDLL(str(so))
    fn = abi.bind(lib)
    lib.fa_tune_b1_config_json.restype = ctypes.c_char_p
    assert fn["abi_version"]() == abi.ABI_VERSION
    table = DispatchTable.load(exported / "dispatch.json")
    assert json.loads(fn["dispatch_json"]()) == json.loads(table.dumps())

    def args(hq: int = 32, sq: int = 100, sk: int = 100) -> abi.Args:
        return abi.make_args(batch=1, heads_q=hq, heads_kv=8, head_dim=128, seqlen_q=sq,
                             seqlen_k=sk, causal=1)

    assert [fn["bucket_for"](ctypes.byref(args(sq=s, sk=s))) for s in (1, 2048, 2049, 10**6)] \
        == [0, 0, 1, 1]
    assert fn["bucket_for"](ctypes.byref(args(sq=2048, sk=8192))) == 0  # by the query length
    assert fn["bucket_for"](ctypes.byref(args(hq=64))) == -1
    # Each bucket is the config it was given, built for the workload's class.
    assert json.loads(lib.fa_tune_b1_config_json()) == json.loads(
        load_preset("multicast").canonical_json())
    assert fn["forward"](ctypes.byref(args(hq=64)), None) == 801
    assert fn["last_error"]().startswith(b"no bucket of this library serves")
    # The bucket's own argument check runs before any CUDA call: no GPU needed.
    assert fn["forward"](ctypes.byref(args()), None) == 1
    assert fn["last_error"]() == b"bucket short: q, k, v and o must be non-null"


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
    # build.sh built the op's C++ launch path for this python's torch, beside the library
    # (where torch has complete CUDA headers: not a CPU build's).
    import torch

    ext = exported / "lib" / f"libfa_tune_torch.{torch.__version__}.abi{abi.ABI_VERSION}.so"
    if (Path(torch.__file__).parent / "include/c10/cuda/impl/cuda_cmake_macros.h").is_file():
        assert ext.is_file() and lines[2] == "native: active"
    else:
        assert lines[2].startswith(f"native: no {ext.name} beside")
    assert "q is torch.float32; the kernel takes torch.bfloat16 only" in lines[3]
