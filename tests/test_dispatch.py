"""Dispatch tables (round trip, selection by query and key length, consistency), bucket config
sources (presets, files, studies), the generated dispatcher on the C ABI (compiled with stub
buckets that record the argument struct: no kernel, a few seconds), and `fa-tune export
--workload` (sources only here; tests/test_workload_export.py builds kernels)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import subprocess
from pathlib import Path

import optuna
import pytest
import yaml
from cli_helpers import one_error_line
from dispatch_stub import HEADER_DIR, TWO, build_stub_library, last_args
from typer.testing import CliRunner

from tuner.cli import app
from tuner.errors import FaTuneError
from tuner.kernel.config import KernelConfig, load_preset
from tuner.kernel.runtime import abi
from tuner.problem import Problem, ProblemClass
from tuner.search.study import default_storage_url, open_storage
from tuner.ship import dispatch, dispatcher_cpp
from tuner.ship.dispatch import DispatchEntry, DispatchError, DispatchTable
from tuner.ship.workload import load_workload, workload_from_dict

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
    assert d["problem_class"] == {"head_dim": 128, "causal": True}
    assert d["abi_version"] == abi.ABI_VERSION
    assert d["schema"] == 2
    assert [e["bucket"] for e in d["entries"]] == ["s1k", "s2k", "s4k", "s8k"]
    assert all(e["k_min"] is None and e["k_max"] is None for e in d["entries"])
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
    # Without key ranges a call is served by its query length, over any key length: a chunk
    # of a chunked prefill, a decode step, non-causal fewer keys.
    assert [t.index_for(32, 8, 2048, k) for k in (1, 2048, 8192, 10**6)] == [1, 1, 1, 1]
    assert t.select("1x32/8x2048:k8192").bucket == "s2k"
    assert t.select("32/8x[2048:8192,512:4096*2]").bucket == "s2k"  # by max_seqlen_q


CHUNKED = {
    "name": "chunked",
    "attention": {"Hq": 32, "Hkv": 8, "head_dim": 128, "causal": True},
    "buckets": [{"name": "s2k", "max_s": 2048}, {"name": "s8k", "max_s": 8192},
                {"name": "chunk2k", "max_s": 2048, "k": {"min": 4096, "max": 16384}},
                {"name": "tail", "min_s": 4096, "max_s": None, "k": {"min": 65536}}],
    "traffic": {"shapes": [{"S": 2048, "Sk": 8192, "weight": 3}, {"S": 1024},
                           {"S": 8192}]},
}


def _chunked_table() -> DispatchTable:
    w = workload_from_dict(CHUNKED)
    return dispatch.table_for_workload(w, dispatch.bucket_sources(w, default="preset:default"))


def test_key_range_buckets_take_chunked_prefill() -> None:
    """Key-range buckets come first in dispatch order and take their (S_q, S_k) part of the
    query-length chain's calls; the rest stays with the chain."""
    t = _chunked_table()
    assert [e.bucket for e in t.entries] == ["chunk2k", "tail", "s2k", "s8k"]
    assert (t.entries[0].k_min, t.entries[0].k_max) == (4096, 16384)
    assert (t.entries[1].s_min, t.entries[1].s_max, t.entries[1].k_max) == (4096, None, None)
    cases = {(2048, 8192): "chunk2k", (2048, 2048): "s2k", (1, 4096): "chunk2k",
             (2048, 16385): "s2k", (2049, 8192): "s8k", (4096, 70000): "tail",
             (8192, 8192): "s8k", (9000, 9000): None}
    for (sq, sk), want in cases.items():
        i = t.index_for(32, 8, sq, sk)
        assert (t.entries[i].bucket if i >= 0 else None) == want, (sq, sk)
    assert t.select("1x32/8x2048:k8192").bucket == "chunk2k"
    assert "S 1..2048, k 4096..16384 (chunk2k)" in t.serves_text()
    assert t.entries[0].problems == ("1x32/8x2048:k8192",)  # tuned on its traffic
    assert t.entries[1].problems == ("1x32/8x4096:k65536",)  # no traffic: its edge
    assert DispatchTable.from_dict(json.loads(t.dumps())) == t
    # A schema-1 table (before key ranges) still loads: any key length.
    d = _table().to_dict()
    d["schema"] = 1
    for e in d["entries"]:
        del e["k_min"], e["k_max"]
    assert DispatchTable.from_dict(d) == _table()


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
    # Key ranges: a key-range entry may precede an any-key one it overlaps, not follow it;
    # two key-range entries overlap only if both ranges do.
    keyed = _entry("c", 1, 2048, k_min=4096, k_max=None)
    DispatchTable("t", (keyed, _entry("a", 1, 100), _entry("b", 101, None)))
    with pytest.raises(DispatchError, match="put c first"):
        DispatchTable("t", (_entry("a", 1, 100), keyed))
    DispatchTable("t", (keyed, _entry("d", 1, 2048, k_min=100, k_max=4095)))
    with pytest.raises(DispatchError, match="overlap"):
        DispatchTable("t", (keyed, _entry("d", 2048, 4096, k_min=5000, k_max=6000)))
    with pytest.raises(DispatchError, match="k_max 10 < k_min 20"):
        DispatchTable("t", (_entry("d", 1, 10, k_min=20, k_max=10),))


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(schema=7), "schema 7"),
    (lambda d: d["entries"][0].pop("s_min"), "missing 's_min'"),
    (lambda d: d["entries"][0].update(Hq="32"), "expected an integer"),
    (lambda d: d["entries"][0].update(config_id="abc"), "does not match its config"),
    (lambda d: d["entries"][1].update(s_min=1000), "overlap"),
    (lambda d: d["entries"][1].update(k_max=5), "k_max without k_min"),
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
    abi.bind(lib)
    for i in range(4):
        getattr(lib, f"fa_tune_b{i}_problem_class").restype = ctypes.c_char_p
    lib.stub_last_stream.restype = ctypes.c_void_p
    return lib, t


def _args(**kw) -> abi.Args:
    """A call's struct: Llama-3-8B heads, B=1, S_q = S_k = 1024, fake pointers."""
    base = dict(q=0x1000, k=0x2000, v=0x3000, o=0x4000, lse=0x5000, batch=1, heads_q=32,
                heads_kv=8, head_dim=128, seqlen_q=1024, seqlen_k=1024, causal=1)
    return abi.make_args(**{**base, **kw})


def _forward(lib: ctypes.CDLL, **kw) -> int:
    return lib.fa_tune_forward(ctypes.byref(_args(**kw)), ctypes.c_void_p(0xABC))


def test_dispatcher_selects_like_the_table(stub) -> None:
    lib, t = stub
    assert lib.fa_tune_abi_version() == abi.ABI_VERSION and lib.fa_tune_bucket_count() == 4
    for hq, hkv in ((32, 8), (32, 4), (64, 8)):
        for s in (1, 777, 1024, 1025, 2048, 2049, 4096, 4097, 8192, 8193, 1 << 20):
            for sk in (s, 1, 8192):
                a = _args(heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=sk)
                assert lib.fa_tune_bucket_for(ctypes.byref(a)) == t.index_for(hq, hkv, s, sk)
    assert json.loads(lib.fa_tune_dispatch_json()) == json.loads(t.dumps())
    # varlen: some bucket serves it (s1k and s2k; see test_dispatcher_routes_device_metadata)
    assert json.loads(lib.fa_tune_problem_class()) == {"head_dim": 128, "causal": True,
                                                       "varlen": True}
    conf = json.loads(lib.fa_tune_config_json())
    assert conf["dispatch"] == "llama3-8b" and conf["write_lse"] is True
    assert [b["prefix"] for b in conf["buckets"]] == [f"fa_tune_b{i}_" for i in range(4)]
    assert conf["buckets"][3]["config"] == load_preset("multicast").to_dict()
    assert lib.fa_tune_smem_bytes() == 4000  # the largest stub bucket's


def test_dispatcher_forwards_the_struct_and_reports(stub) -> None:
    lib, _ = stub
    for s, sk, bucket in ((100, 100, 0), (3000, 3000, 2), (8192, 8192, 3), (2048, 8192, 1),
                          (64, 1 << 20, 0)):
        assert _forward(lib, seqlen_q=s, seqlen_k=sk) == 0
        assert lib.stub_last_bucket() == bucket and lib.fa_tune_last_error() == b""
    # The bucket gets the caller's struct as it is, and the stream.
    a = _args(q_stride=(8 * 2**20, 4096, 128), k_stride=(2**24, 128, 2**20),
              v_stride=(2**24, 128, 2**20), seqlen_q=2048, seqlen_k=8192, softmax_scale=0.125)
    assert lib.fa_tune_forward(ctypes.byref(a), ctypes.c_void_p(0xABC)) == 0
    got = last_args(lib)
    assert bytes(got) == bytes(a) and lib.stub_last_stream() == 0xABC
    ms = ctypes.c_double(-1)
    assert lib.fa_tune_prepare(ctypes.byref(_args(seqlen_q=1500, seqlen_k=1500)),
                               ctypes.byref(ms)) == 0
    assert lib.stub_last_bucket() == 1 and ms.value == 0.5
    # A bucket's failure comes back with its code and message, named by bucket.
    assert _forward(lib, seqlen_q=777, seqlen_k=777) == 1
    assert lib.fa_tune_last_error() == b"bucket s1k: stub says no"
    # No bucket: cudaErrorNotSupported and what the library serves; no bucket is called.
    calls = lib.stub_calls()
    assert _forward(lib, heads_q=64, seqlen_q=100, seqlen_k=100) == 801
    assert lib.stub_calls() == calls
    err = lib.fa_tune_last_error().decode()
    assert err.startswith("no bucket of this library serves B=1 Hq=64 Hkv=8 S_q=100 S_k=100; it "
                          "serves Hq=32 Hkv=8: S 1..1024 (s1k)")
    assert lib.fa_tune_prepare(ctypes.byref(_args(seqlen_q=9000, seqlen_k=9000)),
                               ctypes.byref(ms)) == 801 and ms.value == 0
    assert _forward(lib, seqlen_q=0) == 1  # cudaErrorInvalidValue, before any bucket
    assert lib.fa_tune_last_error().startswith(b"seqlen_q and seqlen_k (max_seqlen_q")
    assert lib.stub_calls() == calls
    assert _forward(lib) == 0 and lib.fa_tune_last_error() == b""  # a success clears it


def test_dispatcher_refuses_another_abi_in_one_line(stub) -> None:
    lib, _ = stub
    calls = lib.stub_calls()
    for change in ({"abi_version": 2}, {"struct_bytes": ctypes.sizeof(abi.Args) - 8}):
        a = _args()
        for name, value in change.items():
            setattr(a, name, value)
        assert lib.fa_tune_forward(ctypes.byref(a), None) == 1  # cudaErrorInvalidValue
        err = lib.fa_tune_last_error().decode()
        assert err.startswith(f"args of C ABI {a.abi_version} ({a.struct_bytes} bytes); this "
                              f"library speaks C ABI {abi.ABI_VERSION} "
                              f"({ctypes.sizeof(abi.Args)} bytes): "
                              "rebuild the caller") and "\n" not in err
        assert lib.fa_tune_bucket_for(ctypes.byref(a)) == -1
        assert lib.fa_tune_workspace_bytes(ctypes.byref(a)) == 0
    assert lib.fa_tune_forward(None, None) == 1
    assert lib.fa_tune_last_error() == b"args must be non-null"
    assert lib.stub_calls() == calls


def test_dispatcher_refuses_a_bucket_of_another_abi(tmp_path: Path) -> None:
    t = _table(s8k="preset:multicast")
    lib = ctypes.CDLL(str(build_stub_library(t, tmp_path, defines=("STUB_B3_ABI=2",))))
    abi.bind(lib)
    assert _forward(lib, seqlen_q=8000, seqlen_k=8000) == 801
    assert lib.fa_tune_last_error() == (b"bucket s8k: its kernel speaks C ABI 2, this "
                                        b"dispatcher %d (export the library again)"
                                        % abi.ABI_VERSION)
    assert _forward(lib, seqlen_q=100, seqlen_k=100) == 0  # the others still serve


def _meta(lib: ctypes.CDLL, **kw) -> int:
    """A call with device metadata: 3 packed sequences, 5000 query and 9000 key rows."""
    base = dict(cu_seqlens_q=0x6000, cu_seqlens_k=0x6100, batch=3, total_q=5000,
                total_k=9000, seqlen_q=2048, seqlen_k=4096, workspace=0x7000,
                workspace_bytes=4096, status=0x8000, softmax_scale=0.125)
    return _forward(lib, **{**base, **kw})


def test_dispatcher_routes_device_metadata(stub) -> None:
    """By (Hq, Hkv, max_seqlen_q, max_seqlen_k), as fixed length by (S_q, S_k). The stub's s1k
    and s2k serve varlen, s4k and s8k were built without it (801, said by the dispatcher
    before any bucket is called)."""
    lib, t = stub
    for max_q, bucket in ((1, 0), (1024, 0), (1025, 1), (2048, 1)):
        assert _meta(lib, seqlen_q=max_q) == 0, max_q
        assert lib.stub_last_bucket() == bucket and lib.fa_tune_last_error() == b""
    got = last_args(lib)  # every field reaches the bucket as given
    assert (got.cu_seqlens_q, got.cu_seqlens_k, got.total_q, got.total_k, got.status,
            got.workspace, got.workspace_bytes) == (0x6000, 0x6100, 5000, 9000, 0x8000, 0x7000,
                                                    4096)
    calls = lib.stub_calls()
    for max_q, name in ((3000, "s4k"), (8192, "s8k")):
        assert _meta(lib, seqlen_q=max_q, seqlen_k=8192) == 801
        assert lib.fa_tune_last_error().decode().startswith(
            f"bucket {name}: its kernel was built without the varlen kernel, which serves calls "
            "with device metadata (cu_seqlens_q, cu_seqlens_k, seqused_k, block_table)")
    for fields in ({"cu_seqlens_q": None, "cu_seqlens_k": None, "seqused_k": 0x6200},
                   {"cu_seqlens_k": None}):  # a cache's seqused_k alone; packed q over a cache
        assert _meta(lib, seqlen_q=3000, seqlen_k=8192, **fields) == 801
    assert lib.stub_calls() == calls
    assert _meta(lib, seqlen_q=100, heads_kv=4) == 801
    assert lib.fa_tune_last_error().decode().startswith(
        "no bucket of this library serves a call with device metadata, Hq=32 Hkv=4 "
        "max_seqlen_q=100 max_seqlen_k=4096; it serves Hq=32 Hkv=8: S 1..1024 (s1k)")
    # The workspace of the bucket the call picks (stub: 1000 * (index + 1) + batch); 0 where
    # none serves, for a bucket without varlen, or for a fixed-length call.
    ws = lib.fa_tune_workspace_bytes
    meta = dict(cu_seqlens_q=0x6000, batch=3, total_q=5000, seqlen_k=4096)
    assert [ws(ctypes.byref(_args(seqlen_q=m, **meta))) for m in (1, 1024, 2048, 3000, 9000)] \
        == [1003, 1003, 2003, 0, 0]
    assert ws(ctypes.byref(_args())) == 0


def _library_module():
    """tuner/ship/fa_tune_ops/library.py (and the abi.py it imports) without the package's
    __init__, which imports torch: the binding needs neither torch nor fa-tune."""
    import importlib
    import sys
    import types

    name = "fa_tune_ops_no_torch"
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(Path(dispatch.__file__).parent / "fa_tune_ops")]
        sys.modules[name] = pkg
    return importlib.import_module(f"{name}.library")


def test_exported_binding_reads_the_library(stub) -> None:
    lib_mod = _library_module()
    lib, _ = stub
    L = lib_mod.Library(lib._name)
    assert L.varlen is True and L.head_dim == 128 and L.causal is True
    assert [L.bucket_for(32, 8, s, k) for s, k in ((100, 100), (2048, 8192), (9000, 9000))] \
        == [0, 1, -1]
    assert L.varlen_missing() is None and L.varlen_missing(0) is None
    assert L.varlen_missing(1) is None
    for i, name in ((2, "s4k"), (3, "s8k")):
        assert L.varlen_missing(i) == (
            f"bucket {name} of libfa_tune_fwd.so cannot run varlen: it was built without the "
            "varlen kernel (fa-tune export leaves it out where the config cannot serve varlen: "
            "its README says why)")
    assert L.serves_text().startswith("Hq=32 Hkv=8 S 1..1024 (s1k); Hq=32 Hkv=8 S 1025..2048")


def test_exported_binding_refuses_another_abi(tmp_path: Path) -> None:
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lib_mod = _library_module()
    src = tmp_path / "old.c"
    src.write_text("int fa_tune_abi_version(void) { return 2; }\n")
    so = tmp_path / "libold.so"
    import subprocess

    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    with pytest.raises(lib_mod.LibraryError) as e:
        lib_mod.Library(so)
    assert str(e.value) == (f"{so} speaks fa-tune C ABI 2, this binding speaks "
                            f"{abi.ABI_VERSION}: rebuild or re-export the library")


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
    assert "fa_tune_workspace_bytes" in readme and "fa_tune_b1_" in readme
    assert f"## C ABI (version {abi.ABI_VERSION}; `include/fa_tune.h`)" in readme
    assert "| long | 32/8 | >= 2049 | `fa_tune_b1_` | " in readme
    assert " | yes | preset multicast |" in readme
    # The header shipped is the one the kernels and the dispatcher are compiled against.
    header = (out / "include" / "fa_tune.h").read_text()
    assert header == (HEADER_DIR / "fa_tune.h").read_text()
    assert header == (out / "fa_tune" / "fa_tune.h").read_text()
    assert '#include "fa_tune.h"' in (out / "dispatch.cu").read_text()
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
    (["--workload", "llama3-8b", "--study-prefix", "nope-"],
     "no study nope-<bucket> for buckets s1k, s2k, s4k, s8k of workload 'llama3-8b': tune them"),
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
    assert dispatcher_cpp._comment("file C:\\cfg\\\nx\u00e9") == "file C:?cfg??x?"
    t = _table()
    src = dispatcher_cpp.dispatcher_source(t)
    rows = [ln for ln in src.splitlines() if ln.lstrip().startswith('{"s')]
    assert len(rows) == 4 and all("fa_tune_b" in r for r in rows)


def test_a_kinds_library_exports_from_its_studies_each_bucket_for_its_kind(
        studies: Path) -> None:
    """gpt-oss-20b tuned by `tune`: each full bucket's trials ran on full problems, and the
    export refused them against the library's window class. Each bucket's kernel is now built
    for its kind's class: the full ones without the window they never use (it cost them 1.2 %,
    docs/PERF.md step 81), while the library still serves both kinds."""
    from tuner.ship.workload import load_workload

    ms = {"median_ms": 1.0, "tflops": 500.0, "gate": "pass"}
    _study_with_trial("gpt-oss-20b-full-s2k", load_preset("d64"), {"1x64/8x2048:d64:sinks": ms})
    _study_with_trial("gpt-oss-20b-window-s2k", load_preset("d64-window-packed"),
                      {"1x64/8x2048:d64:w128:sinks": ms})
    w = load_workload("gpt-oss-20b")
    full, win = w.bucket("full-s2k"), w.bucket("window-s2k")
    assert not w.bucket_class(full).window and w.bucket_class(win).window
    assert w.bucket_class(full).sinks and w.problem_class.window
    srcs = dispatch.bucket_sources(w, study_prefix="gpt-oss-20b-", default="preset:d64")
    assert srcs["full-s2k"].source["kind"] == srcs["window-s2k"].source["kind"] == "study"
    t = dispatch.table_for_workload(w, srcs)
    masks = {e.bucket: e.masks for e in t.entries}
    assert masks["full-s32k"] == ("sinks",) and masks["window-s32k"] == ("window", "sinks")
    assert t.problem_class == w.problem_class
    assert DispatchTable.from_dict(json.loads(t.dumps())) == t
    out = studies / "lib"
    r = runner.invoke(app, ["export", "--workload", "gpt-oss-20b", "--study-prefix",
                            "gpt-oss-20b-", "--default", "preset:d64", "--no-build",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    for e in t.entries:
        src = (out / "buckets" / e.bucket / "kernel.cu").read_text()
        assert ("static constexpr bool window = true;" in src) == bool(e.window), e.bucket
    # A bucket that may be handed a windowed call must carry the window.
    bad = [dataclasses.replace(e, window=None) if e.bucket == "full-s2k" else e
           for e in t.entries]
    with pytest.raises(DispatchError, match="bucket full-s2k has no window in its masks"):
        DispatchTable("x", tuple(bad))


def test_a_masked_workload_carries_its_class_into_the_table(tmp_path: Path) -> None:
    """gemma-2-9b: window and softcap. The table's entries carry the class (into dispatch.json
    and back), the problems they are tuned on have the masks, and select() takes a problem with
    or without a window (one window library serves local and global layers) but not one
    without the cap the library needs."""
    from tuner.ship.workload import load_workload

    w = load_workload("gemma-2-9b")
    t = dispatch.table_for_workload(w, dispatch.bucket_sources(w, default="preset:d256"))
    assert t.problem_class.window and t.problem_class.softcap and not t.problem_class.sinks
    # Two kinds of layers: the local ones' buckets tuned with the window, the global ones' not.
    assert all(":w4096:cap50" in p for e in t.entries if e.window for p in e.problems)
    assert all(":w" not in p and ":cap50" in p for e in t.entries if e.window == 0
               for p in e.problems)
    d = t.to_dict()
    assert d["problem_class"] == {"head_dim": 256, "causal": True, "window": True,
                                  "softcap": True}
    assert d["entries"][0]["masks"] == ["window", "softcap"] and d["entries"][0]["window"] == 4096
    assert DispatchTable.load(t.save(tmp_path / "d.json")) == t
    assert t.select("1x16/8x2048:d256:w4096:cap50") is not None
    assert t.select("1x16/8x2048:d256:cap50") is not None  # a global layer
    assert t.select("1x16/8x2048:d256") is None  # no cap: not this library's class
    assert "masks" not in _table().to_dict()["entries"][0]  # plain tables stay as they were


def test_kinds_of_layers_get_buckets_of_their_own(tmp_path: Path) -> None:
    """gpt-oss-20b's windowed and full layers: each bucket is made per kind and tuned on its
    kind's problems; the compiled dispatcher picks by the call's window as the table does, and a
    window no kind has is no bucket's."""
    from tuner.ship.workload import load_workload, workload_from_dict

    shipped = load_workload("gpt-oss-20b")
    assert [b.name for b in shipped.buckets][:4] == ["window-s2k", "window-s8k", "window-s32k",
                                                      "full-s2k"]
    d = shipped.to_dict()  # two buckets of each kind: the stub library holds four
    w = workload_from_dict({
        "name": "oss2", "attention": {"Hq": 64, "Hkv": 8, "head_dim": 64, "sinks": True},
        "layers": [{"name": "window", "window": 128, "count": 12}, {"name": "full", "count": 12}],
        "buckets": [{"name": "s2k", "max_s": 2048}, {"name": "s32k", "max_s": 32768}],
        "traffic": {"lengths": {1024: 1, 8192: 1}}})
    assert d["layers"][0] == {"name": "window", "window": 128, "count": 12}
    t = dispatch.table_for_workload(w, dispatch.bucket_sources(w, default="preset:d64"))
    assert [e.window for e in t.entries] == [128, 128, 0, 0]
    assert all(":w128:sinks" in p for p in t.entries[0].problems)
    assert all(":w" not in p and ":sinks" in p for p in t.entries[2].problems)
    assert DispatchTable.load(t.save(tmp_path / "d.json")) == t
    lib = ctypes.CDLL(str(build_stub_library(t, tmp_path / "lib")))
    abi.bind(lib)
    for s in (100, 2048, 5000, 32768):
        for window in (0, 128, 64):
            a = _args(heads_q=64, heads_kv=8, head_dim=64, seqlen_q=s, seqlen_k=s, window=window)
            assert lib.fa_tune_bucket_for(ctypes.byref(a)) == t.index_for(64, 8, s, s, window)
    assert t.index_for(64, 8, 100, 100, 64) == -1
    assert t.select("1x64/8x5000:d64:w128:sinks").bucket == "window-s32k"
    assert t.select("1x64/8x5000:d64:sinks").bucket == "full-s32k"


@pytest.mark.parametrize("masks", [{}, {"softcap": 50, "window": 512}, {"sinks": True}])
def test_the_export_checks_the_built_librarys_class(tmp_path: Path, masks: dict) -> None:
    """The export's last check reads the built library's dispatch table and class back (host
    only): a mask class's library says window / softcap / sinks true, and it must pass (it
    failed every mask workload before); a library whose class lacks a flag is refused."""
    import shutil

    from tuner.ship.export_workload import ExportError, _check_built_library

    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    wl = {**TWO, "attention": {**TWO["attention"], **masks}}
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(wl))
    workload = load_workload(tmp_path / "w.yaml")
    sources = {b.name: dispatch.resolve_source("preset:default", workload.problem_class)
               for b in workload.buckets}
    table = dispatch.table_for_workload(workload, sources)
    flags = {m: True for m in dispatch.MASKS if getattr(workload.problem_class, m)}

    def lib(name: str, pclass: dict) -> Path:
        pc = json.dumps({**pclass, "varlen": True})
        js = json.dumps(json.dumps(table.to_dict(), separators=(",", ":")))
        src, so = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
        src.write_text(f"int fa_tune_abi_version(void) {{ return {abi.ABI_VERSION}; }}\n"
                       f"int fa_tune_bucket_count(void) {{ return {len(table.entries)}; }}\n"
                       f"const char* fa_tune_dispatch_json(void) {{ return {js}; }}\n"
                       f"const char* fa_tune_problem_class(void) {{ return {json.dumps(pc)}; }}\n")
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
        return so

    _check_built_library(lib("ok", {"head_dim": 128, "causal": True, **flags}), table)
    if flags:
        with pytest.raises(ExportError, match="does not answer as dispatch.json says"):
            _check_built_library(lib("plain", {"head_dim": 128, "causal": True}), table)
