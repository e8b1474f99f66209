"""Workload files: the shipped ones, bucket selection, the tuning plan, and one clear line for
every malformed file (tuner/ship/workload.py, `fa-tune workload`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cli_helpers import one_error_line
from typer.testing import CliRunner

from tuner.cli import app
from tuner.errors import FaTuneError
from tuner.problem import Problem
from tuner.ship.workload import WorkloadError, load_workload, shipped_workloads, workload_from_dict

runner = CliRunner()

GOOD = {
    "name": "w",
    "attention": {"Hq": 32, "Hkv": 8, "head_dim": 128, "causal": True},
    "buckets": [{"name": "a", "max_s": 1024}, {"name": "b", "max_s": 4096},
                {"name": "c", "max_s": None}],
    "traffic": {"lengths": {512: 1, 1024: 1, 2048: 2, 16384: 1}, "batch": {1: 3, 4: 1},
                "shapes": [{"B": 2, "S": 1024, "weight": 2}]},
}


def test_shipped_llama_workloads() -> None:
    assert {"llama3-8b", "llama3-70b"} <= set(shipped_workloads())
    w8, w70 = load_workload("llama3-8b"), load_workload("llama3-70b")
    assert (w8.attention.Hq, w8.attention.Hkv, w8.attention.head_dim, w8.attention.causal) == (
        32, 8, 128, True)
    assert (w70.attention.Hq, w70.attention.Hkv, w70.attention.head_dim,
            w70.attention.causal) == (64, 8, 128, True)
    for w in (w8, w70):
        assert abs(sum(t.weight for t in w.traffic) - 1) < 1e-12
        assert [b.name for b in w.buckets] == ["s1k", "s2k", "s4k", "s8k"]
        assert all(w.bucket_for(t.S) is not None for t in w.traffic)
    # The benchmark problems are part of the 8B traffic and land in the top buckets.
    plans = {p.bucket.name: p.shapes for p in w8.plan()}
    assert "1x32/8x8192" in plans["s8k"] and "4x32/8x4096" in plans["s4k"]


def test_bucket_selection_edges() -> None:
    w = workload_from_dict(GOOD)
    assert [(b.name, b.s_min, b.s_max) for b in w.buckets] == [
        ("a", 1, 1024), ("b", 1025, 4096), ("c", 4097, None)]
    names = {s: (w.bucket_for(s).name if w.bucket_for(s) else None)
             for s in (1, 1024, 1025, 4096, 4097, 10**6)}
    assert names == {1: "a", 1024: "a", 1025: "b", 4096: "b", 4097: "c", 10**6: "c"}
    closed = workload_from_dict({**GOOD, "buckets": GOOD["buckets"][:2],
                                 "traffic": {"shapes": [{"S": 100}]}})
    assert closed.bucket_for(4097) is None and closed.bucket_for(0) is None


def test_plan_ranks_by_attention_time_and_keeps_max_problems() -> None:
    w = workload_from_dict({**GOOD, "tuning": {"max_problems": 2}})
    plans = {p.bucket.name: p for p in w.plan()}
    a = plans["a"]
    # In bucket a: (1,512) w=3, (4,512) w=1, (1,1024) w=3, (4,1024) w=1, (2,1024) w=2 (the
    # shape); time ~ weight * B * S^2: (4,1024) 4M, (2,1024) 4M, (1,1024) 3M ... ties by S, B.
    assert a.shapes == ["2x32/8x1024", "4x32/8x1024"]
    assert len(w.plan(1)[0].problems) == 1 and len(w.plan(5)[0].problems) == 5
    assert abs(sum(p.call_share for p in plans.values()) - 1) < 1e-12
    assert abs(sum(p.time_share for p in plans.values()) - 1) < 1e-12
    assert plans["c"].shapes == ["4x32/8x16384", "1x32/8x16384"]
    assert all(isinstance(x.problem, Problem) and x.problem.Hkv == 8 for x in a.problems)
    with pytest.raises(WorkloadError, match="at least 1"):
        w.plan(0)


def test_bucket_without_traffic_is_tuned_on_its_upper_edge() -> None:
    w = workload_from_dict({**GOOD, "traffic": {"shapes": [{"S": 100}]}})
    plans = {p.bucket.name: p for p in w.plan()}
    assert plans["b"].shapes == ["1x32/8x4096"] and plans["b"].call_share == 0.0
    assert plans["c"].shapes == ["1x32/8x4097"]


def _bad(**changes):
    d = {**GOOD, **changes}
    return {k: v for k, v in d.items() if v is not ...}


@pytest.mark.parametrize("data, needle", [
    (_bad(name=...), "missing 'name'"),
    (_bad(colour="red"), "unknown key colour"),
    (_bad(attention={"Hq": 32}), "attention needs Hkv"),
    (_bad(attention={"Hq": "32", "Hkv": 8}), "attention.Hq must be a positive integer"),
    (_bad(attention={"Hq": 32, "Hkv": 6}), "multiple of Hkv"),
    (_bad(attention={"Hq": 32, "Hkv": 8, "head_dim": 96}), "head dim D=96"),
    (_bad(attention={"Hq": 32, "Hkv": 8, "causal": "yes"}), "causal must be true or false"),
    (_bad(attention={"Hq": 32, "Hkv": 8, "heads": 3}), "unknown key heads in attention"),
    (_bad(buckets=[]), "non-empty list"),
    (_bad(buckets=[{"name": "a", "max_s": 10}, {"name": "a", "max_s": 20}]), "used twice"),
    (_bad(buckets=[{"name": "a", "max_s": 20}, {"name": "b", "max_s": 10}]), "must grow"),
    (_bad(buckets=[{"name": "a", "max_s": None}, {"name": "b", "max_s": 10}]), "only the last"),
    (_bad(buckets=[{"name": "a b", "max_s": 10}]), "name must be letters"),
    (_bad(buckets=[{"name": "a"}]), "needs max_s"),
    (_bad(buckets=[{"name": "a", "max_s": 2048}]), "S=16384 falls in no bucket"),
    (_bad(traffic={}), "traffic names no shapes"),
    (_bad(traffic={"batch": {1: 1}}), "traffic.batch needs traffic.lengths"),
    (_bad(traffic={"lengths": {512: -1}}), "must be a finite number >= 0"),
    (_bad(traffic={"lengths": {512: 0}}), "weights sum to 0"),
    (_bad(traffic={"lengths": {"long": 1}}), "traffic.lengths key 'long'"),
    (_bad(traffic={"shapes": [{"B": 1}]}), "traffic.shapes[0] needs S"),
    (_bad(traffic={"shapes": [{"S": 10**6, "B": 64}]}), "too large"),
    (_bad(tuning={"max_problems": 0}), "tuning.max_problems"),
    (_bad(traffic={"packed": {"lengths": "512"}}), "traffic.packed must be a list"),
    (_bad(traffic={"packed": [{"weight": 1}]}), "traffic.packed[0] needs lengths"),
    (_bad(traffic={"packed": [{"lengths": "512,x"}]}), "'x' is not a length"),
    (_bad(traffic={"packed": [{"lengths": [512, -3]}]}), "entries must be a positive integer"),
    (_bad(traffic={"packed": [{"lengths": "0,0"}]}), "at least one sequence of 1 token"),
    (_bad(traffic={"packed": [{"lengths": 512}]}), "must be sequence lengths"),
    (_bad(buckets=[{"name": "a", "max_s": 2048}], traffic={"packed": [{"lengths": "100,4096"}]}),
     "S=4096 (its longest sequence) falls in no bucket"),
    (_bad(buckets=[{"name": "a", "max_s": 2048, "min_s": 2}]), "min_s goes with k"),
    (_bad(buckets=[{"name": "a", "max_s": 2048, "k": {"min": 4096}}]),
     "need at least one bucket without k"),
    (_bad(buckets=[{"name": "a", "max_s": 2048, "k": {"mid": 1}}, {"name": "b", "max_s": None}]),
     "unknown key mid in buckets[0].k"),
    (_bad(buckets=[{"name": "a", "max_s": 2048, "k": {"min": 9, "max": 8}},
                   {"name": "b", "max_s": None}]), "k.max 8 is below k.min 9"),
    (_bad(buckets=[{"name": "a", "min_s": 99, "max_s": 98, "k": {}},
                   {"name": "b", "max_s": None}]), "max_s 98 is below min_s 99"),
    (_bad(buckets=[{"name": "a", "max_s": 2048, "k": {"min": 4096}},
                   {"name": "b", "max_s": 512, "k": {"min": 8192, "max": 9000}},
                   {"name": "c", "max_s": None}]),
     "key-range buckets a (1..2048, k >= 4096) and b (1..512, k 8192..9000) overlap"),
    (_bad(traffic={"shapes": [{"S": 2048, "Sk": 1024}]}), "query rows would see no key"),
    (_bad(traffic={"shapes": [{"S": 2048, "Sk": 0}]}), "traffic.shapes[0].Sk must be a positive"),
    ("just text", "must be a mapping"),
    (_bad(attention={"Hq": 32, "Hkv": 8, "page_size": 12}), "power of two from 8 to 4096"),
    (_bad(attention={"Hq": 32, "Hkv": 8, "page_size": -16}), "attention.page_size"),
])
def test_bad_workloads_are_one_line(data, needle: str) -> None:
    with pytest.raises(WorkloadError) as e:
        workload_from_dict(data, "f.yaml")
    msg = str(e.value)
    assert needle in msg and msg.startswith("f.yaml: ") and "\n" not in msg


def test_files_and_names(tmp_path: Path) -> None:
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(GOOD))
    assert load_workload(p).name == "w" and load_workload(str(p)).source == str(p)
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(WorkloadError, match=r"cannot parse YAML: line \d+:"):
        load_workload(tmp_path / "bad.yaml")
    with pytest.raises(WorkloadError, match="llama3-8b"):
        load_workload("no-such-workload")


def test_workload_command_prints_the_plan() -> None:
    r = runner.invoke(app, ["workload", "llama3-8b", "--max-problems", "2"])
    assert r.exit_code == 0, r.output
    assert "s8k" in r.output and "1x32/8x8192" in r.output
    assert "fa-tune search --study llama3-8b-s8k --shape 1x32/8x8192 --shape 4x32/8x8192" in (
        r.output)
    assert "fa-tune export --workload llama3-8b --study-prefix llama3-8b-" in r.output


def test_workload_command_bad_file_one_line(tmp_path: Path) -> None:
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(_bad(attention={"Hq": 32, "Hkv": 6})))
    r = runner.invoke(app, ["workload", str(p)])
    assert r.exit_code == 2
    assert "multiple of Hkv" in one_error_line(r.output)


def test_workload_error_is_a_user_error() -> None:
    assert issubclass(WorkloadError, FaTuneError)


def test_tune_searches_each_bucket_in_its_own_study(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fa-tune tune --workload`: one search per bucket, study <workload>-<bucket>, on the
    bucket's planned problems (the orchestration only: the search itself is tested elsewhere);
    the same names on a rerun, so it resumes; then the export command."""
    from typer.testing import CliRunner

    from tuner.cli import search_cmds
    from tuner.ship.workload import load_workload

    calls: list[dict] = []
    monkeypatch.setattr(search_cmds, "_run_search", lambda **kw: calls.append(kw))
    w = load_workload("llama3-8b")
    plans = w.plan(None)
    r = CliRunner().invoke(app, ["tune", "--workload", "llama3-8b", "--timeout", "30m"])
    assert r.exit_code == 0, r.output
    assert [c["study"] for c in calls] == [f"llama3-8b-{p.bucket.name}" for p in plans]
    for c, p in zip(calls, plans, strict=True):
        assert [str(s) for s in c["shapes"]] == p.shapes
        assert c["timeout"] == "30m" and c["space"].source.endswith("default.yaml")
    assert "fa-tune export --workload llama3-8b --study-prefix llama3-8b-" in r.output
    calls.clear()
    one = plans[-1].bucket.name
    r = CliRunner().invoke(app, ["tune", "--workload", "llama3-8b", "--trials", "5",
                                     "--bucket", one])
    assert r.exit_code == 0 and [c["study"] for c in calls] == [f"llama3-8b-{one}"]
    r = CliRunner().invoke(app, ["tune", "--workload", "llama3-8b", "--trials", "5",
                                     "--bucket", "s99k"])
    assert r.exit_code == 2 and "has no bucket 's99k'" in r.output
    calls.clear()  # a bad budget is one line before any bucket starts
    r = CliRunner().invoke(app, ["tune", "--workload", "llama3-8b", "--timeout", "0s"])
    assert r.exit_code == 2 and not calls and "bucket 1/" not in r.output
    assert "duration must be positive" in r.output


def test_packed_traffic_is_tuned_as_varlen_in_the_bucket_of_its_longest_sequence() -> None:
    """A packed batch (a prefill server's) is one traffic point: its bucket is the one serving
    its longest sequence (the dispatcher picks by max_seqlen), its time share is its FLOPs
    (the sum over its sequences), and the bucket tunes on it as a varlen problem; the text and
    list forms are one point; to_dict keeps the lengths (dispatch tables carry it)."""
    w = workload_from_dict({**GOOD, "traffic": {
        "shapes": [{"B": 1, "S": 4096, "weight": 1}],
        "packed": [{"lengths": "4096,2048*2,512*8", "weight": 1},
                   {"lengths": [4096, 2048, 2048] + [512] * 8, "weight": 1},
                   {"lengths": "[900,100]", "weight": 2}]}})
    assert len(w.traffic) == 3  # the two spellings of one batch merged
    plans = {p.bucket.name: p for p in w.plan()}
    assert plans["b"].shapes == ["32/8x[4096,2048*2,512*8]", "1x32/8x4096"]
    packed = plans["b"].problems[0].problem
    assert packed.is_varlen and packed.problem_class.varlen and packed.S == 4096
    assert plans["a"].shapes == ["32/8x[900,100]"]
    assert abs(plans["b"].problems[0].weight - 2 / 3) < 1e-12  # 2 of the bucket's 3 calls
    d = w.to_dict()["traffic"]
    assert {"B": 11, "S": 4096, "weight": 0.4, "lengths": "4096,2048*2,512*8"} in d
    assert {"B": 1, "S": 4096, "weight": 0.2} in d


def test_tune_runs_a_packed_bucket_as_varlen(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    from tuner.cli import search_cmds

    calls: list[dict] = []
    monkeypatch.setattr(search_cmds, "_run_search", lambda **kw: calls.append(kw))
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump({**GOOD, "traffic": {"packed": [{"lengths": "3000,1000*4"}]}}))
    r = runner.invoke(app, ["tune", "--workload", str(f), "--bucket", "b", "--trials", "3"])
    assert r.exit_code == 0, r.output
    [c] = calls
    assert [str(s) for s in c["shapes"]] == ["32/8x[3000,1000*4]"]
    assert c["shapes"][0].is_varlen


def test_tune_builds_each_kinds_buckets_for_that_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt-oss-20b: the windowed kind's buckets are built with the window, the full kind's
    without it (as the export builds them; the window cost a full layer 1.2 %, PERF step 81)."""
    from tuner.cli import search_cmds

    calls: list[dict] = []
    monkeypatch.setattr(search_cmds, "_run_search", lambda **kw: calls.append(kw))
    r = runner.invoke(app, ["tune", "--workload", "gpt-oss-20b", "--bucket", "window-s2k",
                            "--bucket", "full-s2k", "--trials", "1"])
    assert r.exit_code == 0, r.output
    got = {c["study"]: c["problem_class"] for c in calls}
    assert got["gpt-oss-20b-window-s2k"].window and got["gpt-oss-20b-window-s2k"].sinks
    assert not got["gpt-oss-20b-full-s2k"].window and got["gpt-oss-20b-full-s2k"].sinks


def test_workload_command_quotes_packed_shapes(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump({**GOOD, "traffic": {"packed": [{"lengths": "3000,1000*4"}]}}))
    r = runner.invoke(app, ["workload", str(f)])
    assert r.exit_code == 0, r.output
    assert "fa-tune search --study w-b --shape '32/8x[3000,1000*4]'" in r.output


def test_key_range_buckets_and_chunked_prefill_traffic() -> None:
    """A key-range bucket takes queries over a longer cache (chunked prefill) from the chain;
    traffic with Sk lands there and is tuned there, as S_q < S_k problems; packed batches with
    q:k pairs too."""
    w = workload_from_dict({**GOOD, "buckets": [
        {"name": "a", "max_s": 1024}, {"name": "b", "max_s": 4096}, {"name": "c", "max_s": None},
        {"name": "chunk2k", "max_s": 2048, "k": {"min": 4096, "max": 16384}},
        {"name": "far", "min_s": 1025, "max_s": None, "k": {"min": 32768}}],
        "traffic": {"shapes": [{"S": 2048, "Sk": 8192, "weight": 3}, {"S": 2048, "weight": 1},
                               {"B": 2, "S": 512, "Sk": 4096}],
                    "packed": [{"lengths": "2048:8192,512:4096*2"}, {"lengths": "900:40000"}]}})
    chunk = w.bucket("chunk2k")
    assert (chunk.s_min, chunk.s_max, chunk.k_min, chunk.k_max) == (1, 2048, 4096, 16384)
    assert chunk.range_text() == "1..2048, k 4096..16384" and chunk.keyed
    assert [b.name for b in w.dispatch_order()] == ["chunk2k", "far", "a", "b", "c"]
    cases = {(2048, 8192): "chunk2k", (2048, None): "b", (2048, 2048): "b", (100, 20000): "a",
             (5000, 40000): "far", (900, 40000): "a", (4096, 4096): "b"}
    for (S, Sk), want in cases.items():
        assert w.bucket_for(S, Sk).name == want, (S, Sk)
    plans = {p.bucket.name: p for p in w.plan()}
    assert plans["chunk2k"].shapes == ["1x32/8x2048:k8192", "32/8x[2048:8192,512:4096*2]",
                                       "2x32/8x512:k4096"]
    assert plans["chunk2k"].problems[0].problem.Sk == 8192
    assert plans["b"].shapes == ["1x32/8x2048"]
    assert plans["a"].shapes == ["32/8x[900:40000]"]
    assert plans["far"].shapes == ["1x32/8x1025:k32768"]  # no traffic: its lower edge, B=1
    d = w.to_dict()
    assert {"name": "chunk2k", "s_min": 1, "s_max": 2048, "k_min": 4096, "k_max": 16384} in (
        d["buckets"])
    assert {"B": 1, "S": 2048, "weight": 3 / 7, "Sk": 8192} in d["traffic"]
    assert {"B": 3, "S": 2048, "weight": 1 / 7, "Sk": 8192,
            "lengths": "2048:8192,512:4096*2"} in d["traffic"]
    assert abs(sum(p.time_share for p in plans.values()) - 1) < 1e-12


def test_a_paged_workload_tunes_paged_problems() -> None:
    """attention.page_size: every call's K and V in a paged cache; the library's class is paged
    (and device-scheduled), and every planned problem, fixed or packed, has the pages."""
    w = workload_from_dict({**GOOD, "attention": {**GOOD["attention"], "page_size": 64},
                            "traffic": {**GOOD["traffic"],
                                        "packed": [{"lengths": "2048:8192,512:4096*2"}]}},
                           "p.yaml")
    assert w.problem_class.paged and w.problem_class.varlen
    problems = [pp.problem for plan in w.plan() for pp in plan.problems]
    assert problems and all(p.page_size == 64 for p in problems)
    assert any(p.is_varlen for p in problems)
    assert w.attention.to_dict()["page_size"] == 64
