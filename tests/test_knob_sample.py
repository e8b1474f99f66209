"""Issue 3's coverage test: a small sample touching every value of every knob compiles clean.

The sample is the D 128 presets (which tests/test_kernel_build.py compiles: cache hits in one
session) and the extra configs a greedy cover adds for the values they leave out. Each extra is
a real sm_90a compile (about 20 s of CPU), built in the background from the start of the run
(its ``builds`` marker, tests/prebuild.py) two at a time; the test's build_many then finds them
cached, and its time is printed (pytest -s, or in the -ra summary on failure). The generator
lives in tests/knob_sample.py so the GPU gate test samples from the same list.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from knob_sample import (
    BUILT_ELSEWHERE,
    CLASS_BOUND,
    OTHER_HEAD_DIM,
    PINNED,
    TODO_NOT_COVERED,
    built_elsewhere_values,
    config_of,
    knob_sample,
    knob_sample_extras,
    other_class_values,
    other_head_dim_values,
    pairs_of,
    pairs_to_cover,
    seed_configs,
    seed_presets,
)

from tuner import _paths
from tuner.errors import ConfigError
from tuner.kernel import build
from tuner.kernel.config import KNOBS, KernelConfig, load_preset, preset_head_dim, validate


def test_sample_covers_every_knob_value() -> None:
    sample = knob_sample()
    for cfg in sample:
        validate(cfg)  # raises if not admitted
    # The sample is the D 128 presets' configs (compiled for the default class by
    # tests/test_kernel_build.py, each once), then extras that are not presets.
    seeds, extras = seed_configs(), knob_sample_extras()
    assert sample == seeds + extras and not set(seeds) & set(extras)
    assert seeds and {load_preset(p) for p in seed_presets()} == set(seeds)
    assert all(preset_head_dim(p) == 128 for p in seed_presets())
    covered = set().union(*(pairs_of(c) for c in sample))
    missing = pairs_to_cover() - covered
    assert not missing, f"values never used by the sample: {sorted(missing, key=str)}"
    # Every value of every knob is either covered or on the explicit TODO list (nothing is
    # silently skipped), and the TODO list only names knobs the sample pins.
    for name, knob in KNOBS.items():
        for v in knob.choices:
            assert ((name, v) in covered or v in TODO_NOT_COVERED.get(name, ())
                    or v in other_head_dim_values(name) or v in other_class_values(name)
                    or v in built_elsewhere_values(name)), (
                name, v)
    assert set(TODO_NOT_COVERED) <= set(PINNED)
    # The class-bound knobs are those the knob table binds to classes, and each one's test
    # file builds it for its class.
    assert set(CLASS_BOUND) == {k for k, knob in KNOBS.items() if knob.classes}
    for name, (_, test_file) in BUILT_ELSEWHERE.items():
        assert name in (Path(__file__).parent.parent / test_file).read_text(), (name, test_file)
    for name, test_file in CLASS_BOUND.items():
        assert name in (Path(__file__).parent.parent / test_file).read_text(), (name, test_file)
    # A value left to another head dim is one D 128 refuses and that head dim's preset uses.
    for name, (d, specs) in OTHER_HEAD_DIM.items():
        for v, spec in specs.items():
            with pytest.raises(ConfigError):
                validate(KernelConfig().replace(**{name: v}))
            cfg = config_of(spec)
            assert getattr(cfg, name) == v and validate(cfg, d) is cfg
    assert 6 <= len(extras) <= 16, len(extras)  # the compiles the sample adds to the presets'
    assert knob_sample() == sample  # deterministic


@pytest.mark.slow
@pytest.mark.skipif(not _paths.kernel_template().is_file(), reason="no kernel template yet")
@pytest.mark.builds(lambda: knob_sample())
def test_knob_sample_compiles_clean() -> None:
    sample = knob_sample()
    t0 = time.monotonic()
    outcomes = build.build_many(sample, jobs=2)
    elapsed = time.monotonic() - t0
    compiled = sum(1 for o in outcomes if o.ok and not o.result.cache_hit)
    print(f"\nknob sample: {len(sample)} configs ({compiled} compiled) in {elapsed:.0f} s")
    problems = []
    for o in outcomes:
        cid = o.config.config_id()
        if not o.ok:
            problems.append(f"{cid} {o.config.diff_from_default()}: {o.error}")
            continue
        r = o.result
        regs = r.main_entry.get("registers")
        print(f"  {cid}: {regs} registers, {r.compile_seconds:.0f} s, "
              f"{'cache hit' if r.cache_hit else 'compiled'}")
        why = []
        if not (r.sass_checked and r.sass and r.sass.get("has_hgmma")):
            why.append(f"no HGMMA in the SASS ({r.sass_note or 'checked'})")
        if r.unfit is not None:
            why.append(r.unfit)
        if not isinstance(regs, int) or regs <= 0:
            why.append(f"no register count from ptxas ({r.main_entry})")
        if why:
            problems.append(f"{cid} {o.config.diff_from_default()}: {'; '.join(why)}")
    assert not problems, "\n".join(problems)
