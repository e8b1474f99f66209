"""Accuracy in plain sight (issue 35; docs/GATE.md, "Error ratios"): FlashAttention's rule against
the BF16 implementation, the LSE rule at BF16 resolution, the error relative to the default
config's, on the NumPy emulation of a correct kernel; where configs are chosen: show, compare
and the search's --max-error-ratio, with the fixture builder and worker."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from typer.testing import CliRunner

from tuner.analysis import show
from tuner.cli import app
from tuner.measure import accuracy as A
from tuner.measure import gate_rule as GR
from tuner.measure import reference_numpy as RN
from tuner.problem import Problem
from tuner.search import loop as search
from tuner.search.space import space_from_dict
from tuner.search.trials import GATE_CONSTRAINT, is_gate_refused

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compare import fixture_payload  # noqa: E402
from test_oracle_cpu import _bf16, _fa_emulate  # noqa: E402

FIX = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIX))
from fake_builder import FakeBuilder  # noqa: E402

runner = CliRunner()

PROBLEMS = [Problem(1, 2, 320), Problem(1, 4, 256, Hkv=2), Problem(1, 2, 256, D=64),
            Problem(1, 2, 256, D=256), Problem(1, 4, 256, Hkv=2, D=64, causal=False),
            Problem(1, 4, 200, Hkv=1, D=256, causal=False), Problem(1, 2, 17),
            Problem(1, 2, 3, causal=False), Problem.parse("1x4/2x192:k640")]


def _emulated(problem: Problem, input_set: str) -> tuple[Any, ...]:
    """(q, k, v, O_ref, LSE_ref, the correct kernel's O (BF16 bits) and FP32 LSE)."""
    q, k, v = RN.host_inputs(problem, input_set, 42)
    ref, lse_ref = RN.numpy_reference(q, k, v, problem.causal)
    o, lse = _fa_emulate(q, k, v, block_n=64, causal=problem.causal, with_lse=True)
    return q, k, v, ref.astype(np.float32), lse_ref.astype(np.float32), RN.f32_to_bf16_bits(o), lse


def _metrics(problem: Problem, o_bits: np.ndarray, ref: np.ndarray, impl: A.ImplError | None,
             lse: np.ndarray | None = None, lse_ref: np.ndarray | None = None) -> GR.SetMetrics:
    stats, sums = GR.compare_numpy(o_bits, ref, lse, lse_ref)
    return GR.evaluate(stats, problem, "seed", check_lse=lse is not None, budget=sums,
                       bf16_impl=impl)


def _impl(q: Any, k: Any, v: Any, ref: np.ndarray, causal: bool) -> A.ImplError:
    stats, _ = GR.compare_numpy(RN.numpy_reference_bf16(q, k, v, causal), ref)
    return A.ImplError.from_stats(stats)


# ---- the BF16 implementation's NumPy twin ---------------------------------------------------
def test_bf16_reference_is_flash_attentions_bf16_math() -> None:
    """attention_ref(upcast=False) step by step on one tiny row: Q*scale, S, P and O each
    rounded to BF16; GQA reads the shared K/V head; a row without keys is 0."""
    rng = np.random.default_rng(0)
    q = RN.f32_to_bf16_bits(rng.uniform(-2, 2, (1, 5, 4, 64)).astype(np.float32))
    k = RN.f32_to_bf16_bits(rng.uniform(-2, 2, (1, 5, 2, 64)).astype(np.float32))
    v = RN.f32_to_bf16_bits(rng.uniform(-1, 1, (1, 5, 2, 64)).astype(np.float32))
    o = RN.numpy_reference_bf16(q, k, v, causal=True)
    assert o.dtype == np.uint16 and o.shape == (1, 5, 4, 64)
    qf, kf, vf = (RN.bf16_bits_to_f32(x).astype(np.float64) for x in (q, k, v))
    b16 = lambda x: _bf16(np.asarray(x, np.float32)).astype(np.float64)  # noqa: E731
    h, s = 3, 2  # query head 3 reads K/V head 1; causal row 2 sees keys 0..2
    sc = b16(b16(qf[0, s, h] * np.float32(0.125)) @ kf[0, :3, 1].T)
    p = b16(np.exp(sc - sc.max()) / np.exp(sc - sc.max()).sum())
    np.testing.assert_array_equal(RN.bf16_bits_to_f32(o[0, s, h]), b16(p @ vf[0, :3, 1]))
    np.testing.assert_array_equal(o[0, 0, 0], v[0, 0, 0])  # one key: P = 1, O = V's row
    mha = RN.numpy_reference_bf16(q, np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2))
    np.testing.assert_array_equal(o, mha)


@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_correct_kernel_passes_flash_attentions_rule_with_margin(problem: Problem,
                                                                  input_set: str) -> None:
    """The emulated correct kernel (P and O rounded once each, FP32 scores) measures at most
    0.85x the BF16 implementation's max error (FA's rule allows 2x): it gates with a margin of
    2.3x or more, and the LSE at 2^-9 + 2^-18|ref| with a margin of 20x or more."""
    q, k, v, ref, lse_ref, o, lse = _emulated(problem, input_set)
    impl = _impl(q, k, v, ref, problem.causal)
    m = _metrics(problem, o, ref, impl, lse, lse_ref)
    assert m.passed, m.reasons
    assert m.fa_rule_ok and m.fa_ratio is not None and m.fa_ratio < 0.85
    assert m.err_bf16_max == impl.max_abs_err and m.to_dict()["err_max"] == m.max_abs_err
    tol = GR.LSE_ATOL + GR.LSE_RTOL * np.abs(lse_ref)
    assert (np.abs(lse - lse_ref) / tol).max() < 0.05


def test_flash_attentions_rule_catches_what_it_should() -> None:
    problem = Problem(1, 4, 256, Hkv=2)
    q, k, v, ref, _, o, _ = _emulated(problem, "seed")
    impl = _impl(q, k, v, ref, problem.causal)
    # O x 1.02 on 8 rows: 2.6x the BF16 implementation's max error (the budget fails it too).
    of = RN.bf16_bits_to_f32(o).copy()
    of[:, 40:48] *= np.float32(1.02)
    bad = _metrics(problem, RN.f32_to_bf16_bits(of), ref, impl)
    assert not bad.fa_rule_ok and bad.fa_ratio > 2 and not bad.passed  # the budget fails it
    # Exact problems: both errors 0 passes (0 <= 0 + 1e-5), ratio 1.
    assert A.fa_rule(0.0, 0.0) == (1.0, True) and A.fa_rule(2e-5, 0.0)[1] is False
    assert A.fa_rule(0.003, 0.0015) == (2.0, True)  # the rule's edge holds


# ---- the LSE at BF16 resolution -----------------------------------------------------------
@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_lse_off_by_a_hundredth_fails_and_the_old_rule_passed_it(input_set: str) -> None:
    problem = Problem(1, 4, 256, Hkv=2)
    _, _, _, ref, lse_ref, o, lse = _emulated(problem, input_set)
    assert 4 < np.abs(lse_ref).mean() < 16  # typical |LSE|
    shifted = (lse + np.float32(0.01)).astype(np.float32)
    m = _metrics(problem, o, ref, None, shifted, lse_ref)
    assert not m.passed and m.lse_violations == lse.size  # every value
    assert any("LSE values violate" in r for r in m.reasons)
    old, _ = GR.compare_numpy(o, ref, shifted, lse_ref, lse_atol=1e-2, lse_rtol=1e-4)
    assert old.l_violations == 0  # 0.01 + 1e-4 |ref| let it through
    # Within the BF16 budget: 2^-10 everywhere passes.
    ok = _metrics(problem, o, ref, None, (lse + np.float32(2.0**-10)).astype(np.float32),
                  lse_ref)
    assert ok.passed, ok.reasons
    # The LSE's error in units of the bound's 2^-9, recorded with every gate result.
    g = GR.GateResult(passed=True, shape=str(problem), seed=42, sets=[ok])
    assert g.lse_ratio == pytest.approx(0.5, rel=0.05)
    assert g.to_dict()["lse_ratio"] == pytest.approx(g.lse_ratio)
    assert GR.GateResult(passed=False, shape=str(problem), seed=42, sets=[m]).lse_ratio \
        == pytest.approx(0.01 / 2.0**-9, rel=0.05)


def test_lse_rule_numbers() -> None:
    assert GR.LSE_ATOL == 2.0**-9 and GR.LSE_RTOL == 2.0**-18
    for lse in (5.0, 15.0, 550.0):  # an LSE off by 0.01 fails up to the rising set's largest
        assert 0.01 > GR.LSE_ATOL + GR.LSE_RTOL * lse
    assert GR.rule_dict()["lse_atol"] == 2.0**-9 and "2^-9 + 2^-18" in GR.RULE_TEXT


# ---- relative to the default config -----------------------------------------------------
def test_one_percent_output_error_shows_against_the_default() -> None:
    problem = Problem(1, 2, 320)
    q, k, v, ref, _, o, _ = _emulated(problem, "seed")
    impl = _impl(q, k, v, ref, problem.causal)
    default = _metrics(problem, o, ref, impl)
    same = _metrics(problem, o, ref, impl)
    A.relate_set(same, default)
    assert same.err_vs_default == 1.0 and same.rms_vs_default == 1.0
    worse = _metrics(problem, RN.f32_to_bf16_bits(RN.bf16_bits_to_f32(o) * np.float32(1.01)),
                     ref, impl)
    A.relate_set(worse, default)
    assert worse.err_vs_default > 1.5 and worse.rms_vs_default > 1.5
    g = GR.GateResult(passed=True, shape=str(problem), seed=42, sets=[worse])
    d = GR.GateResult(passed=True, shape=str(problem), seed=42, sets=[default])
    A.relate(g, d)
    assert g.err_vs_default == worse.err_vs_default and g.default_passed
    out = g.to_dict()
    assert out["err_vs_default"] == pytest.approx(worse.err_vs_default)
    assert out["sets"][0]["rms_vs_default"] == pytest.approx(worse.rms_vs_default)
    assert "x default" in g.summary() and "x BF16 impl" in g.summary()


def test_ratio_helpers() -> None:
    assert A.error_ratio(0.0, 0.0) == 1.0 and math.isinf(A.error_ratio(1e-3, 0.0))
    assert A.error_ratio(None, 1.0) is None and A.error_ratio(2.0, 4.0) == 0.5
    assert A.worst([None, 1.2, 0.5, True]) == 1.2 and A.worst([None]) is None
    assert A.ratio_text(None) == "-" and A.ratio_text(math.inf) == "inf"
    assert A.max_error_ratio_reason(1.1, 1.2, "1x2x256") is None
    why = A.max_error_ratio_reason(1.5, 1.2, "1x2x256")
    assert why and "1.50x the default config's" in why and "--max-error-ratio 1.2" in why
    assert "no default-config error" in (A.max_error_ratio_reason(None, 1.2, "x") or "")
    rec = A.accuracy_record({"fa_ratio": 0.4, "details": {"err_vs_default": 1.1}})
    assert rec == {"fa_ratio": 0.4, "fa_rule_ok": None, "err_vs_default": 1.1,
                   "rms_vs_default": None, "lse_ratio": None}


# ---- compare prints them ------------------------------------------------------------------
def _with_ratios() -> dict[str, Any]:
    from tuner.analysis import compare

    p = fixture_payload()
    for s in p["shapes"]:
        for r in s["runs"]:
            if r.get("gate"):
                r["gate"].update(fa_ratio=0.41 if r["backend"] == "fa-tune" else 0.52,
                                 fa_rule_ok=True, err_vs_default=1.07, rms_vs_default=1.01,
                                 lse_ratio=0.98 if r["backend"] == "fa-tune" else 0.0015)
    p["summary"] = compare.summarize(p)
    return p


def test_compare_prints_the_error_ratios(tmp_path: Path) -> None:
    from tuner.analysis import compare_report as R

    p = _with_ratios()
    rows = {(r["shape"], r["backend"]): r for r in p["summary"]}
    row = rows[("4x32x4096", "fa-tune")]
    assert row["fa_ratio"] == 0.41 and row["err_vs_default"] == 1.07
    assert rows[("4x32x4096", "fa3")]["fa_ratio"] == 0.52  # both runs' worst
    text = R.format_table(p)
    assert "errxBF16" in text and "0.41" in text and "1.07" in text
    assert "LSExtol" in text and "0.98" in text  # the LSE's error over its bound
    md = R.summary_markdown(p)
    assert "Error ratios" in md and "0.41x bf16, 1.07x def, LSE 0.98x tol" in md
    files = R.write_outputs(p, tmp_path)
    header = files["csv"].read_text().splitlines()[0].split(",")
    assert {"fa_ratio", "err_vs_default", "rms_vs_default", "lse_ratio"} <= set(header)
    from rich.console import Console

    con = Console(width=200, record=True)
    con.print(R.rich_table(p))
    assert "0.41x bf16, 1.07x def" in con.export_text()
    old = fixture_payload()  # payloads before issue 35: no ratios, '-' in the cells
    assert "-x bf16, -x def" in R.summary_markdown(old)


# ---- the search: ratios stored with each trial, --max-error-ratio, show --------------------
@pytest.fixture
def fake_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import json

    path = tmp_path / "plan.json"
    monkeypatch.setenv("FAKE_GPU_WORKER_PLAN", str(path))
    monkeypatch.setenv("FA_TUNE_STUDIES", str(tmp_path / "studies"))

    def set_plan(d: dict[str, str]) -> None:
        path.write_text(json.dumps(d))

    set_plan({})
    return set_plan


def _search(tmp_path: Path, **kw: Any) -> search.Search:
    return search.Search(
        study="acc", space=space_from_dict({"block_n": [112, 128, 144]}, "test-space"),
        shapes=[Problem(1, 2, 256), Problem(1, 2, 512)], n_trials=3, sampler="grid", seed=0,
        jobs=2, builder=FakeBuilder(tmp_path / "art"),
        worker_entry=f"{FIX / 'fake_gpu_worker.py'}:main", results_root=tmp_path / "results",
        **kw)


def _trials(tmp_path: Path) -> dict[int, Any]:
    from tuner.search.study import default_storage_url

    st = optuna.load_study(study_name="acc", storage=default_storage_url("acc"))
    # (A duplicate of a measured config carries its verdict and ratios; the original first.)
    ts = sorted(st.get_trials(), key=lambda t: "duplicate_of" not in t.user_attrs)
    return {t.params["block_n"]: t for t in ts}


def test_search_stores_ratios_and_max_error_ratio_rejects(tmp_path: Path, fake_worker) -> None:
    # block_n 144: 1.5x the default's error; 112: 1.1x; 128 is the default config itself.
    fake_worker({"block_n=144": "err=1.5", "block_n=112": "err=1.1"})
    s = _search(tmp_path, max_error_ratio=1.2)
    summ = s.run()
    ts = _trials(tmp_path)
    bad = ts[144]
    # Refused by --max-error-ratio: a failure to the user, infeasible for TPE (as the gate's).
    assert bad.state.name == "PRUNED" and bad.constraints == {GATE_CONSTRAINT: 1.0}
    assert show.trial_rows([bad])[0]["state"] == "FAIL"
    assert bad.user_attrs["fail_reason"].startswith("error ratio: max|err| is 1.50x the default")
    assert "--max-error-ratio 1.2" in bad.user_attrs["fail_reason"]
    assert ts[128].state.name == "COMPLETE"
    for shape in ("1x2x256", "1x2x512"):
        acc = ts[128].user_attrs["accuracy"][shape]
        assert acc["err_vs_default"] == 1.0 and acc["fa_ratio"] == pytest.approx(0.4)
    # 112 is pruned after its screen (12.5% slower): the screen's gate is recorded.
    assert ts[112].user_attrs["accuracy"]["1x2x256"]["err_vs_default"] == pytest.approx(1.1)
    row = ts[128].user_attrs["shapes"]["1x2x512"]
    assert row["err_vs_default"] == 1.0 and row["fa_ratio"] == pytest.approx(0.4)
    assert summ.best is not None and summ.best["trial"] != bad.number
    # The default's library came from its own candidate: no second build.
    assert sorted(s.builder.calls) == sorted(set(s.builder.calls))
    # show prints the ratios: best and trials.
    r = runner.invoke(app, ["show", "best", "--study", "acc"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "err/def" in r.output and "1.00" in r.output and "0.40" in r.output
    assert "LSE/tol" in r.output
    assert "0.40x the BF16 implementation's" in r.output and "1.00x the default" in r.output
    r = runner.invoke(app, ["show", "trials", "--study", "acc"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "err/BF16" in r.output and "1.50" in r.output and "error ratio" in r.output


def test_search_without_the_option_records_but_never_rejects(tmp_path: Path,
                                                             fake_worker) -> None:
    fake_worker({"block_n=144": "err=3"})
    _search(tmp_path).run()
    ts = _trials(tmp_path)
    assert ts[144].state.name in ("COMPLETE", "PRUNED")  # pruned by speed, never by error
    assert not is_gate_refused(ts[144])
    assert ts[144].user_attrs["accuracy"]["1x2x256"]["err_vs_default"] == pytest.approx(3.0)


def test_max_error_ratio_must_be_positive(tmp_path: Path) -> None:
    from tuner.errors import SearchError

    with pytest.raises(SearchError, match="must be positive"):
        _search(tmp_path, max_error_ratio=0.0)
