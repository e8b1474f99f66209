"""CPU tests of the correctness gate: oracle.cu compiles for sm_90a, the C ABI loads, the
stats struct and index decoding, the pass/fail rule, and the NumPy twin of the input generators
(including the "rising" property, checked in float64), for every problem of the family (MHA,
GQA, MQA; head dims 64, 128, 256; causal and not)."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tuner.errors import FaTuneError
from tuner.kernel.runtime import (
    ORACLE_ABI_VERSION,
    ORACLE_ROW_BLOCK,
    ORACLE_STATS_BYTES,
    CudaError,
    KernelError,
    OracleModule,
)
from tuner.measure import gate_rule as GR
from tuner.measure import oracle as O
from tuner.measure import reference_numpy as RN
from tuner.problem import Problem

ROOT = Path(__file__).resolve().parents[1]
ORACLE_CU = ROOT / "cuda_src" / "oracle.cu"
ORACLE_PIECES = sorted((ROOT / "cuda_src" / "oracle").glob("*.cuh"))  # its one TU's headers
FLAGS = ["-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-shared",
         "-Xcompiler", "-fPIC"]


def _nvcc() -> str:
    try:
        from tuner.kernel.build import find_nvcc

        return str(find_nvcc())
    except Exception:
        found = shutil.which("nvcc")
        if not found:
            pytest.skip("nvcc not found")
        return found


@pytest.fixture(scope="module")
def oracle_so(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("oracle") / "oracle.so"
    proc = subprocess.run(
        [_nvcc(), *FLAGS, "-Xptxas", "-v", "-o", str(out), str(ORACLE_CU)],
        capture_output=True, text=True, timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    return out, log


def Shape(B: int, H: int, S: int) -> SimpleNamespace:  # noqa: N802 - mimics config.Shape
    return SimpleNamespace(B=B, H=H, S=S)


# ---- oracle.cu ------------------------------------------------------------------------------
def test_oracle_compiles_without_spills(oracle_so: tuple[Path, str]) -> None:
    so, log = oracle_so
    assert so.is_file()
    assert not re.search(r"\berror\b", log, re.IGNORECASE), log
    entries = re.findall(r"Compiling entry function '(\w+)' for 'sm_90a'", log)
    assert any("reference_kernel" in e for e in entries)
    # FP32 and BF16-math references (ABI 7; the masks, ABI 8), each for D 64, 128, 256: none
    # spills.
    assert sum("reference_kernel" in e for e in entries) == 6
    assert any("compare_o_kernel" in e for e in entries)
    assert any("copy_4d_kernel" in e for e in entries)  # the layouts' mirror (ABI 6)
    # Every kernel: no spills, no stack (the reference must stay in registers to be fast).
    for m in re.finditer(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                         r"loads", log):
        assert m.groups() == ("0", "0", "0"), log


def test_oracle_builds_through_build_cache() -> None:
    from tuner.kernel import build

    res = build.build_oracle()
    assert Path(res.so_path).is_file()
    assert not res.any_spills


def test_oracle_abi_loads_without_gpu(oracle_so: tuple[Path, str]) -> None:
    # The .so links cudart statically: it loads (and reports its ABI) without a driver.
    mod = OracleModule(oracle_so[0])
    assert mod._lib.oracle_stats_size() == ORACLE_STATS_BYTES
    assert mod._lib.oracle_abi_version() == ORACLE_ABI_VERSION
    assert mod._lib.oracle_row_block() == ORACLE_ROW_BLOCK == GR.ROW_BLOCK


def test_oracle_call_without_gpu_is_a_clear_error(oracle_so: tuple[Path, str]) -> None:
    from tuner.doctor import has_sm90_gpu

    if has_sm90_gpu():
        pytest.skip("a GPU is present")
    mod = OracleModule(oracle_so[0])
    with pytest.raises(CudaError, match=r"oracle gen_seed failed with cudaError"):
        mod.gen_seed(1 << 20, 1 << 20, 1 << 20, 1, 1, 1, 64, 256, 128, 42, None)
    # A packed batch of more than 32768 keys in all passes the argument checks (the bound is
    # per sequence, ABI 9): it fails at the launch, not with cudaErrorInvalidValue.
    with pytest.raises(CudaError, match=r"oracle gen_rising failed with cudaError") as e:
        mod.gen_rising(1 << 20, 1 << 20, 1 << 20, 1, 1, 1, 64, 55552, 128, 42, -1, None,
                       cu_seqlens_k=1 << 20, num_seqs=8)
    assert e.value.code != 1


def test_oracle_rejects_bad_arguments(oracle_so: tuple[Path, str]) -> None:
    mod = OracleModule(oracle_so[0])
    # Argument checks run before any CUDA call: cudaErrorInvalidValue (1) everywhere.
    # gen_seed(q, k, v, B, Hq, Hkv, Sq, Sk, D, seed, stream); gen_rising(..., seed,
    # direction, cu_seqlens_k, num_seqs, stream)
    fixed, packed = (None, 0), (1, 3)
    assert mod._gen_rising(1, 1, 1, 1, 1, 1, 64, 40000, 128, 42, -1, *fixed, None) == 1  # Sk
    assert mod._gen_rising(1, 1, 1, 1, 1, 1, 64, 64, 128, 42, 0, *fixed, None) == 1  # direction
    assert mod._gen_rising(1, 1, 1, 1, 4, 3, 64, 64, 128, 42, -1, *fixed, None) == 1  # 4 % 3
    assert mod._gen_rising(1, 1, 1, 1, 1, 1, 64, 0, 128, 42, -1, *fixed, None) == 1  # Sk = 0
    assert mod._gen_rising(1, 1, 1, 1, 1, 1, 64, 64, 128, 42, -1, None, 2, None) == 1  # no cu
    assert mod._gen_rising(1, 1, 1, 1, 1, 1, 64, 64, 128, 42, -1, 1, 0, None) == 1  # 0 seqs
    assert mod._gen_rising(1, 1, 1, 2, 1, 1, 64, 64, 128, 42, -1, *packed, None) == 1  # B = 2
    assert mod._gen_rising(1, 1, 1, 1, 1, 1, 64, 0, 128, 42, -1, *packed, None) == 1  # Sk = 0
    assert mod._gen_seed(1, 1, 1, 1, 4, 0, 64, 64, 128, 42, None) == 1  # Hkv = 0
    assert mod._gen_seed(1, 1, 1, 1, 4, 4, 64, 64, 96, 42, None) == 1  # D not 64/128/256
    assert mod._gen_seed(1, 1, 1, 1, 4, 4, 0, 64, 128, 42, None) == 1  # Sq = 0
    # reference(q, k, v, o_ref, lse_ref, B, Hq, Hkv, Sq, Sk, D, causal, window, softcap,
    #           sinks, flags, stream)
    nm = (0, 0.0, None)  # no window, softcap, sinks
    assert mod._reference(None, 1, 1, 1, None, 1, 1, 1, 64, 64, 128, 1, *nm, 0, None) == 1
    assert mod._reference(1, 1, 1, 1, None, 1, 1, 1, 64, 64, 128, 1, *nm, 64, None) == 1  # flag
    assert mod._reference(1, 1, 1, 1, None, 1, 8, 3, 64, 64, 128, 1, *nm, 0, None) == 1  # 8 % 3
    assert mod._reference(1, 1, 1, 1, None, 1, 8, 2, 64, 64, 32, 0, *nm, 0, None) == 1  # D = 32
    assert mod._reference(1, 1, 1, 1, None, 1, 8, 2, 64, 0, 128, 0, *nm, 0, None) == 1  # Sk = 0
    for bad in ((-1, 0.0, None), (0, -1.0, None), (0, math.inf, None), (0, math.nan, None)):
        assert mod._reference(1, 1, 1, 1, None, 1, 8, 2, 64, 64, 128, 1, *bad, 0, None) == 1
        assert mod._reference_bf16(1, 1, 1, 1, 1, 8, 2, 64, 64, 128, 1, *bad, None) == 1
    # reference_varlen(q, k, v, o_ref, lse_ref, cu_q, cu_k, num_seqs, max_q, total_q, Hq, Hkv,
    #                  D, causal, window, softcap, sinks, flags, stream): both cu_seqlens
    assert mod._reference_varlen(1, 1, 1, 1, None, 1, None, 1, 64, 64, 8, 2, 128, 1, *nm, 0,
                                 None) == 1
    assert mod._reference_varlen(1, 1, 1, 1, None, None, 1, 1, 64, 64, 8, 2, 128, 1, *nm, 0,
                                 None) == 1
    assert mod._reference_varlen(1, 1, 1, 1, None, 1, 1, 0, 64, 64, 8, 2, 128, 1, *nm, 0,
                                 None) == 1  # no sequence
    assert mod._reference_varlen(1, 1, 1, 1, None, 1, 1, 1, 64, 64, 8, 2, 128, 1, -3, 0.0,
                                 None, 0, None) == 1  # a negative window
    assert mod._reference_bf16_varlen(1, 1, 1, 1, 1, 1, 1, 64, 64, 8, 2, 128, 1, 0, -2.0, None,
                                      None) == 1  # a negative softcap
    # fill_uniform_f32(dst, n, seed, stream_id, lo, hi, stream): the sinks' generator
    assert mod._fill_uniform_f32(None, 4, 42, 21, 0.0, 1.0, None) == 1
    assert mod._fill_uniform_f32(1, -1, 42, 21, 0.0, 1.0, None) == 1
    assert mod._fill_uniform_f32(1, 0, 42, 21, 0.0, 1.0, None) == 0  # nothing to do
    # copy_bf16_4d(src, dst, dims[4], src_strides[4], dst_strides[4], stream): host arrays
    good = ((1, 2, 3, 64), (384, 192, 64, 1), (1152, 64, 384, 1))
    for bad in (((1, 0, 3, 64), good[1], good[2]),  # a zero dim
                (good[0], (384, -192, 64, 1), good[2]),  # a negative stride
                ((1 << 40, 1 << 40, 1, 1), good[1], good[2])):  # elements overflow
        with pytest.raises(CudaError, match=r"oracle copy_bf16_4d failed with .*\(1\)"):
            mod.copy_bf16_4d(1, 1, *bad, None)
    with pytest.raises(CudaError, match=r"copy_bf16_4d failed"):
        mod.copy_bf16_4d(0, 1, *good, None)  # NULL source
    with pytest.raises(ValueError, match="dims needs 4 values"):
        mod.copy_bf16_4d(1, 1, (1, 2, 3), good[1], good[2], None)
    # compare(o, o_ref, B, Hq, S, D, lse, lse_ref, 4 tolerances, stats, blocks, cols, stream)
    args = (0.05, 0.1, 0.01, 0.0)
    assert mod._compare(None, 1, 1, 1, 64, 128, None, None, *args, 1, None, None, None) == 1
    assert mod._compare(1, 1, 1, 1, 0, 128, None, None, *args, 1, None, None, None) == 1  # S=0
    assert mod._compare(1, 1, 1, 1, 64, 128, 1, None, *args, 1, None, None, None) == 1  # lse_ref
    assert mod._compare(1, 1, 1, 1, 64, 128, None, None, *args, None, 1, 1, None) == 1  # stats
    assert mod._compare(1, 1, 1, 1, 64, 100, None, None, *args, 1, None, None, None) == 1  # D


def test_oracle_stats_layout_matches_python() -> None:
    text = "".join(p.read_text() for p in [ORACLE_CU, *ORACLE_PIECES])
    start = text.index("struct OracleStats {")
    body = text[start:text.index("};", start)]
    fields = re.findall(r"(?:unsigned long long|double) (\w+);", body)
    assert fields == list(GR._STATS_DTYPE.names)
    assert "#define ORACLE_POISON_BF16 0x7FBFu" in text
    assert f"#define ORACLE_ABI_VERSION {ORACLE_ABI_VERSION}\n" in text
    assert f"#define ORACLE_ROW_BLOCK {ORACLE_ROW_BLOCK}\n" in text
    assert f"sizeof(OracleStats) == {ORACLE_STATS_BYTES}" in text
    assert "#define ORACLE_POISON_F32 0x7FBADBADu" in text
    assert GR.POISON_BF16 == 0x7FBF and GR.POISON_F32 == 0x7FBADBAD


def test_poison_patterns_are_nan_but_not_hardware_nans() -> None:
    assert np.isnan(O.bf16_bits_to_f32(np.array([GR.POISON_BF16], np.uint16))[0])
    assert np.isnan(np.array([GR.POISON_F32], np.uint32).view(np.float32)[0])
    assert GR.POISON_BF16 not in (0x7FC0, 0x7FFF, 0xFFC0, 0xFFFF)
    assert GR.POISON_F32 not in (0x7FC00000, 0x7FFFFFFF, 0xFFC00000)


# ---- decoding -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [Shape(1, 1, 1), Shape(2, 3, 5), Shape(4, 32, 4096),
                                   Problem(2, 8, 5, Hkv=2, D=64), Problem(1, 4, 7, Hkv=1, D=256,
                                                                          causal=False)])
def test_decode_bshd_matches_numpy(shape: Any) -> None:
    D = getattr(shape, "D", 128)
    n = shape.B * shape.S * shape.H * D  # O is [B, S, Hq, D]
    rng = np.random.default_rng(0)
    for idx in [0, n - 1, *rng.integers(0, n, 50).tolist()]:
        want = np.unravel_index(idx, (shape.B, shape.S, shape.H, D))
        assert GR.decode_bshd(int(idx), shape) == tuple(int(x) for x in want)
    with pytest.raises(ValueError):
        GR.decode_bshd(n, shape)


@pytest.mark.parametrize("shape", [Shape(3, 5, 7), Problem(3, 6, 7, Hkv=2, D=64)])
def test_decode_bhs_matches_numpy(shape: Any) -> None:
    dims = (shape.B, shape.H, shape.S)  # LSE is [B, Hq, S] whatever Hkv and D
    for idx in range(int(np.prod(dims))):
        want = np.unravel_index(idx, dims)
        assert GR.decode_bhs(idx, shape) == tuple(int(x) for x in want)
    with pytest.raises(ValueError):
        GR.decode_bhs(-1, shape)


# ---- stats and the verdict ------------------------------------------------------------------
def _stats(shape: SimpleNamespace, **kw: object) -> GR.OracleStats:
    n = shape.B * shape.S * shape.H * 128
    base: dict[str, object] = dict(
        o_count=n, o_violations=0, o_nonfinite=0, o_unwritten=0,
        o_first_violation=GR.NO_VIOLATION, o_ref_nonfinite=0, o_max_abs_err=0.002,
        o_sum_sq_err=1e-6 * n, o_sum_sq_ref=0.1 * n, o_sum_sq_bf16=0.8e-6 * n,
        l_count=shape.B * shape.H * shape.S, l_violations=0, l_nonfinite=0, l_unwritten=0,
        l_first_violation=GR.NO_VIOLATION, l_ref_nonfinite=0, l_max_abs_err=2.0**-17,
    )
    base.update(kw)
    return GR.OracleStats(**base)  # type: ignore[arg-type]


def test_stats_bytes_roundtrip() -> None:
    s = _stats(Shape(2, 3, 64), o_violations=3, o_first_violation=12345, o_max_abs_err=0.75)
    raw = s.to_bytes()
    assert len(raw) == ORACLE_STATS_BYTES
    assert GR.OracleStats.from_bytes(raw) == s
    with pytest.raises(ValueError):
        GR.OracleStats.from_bytes(raw[:-8])


def test_evaluate_pass() -> None:
    shape = Shape(2, 3, 64)
    m = GR.evaluate(_stats(shape), shape, "seed", check_lse=True)
    assert m.passed and not m.reasons
    assert m.first_violation is None
    assert m.rel_l2 == pytest.approx(math.sqrt(1e-5))
    assert m.lse_checked and m.lse_max_abs_err == 2.0**-17


def test_evaluate_one_violation_decodes_location() -> None:
    shape = Shape(2, 3, 64)
    idx = ((1 * 64 + 17) * 3 + 2) * 128 + 100  # (b=1, s=17, h=2, d=100)
    m = GR.evaluate(_stats(shape, o_violations=1, o_first_violation=idx, o_max_abs_err=9.0),
                   shape, "rising", check_lse=False)
    assert not m.passed
    assert m.violations == 1 and m.first_violation == (1, 17, 2, 100)
    assert "b=1,s=17,h=2,d=100" in " ".join(m.reasons)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(o_unwritten=1, o_violations=1, o_first_violation=5), "never written"),
        (dict(o_nonfinite=2, o_violations=2, o_first_violation=0), "NaN/Inf"),
        (dict(o_sum_sq_err=0.02 * 100), "relative L2"),  # rel L2 > 1e-2 alone fails
        (dict(o_count=7), "oracle bug"),
        (dict(o_ref_nonfinite=1, o_violations=1, o_first_violation=0), "reference"),
        (dict(l_violations=1, l_first_violation=3), "LSE values violate"),
        (dict(l_unwritten=4, l_violations=4, l_first_violation=0), "LSE values never written"),
        (dict(l_nonfinite=1, l_violations=1, l_first_violation=0), "NaN/Inf LSE"),
    ],
)
def test_evaluate_failures(kw: dict[str, object], needle: str) -> None:
    shape = Shape(1, 1, 64)
    if "o_sum_sq_err" in kw:
        kw = dict(kw, o_sum_sq_ref=1.0, o_sum_sq_err=(0.011) ** 2)
    m = GR.evaluate(_stats(shape, **kw), shape, "seed", check_lse=True)
    assert not m.passed, m
    assert needle in " ".join(m.reasons)


def test_evaluate_lse_ignored_when_kernel_does_not_write_it() -> None:
    shape = Shape(1, 1, 64)
    m = GR.evaluate(_stats(shape, l_unwritten=64, l_violations=64, l_first_violation=0, l_count=64),
                   shape, "seed", check_lse=False)
    assert m.passed and not m.lse_checked and m.lse_first_violation is None


def test_evaluate_lse_first_violation_decoded() -> None:
    shape = Shape(2, 3, 64)
    m = GR.evaluate(_stats(shape, l_violations=1, l_first_violation=(1 * 3 + 2) * 64 + 9),
                   shape, "seed", check_lse=True)
    assert m.lse_first_violation == (1, 2, 9)


def test_evaluate_zero_reference_energy() -> None:
    shape = Shape(1, 1, 64)
    assert GR.evaluate(_stats(shape, o_sum_sq_err=0.0, o_sum_sq_ref=0.0), shape, "seed",
                      check_lse=False).rel_l2 == 0.0
    m = GR.evaluate(_stats(shape, o_sum_sq_err=1.0, o_sum_sq_ref=0.0), shape, "seed",
                   check_lse=False)
    assert math.isinf(m.rel_l2) and not m.passed
    assert m.to_dict()["rel_l2"] is None


def test_gate_result_summary_and_dict() -> None:
    shape = Shape(2, 3, 64)
    ok = GR.evaluate(_stats(shape), shape, "seed", check_lse=True)
    bad = GR.evaluate(_stats(shape, o_violations=2, o_first_violation=0, o_max_abs_err=0.9),
                     shape, "rising", check_lse=True)
    g = GR.GateResult(passed=False, shape="2x3x64", seed=42, sets=[ok, bad])
    line = g.summary()
    assert "\n" not in line
    assert line.startswith("gate FAIL 2x3x64 seed 42")
    assert "rising" in line and "b=0,s=0,h=0,d=0" in line
    assert g.first_failure() is bad and g.violations == 2 and g.max_abs_err == pytest.approx(0.9)
    d = g.to_dict()
    assert d["sets"][1]["first_violation"] == [0, 0, 0, 0]
    assert d["rule"]["o_atol"] == 0.05 and d["rule"]["o_rtol"] == 0.1
    assert d["rule"]["budget_k"] == GR.BUDGET_K and d["rule"]["budget_floor"] == GR.BUDGET_FLOOR
    assert d["rule"]["budget_row_block"] == GR.ROW_BLOCK
    assert d["budget_ratio"] is None  # no budget sums were given
    import json

    json.dumps(d)  # serialisable
    g2 = GR.GateResult(passed=True, shape="2x3x64", seed=42, sets=[ok])
    assert g2.summary().startswith("gate PASS")
    assert GR.GateResult(passed=True, shape=(2, 3, 64), seed=42,  # type: ignore[arg-type]
                        sets=[ok]).summary().startswith("gate PASS 2x3x64")  # old tuple form


def test_fill_inputs_hands_a_packed_batch_its_key_offsets() -> None:
    """The rising sets of a packed batch get bufs.cu_k and the sequence count (each sequence
    its own trend); a fixed problem gets neither, the seed set never."""
    calls: list[tuple[str, tuple[Any, ...]]] = []
    orc = SimpleNamespace(gen_seed=lambda *a: calls.append(("gen_seed", a)),
                          gen_rising=lambda *a: calls.append(("gen_rising", a)))

    def bufs(p: Problem, cu_k: int | None) -> SimpleNamespace:
        ptr = SimpleNamespace
        return SimpleNamespace(shape=p, q=ptr(ptr=1), k=ptr(ptr=2), v=ptr(ptr=3),
                               cu_k=None if cu_k is None else ptr(ptr=cu_k), layout_bufs={})

    packed = Problem.parse("8/2x[512,1024:5120,2048:10240,4096:6144,8192,768:6912,"
                           "3072:4096,6144:14336]")
    for name, direction in (("rising", -1), ("rising_fwd", 1)):
        calls.clear()
        O.fill_inputs(orc, bufs(packed, 0x600), name, 7, "st")  # type: ignore[arg-type]
        assert calls == [("gen_rising", (1, 2, 3, 1, 8, 2, packed.tokens_q, 55552, 128, 7,
                                         direction, "st", 0x600, 8))]
    calls.clear()
    O.fill_inputs(orc, bufs(Problem.parse("2x8/2x64:k300"), None), "rising", 7, None)  # type: ignore[arg-type]
    assert calls == [("gen_rising", (1, 2, 3, 2, 8, 2, 64, 300, 128, 7, -1, None, None, 0))]
    calls.clear()
    O.fill_inputs(orc, bufs(packed, 0x600), "seed", 7, None)  # type: ignore[arg-type]
    assert [c[0] for c in calls] == ["gen_seed"]
    with pytest.raises(KernelError, match=r"hold no cu_seqlens_k$"):
        O.fill_inputs(orc, bufs(packed, None), "rising", 7, None)  # type: ignore[arg-type]


def test_unknown_input_set_is_a_user_error() -> None:
    with pytest.raises(FaTuneError, match="unknown input set"):
        O.check_input_set("nope", Shape(1, 1, 64))
    with pytest.raises(FaTuneError, match="S_k <= 32768"):
        O.check_input_set("rising", Shape(1, 1, 65536))
    # The rising set's trend is over the keys: the key rows bound it, not the queries.
    O.check_input_set("rising", Problem.parse("1x1x64:k32768"))
    with pytest.raises(FaTuneError, match=r"S_k <= 32768 key rows \(got 32769\)"):
        O.check_input_set("rising", Problem.parse("1x1x64:k32769"))


# ---- the NumPy twin of the generators -------------------------------------------------------
def test_splitmix_int_and_numpy_agree() -> None:
    xs = [0, 1, 42, (1 << 64) - 1, 0x123456789ABCDEF0]
    got = RN._splitmix64_np(np.array(xs, dtype=np.uint64))
    assert [int(g) for g in got] == [RN._splitmix64_int(x) for x in xs]
    # splitmix64 of state 0 (first output of the reference generator seeded with 0)
    assert RN._splitmix64_int(0) == 0xE220A8397B1DCDAF


def test_bf16_rounding_is_rne() -> None:
    x = np.array([1.0, 1.00390625, 1.01171875, -2.0, 0.09, 3.0e-3, 1.0 + 2**-8 + 2**-20],
                 dtype=np.float32)
    bits = O.f32_to_bf16_bits(x)
    back = O.bf16_bits_to_f32(bits)
    # 1 + 2^-8 is a tie -> even (1.0); 1 + 3*2^-8 is a tie -> even (1 + 2^-6)
    assert back[0] == 1.0 and back[1] == 1.0 and back[2] == np.float32(1.015625)
    assert back[3] == -2.0
    assert back[4] == np.float32(0.08984375)
    assert back[6] == np.float32(1.0078125)  # just above the tie rounds up
    assert np.all(np.abs(back - x) <= np.abs(x) * 2**-8)


def test_seed_set_ranges_and_determinism() -> None:
    shape = Shape(1, 2, 64)
    q, k, v = O.host_inputs(shape, "seed", 42)
    qf, kf, vf = (O.bf16_bits_to_f32(a) for a in (q, k, v))
    assert q.shape == (1, 64, 2, 128)
    assert qf.min() >= -2 and qf.max() <= 2 and kf.min() >= -2 and kf.max() <= 2
    assert vf.min() >= -1 and vf.max() <= 1
    assert abs(float(qf.mean())) < 0.05 and float(qf.std()) == pytest.approx(4 / math.sqrt(12),
                                                                             rel=0.05)
    q2, _, _ = O.host_inputs(shape, "seed", 42)
    q3, _, _ = O.host_inputs(shape, "seed", 43)
    assert np.array_equal(q, q2) and not np.array_equal(q, q3)
    assert not np.array_equal(q, k)  # distinct streams


@pytest.mark.parametrize("S", [256, 1024])
def test_rising_set_rises_on_every_reverse_tile_walk(S: int) -> None:
    shape = Shape(1, 2, S)
    q, k, _ = O.host_inputs(shape, "rising", 42)
    for block_n in (64, 80, 128, 176, 192):
        # The construction guarantees a rise of >= 0.38 logits per tile (oracle.cu header).
        assert O.rising_failures(q, k, block_n, reverse=True, min_rise=0.38) == 0, block_n
    # ...and a forward walk of the same inputs does NOT rise: the set is direction-specific.
    assert O.rising_failures(q, k, 128, reverse=False) > 0


def test_rising_fwd_set_rises_on_full_forward_tiles() -> None:
    shape = Shape(1, 1, 512)
    q, k, _ = O.host_inputs(shape, "rising_fwd", 7)
    # Forward walks rise at every step into a FULL tile; only a short diagonal tile may not.
    fails = O.rising_failures(q, k, 64, reverse=False)
    assert fails <= 512 // 64 * 16
    assert O.rising_failures(q, k, 64, reverse=True) > 100


def test_rising_construction_bounds() -> None:
    shape = Shape(2, 2, 512)
    q, k, v = O.host_inputs(shape, "rising", 42)
    qf, kf = O.bf16_bits_to_f32(q), O.bf16_bits_to_f32(k)
    c2 = qf[..., 1]
    assert np.all(qf[..., 0] == c2 * 256)
    assert c2.min() >= 0.0898 and c2.max() <= 0.1349
    assert np.all(kf[..., 0] == np.floor(kf[..., 0]))  # integer hi/lo parts
    assert kf[..., 1].min() >= 0 and kf[..., 1].max() <= 255
    assert np.abs(kf[..., 10:]).max() <= 0.0101
    # The trend part: exactly c2 * t(j); the rest ("noise") within the documented bound 0.812.
    for b in range(2):
        for h in range(2):
            sc = O.scores_f64(q, k, b, h)
            t = kf[b, :, h, 0].astype(np.float64) * 256 + kf[b, :, h, 1]
            trend = np.outer(c2[b, :, h], t) / math.sqrt(128)
            assert np.abs(sc - trend).max() < 0.812
            assert np.all(np.diff(t) <= -1)  # strictly decreasing in the key index
    vf = O.bf16_bits_to_f32(v)
    assert vf.min() >= -1 and vf.max() <= 1


def test_numpy_reference_rows_matches_naive_softmax() -> None:
    rng = np.random.default_rng(1)
    q = rng.uniform(-2, 2, (1, 16, 2, 128)).astype(np.float32)
    k = rng.uniform(-2, 2, (1, 16, 2, 128)).astype(np.float32)
    v = rng.uniform(-1, 1, (1, 16, 2, 128)).astype(np.float32)
    o, lse = O.numpy_reference_rows(q, k, v, [(0, 1, 0), (0, 0, 15)])
    assert np.allclose(o[0], v[0, 0, 1])  # row 0 attends to key 0 only
    assert lse[0] == pytest.approx(float(q[0, 0, 1] @ k[0, 0, 1]) / math.sqrt(128))
    s = (k[0, :, 0].astype(np.float64) @ q[0, 15, 0]) / math.sqrt(128)
    p = np.exp(s - s.max())
    assert np.allclose(o[1], p @ v[0, :, 0] / p.sum())
    assert lse[1] == pytest.approx(math.log(np.exp(s).sum()))


# ---- the BF16 error budget ------------------------------------------------------------------
def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to BF16 and back to float32."""
    return O.bf16_bits_to_f32(O.f32_to_bf16_bits(np.asarray(x, dtype=np.float32)))


def _synthetic(B: int = 1, H: int = 2, S: int = 256, seed: int = 0,
               ) -> tuple[np.ndarray, np.ndarray]:
    """(ref, pre-rounding output of a "correct" kernel), [B, S, H, 128] float32. The reference
    shrinks along the rows like attention output over more and more keys; the kernel's extra
    error before its one final rounding stands for P's BF16 rounding: 0.6 * 2^-9 of the row's
    RMS (a correct FA kernel then measures ~1.25x rms_bf16, as the emulation below does)."""
    rng = np.random.default_rng(seed)
    rows = np.arange(S, dtype=np.float64)[None, :, None, None]
    ref = (rng.standard_normal((B, S, H, 128)) / np.sqrt(1.0 + rows / 8)).astype(np.float32)
    row_rms = np.sqrt((ref.astype(np.float64) ** 2).mean(axis=-1, keepdims=True))
    noise = 0.6 * GR.BF16_UNIT * row_rms * rng.standard_normal(ref.shape)
    return ref, (ref + noise).astype(np.float32)


def _verdict(o_pre: np.ndarray, ref: np.ndarray, problem: Any = None) -> GR.SetMetrics:
    """Round a kernel's FP32 output to BF16 (as the kernel's epilogue does) and gate it."""
    B, S, H, D = ref.shape
    stats, sums = GR.compare_numpy(O.f32_to_bf16_bits(o_pre), ref)
    shape = problem if problem is not None else Problem(B, H, S, D=D)
    return GR.evaluate(stats, shape, "seed", check_lse=False, budget=sums)


def _scaled(o: np.ndarray, factor: float, rows: Any = slice(None), cols: Any = slice(None),
            ) -> np.ndarray:
    out = o.copy()
    out[:, rows, :, cols] *= np.float32(factor)
    return out


def _old_rule_passes(m: GR.SetMetrics) -> bool:
    return m.violations == 0 and m.rel_l2 <= GR.REL_L2_MAX and not m.nan_count


def test_budget_passes_a_correct_looking_kernel() -> None:
    ref, o = _synthetic()
    m = _verdict(o, ref)
    assert m.passed, m.reasons
    assert m.budget_ratio is not None and m.budget_ratio < 0.6  # margin > 1.6x
    assert 1.0 < m.bf16_ratio < 1.6 and 1.0 < m.err_over_bf16 < 1.4
    assert m.block_failures == 0 and m.col_failures == 0
    assert "budget" in m.brief()
    # The perfect kernel (the reference rounded once) measures exactly its rounding error.
    p = _verdict(ref, ref)
    assert p.passed and p.bf16_ratio == pytest.approx(1.0)


def test_budget_fails_one_percent_on_one_64_row_block() -> None:
    ref, o = _synthetic()
    m = _verdict(_scaled(o, 1.01, rows=slice(64, 128)), ref)
    assert not m.passed and _old_rule_passes(m)  # only the budget sees it
    assert m.block_failures == 2 * 4 and m.block_budget_ratio > 1.5  # 2 heads x 4 blocks
    b, h, s0, s1 = m.block_worst
    assert 64 <= s0 and s1 < 128
    assert "16-row blocks exceed the BF16 error budget" in " ".join(m.reasons)


@pytest.mark.parametrize("first", [200, 196])  # 8 rows inside one 16-row block; and 4 + 4
def test_budget_fails_one_percent_on_8_rows(first: int) -> None:
    ref, o = _synthetic(H=1)
    m = _verdict(_scaled(o, 1.01, rows=slice(first, first + 8)), ref)
    assert not m.passed and _old_rule_passes(m), m.reasons
    assert m.block_worst[2] <= first + 7 and m.block_worst[3] >= first
    assert m.col_failures == 0  # a few rows hardly move a column's RMS over 256 rows


def test_budget_fails_one_percent_on_4_columns() -> None:
    ref, o = _synthetic()
    m = _verdict(_scaled(o, 1.01, cols=slice(60, 64)), ref)
    assert not m.passed and _old_rule_passes(m)
    assert m.col_failures >= 4 and m.col_worst[2] in range(60, 64)
    assert m.block_failures == 0  # 4 of 128 columns hardly move a block's RMS
    assert "head-dim columns exceed the BF16 error budget" in " ".join(m.reasons)


def test_budget_floor_keeps_degenerate_blocks_passing() -> None:
    # S = 1: the only block holds row 0, whose output is V's first row: exact in BF16, so its
    # rms_bf16 is 0; a correct kernel reproduces it exactly (P = 1, l = 1).
    rng = np.random.default_rng(3)
    v0 = _bf16(rng.uniform(-1, 1, (1, 1, 2, 128)))
    m = _verdict(v0, v0)
    assert m.passed and m.budget_ratio == 0.0 and m.bf16_ratio == 0.0
    # ... and a kernel whose FP32 result is off by far less than half an ulp rounds to it.
    assert _verdict(v0 * np.float32(1 + 2**-20), v0).passed
    # The floor is small: 1% on that exact row still fails.
    bad = _verdict(v0 * np.float32(1.01), v0)
    assert not bad.passed and bad.block_bf16_ratio == math.inf
    assert bad.to_dict()["block_bf16_ratio"] is None  # JSON-safe


def test_budget_column_floor_is_the_heads_rounding_error() -> None:
    # A column whose |O| is tiny by cancellation (the "rising" set: every row mixes the same V
    # rows) has a tiny rms_bf16, but the error P's rounding leaves in it is like any column's.
    ref, o = _synthetic(H=1)
    rng = np.random.default_rng(5)
    row_rms = np.sqrt((ref.astype(np.float64) ** 2).mean(axis=-1))
    ref[..., 7] *= np.float32(0.02)  # cancellation
    o[..., 7] = ref[..., 7] + (0.6 * GR.BF16_UNIT * row_rms * rng.standard_normal(row_rms.shape))
    m = _verdict(o, ref)
    assert m.passed, m.reasons
    _, sums = GR.compare_numpy(O.f32_to_bf16_bits(o), ref)
    own = math.sqrt(sums.cols[0, 0, 7, 0] / sums.cols[0, 0, 7, 1])
    assert own > 5 * GR.BUDGET_K  # judged by its own rounding alone it would fail


def test_budget_sums_twin_and_device_layout() -> None:
    ref, o = _synthetic(B=2, H=3, S=50)  # S not a multiple of 16: a partial last block
    bits = O.f32_to_bf16_bits(o)
    sums = GR.budget_sums_numpy(bits, ref)
    assert sums.blocks.shape == (2, 3, 4, 4) and sums.cols.shape == (2, 3, 128, 4)
    of = O.bf16_bits_to_f32(bits).astype(np.float64)
    e2 = (of - ref) ** 2
    b2 = (_bf16(ref).astype(np.float64) - ref) ** 2
    assert sums.blocks[1, 2, 3, 0] == pytest.approx(e2[1, 48:50, 2].sum())
    assert sums.blocks[1, 2, 3, 3] == 2 * 128  # the partial block counts its 2 rows
    assert sums.blocks[0, 1, 1, 1] == pytest.approx(b2[0, 16:32, 1].sum())
    assert sums.cols[1, 0, 5, 2] == pytest.approx((ref[1, :, 0, 5].astype(np.float64) ** 2).sum())
    assert sums.cols[..., 3].min() == 50
    # The device buffers' layout: [B, H, NB] float4 blocks, [B, H, 128] x 4 doubles columns.
    nb_blocks, nb_cols = GR.BudgetSums.device_bytes(Shape(2, 3, 50))
    assert (nb_blocks, nb_cols) == (2 * 3 * 4 * 16, 2 * 3 * 128 * 32)
    dev = GR.BudgetSums.from_device(Shape(2, 3, 50), sums.blocks.astype(np.float32).reshape(-1),
                                   sums.cols.reshape(-1))
    np.testing.assert_allclose(dev.blocks, sums.blocks, rtol=1e-6)
    assert np.array_equal(dev.cols, sums.cols)
    # Worst case for the gate: 4x32x16384 needs 2.5 MB of device memory for the sums.
    assert sum(GR.BudgetSums.device_bytes(Shape(4, 32, 16384))) <= 3 << 20


def test_budget_non_finite_and_poison_are_left_out_of_the_sums() -> None:
    ref, o = _synthetic(S=32)
    bits = O.f32_to_bf16_bits(o)
    bits[0, 3, 1, 9] = GR.POISON_BF16
    bits[0, 20, 0, 0] = 0x7FC0  # NaN
    stats, sums = GR.compare_numpy(bits, ref)
    assert stats.o_unwritten == 1 and stats.o_nonfinite == 1 and stats.o_violations == 2
    assert stats.o_first_violation == (3 * 2 + 1) * 128 + 9
    assert np.isfinite(sums.blocks).all() and sums.blocks[0, 1, 0, 3] == 16 * 128 - 1
    m = GR.evaluate(stats, Shape(1, 2, 32), "seed", check_lse=False, budget=sums)
    assert not m.passed and m.block_failures == 0  # failed by the old rule, not the budget


def test_budget_overflowing_sums_fail() -> None:
    ref, o = _synthetic(S=32)
    _, sums = GR.compare_numpy(O.f32_to_bf16_bits(o), ref)
    sums.blocks[0, 0, 1, 0] = np.inf
    sums.cols[0, 1, 3, 0] = np.nan
    bc = GR.check_budget(sums, 32)
    assert bc.block_failures == 1 and bc.block_worst == (0, 0, 16, 31)
    assert bc.col_failures == 1 and bc.col_worst == (0, 1, 3)


def test_evaluate_rejects_budget_sums_of_another_shape() -> None:
    ref, o = _synthetic(S=32)
    stats, sums = GR.compare_numpy(O.f32_to_bf16_bits(o), ref)
    m = GR.evaluate(stats, Shape(1, 2, 32), "seed", check_lse=False,
                   budget=GR.BudgetSums(sums.blocks[:, :, :1], sums.cols))
    assert not m.passed and "oracle bug" in " ".join(m.reasons)


def test_compare_numpy_lse_side() -> None:
    ref, o = _synthetic(S=16)
    lse_ref = np.linspace(-3, 400, 2 * 16, dtype=np.float32).reshape(1, 2, 16)
    lse = lse_ref.copy()
    lse[0, 1, 5] += 1.0
    bits = lse.view(np.uint32).copy()
    bits[0, 0, 2] = GR.POISON_F32
    stats, _ = GR.compare_numpy(O.f32_to_bf16_bits(o), ref, bits, lse_ref)
    assert stats.l_count == 32 and stats.l_violations == 2 and stats.l_unwritten == 1
    assert stats.l_first_violation == 2 and stats.l_max_abs_err == pytest.approx(1.0, abs=1e-4)


def test_stats_bytes_roundtrip_carries_budget_fields() -> None:
    s = _stats(Shape(1, 2, 64), o_sum_sq_bf16=1.25e-3)
    back = GR.OracleStats.from_bytes(s.to_bytes())
    assert back.o_sum_sq_bf16 == 1.25e-3 and back.o_block_rows == GR.ROW_BLOCK


# ---- the budget on an emulated FlashAttention kernel (real inputs, real rounding) ------------
def _ref_f64(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True) -> np.ndarray:
    return O.numpy_reference(q, k, v, causal)[0]


def _fa_emulate(q: np.ndarray, k: np.ndarray, v: np.ndarray, block_n: int = 128,
                causal: bool = True, with_lse: bool = False, *, window: int = 0,
                softcap: float = 0.0, sinks: np.ndarray | None = None) -> Any:
    """The kernel's numerics in FP32 (before its final BF16 rounding): KV tiles walked from the
    diagonal (or the last tile), online softmax in base 2, P rounded to BF16 for the PV product
    while the row sum adds the FP32 probabilities, O / l at the end. q [B, S_q, Hq, D]; k, v
    [B, S_k, Hkv, D] (query head h reads K/V head h // (Hq / Hkv)); causal bottom-right.
    ``with_lse``: (O, LSE [B, Hq, S] as the kernel writes it: (m c + log2 l) ln 2 in FP32).
    The models' masks: a ``window`` of keys, ``softcap`` (C tanh(s / C) of the scaled FP32
    score, then base 2), ``sinks`` ([Hq] natural-log logits: sink log2(e) joins the base-2 max
    and sum at the end)."""
    qf, kf, vf = (O.bf16_bits_to_f32(a) for a in (q, k, v))
    B, S, H, D = qf.shape
    Sk = kf.shape[1]
    group = H // kf.shape[2]
    c = np.float32(math.log2(math.e) / math.sqrt(D))
    out = np.empty((B, S, H, D), dtype=np.float32)
    lse_out = np.empty((B, H, S), dtype=np.float32)
    mask = RN.key_mask(S, Sk, causal, window)
    for b in range(B):
        for h in range(H):
            g = h // group
            sc = (qf[b, :, h].astype(np.float64) @ kf[b, :, g].T.astype(np.float64))
            sc = sc.astype(np.float32)
            if softcap > 0:  # the capped score, already scaled: base 2 is all c is left to do
                cap = np.float32(softcap)
                sc = (cap * np.tanh(sc * np.float32(1 / math.sqrt(D)) / cap)).astype(np.float32)
                c = np.float32(math.log2(math.e))
            sc = np.where(mask, sc, -np.inf).astype(np.float32)
            m = np.full(S, -np.inf, np.float32)
            lsum = np.zeros(S, np.float32)
            acc = np.zeros((S, D), np.float32)
            for t in range((Sk + block_n - 1) // block_n - 1, -1, -1):
                s = sc[:, t * block_n:(t + 1) * block_n]
                mn = np.maximum(m, s.max(axis=1))
                ms = np.where(mn == -np.inf, 0, mn * c).astype(np.float32)
                with np.errstate(invalid="ignore"):
                    al = np.where(m == -np.inf, 1, np.exp2(m * c - ms)).astype(np.float32)
                p = np.exp2(s * c - ms[:, None]).astype(np.float32)
                lsum = lsum * al + p.sum(axis=1, dtype=np.float32)
                acc = acc * al[:, None] + (_bf16(p).astype(np.float64)
                                           @ vf[b, t * block_n:(t + 1) * block_n, g]
                                           ).astype(np.float32)
                m = mn
            mc = np.where(m == -np.inf, -np.inf, m * c).astype(np.float32)
            if sinks is not None:  # the sink joins the base-2 max and sum
                s2 = np.float32(sinks[h]) * np.float32(math.log2(math.e))
                mf = np.maximum(mc, s2)
                al = np.exp2(mc - mf).astype(np.float32)
                lsum = (lsum * al + np.exp2(s2 - mf)).astype(np.float32)
                acc = acc * al[:, None]
                mc = mf
            out[b, :, h] = acc / lsum[:, None]
            lse_out[b, h] = ((mc + np.log2(lsum)) * np.float32(math.log(2))).astype(np.float32)
    return (out, lse_out) if with_lse else out


@pytest.mark.parametrize("input_set", ["seed", "rising", "rising_fwd"])
def test_budget_on_emulated_flash_attention(input_set: str) -> None:
    shape = Shape(1, 2, 320)
    q, k, v = O.host_inputs(shape, input_set, 42)
    ref = _ref_f64(q, k, v).astype(np.float32)
    o = _fa_emulate(q, k, v)
    good = _verdict(o, ref)
    assert good.passed, good.reasons
    assert good.budget_ratio < 0.65 and good.bf16_ratio < 1.7  # margin >= 1.5x
    rows = np.arange(shape.S) % 64 < 8  # planted bug 4: O x 1.015 on rows 0-7 of every 64
    bug4 = _verdict(_scaled(o, 1.015, rows=rows), ref)
    assert not bug4.passed and _old_rule_passes(bug4) and bug4.block_budget_ratio > 1.5
    assert bug4.block_worst[2] % 64 == 0  # a block holding rows 0-7 of a 64-row tile
    bug6 = _verdict(_scaled(o, 1.01, cols=slice(0, 4)), ref)  # planted bug 6
    assert not bug6.passed and _old_rule_passes(bug6) and bug6.col_worst[2] < 4
    one_pct = _verdict(_scaled(o, 1.01, rows=slice(136, 144)), ref)  # 1% on 8 rows
    assert not one_pct.passed and _old_rule_passes(one_pct)


# ---- the problem family: GQA / MQA, head dims 64 and 256, non-causal -------------------------
FAMILY = [
    Problem(1, 4, 256, Hkv=2),  # GQA
    Problem(1, 4, 256, Hkv=1),  # MQA
    Problem(1, 2, 256, D=64),
    Problem(1, 2, 256, D=256),
    Problem(1, 4, 256, Hkv=2, D=64, causal=False),
    Problem(1, 4, 200, Hkv=1, D=256, causal=False),
]

# sha256 (first 32 hex digits) of Q, K, V of 2x3x200 as ABI 2 generated them (MHA, D 128,
# seed 42): the family's generators must not move a bit of the sets existing results used.
ABI2_DIGESTS = {"seed": "d5400ac5e483b961d22e36261b6b0a85",
                "rising": "84f802b0e93f8fd4178a374094c60373",
                "rising_fwd": "74065b12fb087beb8ec78c84492f5e27"}


@pytest.mark.parametrize("input_set", sorted(ABI2_DIGESTS))
def test_mha_d128_inputs_are_bit_identical_to_abi2(input_set: str) -> None:
    import hashlib

    for shape in (Shape(2, 3, 200), Problem(2, 3, 200)):
        h = hashlib.sha256()
        for a in O.host_inputs(shape, input_set, 42):
            h.update(a.tobytes())
        assert h.hexdigest()[:32] == ABI2_DIGESTS[input_set], shape


@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_gqa_inputs_use_each_tensors_own_flat_index(input_set: str) -> None:
    mha = O.host_inputs(Problem(1, 4, 64), input_set, 42)
    gqa = O.host_inputs(Problem(1, 4, 64, Hkv=2), input_set, 42)
    assert gqa[0].shape == (1, 64, 4, 128) and gqa[1].shape == gqa[2].shape == (1, 64, 2, 128)
    assert np.array_equal(gqa[0], mha[0])  # Q: same problem of query heads, same bits
    v_mha, v_gqa = mha[2].reshape(-1), gqa[2].reshape(-1)
    assert np.array_equal(v_gqa, v_mha[: v_gqa.size])  # V: the first n_kv elements' stream
    if input_set == "seed":
        assert np.array_equal(gqa[1].reshape(-1), mha[1].reshape(-1)[: v_gqa.size])


@pytest.mark.parametrize("problem", FAMILY, ids=str)
def test_host_inputs_shapes_and_ranges_for_the_family(problem: Problem) -> None:
    q, k, v = O.host_inputs(problem, "seed", 3)
    assert q.shape == (problem.B, problem.S, problem.Hq, problem.D)
    assert k.shape == v.shape == (problem.B, problem.S, problem.Hkv, problem.D)
    qf, vf = O.bf16_bits_to_f32(q), O.bf16_bits_to_f32(v)
    assert qf.min() >= -2 and qf.max() <= 2 and vf.min() >= -1 and vf.max() <= 1
    O.check_input_set("rising", problem)  # every problem of the family has the rising sets


@pytest.mark.parametrize("problem", FAMILY, ids=str)
def test_rising_set_rises_for_the_family(problem: Problem) -> None:
    """Every query head (GQA: against its shared K/V head), every tile size, reverse walks:
    the running max rises by at least the construction's margin, causal or not."""
    q, k, _ = O.host_inputs(problem, "rising", 42)
    margin = O.rising_min_rise(problem.D)
    assert margin >= 0.38  # D 128's margin is the smallest
    for block_n in (64, 80, 128, 176):
        assert O.rising_failures(q, k, block_n, reverse=True, min_rise=margin - 1e-9,
                                 causal=problem.causal) == 0, block_n
    assert O.rising_failures(q, k, 64, reverse=False, causal=problem.causal) > 0
    qf, kf, _ = O.host_inputs(problem, "rising_fwd", 42)
    # Forward walks rise at every step into a FULL tile; only a short last tile may not.
    n_tiles = (problem.S + 63) // 64
    fails = O.rising_failures(qf, kf, 64, reverse=False, causal=problem.causal)
    assert fails <= n_tiles * 64 * problem.B * problem.Hq // 4
    full = O.rising_failures(qf, kf, 64, reverse=False, min_rise=margin - 1e-9,
                             causal=problem.causal)
    if problem.S % 64 == 0 and not problem.causal:
        assert full == 0  # no partial tile at all


@pytest.mark.parametrize("D", [64, 128, 256])
def test_rising_construction_bounds_per_head_dim(D: int) -> None:
    problem = Problem(1, 4, 512, Hkv=2, D=D)
    q, k, _ = O.host_inputs(problem, "rising", 42)
    qf, kf = O.bf16_bits_to_f32(q), O.bf16_bits_to_f32(k)
    c2 = qf[..., 1]
    m = O.rising_c2_scale(D)
    assert np.all(qf[..., 0] == c2 * 256)
    assert c2.min() >= 0.0898 * m and c2.max() <= 0.1349 * m
    assert np.abs(kf[..., 10:]).max() <= 0.0101
    bound = O.rising_noise_bound(D)
    for h in range(problem.Hq):
        g = h // problem.group
        sc = O.scores_f64(q, k, 0, h)
        t = kf[0, :, g, 0].astype(np.float64) * 256 + kf[0, :, g, 1]
        trend = np.outer(c2[0, :, h], t) / math.sqrt(D)
        assert np.abs(sc - trend).max() < bound
        assert np.all(np.diff(t) <= -1)
    # Query heads of one group share t (their K/V head's), so the trend is the same per row.
    assert np.array_equal(kf[0, :, 0, :2], O.bf16_bits_to_f32(
        O.host_inputs(Problem(1, 2, 512, Hkv=2, D=D), "rising", 42)[1])[0, :, 0, :2])


@pytest.mark.parametrize("causal", [True, False])
def test_numpy_reference_gqa_equals_mha_with_repeated_kv(causal: bool) -> None:
    rng = np.random.default_rng(4)
    q = rng.uniform(-2, 2, (2, 24, 6, 64)).astype(np.float32)
    k = rng.uniform(-2, 2, (2, 24, 2, 64)).astype(np.float32)
    v = rng.uniform(-1, 1, (2, 24, 2, 64)).astype(np.float32)
    o, lse = O.numpy_reference(q, k, v, causal)
    o_mha, lse_mha = O.numpy_reference(q, np.repeat(k, 3, axis=2), np.repeat(v, 3, axis=2),
                                       causal)
    assert o.shape == (2, 24, 6, 64) and lse.shape == (2, 6, 24)
    np.testing.assert_allclose(o, o_mha, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, lse_mha, rtol=0, atol=1e-12)
    rows = [(0, 0, 0), (1, 5, 23), (0, 3, 11)]
    o_r, l_r = O.numpy_reference_rows(q, k, v, rows, causal=causal)
    for i, (b, h, s) in enumerate(rows):
        np.testing.assert_allclose(o_r[i], o[b, s, h], atol=1e-12)
        assert l_r[i] == pytest.approx(lse[b, h, s], abs=1e-12)
    # Row 0: causal attends to key 0 only (O = V's row 0); non-causal to every key.
    s0 = k[0, :, 0].astype(np.float64) @ q[0, 0, 1] / 8.0  # head 1 reads K/V head 0
    if causal:
        np.testing.assert_allclose(o[0, 0, 1], v[0, 0, 0], atol=1e-12)
    else:
        p = np.exp(s0 - s0.max())
        np.testing.assert_allclose(o[0, 0, 1], p @ v[0, :, 0] / p.sum(), atol=1e-12)
        assert lse[0, 1, 0] == pytest.approx(math.log(np.exp(s0).sum()))


@pytest.mark.parametrize("D", [64, 256])
def test_budget_sums_and_device_layout_per_head_dim(D: int) -> None:
    problem = Problem(2, 4, 40, Hkv=2, D=D, causal=False)
    rng = np.random.default_rng(D)
    ref = rng.standard_normal((2, 40, 4, D)).astype(np.float32)
    bits = O.f32_to_bf16_bits(ref * np.float32(1.001))
    stats, sums = GR.compare_numpy(bits, ref)
    assert sums.blocks.shape == (2, 4, 3, 4) and sums.cols.shape == (2, 4, D, 4)
    assert sums.cols[..., 3].min() == 40 and sums.blocks[0, 0, 2, 3] == 8 * D
    nb_blocks, nb_cols = GR.BudgetSums.device_bytes(problem)
    assert (nb_blocks, nb_cols) == (2 * 4 * 3 * 16, 2 * 4 * D * 32)
    dev = GR.BudgetSums.from_device(problem, sums.blocks.astype(np.float32).reshape(-1),
                                   sums.cols.reshape(-1))
    assert np.array_equal(dev.cols, sums.cols)
    m = GR.evaluate(stats, problem, "seed", check_lse=False, budget=sums)
    assert m.elements == 2 * 40 * 4 * D and not [r for r in m.reasons if "oracle bug" in r]
    # Sums laid out for another head dim are an oracle bug, not a verdict.
    other = Problem(2, 4, 40, Hkv=2, D=128 if D != 128 else 64, causal=False)
    bad = GR.evaluate(stats, other, "seed", check_lse=False, budget=sums)
    assert not bad.passed and "oracle bug" in " ".join(bad.reasons)


def test_evaluate_decodes_the_first_violation_of_a_gqa_d64_problem() -> None:
    problem = Problem(2, 6, 50, Hkv=3, D=64)
    idx = ((1 * 50 + 17) * 6 + 5) * 64 + 33  # (b=1, s=17, h=5, d=33): O is [B, S, Hq, D]
    n = 2 * 50 * 6 * 64
    m = GR.evaluate(GR.OracleStats(o_count=n, o_violations=1, o_nonfinite=0, o_unwritten=0,
                                 o_first_violation=idx, o_ref_nonfinite=0, o_max_abs_err=1.0,
                                 o_sum_sq_err=1e-6, o_sum_sq_ref=1.0,
                                 l_count=2 * 6 * 50), problem, "seed", check_lse=True)
    assert m.first_violation == (1, 17, 5, 33) and m.elements == n
    assert "compared" not in " ".join(m.reasons)  # counts match the problem's sizes
    g = GR.GateResult(passed=m.passed, shape=str(problem), seed=42, sets=[m],
                     problem=problem.to_dict())
    assert g.summary().startswith("gate FAIL 2x6/3x50:d64 seed 42")
    assert g.to_dict()["problem"]["Hkv"] == 3 and g.to_dict()["shape"] == "2x6/3x50:d64"


@pytest.mark.parametrize("problem", [Problem(1, 4, 192, Hkv=2), Problem(1, 2, 192, D=64),
                                     Problem(1, 2, 192, D=256),
                                     Problem(1, 4, 192, Hkv=1, D=64, causal=False)], ids=str)
@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_budget_on_emulated_flash_attention_for_the_family(problem: Problem,
                                                           input_set: str) -> None:
    """The budget rule is per block of O (16 rows x D columns) and per column of O: GQA, the
    mask and D change the reference, not the rule. A correct kernel's numerics pass with the
    same margin; 1.5% on rows 0-7 of every 64 and 1% on 4 columns fail by the budget alone."""
    q, k, v = O.host_inputs(problem, input_set, 42)
    ref = _ref_f64(q, k, v, problem.causal).astype(np.float32)
    o = _fa_emulate(q, k, v, block_n=64, causal=problem.causal)
    good = _verdict(o, ref, problem)
    assert good.passed, good.reasons
    assert good.budget_ratio < 0.7 and good.bf16_ratio < 1.8
    rows = np.arange(problem.S) % 64 < 8
    bug4 = _verdict(_scaled(o, 1.015, rows=rows), ref, problem)
    assert not bug4.passed and _old_rule_passes(bug4) and bug4.block_budget_ratio > 1.3
    bug6 = _verdict(_scaled(o, 1.01, cols=slice(0, 4)), ref, problem)
    assert not bug6.passed and _old_rule_passes(bug6) and bug6.col_worst[2] < 4


# ---- queries over a longer KV (S_q < S_k): the same rule over the query rows -----------------
@pytest.mark.parametrize("problem", [Problem.parse("1x4/2x192:k640"),
                                     Problem.parse("1x2x100:k333:d64"),
                                     Problem.parse("1x4/1x128:k500:full"),
                                     Problem.parse("1x8/2x16:k2048")], ids=str)
@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_budget_on_emulated_flash_attention_with_more_keys(problem: Problem,
                                                           input_set: str) -> None:
    """A correct kernel's numerics over S_k > S_q keys (bottom-right causal) pass with the
    family's margin; the planted-bug patterns on O's query rows and columns still fail by the
    budget alone."""
    q, k, v = O.host_inputs(problem, input_set, 42)
    assert q.shape[1] == problem.S_q and k.shape[1] == problem.S_k
    ref = _ref_f64(q, k, v, problem.causal).astype(np.float32)
    o = _fa_emulate(q, k, v, block_n=64, causal=problem.causal)
    good = _verdict(o, ref, problem)
    assert good.passed, good.reasons
    # 16 rows: a column's RMS is over 16 elements only, so its ratio scatters more (issue 35).
    assert good.budget_ratio < (0.8 if problem.S_q < 64 else 0.7) and good.bf16_ratio < 2.2
    assert good.elements == problem.S_q * problem.Hq * problem.D
    rows = np.arange(problem.S_q) % 64 < 8
    bug4 = _verdict(_scaled(o, 1.015, rows=rows), ref, problem)
    assert not bug4.passed and bug4.block_budget_ratio > 1.3
    # (16 rows: the bug is half of them, so relative L2 catches it too.)
    assert _old_rule_passes(bug4) or problem.S_q < 64
    bug6 = _verdict(_scaled(o, 1.01, cols=slice(0, 4)), ref, problem)
    assert not bug6.passed and _old_rule_passes(bug6) and bug6.col_worst[2] < 4
