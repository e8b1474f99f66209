"""Dispatch tables (round trip, selection, consistency), bucket config sources (presets, files,
studies), the generated dispatcher (compiled with stub buckets: no kernel, a few seconds), and
`fa-tune export --workload` (sources only here; tests/test_workload_export.py builds kernels)."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import optuna
import pytest
import yaml
from cli_helpers import one_error_line
from dispatch_stub import TWO, build_stub_library
from typer.testing import CliRunner

from tuner import dispatch
from tuner.cli import app
from tuner.config import KernelConfig, load_preset
from tuner.dispatch import DispatchEntry, DispatchError, DispatchTable
from tuner.errors import FaTuneError
from tuner.problem import Problem, ProblemClass
from tuner.study import default_storage_url, open_storage
from tuner.workload import load_workload, workload_from_dict

runner = CliRunner()



@pytest.fixture
def two_file(tmp_path: Path) -> Path:
    p = tmp_path / "two.yaml"
    p.write_text(yaml.safe_dump(TWO))
    return p


def _table(default: str = "preset:default", **assign: str) -> DispatchTable:
    w = load_workload("llama3-8b")
    srcs = dispatch.bucket_sources(w, [f"{k}={v}" for k, v in assign.items()], default=default)
    return dispatch.table_for_workload(w, srcs)


def test_table_round_trip(tmp_path: Path) -> None:
    t = _table(s8k="preset:multicast")
    assert DispatchTable.from_dict(t.to_dict()) == t
    assert DispatchTable.from_dict(json.loads(t.dumps())) == t
    assert DispatchTable.load(t.save(tmp_path / "d.json")) == t
    d = t.to_dict()
    assert d["problem_class"] == {"head_dim": 128, "causal": True} and d["abi_version"] == 2
    assert [e["bucket"] for e in d["entries"]] == ["s1k", "s2k", "s4k", "s8k"]
    assert d["entries"][3]["config"] == load_preset("multicast").to_dict()
    assert d["entries"][3]["source"] == {"kind": "preset", "name": "multicast"}
    # With no trial, each entry records the workload's problems to tune it on.
    assert d["entries"][3]["problems"][0] == "1x32/8x8192"
    assert d["workload"]["attention"]["Hq"] == 32


def test_select_and_index() -> None:
    t = _table()
    assert [t.index_for(32, 8, s) for s in (1, 1024, 1025, 8192, 8193)] == [0, 0, 1, 3, -1]
    assert t.index_for(32, 4, 100) == -1 and t.index_for(64, 8, 100) == -1
    assert t.select("4x32/8x4096").bucket == "s4k"
    assert t.select(Problem(1, 32, 4097, Hkv=8)).bucket == "s8k"
    assert t.select("1x32/8x4096:full") is None and t.select("1x32/8x4096:d64") is None
    assert t.select("1x32x4096") is None  # MHA heads: no bucket
    assert t.serves_text().startswith("Hq=32 Hkv=8: S 1..1024 (s1k), S 1025..2048 (s2k)")


def _entry(bucket: str, s_min: int, s_max: int | None, **kw) -> DispatchEntry:
    base = dict(bucket=bucket, Hq=32, Hkv=8, head_dim=128, causal=True, s_min=s_min,
                s_max=s_max, config=KernelConfig())
    return DispatchEntry(**{**base, **kw})


def test_table_consistency_errors() -> None:
    with pytest.raises(DispatchError, match="overlap"):
        DispatchTable("t", (_entry("a", 1, 100), _entry("b", 100, None)))
    DispatchTable("t", (_entry("a", 1, 100), _entry("b", 50, None, Hq=64)))  # other heads: fine
    with pytest.raises(DispatchError, match="mixes problem classes"):
        DispatchTable("t", (_entry("a", 1, 100), _entry("b", 101, None, causal=False)))
    with pytest.raises(DispatchError, match="appears twice"):
        DispatchTable("t", (_entry("a", 1, 100), _entry("a", 101, None)))
    with pytest.raises(DispatchError, match="no entries"):
        DispatchTable("t", ())


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(schema=7), "schema 7"),
    (lambda d: d["entries"][0].pop("s_min"), "missing 's_min'"),
    (lambda d: d["entries"][0].update(Hq="32"), "expected an integer"),
    (lambda d: d["entries"][0].update(config_id="abc"), "does not match its config"),
    (lambda d: d["entries"][1].update(s_min=1000), "overlap"),
    (lambda d: d.update(entries={}), "'entries' must be a list"),
])
def test_bad_tables_are_one_line(tmp_path: Path, mutate, needle: str) -> None:
    d = _table().to_dict()
    mutate(d)
    p = tmp_path / "d.json"
    p.write_text(json.dumps(d))
    with pytest.raises(DispatchError) as e:
        DispatchTable.load(p)
    assert needle in str(e.value) and str(p) in str(e.value)
    p.write_text("{not json")
    with pytest.raises(DispatchError, match="not valid JSON"):
        DispatchTable.load(p)


def test_sources_and_their_errors(tmp_path: Path) -> None:
    w = load_workload("llama3-8b")
    cfg = tmp_path / "c.yaml"
    load_preset("static").save_yaml(cfg)
    srcs = dispatch.bucket_sources(w, [f"s1k={cfg}", "s2k=preset:fa3"], default="preset:default")
    assert srcs["s1k"].config == load_preset("static")
    assert srcs["s1k"].source == {"kind": "file", "path": str(cfg)}
    assert srcs["s2k"].source == {"kind": "preset", "name": "fa3"}
    with pytest.raises(DispatchError, match="no config for buckets s2k, s4k, s8k"):
        dispatch.table_for_workload(w, dispatch.bucket_sources(w, [f"s1k={cfg}"]))
    with pytest.raises(FaTuneError, match="has no bucket 'nope'; its buckets: s1k"):
        dispatch.bucket_sources(w, ["nope=preset:default"])
    with pytest.raises(DispatchError, match="write NAME=SOURCE"):
        dispatch.bucket_sources(w, ["s1k"])
    with pytest.raises(DispatchError, match="given twice"):
        dispatch.bucket_sources(w, ["s1k=preset:default", "s1k=preset:fa3"])
    with pytest.raises(DispatchError, match="no such file"):
        dispatch.bucket_sources(w, ["s1k=missing.yaml"])
    with pytest.raises(DispatchError, match="write_lse: false"):
        dispatch.check_entry_config("s1k", KernelConfig(write_lse=False), ProblemClass())



def _study_with_trial(name: str, cfg: KernelConfig, shapes: dict) -> None:
    url = default_storage_url(name)
    open_storage(url)
    st = optuna.create_study(study_name=name, storage=url, direction="maximize")
    t = st.ask()
    t.set_user_attr("config", cfg.to_dict())
    t.set_user_attr("config_id", cfg.config_id())
    t.set_user_attr("confirmed", {"geomean_tflops": 600.0, "shapes": shapes})
    st.tell(t, 600.0)


def test_study_sources(studies: Path) -> None:
    w = workload_from_dict(TWO)
    ms = {"median_ms": 3.3, "tflops": 660.0, "gate": "pass"}
    _study_with_trial("two-long", load_preset("multicast"), {"1x32/8x8192": ms})
    _study_with_trial("other", load_preset("static"), {"1x32/8x8192:full": ms})
    srcs = dispatch.bucket_sources(w, study_prefix="two-", default="preset:default")
    assert srcs["long"].source["kind"] == "study" and srcs["long"].source["trial"] == 0
    assert srcs["long"].config == load_preset("multicast")
    assert srcs["long"].measured == {"protocol": "confirmed (full)",
                                     "1x32/8x8192": {"median_ms": 3.3, "tflops": 660.0}}
    assert srcs["short"].source == {"kind": "preset", "name": "default"}  # no study two-short
    t = dispatch.table_for_workload(w, srcs)
    assert t.entries[1].problems == ("1x32/8x8192",)
    assert DispatchTable.from_dict(json.loads(t.dumps())) == t
    with pytest.raises(DispatchError, match="measured on D 128, non-causal problems"):
        dispatch.bucket_sources(w, ["long=study:other"])
    with pytest.raises(FaTuneError, match="unknown study"):
        dispatch.bucket_sources(w, ["long=study:nope"])
    # Through the CLI: each bucket's results come from its trial.
    wfile = studies / "two.yaml"
    wfile.write_text(yaml.safe_dump(TWO))
    out = studies / "lib"
    r = runner.invoke(app, ["export", "--workload", str(wfile), "--study-prefix", "two-",
                            "--default", "preset:default", "--no-build", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "long: S >= 2049, " in r.output and "(study two-long, trial 0)" in r.output
    res = json.loads((out / "results.json").read_text())["buckets"]
    assert res["long"]["source"]["study"] == "two-long"
    assert res["long"]["results"]["confirmed"]["shapes"]["1x32/8x8192"]["tflops"] == 660.0
    assert res["short"]["results"]["status"] == "not measured"
    assert "| long | 32/8 | >= 2049 |" in (out / "README.md").read_text()


# ---- the generated dispatcher, with stub buckets -------------------------------------------------
@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> tuple[ctypes.CDLL, DispatchTable]:
    t = _table(s8k="preset:multicast")
    so = build_stub_library(t, tmp_path_factory.mktemp("stub"))
    lib = ctypes.CDLL(str(so))
    for fn in ("fa_tune_last_error", "fa_tune_problem_class", "fa_tune_config_json",
               "fa_tune_dispatch_json"):
        getattr(lib, fn).restype = ctypes.c_char_p
    vp, ci = ctypes.c_void_p, ctypes.c_int
    lib.fa_tune_forward.argtypes = [vp] * 5 + [ci] * 4 + [ctypes.c_float, vp]
    lib.fa_tune_prepare.argtypes = [ci] * 4 + [vp, ctypes.POINTER(ctypes.c_double)]
    lib.fa_tune_forward_varlen.argtypes = ([vp] * 6 + [ci] * 5
                                           + [ctypes.c_float, vp, ctypes.c_size_t, vp])
    lib.fa_tune_varlen_workspace_bytes.argtypes = [ci] * 4
    lib.fa_tune_varlen_workspace_bytes.restype = ctypes.c_size_t
    lib.stub_varlen.restype = ctypes.c_longlong
    return lib, t


def test_dispatcher_selects_like_the_table(stub) -> None:
    lib, t = stub
    assert lib.fa_tune_abi_version() == 2 and lib.fa_tune_bucket_count() == 4
    for hq, hkv in ((32, 8), (32, 4), (64, 8)):
        for s in (1, 777, 1024, 1025, 2048, 2049, 4096, 4097, 8192, 8193, 1 << 20):
            assert lib.fa_tune_bucket_for(2, hq, hkv, s) == t.index_for(hq, hkv, s), (hq, hkv, s)
    assert json.loads(lib.fa_tune_dispatch_json()) == json.loads(t.dumps())
    # varlen: some bucket serves it (s1k and s2k; see test_dispatcher_routes_varlen)
    assert json.loads(lib.fa_tune_problem_class()) == {"head_dim": 128, "causal": True,
                                                       "varlen": True}
    conf = json.loads(lib.fa_tune_config_json())
    assert conf["dispatch"] == "llama3-8b" and conf["write_lse"] is True
    assert [b["prefix"] for b in conf["buckets"]] == [f"fa_tune_b{i}_" for i in range(4)]
    assert conf["buckets"][3]["config"] == load_preset("multicast").to_dict()
    assert lib.fa_tune_smem_bytes() == 4000  # the largest stub bucket's


def test_dispatcher_forwards_and_reports(stub) -> None:
    lib, _ = stub
    for s, bucket in ((100, 0), (3000, 2), (8192, 3)):
        assert lib.fa_tune_forward(None, None, None, None, None, 1, 32, 8, s, 0.0, None) == 0
        assert lib.stub_last_bucket() == bucket and lib.fa_tune_last_error() == b""
    ms = ctypes.c_double(-1)
    assert lib.fa_tune_prepare(1, 32, 8, 1500, None, ctypes.byref(ms)) == 0
    assert lib.stub_last_bucket() == 1 and ms.value == 0.5
    # A bucket's failure comes back with its code and message, named by bucket.
    assert lib.fa_tune_forward(None, None, None, None, None, 1, 32, 8, 777, 0.0, None) == 1
    assert lib.fa_tune_last_error() == b"bucket s1k: stub says no"
    # No bucket: cudaErrorNotSupported and what the library serves; no bucket is called.
    calls = lib.stub_calls()
    assert lib.fa_tune_forward(None, None, None, None, None, 1, 64, 8, 100, 0.0, None) == 801
    assert lib.stub_calls() == calls
    err = lib.fa_tune_last_error().decode()
    assert err.startswith("no bucket of this library serves B=1 Hq=64 Hkv=8 S=100; it serves "
                          "Hq=32 Hkv=8: S 1..1024 (s1k)")
    assert lib.fa_tune_prepare(1, 32, 8, 9000, None, ctypes.byref(ms)) == 801 and ms.value == 0
    assert lib.fa_tune_forward(None, None, None, None, None, 1, 32, 8, 100, 0.0, None) == 0
    assert lib.fa_tune_last_error() == b""  # a success clears it


def _varlen(lib: ctypes.CDLL, max_seqlen: int, hkv: int = 8, num_seqs: int = 3) -> int:
    return lib.fa_tune_forward_varlen(0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, num_seqs,
                                      5000, max_seqlen, 32, hkv, 0.125, 0x7000, 4096, 0xABC)


def test_dispatcher_routes_varlen(stub) -> None:
    """By (Hq, Hkv, max_seqlen), as fixed length by S. The stub's s1k and s2k serve varlen, s4k
    is an object from before varlen (no functions), s8k has them without the kernel (a config
    that cannot serve varlen)."""
    lib, t = stub
    for max_seqlen, bucket in ((1, 0), (1024, 0), (1025, 1), (2048, 1)):
        assert _varlen(lib, max_seqlen) == 0, max_seqlen
        assert lib.stub_last_bucket() == bucket and lib.fa_tune_last_error() == b""
        assert lib.fa_tune_bucket_for(1, 32, 8, max_seqlen) == bucket
    # Every argument reaches the bucket as given.
    assert [lib.stub_varlen(j) for j in range(15)] == [
        0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x7000, 0xABC, 3, 5000, 2048, 32, 8,
        125, 4096]
    assert _varlen(lib, 100, num_seqs=0) == 1  # the bucket's own failure, named
    assert lib.fa_tune_last_error() == b"bucket s1k: num_seqs must be positive"
    calls = lib.stub_calls()
    assert _varlen(lib, 3000) == 801 and lib.stub_calls() == calls  # s4k: nothing to call
    assert lib.fa_tune_last_error() == (b"bucket s4k: its kernel was built before the varlen "
                                        b"entry points (export the library again)")
    assert _varlen(lib, 8192) == 801  # s8k: the bucket's own refusal
    assert lib.fa_tune_last_error() == b"bucket s8k: built without the varlen kernel (stub)"
    for max_seqlen, hkv in ((9000, 8), (100, 4)):
        assert _varlen(lib, max_seqlen, hkv) == 801
        assert lib.fa_tune_last_error().decode().startswith(
            f"no bucket of this library serves varlen Hq=32 Hkv={hkv} max_seqlen={max_seqlen}; "
            "it serves Hq=32 Hkv=8: S 1..1024 (s1k)")
    calls = lib.stub_calls()
    assert _varlen(lib, 0) == 1 and lib.stub_calls() == calls  # cudaErrorInvalidValue
    assert lib.fa_tune_last_error() == b"max_seqlen must be positive (the longest sequence), got 0"
    # The workspace of the bucket max_seqlen picks (stub: 1000 * (index + 1) + num_seqs); 0
    # where none serves, or the bucket says the arguments are invalid.
    ws = lib.fa_tune_varlen_workspace_bytes
    assert [ws(3, 32, 5000, m) for m in (1, 1024, 2048, 3000, 8192, 9000)] == [
        1003, 1003, 2003, 0, 4003, 0]
    assert ws(3, 64, 5000, 100) == 0 and ws(0, 32, 5000, 100) == 0


def _library_module():
    """tuner/fa_tune_ops/library.py alone: it needs neither torch nor fa-tune (the package's
    __init__ imports torch)."""
    import importlib.util

    path = Path(dispatch.__file__).parent / "fa_tune_ops" / "library.py"
    spec = importlib.util.spec_from_file_location("fa_tune_ops_library", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_exported_binding_reads_varlen(stub) -> None:
    lib_mod = _library_module()
    lib, _ = stub
    L = lib_mod.Library(lib._name)
    assert L.varlen is True and L.forward_varlen is not None
    assert int(L.varlen_workspace_bytes(2, 32, 100, 1500)) == 2002
    assert L.varlen_missing() is None and L.varlen_missing(0) is None
    assert L.varlen_missing(1) is None
    assert L.varlen_missing(2) == ("bucket s4k of libfa_tune_fwd.so cannot run varlen: it was "
                                   "built without the varlen kernel (fa-tune export leaves it "
                                   "out where the config cannot serve varlen: its README says "
                                   "why)")
    assert L.varlen_missing(3) == ("bucket s8k of libfa_tune_fwd.so cannot run varlen: it was "
                                   "built without the varlen kernel (fa-tune export leaves it "
                                   "out where the config cannot serve varlen: its README says "
                                   "why)")


# ---- fa-tune export --workload (no build) ------------------------------------------------------
def test_export_workload_sources(two_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "lib"
    r = runner.invoke(app, ["export", "--workload", str(two_file), "--bucket",
                            "long=preset:multicast", "--default", "preset:default", "--no-build",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "sources (not built: run build.sh)" in r.output
    for rel in ("build.sh", "dispatch.cu", "dispatch.json", "include/fa_tune.h",
                "buckets/short/kernel.cu", "buckets/long/kernel.cu", "configs/long.yaml",
                "fa_tune/entry.cuh", "workload.yaml", "results.json", "README.md",
                "fa_tune_ops/__init__.py", "fa_tune_ops/op.py", "fa_tune_ops/hf.py",
                "fa_tune_ops/library.py"):
        assert (out / rel).is_file(), rel
    assert not (out / "lib").exists()
    t = DispatchTable.load(out / "dispatch.json")
    assert [e.bucket for e in t.entries] == ["short", "long"]
    assert KernelConfig.load(out / "configs" / "long.yaml") == load_preset("multicast")
    sh = (out / "build.sh").read_text()
    assert '"short fa_tune_b0_" "long fa_tune_b1_"' in sh and "-DFA_TUNE_API_PREFIX" in sh
    assert " -shared" not in sh.split("KERNEL_FLAGS=(")[1].split(")")[0]
    # Every bucket is rendered with the varlen kernel (multicast too: its clusters share tasks).
    assert '"$NVCC" "${KERNEL_FLAGS[@]}" -DFA_TUNE_API_PREFIX="$2" -c' in sh
    for b in ("short", "long"):
        assert "#define FA_TUNE_VARLEN 1" in (out / "buckets" / b / "kernel.cu").read_text()
    res = json.loads((out / "results.json").read_text())
    assert res["buckets"]["long"]["results"]["status"] == "not measured"
    readme = (out / "README.md").read_text()
    assert "fa_tune_varlen_workspace_bytes" in readme and "fa_tune_b1_" in readme
    assert "| long | 32/8 | >= 2049 | `fa_tune_b1_` | " in readme
    assert " | yes | preset multicast |" in readme
    header = (out / "include" / "fa_tune.h").read_text()
    assert "void* workspace," in header and "size_t fa_tune_varlen_workspace_bytes" in header
    # The table exports again by itself, to the same sources.
    out2 = tmp_path / "again"
    r = runner.invoke(app, ["export", "--table", str(out / "dispatch.json"), "--no-build",
                            "--out", str(out2)])
    assert r.exit_code == 0, r.output
    assert (out2 / "dispatch.cu").read_text() == (out / "dispatch.cu").read_text()


@pytest.mark.parametrize("argv, needle", [
    (["--workload", "llama3-8b", "--study", "s"], "--study/--trial export one kernel"),
    (["--bucket", "a=preset:default"], "go with --workload or --table"),
    (["--workload", "llama3-8b"], "no config for buckets s1k, s2k, s4k, s8k"),
    (["--workload", "llama3-8b", "--bucket", "s9=preset:default"], "has no bucket 's9'"),
    (["--workload", "nope"], "no workload file 'nope'"),
    (["--workload", "llama3-8b", "--default", "preset:nope"], "unknown preset 'nope'"),
    (["--table", "missing.json"], "cannot read dispatch table"),
    (["--table", "x.json", "--workload", "llama3-8b"], "give it alone"),
])
def test_export_workload_wrong_input_one_line(argv: list[str], needle: str,
                                              tmp_path: Path) -> None:
    r = runner.invoke(app, ["export", *argv, "--no-build", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    assert needle in one_error_line(r.output)
    assert not (tmp_path / "o").exists()


def test_dispatcher_comments_cannot_swallow_code() -> None:
    # A source text ending in a backslash would splice the next bucket row into the comment.
    assert dispatch._comment("file C:\\cfg\\\nx\u00e9") == "file C:?cfg??x?"
    t = _table()
    src = dispatch.dispatcher_source(t)
    rows = [ln for ln in src.splitlines() if ln.lstrip().startswith('{"s')]
    assert len(rows) == 4 and all("fa_tune_b" in r for r in rows)
