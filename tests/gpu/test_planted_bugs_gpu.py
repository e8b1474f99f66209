"""Planted kernel bugs on an H200: the gate must reject every one, and pass every preset.

Each planted bug (FA_TUNE_PLANT_BUG = N, documented in cuda_src/lab/hooks.cuh) is compiled
into the default preset through the product's own build path (tuner.kernel.build.build_config with
``defines``), loaded through tuner.kernel.runtime.KernelModule and gated by
tuner.measure.oracle.gate at a shape no tile divides (2x4x1000) and at 1x8x4096 (bug 8, the GQA head
mapping, at GQA shapes). Every preset of search_spaces/presets/ must pass on seed, rising and
rising_fwd at the same shapes, at its own head dim (config.preset_head_dim). With ``pytest -s`` a
table shows, per variant, shape and input set, the worst rms_err / rms_bf16 over the 16-row blocks
and over the head-dim columns, the worst rms_err / budget (<= 1 passes) and the verdict: the margins
that confirm BUDGET_K (docs/GATE.md).

    pytest -s -m gpu tests/gpu/test_planted_bugs_gpu.py
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tuner import _paths
from tuner.kernel import build, toolchain
from tuner.kernel.config import list_presets, load_preset, preset_head_dim
from tuner.kernel.runtime import AttnBuffers, Device, KernelModule
from tuner.measure import gate_rule as GR
from tuner.measure import oracle
from tuner.problem import Problem, ProblemClass

pytestmark = pytest.mark.gpu

SHAPES = [Problem(2, 4, 1000), Problem(1, 8, 4096)]
GQA_SHAPES = [Problem(2, 8, 1000, Hkv=2), Problem(1, 8, 4096, Hkv=4)]
GQA_ONLY = {8}  # the head mapping is the identity for MHA
ALL_SETS = ("seed", "rising", "rising_fwd")


def planted_bugs() -> dict[int, str]:
    """{N: "file  what it does"} as cuda_src/lab/hooks.cuh documents them."""
    text = (Path(_paths.cuda_src_dir()) / "lab" / "hooks.cuh").read_text()
    block = text[text.index("FA_TUNE_PLANT_BUG = N"):text.index("#pragma once")]
    return {int(m.group(1)): " ".join(m.group(2).split())
            for m in re.finditer(r"^//\s+(\d+) (\w+\.cuh .*)$", block, re.MULTILINE)}


# A bug of one of the models' masks ("[window]") changes only that class's kernels: its gate is
# tests/gpu/test_masks_gpu.py's.
BUGS = {n: what for n, what in planted_bugs().items() if "[" not in what.split(".cuh", 1)[1]}
# Bugs too small for the per-element rule and the relative L2 bound: only the BF16 error budget
# may catch them (and it must say so).
BUDGET_ONLY = {4: "16-row blocks exceed the BF16 error budget",
               6: "head-dim columns exceed the BF16 error budget"}
# Bugs of the online rescale: the running max must rise, which the seed set rarely does.
RISING_ONLY = {1, 7}


@pytest.fixture(scope="module")
def dev() -> Device:
    return Device.open(0)


@pytest.fixture(scope="module")
def artifacts() -> dict[str, build.BuildResult]:
    """Every preset and every planted bug, built in parallel (nvcc runs in subprocesses)."""
    jobs: dict[str, tuple[str, int | None]] = {f"preset {p}": (p, None) for p in list_presets()}
    jobs.update({f"bug {n}": ("default", n) for n in BUGS})

    def one(item: tuple[str, int | None]) -> build.BuildResult:
        preset, bug = item
        defines = None if bug is None else {"FA_TUNE_PLANT_BUG": bug}
        pclass = ProblemClass(preset_head_dim(preset), True)
        return build.build_config(load_preset(preset), defines=defines, pclass=pclass)

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), toolchain.usable_cpus()))) as ex:
        results = dict(zip(jobs, ex.map(one, jobs.values()), strict=True))
    for name, r in results.items():
        assert r.local_memory is None, f"{name}: {r.local_memory}"
    return results


@pytest.fixture(scope="module")
def table() -> Iterator[list[tuple[str, ...]]]:
    rows: list[tuple[str, ...]] = []
    yield rows
    head = ("variant", "shape", "set", "blk err/bf16", "col err/bf16", "err/budget", "max|err|",
            "verdict")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    print(f"\n\nBF16 error budget: K = {GR.BUDGET_K}, floor = {GR.BUDGET_FLOOR} * 2^-9 "
          f"* rms_ref, {GR.ROW_BLOCK}-row blocks")
    for r in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _gate(dev: Device, so_path: str, shape: Problem, sets: tuple[str, ...],
          rows: list[tuple[str, ...]], variant: str) -> GR.GateResult:
    kernel = KernelModule(so_path)
    with AttnBuffers(dev, shape) as bufs:
        g = oracle.gate(dev, kernel, shape, bufs, input_sets=sets)
    for m in g.sets:
        why = "PASS" if m.passed else "FAIL: " + "; ".join(r.split(" (")[0] for r in m.reasons)
        rows.append((variant, str(shape), m.input_set, _fmt(m.block_bf16_ratio),
                     _fmt(m.col_bf16_ratio), _fmt(m.budget_ratio), f"{m.max_abs_err:.3g}",
                     why[:90]))
    return g


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_passes_with_margin(dev: Device, artifacts: dict, table: list,
                                         preset: str, shape: Problem) -> None:
    shape = dataclasses.replace(shape, D=preset_head_dim(preset))
    if load_preset(preset).head_cluster > 1:  # GQA-only presets: the same shapes with groups
        shape = dataclasses.replace(shape, Hkv=shape.Hq // 4)
    g = _gate(dev, artifacts[f"preset {preset}"].so_path, shape, ALL_SETS, table,
              f"preset {preset}")
    assert g.passed, g.summary()
    for m in g.sets:
        assert m.budget_ratio is not None and m.budget_ratio <= 1.0, m.brief()


@pytest.mark.parametrize(("bug", "shape"), [
    (b, s) for b in sorted(BUGS) for s in (GQA_SHAPES if b in GQA_ONLY else SHAPES)],
    ids=lambda x: f"bug{x}" if isinstance(x, int) else str(x))
def test_gate_rejects_planted_bug(dev: Device, artifacts: dict, table: list, bug: int,
                                  shape: Problem) -> None:
    g = _gate(dev, artifacts[f"bug {bug}"].so_path, shape, oracle.DEFAULT_INPUT_SETS, table,
              f"bug {bug}")
    what = BUGS[bug]
    assert not g.passed, f"planted bug {bug} ({what}) passed the gate: {g.summary()}"
    failed = [m for m in g.sets if not m.passed]
    for m in failed:
        assert m.reasons, m  # the verdict names why
    if bug in RISING_ONLY:
        assert not g.by_set["rising"].passed, g.summary()
    if bug in BUDGET_ONLY:
        for m in g.sets:
            # Invisible to the per-element rule and to the relative L2 bound...
            assert m.violations == 0 and m.rel_l2 <= GR.REL_L2_MAX, m.brief()
            # ... and caught, on every set, by the budget, which names the place.
            assert not m.passed and BUDGET_ONLY[bug] in " ".join(m.reasons), m.brief()
        if bug == 4:
            for m in g.sets:
                assert m.block_worst is not None and m.block_worst[2] % 64 == 0, m.block_worst
        if bug == 6:
            for m in g.sets:
                assert m.col_worst is not None and m.col_worst[2] < 4, m.col_worst
