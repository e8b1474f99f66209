"""CPU tests for ``fa-tune compare`` and its peers: no torch, triton, flash_attn or GPU needed.

Where a test must prove behaviour *without* torch, it runs in a subprocess whose import system
refuses torch/triton/flash_attn, so it holds on machines where they are installed too.
"""

from __future__ import annotations

import ast
import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tuner.analysis import compare, compare_report
from tuner.errors import FaTuneError
from tuner.problem import Problem

REPO = Path(__file__).resolve().parent.parent

BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = {"torch", "triton", "flash_attn", "cutlass", "quack", "flashinfer"}
    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by test)")
            return None
    sys.meta_path.insert(0, _Block())
    """
)


def run_without_torch(body: str) -> subprocess.CompletedProcess[str]:
    code = BLOCKER + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_compare_and_peers_import_without_torch() -> None:
    r = run_without_torch(
        """
        import tuner.analysis.compare, tuner.measure.peers, tuner.measure.peers.fa3
        import tuner.measure.peers.sdpa, tuner.measure.peers.triton_fa, tuner.measure.peers.base
        import tuner.measure.peers.flashinfer
        import tuner.measure.launch, tuner.measure.bench
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not heavy, heavy
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_peers_report_unavailable_without_torch(tmp_path: Path) -> None:
    fake_so = tmp_path / "kernel.so"
    fake_so.write_bytes(b"not really a library")
    r = run_without_torch(
        f"""
        import json
        from tuner.analysis.compare import make_backends
        from tuner.measure.peers import PEER_NAMES
        out = {{b.name: [b.available, b.reason] for b in make_backends(
            [({str(fake_so)!r}, "x")], PEER_NAMES)}}
        print(json.dumps(out))
        """
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    for name in ("fa3", "cudnn", "fa2", "triton", "mem_efficient", "flashinfer"):
        ok, reason = res[name]
        assert ok is False
        assert "torch" in reason and "not installed" in reason, (name, reason)
    assert res["x"][0] is False and "cannot load kernel library" in res["x"][1]


def test_run_compare_missing_library_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(FaTuneError, match="does not exist"):
        compare.run_compare(tmp_path / "missing.so", ["1x1x128"], "none", results_root=tmp_path)


def test_run_suite_without_a_gpu_is_one_line() -> None:
    """No peers asked for: compare needs no torch, only the GPU (none here: one clear line)."""
    from tuner.errors import GpuError
    from tuner.measure.timing import FULL

    try:
        compare.run_suite([], [Problem(1, 1, 128)], FULL)
    except GpuError as e:
        assert "\n" not in str(e) and ("GPU" in str(e) or "driver" in str(e))
    else:  # pragma: no cover - only on a machine with a GPU
        pytest.skip("a GPU is visible here")


def test_kernel_lab_help_without_torch() -> None:
    r = run_without_torch(
        """
        import runpy
        sys.argv = ["kernel_lab.py", "--help"]
        try:
            runpy.run_path("scripts/kernel_lab.py", run_name="__main__")
        except SystemExit as e:
            assert e.code == 0, e.code
        """
    )
    assert r.returncode == 0, r.stderr
    assert "--variant" in r.stdout and "--shape" in r.stdout


@pytest.mark.parametrize("variant, says", [
    ('{"block_n": 32}', "knob 'block_n' must be"),       # a value the config refuses
    ('{"block_n": 64', "Expecting"),                      # not JSON
    ("no-such-preset", "unknown preset 'no-such-preset'"),
])
def test_kernel_lab_bad_variant_is_one_line(variant: str, says: str) -> None:
    r = subprocess.run([sys.executable, "scripts/kernel_lab.py", "--variant", variant,
                        "--build-only"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert r.stderr.startswith("kernel_lab: ") and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr


# ---- the Triton kernel (parsed, never imported: no triton here) ---------------------------
def _triton_source() -> ast.Module:
    return ast.parse((REPO / "tuner/measure/peers/_triton_kernel.py").read_text())


def test_triton_kernel_source_parses_and_has_the_kernel() -> None:
    tree = _triton_source()
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"attn_fwd_kernel", "_attn_tiles"} <= set(funcs)
    decorators = [ast.unparse(d) for d in funcs["attn_fwd_kernel"].decorator_list]
    assert any(d.startswith("triton.autotune") for d in decorators)
    assert decorators[-1] == "triton.jit"
    params = [a.arg for a in funcs["attn_fwd_kernel"].args.args]
    for p in ("BLOCK_M", "BLOCK_N", "HEAD_DIM", "WRITE_LSE", "qk_scale"):
        assert p in params


def test_triton_autotune_space() -> None:
    configs = None
    for node in _triton_source().body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_CONFIGS":
            configs = ast.literal_eval(node.value)
    assert configs is not None
    assert len(configs) == 20 and len(set(configs)) == 20
    for bm, bn, warps, stages in configs:
        assert bm % bn == 0, "the diagonal loop needs BLOCK_N to divide BLOCK_M"
        assert warps in (4, 8) and stages in (2, 3, 4)
        # K and V tiles per stage must fit the 227 KB of shared memory (Q tile on top).
        assert (bm * 128 + stages * 2 * bn * 128) * 2 <= 232448, (bm, bn, stages)


# ---- backends, heads, stats --------------------------------------------------------------
def test_parse_backends() -> None:
    assert compare.parse_backends(None) == ["fa3", "cudnn", "fa2", "triton"]
    assert compare.parse_backends("cudnn, fa3,cudnn") == ["cudnn", "fa3"]
    assert compare.parse_backends("all")[0] == "fa3"
    assert compare.parse_backends("fa-tune,fa2") == ["fa2"]
    with pytest.raises(FaTuneError, match="unknown backend"):
        compare.parse_backends("fa5")


def _fixture_timing(rounds: list[list[float]], shape: Problem) -> dict:
    """tuner.measure.timing's aggregation over made-up samples, as compare.measure stores it."""
    from tuner.measure import timing

    tw = timing.TempWait(65, 30.0, 0.0, None, None, bound_hit=False, skipped=True)
    st = timing.GpuState(time_unix=0.0, note="TEST FIXTURE")
    rs = [timing.make_round(i, r, tw, st, st) for i, r in enumerate(rounds)]
    res = timing.summarize_rounds(
        timing.Protocol(rounds=len(rounds)), shape, rs, 65
    )
    return {**res.to_dict(), "tflops_min": shape.tflops(res.max_ms)}


def test_timing_is_median_of_round_medians() -> None:
    t = _fixture_timing([[1.0, 2.0, 9.0], [3.0, 4.0, 5.0], [0.5, 2.5, 2.5]], Problem(1, 1, 128))
    assert t["round_medians_ms"] == [2.0, 4.0, 2.5]
    assert t["median_ms"] == 2.5
    assert (t["min_ms"], t["max_ms"]) == (0.5, 9.0)
    assert [r["samples_ms"] for r in t["rounds"]][0] == [1.0, 2.0, 9.0]  # every sample kept


# ---- writers, from a test fixture (made-up numbers, not measurements) ----------------------
def _fixture_run(
    backend: str,
    label: str,
    ms: float | None,
    shape: Problem,
    position: str | None = None,
    status: str = "ok",
    reason: str = "",
) -> dict:
    run = {
        "backend": backend,
        "label": label,
        "position": position,
        "status": status,
        "reason": reason,
        "gate": None,
        "gate_after": None,
        "timing": None,
    }
    if ms is not None:
        run["gate"] = {"passed": True, "max_abs_err": 0.002}
        run["timing"] = _fixture_timing([[ms * 0.99, ms, ms * 1.2]] * 3, shape)
    return run


def fixture_payload() -> dict:
    """TEST FIXTURE: a hand-made compare payload with invented timings."""
    shapes = []
    for S, base in ((4096, 1.0), (8192, 3.6)):
        shape = Problem(4, 32, S)
        runs = [
            _fixture_run("fa3", "FlashAttention-3", base, shape, "before"),
            _fixture_run("fa-tune", "fa-tune", base * 0.9, shape),
            _fixture_run("cudnn", "cuDNN SDPA", base * 1.1, shape),
            _fixture_run(
                "fa2",
                "FlashAttention-2",
                None,
                shape,
                status="gate_failed",
                reason="12 elements outside tolerance",
            ),
            _fixture_run(
                "triton",
                "Triton",
                None,
                shape,
                status="unavailable",
                reason="python package 'triton' is not installed",
            ),
            _fixture_run("fa3", "FlashAttention-3", base * 1.02, shape, "after"),
        ]
        entry = {**shape.to_dict(), "shape": str(shape), "flops": shape.flops, "runs": runs}
        entry["drift"] = compare._drift(runs)
        shapes.append(entry)
    payload = {
        "schema": 1,
        "kind": "compare",
        "created_utc": "2026-01-01T00:00:00Z",
        "protocol": {"warmup": 50, "repeat": 200, "rounds": 3, "temp_limit_c": 65.0, "seed": 42},
        "gpu": {"name": "TEST FIXTURE GPU"},
        "versions": {},
        "reference_peer": "fa3",
        "backends": [
            {
                "name": "triton",
                "label": "Triton",
                "available": False,
                "reason": "python package 'triton' is not installed",
            }
        ],
        "artifacts": [{"name": "fa-tune", "so_path": "k.so", "sha256": "ab" * 32}],
        "shapes": shapes,
        "status": "failed",
    }
    payload["summary"] = compare.summarize(payload)
    return payload


def test_summarize_merges_reference_ends_and_takes_ratios() -> None:
    p = fixture_payload()
    rows = {(r["shape"], r["backend"]): r for r in p["summary"]}
    assert len(p["summary"]) == 10  # 2 shapes x 5 backends; fa3's two runs are one row
    fa3 = rows[("4x32x4096", "fa3")]
    assert fa3["median_ms"] == pytest.approx(1.01)  # mean of before (1.0) and after (1.02)
    assert rows[("4x32x4096", "fa-tune")]["ratio_to_fa3"] == pytest.approx(1.01 / 0.9)
    assert rows[("4x32x4096", "fa2")]["status"] == "gate_failed"
    assert rows[("4x32x4096", "fa2")]["ratio_to_fa3"] is None
    assert rows[("4x32x4096", "triton")]["median_ms"] is None
    tune = rows[("4x32x8192", "fa-tune")]
    assert tune["tflops_min"] < tune["tflops"] < tune["tflops_max"]
    assert p["shapes"][0]["drift"]["change_pct"] == pytest.approx(2.0)


def test_write_outputs_from_fixture(tmp_path: Path) -> None:
    p = fixture_payload()
    files = compare_report.write_outputs(p, tmp_path)
    assert json.loads(files["json"].read_text())["summary"] == json.loads(json.dumps(p["summary"]))

    with open(files["csv"], newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == compare_report.SUMMARY_COLUMNS
        csv_rows = list(reader)
    assert len(csv_rows) == 10
    tune = next(r for r in csv_rows if r["backend"] == "fa-tune" and r["S"] == "4096")
    assert float(tune["median_ms"]) == pytest.approx(0.9)
    assert float(tune["ratio_to_fa3"]) == pytest.approx(1.01 / 0.9)

    md = files["md"].read_text()
    assert "| implementation | S=4096 ms / TFLOPS | S=8192 ms / TFLOPS |" in md
    assert "| fa-tune | 0.900 / " in md
    assert "1.122x" in md  # 1.01 / 0.9
    assert "gate failed" in md and "not installed" in md
    assert "Drift check" in md and "(+2.00%)" in md

    if "png" in files:  # matplotlib present
        assert files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_chart_from_fixture(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "chart.png"
    assert compare_report.write_chart(fixture_payload(), out)
    assert out.stat().st_size > 1000


def test_format_table_lists_every_row() -> None:
    text = compare_report.format_table(fixture_payload())
    assert text.count("\n") >= 11
    assert "gate_failed: 12 elements" in text and "drift 4x32x4096" in text


def test_make_backends_keeps_same_label_kernels_apart(tmp_path: Path) -> None:
    so = tmp_path / "k.so"
    so.write_bytes(b"x")
    names = [b.name for b in compare.make_backends([(so, "a"), (so, "a"), (so, None)], [])]
    assert names == ["a", "a#2", "k"]


STUB_C = r"""
#include "fa_tune.h"
#ifndef STUB_CAUSAL
#define STUB_CAUSAL "true"
#endif
static const char* err = "stub error";
int fa_tune_abi_version(void) { return FA_TUNE_ABI_VERSION; }
int fa_tune_prepare(const fa_tune_args* a, double* ms) { *ms = 1.5; return 0; }
int fa_tune_forward(const fa_tune_args* a, cudaStream_t st) { return 7; }
size_t fa_tune_workspace_bytes(const fa_tune_args* a) { return 0; }
const char* fa_tune_last_error(void) { return err; }
const char* fa_tune_config_json(void) { return "{\"block_m\":128}"; }
const char* fa_tune_problem_class(void) {
    return "{\"head_dim\":128,\"causal\":" STUB_CAUSAL "}";
}
int fa_tune_smem_bytes(void) { return 4242; }
"""


def _stub_so(tmp_path: Path, causal: bool = True) -> Path:
    """STUB_C built as a kernel library for the causal (or the non-causal) mask, against the
    real fa_tune.h with a stub cuda_runtime.h (no CUDA here)."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    tag = "causal" if causal else "full"
    src, so = tmp_path / f"stub_{tag}.c", tmp_path / f"stub_{tag}.so"
    src.write_text(STUB_C)
    inc = tmp_path / "stub_include"
    inc.mkdir(exist_ok=True)
    (inc / "cuda_runtime.h").write_text("typedef struct CUstream_st* cudaStream_t;\n")
    header_dir = Path(__file__).resolve().parents[1] / "cuda_src" / "fa_tune"
    subprocess.run([cc, "-shared", "-fPIC", f'-DSTUB_CAUSAL="{str(causal).lower()}"',
                    f"-I{inc}", f"-I{header_dir}", "-o", str(so), str(src)], check=True)
    return so


def test_kernel_launch_reads_the_c_abi_of_a_stub_library(tmp_path: Path) -> None:
    """The one ctypes binding (tuner.kernel.runtime.KernelModule), on a C stub (no CUDA, no
    torch)."""
    from types import SimpleNamespace

    from tuner.kernel import build
    from tuner.kernel.runtime import KernelError
    from tuner.measure.launch import KernelLaunch

    so = _stub_so(tmp_path)
    k = KernelLaunch(so, "stub")
    assert k.module.config == {"block_m": 128} and k.writes_lse
    assert (k.module.head_dim, k.module.causal) == (128, True)
    details = k.details()
    assert details["smem_bytes"] == 4242 and details["sha256"] == build.sha256_file(so)
    assert k.prepare(Problem(1, 1, 128), None) == 1.5
    buf = SimpleNamespace(ptr=0)
    bufs = SimpleNamespace(q=buf, k=buf, v=buf, o=buf, lse=buf, shape=Problem(1, 1, 128))
    with pytest.raises(KernelError, match="stub error"):
        k.forward(bufs, None)  # type: ignore[arg-type]


# ---- the problem family: which peer runs what (no torch needed) ---------------------------
FAMILY_PROBLEMS = [Problem(1, 32, 1024), Problem(1, 32, 1024, Hkv=8), Problem(1, 32, 1024, Hkv=1),
                   Problem(1, 32, 1024, D=64), Problem(1, 32, 1024, D=256),
                   Problem(1, 32, 1024, causal=False)]


def test_every_peer_answers_supports_and_takes_the_mask() -> None:
    import inspect

    from tuner.measure.peers import PEER_NAMES, make_peer

    for name in PEER_NAMES:
        peer = make_peer(name)
        params = list(inspect.signature(peer.prepare).parameters)
        assert params == ["q", "k", "v", "causal", "varlen", "masks", "pages"], (name, params)
        for p in FAMILY_PROBLEMS:
            why = peer.supports(p)
            assert why is None or (isinstance(why, str) and "\n" not in why and str(p) in why)
    fa3, triton, mem = make_peer("fa3"), make_peer("triton"), make_peer("mem_efficient")
    assert all(fa3.supports(p) is None for p in FAMILY_PROBLEMS)  # FA3: GQA, D 64-256, masks
    assert all(make_peer(n).supports(p) is None for n in ("cudnn", "fa2")
               for p in FAMILY_PROBLEMS)  # asked at prepare (the backend may still decline)
    assert triton.supports(Problem(1, 32, 1024)) is None
    for p, needle in ((Problem(1, 32, 1024, Hkv=8), "no GQA"), (Problem(1, 32, 1024, D=64), "64"),
                      (Problem(1, 32, 1024, causal=False), "causal only")):
        assert needle in (triton.supports(p) or "")
    assert "no GQA" in (mem.supports(Problem(1, 32, 1024, Hkv=1)) or "")
    assert mem.supports(Problem(1, 32, 1024, causal=False)) is None


def test_triton_peer_refuses_at_prepare_before_importing_torch() -> None:
    from types import SimpleNamespace

    from tuner.measure.peers.base import Unsupported
    from tuner.measure.peers.triton_fa import TritonPeer

    q = SimpleNamespace(shape=(1, 64, 8, 128))
    kv = SimpleNamespace(shape=(1, 64, 2, 128))
    with pytest.raises(Unsupported, match="MHA, D 128, causal, S_q = S_k only"):
        TritonPeer().prepare(q, kv, kv, True)
    with pytest.raises(Unsupported, match="causal=False"):
        TritonPeer().prepare(q, q, q, False)
    assert issubclass(Unsupported, ValueError)


class _Launch:
    """A launchable double: what supports() says, and a record of what ran."""

    def __init__(self, why: str | None = None, gate_raises: Exception | None = None) -> None:
        self.why, self.gate_raises, self.ran = why, gate_raises, []

    def supports(self, problem: object) -> str | None:
        return self.why


def test_bench_measure_reports_an_unsupported_problem_as_unavailable() -> None:
    from tuner.measure.bench import Bench
    from tuner.measure.peers.base import Unsupported

    bench = object.__new__(Bench)  # no device: nothing may run for an unsupported problem

    def no_gate(launch: object, shape: object) -> None:
        raise AssertionError("gated an unsupported problem")

    bench.gate = no_gate  # type: ignore[method-assign]
    p = Problem(1, 8, 128, Hkv=2)
    m = bench.measure(_Launch("fa-tune: this kernel runs MHA, D 128, causal only (issue 14)"), p,
                      None)  # type: ignore[arg-type]
    assert m.status == "unavailable" and "issue 14" in m.reason and m.timing is None
    assert m.to_dict()["gate"] is None

    def late_refusal(launch: object, shape: object) -> None:  # an SDPA backend that declines
        raise Unsupported("cudnn (SDPBackend.CUDNN_ATTENTION) cannot run q (1, 128, 8, 256)")

    bench.gate = late_refusal  # type: ignore[method-assign]
    m = bench.measure(_Launch(None), p, None)  # type: ignore[arg-type]
    assert m.status == "unavailable" and "cannot run" in m.reason


def test_kernel_and_peer_launch_supports(tmp_path: Path) -> None:
    from tuner.measure.launch import KernelLaunch, PeerLaunch, launch_supports
    from tuner.measure.peers import make_peer

    # FAMILY_PROBLEMS: MHA, GQA, MQA (D 128, causal), D 64, D 256, non-causal.
    k = KernelLaunch(_stub_so(tmp_path), "stub")
    for p in (Problem(4, 32, 4096), *FAMILY_PROBLEMS[:3]):  # Hkv is a run-time argument
        assert k.supports(p) is None, p
    assert k.supports(Problem(1, 32, 8192, Hkv=8)) is None  # 1x32/8x8192
    for p, got in ((FAMILY_PROBLEMS[3], "D=64"), (FAMILY_PROBLEMS[4], "D=256"),
                   (FAMILY_PROBLEMS[5], "non-causal")):
        why = launch_supports(k, p) or ""
        assert "this kernel library runs D 128, causal problems; got" in why and got in why, p
    # The mask is compiled in: a non-causal library runs 4x32x8192:full and refuses causal.
    full = KernelLaunch(_stub_so(tmp_path, causal=False), "stub-full")
    assert full.module.causal is False
    assert full.supports(Problem(4, 32, 8192, causal=False)) is None
    assert full.supports(Problem(1, 32, 8192, Hkv=8, causal=False)) is None
    why = launch_supports(full, Problem(4, 32, 8192)) or ""
    assert "runs D 128, non-causal problems; got causal" in why
    tri = PeerLaunch(make_peer("triton"))
    assert tri.supports(Problem(1, 8, 128)) is None and tri.supports(Problem(1, 8, 128, Hkv=4))
    assert launch_supports(object(), Problem(1, 8, 128, Hkv=4)) is None  # no supports(): runs all


# ---- queries over a longer KV (S_q < S_k): which peer runs what, and SDPA's mask -------------
def test_peers_on_queries_over_more_keys() -> None:
    from tuner.measure.peers import make_peer

    causal, full = Problem.parse("1x32/8x2048:k8192"), Problem.parse("1x32/8x2048:k8192:full")
    packed = Problem.parse("32/8x[2048:8192,512:4096]")
    fa3 = make_peer("fa3")
    assert fa3.supports(causal) is None and fa3.supports(full) is None
    assert fa3.supports(packed) is None  # flash_attn_varlen_func: cu_seqlens_q / _k
    # FA2 through SDPA takes no mask and refuses a non-square is_causal: declined up front.
    why = make_peer("fa2").supports(causal) or ""
    assert str(causal) in why and "bottom-right" in why and "\n" not in why
    assert make_peer("fa2").supports(full) is None
    for name in ("cudnn", "mem_efficient"):  # an explicit mask; the backend may still decline
        assert make_peer(name).supports(Problem.parse("1x32x2048:k8192")) is None
    for p in (Problem.parse("1x8x128:k256"), Problem.parse("1x8x128:k256:full")):
        assert "S_q = S_k only" in (make_peer("triton").supports(p) or "")
    assert make_peer("triton").supports(Problem(1, 8, 128)) is None
    assert "varlen" in (make_peer("cudnn").supports(packed) or "")


def test_sdpa_peer_gives_a_bottom_right_mask_never_top_left(monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    """SDPA's is_causal is top-left when S_q != S_k; the peer passes the bottom-right boolean
    mask instead (checked on the CPU through torch's own backend against the float64
    reference), and keeps is_causal where S_q = S_k."""
    torch = pytest.importorskip("torch")
    from contextlib import nullcontext

    from tuner.measure import reference_numpy as RN
    from tuner.measure.peers.sdpa import SdpaPeer

    rng = np.random.default_rng(0)
    q = torch.from_numpy(rng.uniform(-2, 2, (2, 5, 4, 16)).astype(np.float32))
    k = torch.from_numpy(rng.uniform(-2, 2, (2, 12, 2, 16)).astype(np.float32))
    v = torch.from_numpy(rng.uniform(-1, 1, (2, 12, 2, 16)).astype(np.float32))
    peer = SdpaPeer("cudnn")
    monkeypatch.setattr(peer, "_ctx_manager", nullcontext)  # no CUDA here: torch's CPU backend
    for causal in (True, False):
        peer.prepare(q, k, v, causal)
        want = RN.numpy_reference(q.numpy(), k.numpy(), v.numpy(), causal)[0]
        np.testing.assert_allclose(peer.run().numpy(), want, atol=1e-5)
        d = peer.details()
        assert d["is_causal"] is False  # non-causal needs no mask
        assert d["attn_mask"] == ("bottom-right causal, bool [5, 12]" if causal else None)
    peer.prepare(q, k[:, :5], v[:, :5], True)  # S_q = S_k: is_causal, no mask
    assert peer.details()["is_causal"] is True and peer.details()["attn_mask"] is None
    want = RN.numpy_reference(q.numpy(), k[:, :5].numpy(), v[:, :5].numpy(), True)[0]
    np.testing.assert_allclose(peer.run().numpy(), want, atol=1e-5)
    peer.release()


def test_a_declined_problem_is_unsupported_not_missing(tmp_path: Path) -> None:
    """An installed peer that declines a problem (FA2's SDPA backend on S_q < S_k causal) says
    "unsupported", with its reason under the table; a peer that did not run is "not
    installed"."""
    p = fixture_payload()
    for s in p["shapes"]:
        for r in s["runs"]:
            if r["backend"] == "fa2":
                r.update(status="unavailable", timing=None, gate=None,
                         reason="fa2 cannot run it: 2048 queries over 8192 keys")
    p["summary"] = compare.summarize(p)
    md = compare_report.summary_markdown(p)
    assert "| FlashAttention-2 | unsupported | unsupported |" in md
    assert "| Triton | not installed | not installed |" in md
    assert "- FlashAttention-2 on 4x32x4096: unsupported (fa2 cannot run it: 2048 queries" in md


def _layout_payload() -> dict:
    """A hand-made payload of one problem in two layouts (invented timings)."""
    shapes = []
    for shape, base in ((Problem.parse("1x32/8x8192"), 0.81), (Problem.parse("1x32/8x8192:qkv"),
                                                                0.83)):
        runs = [_fixture_run("fa3", "FlashAttention-3", base * 1.1, shape, "before"),
                _fixture_run("fa-tune", "fa-tune", base, shape),
                _fixture_run("fa3", "FlashAttention-3", base * 1.1, shape, "after")]
        shapes.append({**shape.to_dict(), "shape": str(shape), "flops": shape.flops,
                       "runs": runs, "drift": compare._drift(runs)})
    payload = fixture_payload()
    payload.update(shapes=shapes, backends=[], status="ok")
    problems = [Problem.from_dict(s) for s in shapes]
    payload["inputs"] = {"layout": compare_report._layout_text(problems)}
    payload["summary"] = compare.summarize(payload)
    return payload


def test_a_layout_is_its_own_row_column_and_csv_field(tmp_path: Path) -> None:
    """1x32/8x8192 and 1x32/8x8192:qkv are two problems: own rows, own table columns (not two
    'S=8192'), the layout in the CSV, and the inputs line says what :qkv means."""
    p = _layout_payload()
    rows = {(r["shape"], r["backend"]): r for r in p["summary"]}
    assert set(rows) == {(s, b) for s in ("1x32/8x8192", "1x32/8x8192:qkv")
                         for b in ("fa3", "fa-tune")}
    assert rows[("1x32/8x8192:qkv", "fa-tune")]["layout"] == "qkv"
    assert "layout" not in rows[("1x32/8x8192", "fa-tune")]  # the default: left out, as Sk
    assert [t for _, t in compare_report._shape_headers(p)] == ["1x32/8x8192", "1x32/8x8192:qkv"]
    assert "fused QKV" in p["inputs"]["layout"] and ":qkv as q, k, v views" in p["inputs"]["layout"]
    assert compare_report._layout_text([Problem(1, 2, 64)]).startswith("BSHD contiguous")
    assert "as q, k, v" not in compare_report._layout_text([Problem(1, 2, 64)])
    files = compare_report.write_outputs(p, tmp_path)
    with open(files["csv"], newline="") as f:
        got = {(r["shape"], r["backend"]): r["layout"] for r in csv.DictReader(f)}
    assert got[("1x32/8x8192:qkv", "fa-tune")] == "qkv" and got[("1x32/8x8192", "fa3")] == ""
    md = files["md"].read_text()
    assert "| 1x32/8x8192 ms / TFLOPS | 1x32/8x8192:qkv ms / TFLOPS |" in md
    assert "; :qkv: q, k, v views of one fused QKV tensor" in md


@pytest.mark.parametrize("text", ["2x4/2x9:qkv", "2x4/2x5:k12:bhsd", "2x4/2x5:k12:full:bhsd"])
def test_sdpa_peer_reads_a_layouts_views(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """SDPA takes q, k, v as the strided views the measurement path makes of a layout (slices of
    a fused QKV tensor, a transposed [B, H, S, D] cache), no copy on our side: checked on the
    CPU through torch's own backend against the float64 reference of the dense values."""
    torch = pytest.importorskip("torch")
    from contextlib import nullcontext

    from tuner.measure import reference_numpy as RN
    from tuner.measure.peers.sdpa import SdpaPeer

    p = Problem.parse(text)
    rng = np.random.default_rng(1)
    views = {}
    for buf, n in p.layout_buffers().items():
        mem = torch.from_numpy(rng.uniform(-2, 2, n).astype(np.float32))
        for name in ("q", "k", "v"):
            tv = p.view(name)
            if tv.buffer == buf:
                views[name] = torch.as_strided(mem, tv.dims, (*tv.strides, 1), tv.offset)
    if "q" not in views:  # bhsd: q is dense
        views["q"] = torch.from_numpy(rng.uniform(-2, 2, p.view("q").dims).astype(np.float32))
    q, k, v = views["q"], views["k"], views["v"]
    assert not (k.is_contiguous() and q.is_contiguous())  # really strided views
    peer = SdpaPeer("cudnn")
    monkeypatch.setattr(peer, "_ctx_manager", nullcontext)  # no CUDA here: torch's CPU backend
    peer.prepare(q, k, v, p.causal)
    want = RN.numpy_reference(q.numpy(), k.numpy(), v.numpy(), p.causal)[0]
    np.testing.assert_allclose(peer.run().numpy(), want, atol=1e-5)
    peer.release()


def test_a_peers_jit_build_is_announced_once_per_class() -> None:
    """FlashInfer's first call per head dim and mask builds its kernels with nvcc for minutes;
    compare says so before it starts, once per problem class, and says nothing for others."""
    from types import SimpleNamespace

    from tuner.measure.peers.flashinfer import FlashInferPeer
    from tuner.measure.peers.sdpa import SdpaPeer

    fi = compare.Backend("flashinfer", "FlashInfer", "peer", SimpleNamespace(peer=FlashInferPeer()),
                         available=True)
    warned: set[tuple[str, str]] = set()
    paged = Problem.parse("4x32/8x2048:k8192:p64")
    note = compare._slow_first_call(fi, paged, warned)
    assert note is not None and "paged" in note and "head dim 128" in note and "nvcc" in note
    assert compare._slow_first_call(fi, Problem.parse("4x32/8x1024:k4096:p64"), warned) is None
    assert "ragged" in (compare._slow_first_call(fi, Problem.parse("1x32x4096:d64"), warned) or "")
    sd = compare.Backend("cudnn", "cuDNN", "peer", SimpleNamespace(peer=SdpaPeer("cudnn")),
                         available=True)
    assert compare._slow_first_call(sd, paged, warned) is None


def test_uneven_launches_are_named_with_the_ratio_by_fastest_launches() -> None:
    # FA3 at 0.08-0.2 ms can be launch-bound in one process: its median 0.199 ms against a
    # fastest 0.151 (docs/PERF.md step 78) made a 1.86x row read 2.92x. compare says so.
    p = fixture_payload()
    assert compare_report.uneven_lines(p) == []  # the fixture's launches are even
    fa3 = next(r for r in p["summary"] if r["backend"] == "fa3" and r["S"] == 4096)
    fa3["median_ms"], fa3["min_ms"] = 1.5, 1.0  # a median 1.5x its fastest launch
    lines = compare_report.uneven_lines(p)
    assert lines[0].startswith("Uneven launches") and len(lines) == 2
    assert lines[1].startswith("FlashAttention-3 on 4x32x4096: median 1.500 ms, fastest launch")
    tune = next(r for r in p["summary"] if r["backend"] == "fa-tune" and r["S"] == 4096)
    assert f"fa-tune {1.0 / tune['min_ms']:.2f}x" in lines[1]
    md = compare_report.summary_markdown(p)
    assert "Uneven launches" in md and "- FlashAttention-3 on 4x32x4096" in md
