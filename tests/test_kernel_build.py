"""The real kernel template, compiled for sm_90a on the CPU: no spills, HGMMA in the SASS.

Each compile takes about 20 s of CPU; every test names the kernels it builds (its ``builds``
marker), which conftest.py compiles ahead in the background, two at a time on two cores, into
the session-wide cache: the test's own builds are then cache hits, as are the other tests'
builds of the same kernels (the CLI's, the knob sample's presets).
"""

from __future__ import annotations

import dataclasses

import pytest
from knob_sample import OTHER_HEAD_DIM, config_of
from prebuild import Artifact

from tuner import _paths
from tuner.kernel import build, toolchain
from tuner.kernel.config import (
    SMEM_LIMIT_BYTES,
    KernelConfig,
    default_preset,
    list_presets,
    load_preset,
    preset_head_dim,
    varlen_reason,
)
from tuner.problem import ProblemClass

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _paths.kernel_template().is_file(), reason="no kernel template yet"),
]


def _preset_artifact(preset: str) -> Artifact:
    return Artifact(load_preset(preset), ProblemClass(preset_head_dim(preset), True))


@pytest.mark.parametrize("preset", [
    pytest.param(p, marks=pytest.mark.builds(_preset_artifact(p))) for p in list_presets()])
def test_preset_compiles_clean(preset: str) -> None:
    # Every preset, built for the head dim it is made for (causal).
    cfg = load_preset(preset)
    pclass = ProblemClass(preset_head_dim(preset), True)
    r = build.build_config(cfg, pclass=pclass)
    assert r.ptxas["entries"], "ptxas reported no kernel entry"
    for name, e in r.ptxas["entries"].items():
        assert e["arch"] == "sm_90a"
        assert e["spill_stores"] == 0 and e["spill_loads"] == 0, f"{name} spills: {e}"
    assert r.sass_checked, r.sass_note
    assert r.sass["has_hgmma"], "no HGMMA in the SASS: the kernel does not use WGMMA"
    assert r.sass["ldl"] == 0 and r.sass["stl"] == 0, "local memory traffic in the SASS"
    assert r.wgmma_serialized is None, r.wgmma_serialized
    if r.smem_dynamic is not None:
        assert 0 < r.smem_dynamic <= SMEM_LIMIT_BYTES
    assert r.template_sha256 == build.sha256_file(_paths.kernel_template())
    # Nothing is compiled twice.
    again = build.build_config(cfg, pclass=pclass)
    assert again.cache_hit and again.so_sha256 == r.so_sha256


TREE_REDUCE_112 = KernelConfig(block_n=112, tree_reduce=True, q_in_regs=True)


@pytest.mark.builds(TREE_REDUCE_112)
def test_tree_reduce_and_q_in_regs_compile_at_uneven_block_n() -> None:
    # Regression (search on the H200, 2026-11-29): tree_reduce with block_n 112 (14 groups of
    # 4 scores per row, not a multiple of the 4 chains) failed a static_assert in nvcc.
    r = build.build_config(TREE_REDUCE_112)
    assert r.sass_checked, r.sass_note
    assert r.sass["has_hgmma"]
    assert r.sass["ldl"] == 0 and r.sass["stl"] == 0, "local memory traffic in the SASS"


EARLY_NEXT_QK = KernelConfig(scheduler="static", producer_regs=40, consumer_regs=232,
                             q_release="after_last_qk", early_next_qk=True)


@pytest.mark.builds(EARLY_NEXT_QK)
def test_early_next_qk_keeps_wgmma_asynchronous() -> None:
    # Regression (lab run 5 on the H200, 2026-11-29): the early QK in flight on one path into
    # the tile loop and not on the other made ptxas serialize every wgmma (C7514), 60% slower.
    r = build.build_config(EARLY_NEXT_QK)
    assert r.wgmma_serialized is None, r.wgmma_serialized
    assert r.local_memory is None, r.local_memory
    assert r.sass_checked and r.sass["has_hgmma"]


@pytest.mark.builds(lambda: [load_preset(p) for p in ("multicast", "static", "gqa-cluster")])
def test_multicast_kernel_shares_kv_across_the_cluster() -> None:
    # kv_multicast: each CTA's K/V loads go to both CTAs of its cluster (UTMALDG...MULTICAST),
    # and consumers release stages on the peer's barrier too (a remote SYNCS arrive); the
    # plain persistent kernel has neither.
    import subprocess

    cuobjdump = toolchain.find_tool("cuobjdump", toolchain.find_nvcc())
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed")

    def sass(preset: str) -> str:
        so = build.build_config(load_preset(preset)).so_path
        return subprocess.run([str(cuobjdump), "--dump-sass", so], capture_output=True,
                              text=True, check=True).stdout

    mc, plain, heads = sass("multicast"), sass("static"), sass("gqa-cluster")
    assert "UTMALDG.4D.MULTICAST" in mc and "UTMALDG.4D.MULTICAST" not in plain
    assert "SYNCS.ARRIVE.TRANS64.RED" in mc and "SYNCS.ARRIVE.TRANS64.RED" not in plain
    # head_cluster 2: the two query heads' CTAs share K/V the same way.
    assert "UTMALDG.4D.MULTICAST" in heads and "SYNCS.ARRIVE.TRANS64.RED" in heads


def _varlen_case(preset: str, head_dim: int, causal: bool, tweak: dict, case_id: str) -> object:
    cfg = dataclasses.replace(load_preset(preset), **tweak)
    return pytest.param(preset, head_dim, causal, tweak, id=case_id, marks=pytest.mark.builds(
        Artifact(cfg, ProblemClass(head_dim, causal, varlen=True))))


@pytest.mark.parametrize(("preset", "head_dim", "causal", "tweak"), [
    _varlen_case("default", 128, True, {}, "default-d128"),
    # VarlenStaticScheduler: clusters take tile pairs
    _varlen_case("multicast", 128, True, {}, "multicast-d128"),
    # VarlenStaticScheduler: clusters take runs of heads
    _varlen_case("gqa-cluster", 128, True, {}, "gqa-cluster-d128"),
    _varlen_case("d64-static", 64, False, {}, "d64-static-full"),
    # 128x80's varlen consumers spill (check_varlen)
    _varlen_case("d256", 256, True, {"block_n": 64}, "d256-bn64"),
])
def test_varlen_class_compiles_both_kernels_clean(preset: str, head_dim: int, causal: bool,
                                                  tweak: dict) -> None:
    """A varlen problem class builds the fixed-length kernel, the varlen kernel (the producer
    given the persistent loop's registers: kernel.cuh RegSplit) and the schedule kernel, all
    without local memory, and the library says it runs varlen."""
    import ctypes
    import json

    from tuner.kernel.config import check_varlen

    cfg = dataclasses.replace(load_preset(preset), **tweak)
    check_varlen(cfg, head_dim)  # what the static check lets through must compile clean
    r = build.build_config(cfg, pclass=ProblemClass(head_dim, causal, varlen=True))
    names = list(r.ptxas["entries"])
    assert sum("attention_fwd_kernel" in n for n in names) == 2, names
    assert any("varlen_prepare_kernel" in n for n in names), names
    for name, e in r.ptxas["entries"].items():
        assert e["spill_stores"] == 0 and e["spill_loads"] == 0 and not e["stack_frame"], (name, e)
    assert r.sass_checked, r.sass_note
    assert r.sass["ldl"] == 0 and r.sass["stl"] == 0, "local memory traffic in the SASS"
    hgmma = [f["hgmma"] for n, f in r.sass["functions"].items() if "attention_fwd_kernel" in n]
    assert len(hgmma) == 2 and min(hgmma) > 0, hgmma
    assert r.wgmma_serialized is None, r.wgmma_serialized
    lib = ctypes.CDLL(r.so_path)
    lib.fa_tune_problem_class.restype = ctypes.c_char_p
    assert json.loads(lib.fa_tune_problem_class()) == {"head_dim": head_dim, "causal": causal,
                                                       "varlen": True, "window": False,
                                                       "softcap": False, "sinks": False,
                                                       "paged": False}
    from tuner.kernel.runtime import abi  # the one mirror of fa_tune.h (no torch needed)

    fns = abi.bind(lib)
    # 16 bytes of counter, then 32 per task: Hq * (total / rows + num_seqs) tasks at most, a
    # task being block_m rows (two tiles with kv_multicast) of one query head (of a run of
    # head_cluster heads: the cluster's CTAs take one task).
    rows = cfg.block_m * (2 if cfg.kv_multicast else 1)
    heads = -(-32 // cfg.head_cluster)
    tiles = heads * min(32768 // rows + 15, 15 * -(-8192 // rows))
    if cfg.head_cluster > 1 or cfg.kv_multicast:
        # A clustered config's deal may move tasks into a round past the list: room for up to
        # kMaxSwapClusters clusters (varlen.cuh).
        tiles += 512
    a = abi.make_args(q=16, k=16, v=16, o=16, batch=15, heads_q=32, heads_kv=8,
                      head_dim=head_dim, causal=int(causal), seqlen_q=8192, seqlen_k=8192,
                      total_q=32768, total_k=32768, cu_seqlens_q=16, cu_seqlens_k=16,
                      q_stride=(0, 8 * head_dim * 4, head_dim),
                      k_stride=(0, 8 * head_dim, head_dim), v_stride=(0, 8 * head_dim, head_dim))
    assert fns["workspace_bytes"](ctypes.byref(a)) == 16 + 32 * tiles


def test_multicast_with_too_few_v_stages_does_not_compile() -> None:
    # The C side's own guard of config.validate's rule (both hung on the H200, 2026-12-02): a
    # lab build that skips validate must not produce a kernel that deadlocks.
    from tuner.errors import BuildError

    cfg = KernelConfig(scheduler="static", kv_multicast=True, q_release="after_last_qk",
                       block_n=64, v_stages=1)
    with pytest.raises(BuildError, match="too few V stages"):
        build.build_source(build.render(cfg), build.KERNEL_FLAGS, name="kernel", config=cfg)


UNCHECKED_D64 = KernelConfig(scheduler="static", q_release="after_last_qk", block_m=192,
                             consumer_regs=160, kv_multicast=True)


@pytest.mark.builds(Artifact(UNCHECKED_D64, ProblemClass(64, True), check=False))
def test_unchecked_build_makes_a_config_validate_refuses() -> None:
    # The lab's --unchecked (scripts/kernel_lab.py): the three-warpgroup multicast pair at D 64,
    # which validate refuses (measured slower, docs/PERF.md step 39), still compiles clean.
    from tuner.errors import ConfigError

    cfg = UNCHECKED_D64
    pclass = ProblemClass(64, True)
    (refused,) = build.build_many([cfg], jobs=1, pclass=pclass)
    assert isinstance(refused.error, ConfigError) and "measured slower" in str(refused.error)
    (built,) = build.build_many([cfg], jobs=1, pclass=pclass, check=False)
    assert built.ok and not built.result.unfit, built.error or built.result.unfit
    assert built.result.sass["has_hgmma"] and built.result.wgmma_serialized is None


def _dump_sass(results: dict) -> dict[str, str]:
    """cuobjdump's SASS of each built library (skips without cuobjdump)."""
    import os
    import subprocess

    tool, nvdisasm = toolchain.find_tool("cuobjdump"), toolchain.find_tool("nvdisasm")
    if tool is None:
        pytest.skip("cuobjdump not found")
    env = dict(os.environ)
    if nvdisasm is not None:  # cuobjdump runs nvdisasm, which the wheels may keep off PATH
        env["PATH"] = f"{nvdisasm.parent}{os.pathsep}{env.get('PATH', '')}"
    return {k: subprocess.run([str(tool), "--dump-sass", r.so_path], capture_output=True,
                              text=True, check=True, env=env).stdout for k, r in results.items()}


@pytest.mark.builds(lambda: [Artifact(c, ProblemClass(64, True)) for c in (
    load_preset("d64-sumpv"), load_preset("d64-sumpv").replace(sum_in_pv=False))])
def test_sum_in_pv_moves_the_row_sums_into_a_64x72_pv() -> None:
    # sum_in_pv (D 64): PV becomes 64 x 72 wgmmas whose last 8 columns multiply P by a block of
    # ones, and the softmax's one FADD per score goes. Real SASS of the preset that uses it
    # beside the same kernel without it (docs/PERF.md step 39: 376 against 431 instructions
    # in the steady loop).
    from tuner.kernel.config import smem_bytes

    on = load_preset("d64-sumpv")
    off = on.replace(sum_in_pv=False)
    built = {k: build.build_config(c, pclass=ProblemClass(64, True))
             for k, c in (("on", on), ("off", off))}
    sass = _dump_sass(built)
    assert "HGMMA.64x72x16.F32.BF16" in sass["on"] and "HGMMA.64x72x16" not in sass["off"]
    assert "HGMMA.64x64x16.F32.BF16" in sass["off"]
    fadd = {k: v.count("FADD") for k, v in sass.items()}
    assert fadd["on"] < fadd["off"] / 2, fadd  # the per-score row-sum FADDs are gone
    # The block of ones: block_n rows x 64 BF16, as config.smem_bytes counts it.
    assert (built["on"].smem_dynamic - built["off"].smem_dynamic
            == smem_bytes(on, 64) - smem_bytes(off, 64) == on.block_n * 64 * 2)


def _max_before_pv_wait(sass: str) -> list[tuple[int, int]]:
    """Per loop with HGMMA in it (a backward branch's body): (FMNMX before the loop's first
    wait for all wgmma groups, FMNMX in the loop)."""
    import re

    ins = [(int(m.group(1), 16), m.group(2))
           for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    at = {a: i for i, (a, _) in enumerate(ins)}
    out = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        if not m or int(m.group(1), 16) >= a or int(m.group(1), 16) not in at:
            continue
        body = [t for _, t in ins[at[int(m.group(1), 16)]:i + 1]]
        if not any("HGMMA" in t for t in body) or len(body) > 700:
            continue
        wait = next((k for k, t in enumerate(body) if "DEPBAR.LE gsb0, 0x0" in t), len(body))
        out.append((sum("FMNMX" in t for t in body[:wait]), sum("FMNMX" in t for t in body)))
    return out


@pytest.mark.builds(lambda: [Artifact.of(load_preset("d64-sumpv"), ProblemClass(64, True))])
def test_three_warpgroup_row_max_runs_before_the_pv_wait() -> None:
    # With three consumer warpgroups at 160 registers, Q's descriptors sliced by thread took 8
    # per-thread registers; ptxas then borrowed P's registers for the row max, so the max
    # waited for the PV still reading P (docs/PERF.md step 40: 21 of 68 FMNMX before the wait,
    # 1.022x FA3; sliced by the warp-uniform warpgroup 66 of 68, 1.037x). Computed directly
    # (operands.cuh) the descriptor takes one register either way (step 53). Real SASS of the
    # d64-sumpv preset.
    built = {"uniform": build.build_config(load_preset("d64-sumpv"), pclass=ProblemClass(64, True))}
    loops = _max_before_pv_wait(_dump_sass(built)["uniform"])
    assert loops and all(before >= total - 4 for before, total in loops), loops


# Two CTAs per SM (ctas_per_sm 2): block_m 64, one consumer warpgroup, 256 threads x 128
# registers at launch, so two CTAs' pools fill the register file; the setmaxnreg split
# (24 + 232) uses all of one CTA's.
TWO_PER_SM = Artifact(KernelConfig(block_m=64, block_n=64, pingpong=False, producer_regs=24,
                                   consumer_regs=232, ctas_per_sm=2),
                      ProblemClass(64, True, window=True, sinks=True))


@pytest.mark.builds(TWO_PER_SM)
def test_two_ctas_per_sm_launch_with_half_the_registers() -> None:
    r = build.build_config(TWO_PER_SM.config, pclass=TWO_PER_SM.pclass)
    assert r.unfit is None, r.unfit  # no local memory, wgmma not serialized
    assert r.sass["has_hgmma"]
    assert {e["registers"] for e in r.ptxas["entries"].values()} == {128}
    assert 2 * (r.smem_dynamic + 1024) <= 233472  # two fit one SM's shared memory
    assert "static constexpr int ctas_per_sm = 2;" in build.render(TWO_PER_SM.config,
                                                                    pclass=TWO_PER_SM.pclass)


# consumer_regs below 136 (D 64, two or three CTAs an SM): the values no preset uses, each
# with a config tests/knob_sample.py names for it (its OTHER_HEAD_DIM).
FEW_REGS = [Artifact(config_of(spec), ProblemClass(64, True, window=True))
            for spec in OTHER_HEAD_DIM["consumer_regs"][1].values() if "+" in spec]


@pytest.mark.builds(*FEW_REGS)
def test_few_consumer_registers_compile_clean() -> None:
    for art in FEW_REGS:
        r = build.build_config(art.config, pclass=art.pclass)
        assert r.unfit is None, (art.config.consumer_regs, r.unfit)  # no local memory
        assert r.sass["has_hgmma"]


_AFTER_MAX = [p for p in list_presets() if load_preset(p).k_release == "after_max"]


@pytest.mark.parametrize("preset", [
    pytest.param(p, marks=pytest.mark.builds(_preset_artifact(p))) for p in _AFTER_MAX])
def test_after_max_keeps_every_row_max_fmnmx_before_the_pv_wait(preset: str) -> None:
    # By design, not by register pressure: with k_release after_max the K release's arrive is
    # gated by a predicate computed from both rows' maxima and row 0's exp2s (softmax.cuh
    # after_value), and ptxas keeps the PV wait after that arrive, so every FMNMX of the loop
    # precedes the wait. Without the gate ptxas hoisted the wait into the max wherever the
    # arrive could issue early (docs/PERF.md step 53: multicast 34 of 68, d64-sumpv 37 of 68).
    # The preset builds are test_preset_compiles_clean's.
    r = build.build_config(load_preset(preset),
                           pclass=ProblemClass(preset_head_dim(preset), True))
    loops = _max_before_pv_wait(_dump_sass({preset: r})[preset])
    assert loops and all(before == total for before, total in loops), loops


# The models' masks (issue 36): every mask at once, with the varlen kernel (the window's tile
# range in the producer and the consumers, the softcap's tanh, the sinks in finalize), on the
# default preset and on D 64's sum_in_pv, whose row sums the sinks join.
ALL_MASKS = Artifact(load_preset("default"),
                     ProblemClass(128, True, True, window=True, softcap=True, sinks=True))
SUMPV_MASKS = Artifact(load_preset("d64-sumpv"), ProblemClass(64, True, True, window=True,
                                                              sinks=True))


@pytest.mark.builds(ALL_MASKS, SUMPV_MASKS)
@pytest.mark.parametrize("art", [ALL_MASKS, SUMPV_MASKS], ids=["default-all", "d64-sumpv"])
def test_the_models_masks_compile_clean(art: Artifact) -> None:
    r = build.build_config(art.config, pclass=art.pclass)
    assert r.unfit is None, r.unfit  # no local memory, wgmma not serialized
    assert r.sass["has_hgmma"]
    src = build.render(art.config, pclass=art.pclass)
    assert "static constexpr bool window = true;" in src
    plain = build.render(art.config, pclass=ProblemClass(art.pclass.head_dim, True, True))
    assert "constexpr bool window" not in plain and "constexpr bool sinks" not in plain


# A paged KV cache (issue 37): the device-scheduled kernel's producer reads each tile's pages
# through the block table (the fixed-length kernel stays as it was); with the masks too, at D 64.
PAGED = Artifact(load_preset("default"), ProblemClass(128, True, True, paged=True))
PAGED_MASKS = Artifact(load_preset("d64-sumpv"), ProblemClass(64, True, True, window=True,
                                                              sinks=True, paged=True))


@pytest.mark.builds(PAGED, PAGED_MASKS)
@pytest.mark.parametrize("art", [PAGED, PAGED_MASKS], ids=["default", "d64-sumpv-masks"])
def test_a_paged_class_compiles_clean(art: Artifact) -> None:
    import ctypes
    import json

    r = build.build_config(art.config, pclass=art.pclass)
    assert r.unfit is None, r.unfit  # no local memory, wgmma not serialized
    assert r.sass["has_hgmma"]
    assert "static constexpr bool paged = true;" in build.render(art.config, pclass=art.pclass)
    lib = ctypes.CDLL(r.so_path)
    lib.fa_tune_problem_class.restype = ctypes.c_char_p
    got = json.loads(lib.fa_tune_problem_class())
    assert got["paged"] is True and got["varlen"] is True


# Softcap's two tanh forms (knob softcap_tanh, docs/PERF.md step 60), at D 256 as Gemma-2 runs.
SOFTCAP_FORMS = {f: Artifact(load_preset("d256").replace(softcap_tanh=f),
                             ProblemClass(256, True, softcap=True)) for f in ("exact", "approx")}


@pytest.mark.builds(*SOFTCAP_FORMS.values())
def test_softcap_approx_takes_one_mufu_op_where_exact_takes_two() -> None:
    built = {f: build.build_config(a.config, pclass=a.pclass) for f, a in SOFTCAP_FORMS.items()}
    for r in built.values():
        assert r.unfit is None, r.unfit  # no local memory, wgmma not serialized
    assert built["exact"].config_id != built["approx"].config_id
    sass = _dump_sass(built)
    assert "MUFU.TANH" in sass["approx"] and "MUFU.TANH" not in sass["exact"]
    assert sass["exact"].count("MUFU.RCP") > sass["approx"].count("MUFU.RCP")


# The preset a class runs untuned (config.default_preset): one that fits its mask. d256 spills
# with a window, and with a softcap in the varlen kernel; d64 with a softcap (docs/PERF.md step
# 61); so those classes get another. Built with the varlen kernel, as an export builds them.
DEFAULT_CLASSES = [ProblemClass(256, True, True, window=True, softcap=True),
                   ProblemClass(256, True, True, softcap=True),
                   ProblemClass(64, True, True, softcap=True),
                   ProblemClass(64, True, True, window=True, sinks=True)]


@pytest.mark.builds(lambda: [Artifact(load_preset(default_preset(c)), c) for c in DEFAULT_CLASSES])
@pytest.mark.parametrize("pclass", DEFAULT_CLASSES, ids=str)
def test_each_class_default_preset_compiles_clean(pclass: ProblemClass) -> None:
    name = default_preset(pclass)
    r = build.build_config(load_preset(name), pclass=pclass)
    assert r.unfit is None, f"{name} for {pclass}: {r.unfit}"


# The export's varlen verdict (export.varlen_why_not) compiles: d256's varlen kernel with a
# softcap fits the static check and has local memory (12 LDL/STL, nvcc 13.0); d256-window's not.
SOFTCAP_VARLEN = ProblemClass(256, True, softcap=True)


@pytest.mark.builds(lambda: [Artifact(load_preset(n), dataclasses.replace(SOFTCAP_VARLEN,
                                                                            varlen=True))
                             for n in ("d256", "d256-window")])
def test_export_leaves_out_a_varlen_kernel_ptxas_spills() -> None:
    from tuner.ship.export import varlen_why_not

    cfgs = [load_preset("d256"), load_preset("d256-window")]
    assert varlen_reason(cfgs[0], 256) is None  # the estimate fits
    spilled, fits = varlen_why_not(cfgs, SOFTCAP_VARLEN, jobs=2)
    assert spilled is not None and "its varlen kernel compiles with local memory" in spilled
    assert fits is None
    assert varlen_why_not(cfgs, SOFTCAP_VARLEN, compile=False) == [None, None]


# pack_gqa (docs/PERF.md step 76): a GQA group's query heads in one tile's rows, Q and O
# through a 5-D TMA view; the window class with sinks and the varlen kernel (which runs
# unpacked) at D 64, two CTAs an SM at block_n 80.
PACKED = Artifact(
    dataclasses.replace(load_preset("d64-window"), block_n=80, k_stages=2, v_stages=2,
                        pack_gqa=True),
    ProblemClass(64, True, True, window=True, sinks=True))


# block_n 48: the packed 128-key window's 8 + 127 keys in three 48-key tiles, three CTAs an SM.
PACKED48 = Artifact(
    dataclasses.replace(load_preset("d64-window3"), block_n=48, pack_gqa=True), PACKED.pclass)


@pytest.mark.builds(PACKED, PACKED48, Artifact(load_preset("d64-window"), PACKED.pclass))
def test_pack_gqa_loads_q_and_stores_o_through_a_5d_view() -> None:
    import subprocess

    cuobjdump = toolchain.find_tool("cuobjdump", toolchain.find_nvcc())
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed")
    r = build.build_config(PACKED.config, pclass=PACKED.pclass)
    assert r.unfit is None, r.unfit  # no local memory, wgmma not serialized
    assert r.sass["has_hgmma"]

    def sass(so: str) -> str:
        return subprocess.run([str(cuobjdump), "--dump-sass", so], capture_output=True,
                              text=True, check=True).stdout

    packed = sass(r.so_path)
    plain = sass(build.build_config(load_preset("d64-window"), pclass=PACKED.pclass).so_path)
    # The fixed-length kernel's Q loads and O stores are 5-D; the varlen kernel's stay 4-D.
    assert "UTMALDG.5D" in packed and "UTMASTG.5D" in packed
    assert "UTMALDG.4D" in packed  # K and V, and the varlen kernel's Q
    assert "UTMALDG.5D" not in plain and "UTMASTG.5D" not in plain
    # block_n 48 issues the 64 x 48 QK atom.
    r48 = build.build_config(PACKED48.config, pclass=PACKED48.pclass)
    assert r48.unfit is None, r48.unfit
    assert "HGMMA.64x48x16.F32.BF16" in sass(r48.so_path)
