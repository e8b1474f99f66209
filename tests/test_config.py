from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuner.errors import ConfigError, ShapeError
from tuner.kernel import config as C
from tuner.kernel.config import KNOBS, KernelConfig, list_presets, load_preset, validate
from tuner.kernel.knobs import camel_case
from tuner.kernel.support import check_problem, check_problems
from tuner.problem import SEED_PROBLEMS, Problem, ProblemClass, class_of

ARCH_DEFAULTS = {
    "block_m": 128, "block_n": 128, "k_stages": 2, "v_stages": 2, "k_release": "after_qk",
    "v_release": "after_pv", "q_release": "at_end", "hint_q": "evict_first",
    "hint_k": "evict_last", "hint_v": "evict_last", "hint_o": "none", "producer_regs": 24,
    "consumer_regs": 240, "intra_wg_overlap": True, "pingpong": True, "rescale_o": "after_pv",
    "lazy_rescale": False,
    "tree_reduce": False,
    "sum_in_pv": False,
    "q_in_regs": False,
    "early_next_qk": False,
    "kv_multicast": False,
    "wg_skip": False,
    "head_cluster": 1,
    "pack_gqa": False,
    "tile_order": "longest_first", "scheduler": "grid", "fixed_cost": 4, "persistent_ctas": 0,
    "ctas_per_sm": 1,
    "softcap_tanh": "exact",
    "write_lse": True,
}


def test_defaults_match_architecture_table() -> None:
    assert KernelConfig().to_dict() == ARCH_DEFAULTS
    assert list(KNOBS) == list(ARCH_DEFAULTS)
    validate(KernelConfig())


def test_round_trips_and_hash() -> None:
    cfg = KernelConfig(block_n=96, hint_o="evict_normal", pingpong=False)
    assert KernelConfig.from_dict(cfg.to_dict()) == cfg
    assert KernelConfig.from_dict(json.loads(cfg.canonical_json())) == cfg
    assert KernelConfig.from_yaml_text(cfg.to_yaml()) == cfg
    assert hash(cfg) == hash(KernelConfig.from_dict(cfg.to_dict()))
    assert {cfg, KernelConfig.from_dict(cfg.to_dict())} == {cfg}
    # canonical: sorted keys, no spaces
    cj = cfg.canonical_json()
    # (knobs added later are left out at their neutral value: old ids stay)
    later = set(C.NEUTRAL_LATER_KNOBS)
    assert " " not in cj and list(json.loads(cj)) == sorted(set(ARCH_DEFAULTS) - later)
    assert len(cfg.config_id()) == 12 and cfg.config_id() != KernelConfig().config_id()
    assert cfg.config_id() == KernelConfig.from_dict(cfg.to_dict()).config_id()


def test_yaml_file_round_trip(tmp_path: Path) -> None:
    cfg = KernelConfig(block_m=64, pingpong=False)
    p = tmp_path / "c.yaml"
    cfg.save_yaml(p)
    assert KernelConfig.load(p) == cfg
    assert yaml.safe_load(p.read_text())["block_m"] == 64


def test_partial_dict_over_defaults() -> None:
    assert KernelConfig.from_dict({"block_n": 64}) == KernelConfig(block_n=64)
    assert KernelConfig.from_dict(None) == KernelConfig()


def test_unknown_knob_names_it() -> None:
    with pytest.raises(ConfigError, match="unknown knob 'blok_m'"):
        KernelConfig.from_dict({"blok_m": 128}, source="x.yaml")


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"block_m": 100}, "knob 'block_m' must be one of 64, 128, 192 (got 100)"),
        ({"block_n": 72}, "knob 'block_n' must be 48..192 in steps of 16 (got 72)"),
        ({"pingpong": "yes"},
         "knob 'pingpong' must be one of false, true (got yes, a str: write it without quotes)"),
        ({"block_m": True}, "knob 'block_m'"),
        ({"hint_q": "evict_fast"}, "none, evict_first, evict_last, evict_normal"),
        ({"fixed_cost": 17}, "an integer from 0 to 16"),
        ({"persistent_ctas": -1}, "knob 'persistent_ctas'"),
    ],
)
def test_bad_values_say_knob_and_allowed(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        KernelConfig.from_dict(data)
    assert needle in str(ei.value)
    assert "\n" not in str(ei.value)


def test_direct_construction_is_checked() -> None:
    with pytest.raises(ConfigError, match="block_m"):
        KernelConfig(block_m=96)


def test_unparseable_yaml(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("block_m: [128\nblock_n: 64\n")
    with pytest.raises(ConfigError, match="cannot parse YAML"):
        KernelConfig.load(p)
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        KernelConfig.load(p)
    with pytest.raises(ConfigError, match="cannot read"):
        KernelConfig.load(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"block_m": 192, "block_n": 192, "k_stages": 3, "v_stages": 3, "consumer_regs": 160},
         "shared memory"),
        ({"block_m": 192, "consumer_regs": 240}, "registers per CTA"),
        # Hung on the H200 (search, 2026-11-29): 32 + 2 x 240 = 65536 registers, but a
        # 384-thread CTA holds 168 x 384 = 64512 at launch, so setmaxnreg.inc waits forever.
        ({"producer_regs": 32, "consumer_regs": 240}, "64512 the CTA holds at launch"),
        ({"block_m": 64, "pingpong": True}, "pingpong needs at least 2 consumer warpgroups"),
        ({"rescale_o": "before_pv", "intra_wg_overlap": False}, "needs intra_wg_overlap"),
        ({"v_release": "deferred", "v_stages": 1}, "needs v_stages >= 2"),
        ({"k_release": "after_softmax", "k_stages": 1}, "needs k_stages >= 2"),
        ({"k_release": "after_max", "intra_wg_overlap": False}, "use after_qk without it"),
        # Measured 2026-12-05 (nvcc 13.0, docs/PERF.md step 57): the serial 128 x 192 kernel with
        # a persistent scheduler put 4-24 B on the stack at 240 registers.
        ({"block_n": 192, "intra_wg_overlap": False, "scheduler": "static",
          "producer_regs": 24}, "about 241 registers per thread"),
        ({"block_n": 160, "consumer_regs": 160}, "about 220 registers per thread"),
        # Measured 2026-12-01 (nvcc 13.0): block_n 192 with overlap at 240 registers put 8 B on
        # the stack (docs/PERF.md step 35), so the check must refuse it.
        ({"block_n": 192}, "about 244 registers per thread"),
        ({"k_stages": 3, "v_stages": 3, "q_release": "after_last_qk"}, "a separate O tile"),
        # The warp-uniform persistent producer fits 24 registers (2026-12-01), but with
        # block_m 64 a D 256 varlen build still spilled at 24: 56 there.
        ({"scheduler": "static", "block_m": 64, "pingpong": False},
         "needs producer_regs >= 56 with block_m 64"),
        # Two CTAs per SM halve each CTA's pool: 384 threads get 80 registers each at launch.
        ({"ctas_per_sm": 2, "block_n": 64, "consumer_regs": 144},
         "more than the 30720 the CTA holds"),
        ({"ctas_per_sm": 2, "block_m": 64, "block_n": 64, "pingpong": False,
          "producer_regs": 24, "consumer_regs": 240}, "more than the 32768 the CTA holds"),
        ({"ctas_per_sm": 2, "block_m": 64, "block_n": 128, "pingpong": False,
          "producer_regs": 24, "consumer_regs": 232}, "each of 2 CTAs on one SM"),
        ({"scheduler": "static", "producer_regs": 40, "consumer_regs": 232,
          "early_next_qk": True}, "needs q_release after_last_qk"),
        ({"early_next_qk": True}, "needs a persistent scheduler"),
        ({"scheduler": "static", "producer_regs": 40, "consumer_regs": 232,
          "q_release": "after_last_qk", "early_next_qk": True, "rescale_o": "before_pv"},
         "spills"),
        # Measured 2026-12-01 (nvcc 13.0, docs/PERF.md step 36): ~1.1 KB of stack at 232 and 240.
        ({"scheduler": "static", "producer_regs": 24, "consumer_regs": 240,
          "q_release": "after_last_qk", "early_next_qk": True, "block_n": 160},
         "early_next_qk with block_n 160 spills"),
        ({"scheduler": "dynamic", "producer_regs": 40, "consumer_regs": 232, "block_m": 64,
          "pingpong": False}, "needs producer_regs >= 56"),
        ({"kv_multicast": True}, "kv_multicast needs the static scheduler"),
        ({"scheduler": "static", "producer_regs": 40, "consumer_regs": 232, "block_m": 192,
          "block_n": 64, "kv_multicast": True}, "skip 5 KV tiles, which needs at least 4 V stages"),
        ({"scheduler": "static", "block_m": 64, "kv_multicast": True},
         "kv_multicast needs block_m 128 or 192"),
        ({"scheduler": "static", "producer_regs": 40, "consumer_regs": 232,
          "q_release": "after_last_qk", "early_next_qk": True, "kv_multicast": True},
         "does not support early_next_qk"),
        ({"scheduler": "dynamic", "head_cluster": 2},
         "head_cluster needs the static or grid scheduler"),
        ({"scheduler": "static", "q_release": "after_last_qk", "early_next_qk": True,
          "block_n": 112, "head_cluster": 2}, "head_cluster does not support early_next_qk"),
        # Hung on the H200 (2026-12-02, docs/PERF.md step 38): the lowest warpgroup skips 3 KV
        # tiles, whose V stages it frees only after a K the producer sends after 2 V tiles.
        ({"scheduler": "static", "kv_multicast": True, "q_release": "after_last_qk",
          "block_n": 64, "v_stages": 1}, "skip 3 KV tiles, which needs at least 2 V stages"),
        ({"scheduler": "static", "kv_multicast": True, "q_release": "after_last_qk",
          "block_n": 80, "v_stages": 1}, "raise v_stages or block_n"),
        # pack_gqa fills one CTA's rows with a group's heads; the clusters split them otherwise.
        ({"scheduler": "static", "head_cluster": 2, "pack_gqa": True},
         "set those off or pack_gqa false"),
        ({"scheduler": "static", "block_m": 192, "consumer_regs": 160, "kv_multicast": True,
          "pack_gqa": True}, "pack_gqa packs a GQA group's heads"),
        ({"block_m": 192, "consumer_regs": 160, "wg_skip": True, "pack_gqa": True},
         "pack_gqa packs a GQA group's heads"),
        # 8 CTAs at D 128: each of the two 64-column boxes in 4 row slices of 20 rows.
        ({"scheduler": "static", "kv_multicast": True, "head_cluster": 4, "block_n": 80},
         "does not split into slices of a multiple of 8 rows; use a block_n divisible by 32"),
    ],
)
def test_validate_explains(changes: dict, needle: str) -> None:
    cfg = KernelConfig().replace(**changes)
    with pytest.raises(ConfigError) as ei:
        validate(cfg)
    assert needle in str(ei.value)


def test_validate_accepts_edge_cases() -> None:
    validate(KernelConfig(k_release="after_softmax", intra_wg_overlap=False, k_stages=1,
                          rescale_o="after_pv"))
    validate(KernelConfig(block_m=192, consumer_regs=160, block_n=64, intra_wg_overlap=False,
                          rescale_o="after_pv"))
    validate(KernelConfig(block_n=112))  # compiled with no stack on 2026-11-29
    # FA3's non-causal D 128 tile: compiled with no stack at 240 and 232 registers, both
    # masks (2026-12-01); and Q in registers at 144 (the old estimate refused all three).
    validate(KernelConfig(block_n=176))
    validate(KernelConfig(block_n=176, consumer_regs=232))
    validate(KernelConfig(block_n=144, q_in_regs=True))
    for sched in ("static", "dynamic"):
        validate(KernelConfig(scheduler=sched, producer_regs=40, consumer_regs=232))
    validate(KernelConfig(block_m=64, pingpong=False))
    # The controls of the multicast hang (ran on the H200, 2026-12-02): 2 V stages at block_n
    # 64, 1 at 96; and without overlap every skipped V stage is freed at once.
    mc = dict(scheduler="static", kv_multicast=True, q_release="after_last_qk")
    validate(KernelConfig(**mc, block_n=64, v_stages=2))
    validate(KernelConfig(**mc, block_n=96, v_stages=1))
    validate(KernelConfig(**mc, block_n=64, v_stages=1, intra_wg_overlap=False,
                          rescale_o="after_pv"))


def test_register_estimate_constant() -> None:
    cfg = KernelConfig()
    assert C.consumer_reg_estimate(cfg) == 64 + 32 + 64 + C.CONSUMER_REG_OVERHEAD
    assert C.smem_bytes(cfg) == 128 * 256 + 2 * 128 * 256 * 2 + 1024


def test_cpp_constants() -> None:
    cc = KernelConfig().cpp_constants()
    assert set(cc) == set(KNOBS)
    assert cc["block_m"] == "128"
    assert cc["pingpong"] == "true"
    assert cc["hint_q"] == "fa_tune::CacheHint::EvictFirst"
    assert cc["k_release"] == "fa_tune::KRelease::AfterQk"
    assert cc["q_release"] == "fa_tune::QRelease::AtEnd"
    assert KernelConfig(q_release="after_last_qk").cpp_constants()["q_release"] == (
        "fa_tune::QRelease::AfterLastQk"
    )
    assert cc["scheduler"] == "fa_tune::Scheduler::Grid"
    assert camel_case("evict_first") == "EvictFirst"


def test_presets() -> None:
    assert {"default", "baseline", "fa3"} <= set(list_presets())
    assert load_preset("default") == KernelConfig()
    b = load_preset("baseline")
    assert (b.block_m, b.block_n, b.k_stages, b.v_stages) == (128, 128, 1, 1)
    assert not b.intra_wg_overlap and not b.pingpong
    assert b.diff_from_default() == {"k_stages": 1, "v_stages": 1, "intra_wg_overlap": False,
                                     "pingpong": False}
    f = load_preset("fa3")
    assert (f.k_stages, f.v_stages, f.intra_wg_overlap, f.pingpong) == (2, 2, True, True)
    for name in list_presets():
        validate(load_preset(name), C.preset_head_dim(name))


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="unknown preset 'nope'.*baseline"):
        load_preset("nope")
    with pytest.raises(ConfigError):
        load_preset("../etc/passwd")


def test_seed_problems_keep_their_names() -> None:
    s = Problem.parse("4x32x8192")
    assert (s.B, s.H, s.S) == (4, 32, 8192) and str(s) == "4x32x8192"
    assert Problem.parse(" 1X2x128 ") == Problem(1, 2, 128)
    assert [str(x) for x in SEED_PROBLEMS] == ["4x32x4096", "4x32x8192", "4x32x16384"]


@pytest.mark.parametrize("text", ["4x32", "4x32x", "axbxc", "4x32x-1", "4*32*8", "", "0x32x128"])
def test_problem_malformed(text: str) -> None:
    with pytest.raises(ShapeError) as ei:
        Problem.parse(text)
    assert "\n" not in str(ei.value)


def test_problem_too_large_and_grid_check() -> None:
    with pytest.raises(ShapeError, match="too large"):
        Problem(64, 64, 1 << 20)
    with pytest.raises(ShapeError, match="Hq=70000 exceeds the kernel's grid limit 65535"):
        check_problem(KernelConfig(), Problem(1, 70000, 128))
    with pytest.raises(ShapeError, match="B=70000 exceeds"):
        check_problem(KernelConfig(), Problem(70000, 1, 128))
    check_problem(KernelConfig(), Problem(1, 1, 100))  # ragged tiles are masked
    for p in SEED_PROBLEMS:
        check_problem(KernelConfig(), p)


@pytest.mark.parametrize(
    ("text", "preset"),
    [("4x32x8192:d64", "d64"), ("4x16x8192:d256", "d256"), ("1x32/8x8192:d64", "d64"),
     ("4x32x8192:d256:full", "d256")],
)
def test_check_problems_per_head_dim(text: str, preset: str) -> None:
    """D 64 and 256 are problem classes of the kernel: the static check is per head dim, and a
    config that cannot fit one says so and names that head dim's default preset."""
    problem = Problem.parse(text)
    check_problem(KernelConfig(), problem)  # the problem itself is one the kernel runs
    pclass = check_problems(load_preset(preset), [problem])
    assert (pclass.head_dim, pclass.causal) == (problem.D, problem.causal)
    if problem.D == 256:  # 128 x 128 tiles and 2 + 2 stages need 328 704 B at D 256
        with pytest.raises(ConfigError) as ei:
            check_problems(KernelConfig(), [problem])
        msg = str(ei.value)
        assert "shared memory" in msg and "head dim 256" in msg and "'d256'" in msg
        assert "\n" not in msg


def test_static_check_per_head_dim() -> None:
    """Registers per head dim (scripts/reg_calibration.py, docs/PERF.md step 26): the O
    accumulator is D/2 per thread, so what fits at D 64 does not at D 256 and back."""
    wide = KernelConfig(block_m=192, block_n=128, producer_regs=32, consumer_regs=160)
    validate(wide, 64)  # FA3's D 64 choice (the d64 preset)
    with pytest.raises(ConfigError, match="at head dim 128 .*O 64"):
        validate(wide, 128)
    d256 = load_preset("d256")
    validate(d256, 256)
    with pytest.raises(ConfigError, match="at head dim 256 .*O 128"):  # spilled 64 B
        validate(d256.replace(block_n=96, k_stages=1), 256)
    # D 64 has one 64-column box: each CTA of a multicast pair loads half its rows.
    validate(load_preset("multicast"), 64)
    with pytest.raises(ConfigError, match="head dim 96 is not one"):
        validate(KernelConfig(), 96)
    for d, name in C.DEFAULT_PRESETS.items():
        validate(load_preset(name), d)
        assert name in list_presets()
    for d, flags, name in C.CLASS_PRESETS:
        validate(load_preset(name), d)
        assert C.default_preset(ProblemClass(d, True, **dict.fromkeys(flags, True))) == name
        assert C.default_preset(ProblemClass(d, True)) == C.DEFAULT_PRESETS[d] != name
    assert C.default_preset(ProblemClass(256, True, softcap=True)) == "d256"  # fits unpacked
    assert C.default_preset(ProblemClass(128, True, window=True, softcap=True)) == "default"


@pytest.mark.parametrize("text", ["1x32/8x8192", "1x32/1x8192", "4x32x8192:full",
                                  "1x32/8x8192:full", "2x16x1000:full"])
def test_check_problem_accepts_gqa_mqa_and_non_causal_at_d128(text: str) -> None:
    """Hkv is a run-time argument of the kernel and the mask is compiled per library."""
    check_problem(KernelConfig(), Problem.parse(text))
    check_problems(KernelConfig(), [Problem.parse(text)])


def test_check_problems_refuses_a_mix_of_masks() -> None:
    causal, full = Problem.parse("4x32x8192"), Problem.parse("4x32x8192:full")
    with pytest.raises(ShapeError) as ei:
        check_problems(KernelConfig(), [causal, Problem.parse("1x32/8x8192"), full])
    msg = str(ei.value)
    assert "mix causal and non-causal (:full) masks" in msg and "two invocations" in msg
    assert "\n" not in msg
    assert class_of([causal, Problem.parse("1x32/8x8192")]) == ProblemClass(128, True)
    assert class_of([full, Problem.parse("1x32/1x8192:full")]) == ProblemClass(128, False)
    with pytest.raises(ShapeError, match="mix head dims"):
        check_problems(KernelConfig(), [Problem.parse("4x32x8192:d64"), causal])


def test_effective_drops_knobs_that_cannot_matter() -> None:
    grid = KernelConfig(fixed_cost=9, persistent_ctas=100, tile_order="natural")
    assert grid.effective() == KernelConfig(tile_order="natural")
    dyn = KernelConfig(scheduler="dynamic", producer_regs=40, consumer_regs=232, fixed_cost=9,
                       persistent_ctas=100, tile_order="natural")
    assert dyn.effective() == dyn.replace(fixed_cost=4, tile_order="longest_first")
    static = dyn.replace(scheduler="static")
    assert static.effective() == static.replace(tile_order="longest_first")
    assert KernelConfig().effective() is not None and KernelConfig().effective() == KernelConfig()
    # Knobs the kernel ignores under others (config.cuh kPingpong, kRescaleBeforePv).
    one_wg = KernelConfig(block_m=64, pingpong=True, consumer_regs=232)
    assert one_wg.effective() == one_wg.replace(pingpong=False)
    serial = KernelConfig(intra_wg_overlap=False, rescale_o="before_pv")
    assert serial.effective() == serial.replace(rescale_o="after_pv")


# ---- the varlen kernel's static check (its compile is in tests/test_kernel_build.py) --------
def test_varlen_register_split_gives_the_producer_the_persistent_loop() -> None:
    # The warp-uniform persistent producer needs 24 registers, the fewest the knob allows, so
    # every grid config's split stays (56 with block_m 64 would come from its one consumer
    # warpgroup's spare registers).
    assert C.varlen_register_split(load_preset("default")) == (24, 240)
    assert C.varlen_register_split(load_preset("static")) == (40, 232)
    assert C.varlen_register_split(load_preset("multicast")) == (40, 232)
    assert C.varlen_register_split(load_preset("d64"), 64) == (32, 160)
    assert C.varlen_register_split(load_preset("d256"), 256) == (24, 240)
    # One consumer warpgroup (block_m 64): 56 above D 64, 24 at D 64, where three CTAs' 24 + 136
    # split built clean (docs/PERF.md step 63); 32 without intra_wg_overlap.
    assert C.varlen_register_split(load_preset("d64-window3"), 64) == (24, 136)
    assert C.varlen_register_split(load_preset("d64-window3"), 128) == (56, 104)
    serial = load_preset("d64-window3").replace(intra_wg_overlap=False, early_next_qk=False)
    assert C.varlen_register_split(serial, 64)[0] == 32


def test_the_d64_persistent_producer_fits_24_registers_at_block_m_64() -> None:
    cfg = load_preset("d64-window3")  # dynamic, block_m 64, producer 24
    assert C.validate(cfg, 64) == cfg
    with pytest.raises(ConfigError, match="needs producer_regs >= 56 with block_m 64"):
        C.validate(cfg.replace(consumer_regs=200, ctas_per_sm=2, k_stages=2, v_stages=2), 128)


def test_every_preset_can_serve_varlen() -> None:
    for name in C.list_presets():
        assert C.varlen_reason(load_preset(name), C.preset_head_dim(name)) is None, name


def test_check_varlen_refuses_what_cannot_serve_varlen(monkeypatch: pytest.MonkeyPatch) -> None:
    # With the loop on one lane the producer needed 40 (nvcc 13.0, 2026-12-01): then d64's
    # 192x128 at 152 consumer registers spilled 80 B. The check still says so for such a need.
    monkeypatch.setattr(C, "PERSISTENT_PRODUCER_REGS", 40)
    cfg = load_preset("d64")
    with pytest.raises(ConfigError, match="leaves the consumers 152"):
        C.check_varlen(cfg, 64)
    assert "leaves" in (C.varlen_reason(cfg, 64) or "")
    with pytest.raises(ConfigError, match="leaves the consumers 152"):
        check_problems(cfg, [Problem.parse("32/8x[8192,4096*2]:d64")])


def test_check_problems_checks_varlen_only_for_varlen_problems() -> None:
    d64 = load_preset("d64")
    assert check_problems(d64, [Problem(1, 32, 8192, Hkv=8, D=64)]).varlen is False
    assert check_problems(d64, [Problem.parse("32/8x[8192,4096*2]:d64")]).varlen is True
    assert check_problems(load_preset("default"), [Problem.parse("32/8x[100,1]")]) == \
        ProblemClass(128, True, varlen=True)


# ---- clusters of query heads (head_cluster) --------------------------------------------------
def test_head_cluster_is_left_out_of_the_id_at_its_neutral_value() -> None:
    # Configs from before the knob keep their ids (studies, caches and docs name them).
    assert "head_cluster" not in KernelConfig().canonical_json()
    assert load_preset("llama3").config_id() == "f9db5b7a6d4c"
    gqa = load_preset("gqa-cluster")
    assert '"head_cluster":2' in gqa.canonical_json()
    assert gqa.config_id() == "d62ee59f79f1"  # the config the H200 lab measured (PERF step 37)


def test_pack_gqa_is_left_out_of_the_id_at_its_neutral_value() -> None:
    assert "pack_gqa" not in KernelConfig().canonical_json()
    packed = load_preset("d64-window").replace(pack_gqa=True)
    assert '"pack_gqa":true' in packed.canonical_json()
    assert packed.config_id() != load_preset("d64-window").config_id()


def test_pack_gqa_fits_three_ctas_at_block_n_80_only_where_ptxas_did() -> None:
    # docs/PERF.md step 76: the packed causal kernel built clean at 136 registers; the same
    # config unpacked, non-causal, or in the (unpacked) varlen kernel put 8-16 B on the stack.
    from tuner.kernel.config import varlen_reason

    packed = load_preset("d64-window3").replace(block_n=80, k_stages=2, v_stages=2,
                                                pack_gqa=True)
    assert validate(packed, 64) is packed
    for cfg, causal in ((packed, False), (packed.replace(pack_gqa=False), True)):
        with pytest.raises(ConfigError, match="need about 140 registers"):
            validate(cfg, 64, causal)
    assert "need about 140" in (varlen_reason(packed, 64) or "")


def test_head_cluster_row_slices_per_head_dim() -> None:
    from tuner.kernel.config import cluster_size

    mc_hc = KernelConfig(scheduler="static", kv_multicast=True, head_cluster=2)
    assert cluster_size(mc_hc) == 4 and cluster_size(KernelConfig()) == 1
    validate(mc_hc)  # D 128: 2 boxes, 2 row slices of 64
    validate(mc_hc.replace(block_n=80, q_release="at_end"), 256)  # 4 boxes, whole boxes
    with pytest.raises(ConfigError, match="4 row slices"):  # D 64: one box, 4 slices of 20
        validate(mc_hc.replace(block_n=80), 64)
    validate(KernelConfig(head_cluster=4))  # the grid scheduler clusters along the heads


@pytest.mark.parametrize(("text", "c", "ok"), [
    ("1x32/8x8192", 2, True), ("1x32/8x8192", 4, True), ("1x64/8x8192", 4, True),
    ("4x32x8192", 2, False), ("1x6/2x512", 2, False), ("1x6/1x512", 2, True),
    ("1x6/1x512", 4, False),
])
def test_check_problem_needs_a_group_head_cluster_divides(text: str, c: int, ok: bool) -> None:
    cfg = KernelConfig(scheduler="static", head_cluster=c)
    problem = Problem.parse(text)
    if ok:
        check_problem(cfg, problem)
    else:
        with pytest.raises(ShapeError, match=f"head_cluster {c} runs that many query heads"):
            check_problem(cfg, problem)


def test_sum_in_pv_only_at_head_dim_64() -> None:
    from tuner.kernel.config import consumer_reg_estimate, smem_bytes

    cfg = load_preset("d64-sumpv")
    assert cfg.sum_in_pv and validate(cfg, 64) is cfg
    for d in (128, 256):
        with pytest.raises(ConfigError, match=f"sum_in_pv .* needs head dim 64; got {d}"):
            validate(KernelConfig(sum_in_pv=True), d)
    off = cfg.replace(sum_in_pv=False)
    assert smem_bytes(cfg, 64) - smem_bytes(off, 64) == cfg.block_n * 64 * 2  # the ones
    # Its 4 sum columns in O against the softmax's partial sums it drops (ptxas: no stack at
    # 160 either way).
    assert consumer_reg_estimate(cfg, 64) == consumer_reg_estimate(off, 64)
    # A knob added after config ids were published: false keeps every old id.
    assert "sum_in_pv" not in KernelConfig().canonical_json()
    assert "sum_in_pv" in cfg.canonical_json()


def test_wg_skip_rules() -> None:
    from tuner.kernel.config import warpgroup_max_skip

    cfg = load_preset("d64-wgskip")
    assert cfg.wg_skip and validate(cfg, 64) is cfg
    # A knob added after config ids were published: false keeps every old id.
    assert "wg_skip" not in KernelConfig().canonical_json()
    assert cfg.replace(wg_skip=False).config_id() == "f30585ce0c34"  # step 40's searched best
    # One warpgroup has no other rows to skip for; a multicast pair always skips.
    assert KernelConfig(block_m=64, pingpong=False, wg_skip=True).effective().wg_skip is False
    mc = load_preset("multicast")
    assert mc.replace(wg_skip=True).effective() == mc.effective()
    assert cfg.effective().wg_skip
    # The lowest warpgroup of a 192-row tile ends 128 rows above the tile's last row.
    assert warpgroup_max_skip(cfg) == 1 and warpgroup_max_skip(cfg.replace(block_n=64)) == 2
    assert warpgroup_max_skip(cfg.replace(wg_skip=False)) == 0
    with pytest.raises(ConfigError, match="wg_skip does not support early_next_qk"):
        validate(cfg.replace(early_next_qk=True), 64)


def test_192_row_pairs_need_v_stages_only_when_causal() -> None:
    # A causal 192-row pair's lowest warpgroup skips up to ceil(320 / block_n) KV tiles, which
    # needs that many minus one V stages; non-causal no warpgroup skips a tile.
    pair = load_preset("full-multicast").replace(block_m=192, block_n=80, consumer_regs=160)
    assert validate(pair, 128, causal=False) is pair
    with pytest.raises(ConfigError, match="skip 4 KV tiles, which needs at least 3 V stages"):
        validate(pair, 128)
    k3v3 = pair.replace(k_stages=3, v_stages=3)
    assert validate(k3v3, 128) is k3v3
    non_causal = [Problem.parse("4x32x8192:full")]
    assert check_problems(pair, non_causal) == ProblemClass(128, False)


def test_two_warpgroup_pairs_count_four_more_registers() -> None:
    # 128 x 80 pairs at 160 registers put 8 B on the stack where the estimate said 160 (nvcc
    # 13.0, 2026-12-03); unpaired and three-warpgroup pairs compiled clean at their estimates.
    from tuner.kernel.config import consumer_reg_estimate

    pair = KernelConfig(scheduler="static", kv_multicast=True, block_n=80, consumer_regs=160,
                        producer_regs=40, q_release="after_last_qk")
    unpaired = pair.replace(kv_multicast=False)
    assert consumer_reg_estimate(pair) == consumer_reg_estimate(unpaired) + 4
    with pytest.raises(ConfigError, match="consumer"):
        validate(pair)
    three = pair.replace(block_m=192, producer_regs=24, k_stages=3, v_stages=3)
    assert consumer_reg_estimate(three) == consumer_reg_estimate(three.replace(kv_multicast=False))
    assert validate(three) is three


def test_a_retired_knob_is_read_at_its_neutral_value_only() -> None:
    """kv_walk (docs/PERF.md step 60) was a knob for a few commits: configs stored then read
    as today's at 1 and are refused otherwise, in one line."""
    cfg = KernelConfig.from_dict({"block_n": 96, "kv_walk": 1})
    assert cfg == KernelConfig(block_n=96)
    with pytest.raises(ConfigError, match=r"^s: knob 'kv_walk' was removed .* sets it to 8$"):
        KernelConfig.from_dict({"kv_walk": 8}, source="s")
