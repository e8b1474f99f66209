from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.kernel.config import KNOBS, KernelConfig, list_presets, load_preset, preset_head_dim
from tuner.search.space import DEFAULT_SPACES, load_space, space_from_dict


def test_default_space_covers_every_knob_and_value() -> None:
    sp = load_space("default")
    assert set(sp.dims) == set(KNOBS)
    # Deliberate narrowings: equal work to FlashAttention-3 (it writes the LSE), CTA counts
    # around one per SM (more only queue CTAs), and consumer_regs from 160: below that only D 64's
    # three warpgroups beside a persistent producer fit (d64.yaml), and the D 128 space stays the
    # one its studies were created with.
    narrowed = {"write_lse": {True}, "persistent_ctas": {0, 128},
                "consumer_regs": set(range(160, 241, 8)), "sum_in_pv": {False},
                "wg_skip": {False}}
    for name, knob in KNOBS.items():
        assert set(sp.choices(name)) == narrowed.get(name, set(knob.choices)), name
    assert sp.dims["block_n"].int_range == (64, 192, 16)
    assert sp.contains(KernelConfig())
    for p in list_presets():
        if preset_head_dim(p) == 128:
            assert sp.contains(load_preset(p))
    # Each head dim's space holds its presets and has its own seeds.
    for d, name in DEFAULT_SPACES.items():
        space = load_space(name)
        assert space.seeds, name
        for p in list_presets():
            if preset_head_dim(p) == d:
                assert space.contains(load_preset(p)), (name, p)
    assert "block_m" in sp.free_knobs and "scheduler" in sp.free_knobs
    assert sp.size() > 1


def test_unknown_knob_names_file_and_knob(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("block_m: [64]\nwarp_count: [4]\n")
    with pytest.raises(ConfigError) as ei:
        load_space(p)
    assert str(p) in str(ei.value) and "unknown knob 'warp_count'" in str(ei.value)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"block_m": [64, 96]}, "knob 'block_m' must be one of 64, 128, 192 (got 96)"),
        ({"block_n": {"low": 64, "high": 208, "step": 16}}, "(got 208)"),
        ({"pingpong": {"low": 0, "high": 1}}, "only for integer knobs"),
        ({"block_m": []}, "empty"),
        ({"k_stages": {"low": 3, "high": 1}}, "below low"),
        ({"k_stages": [1, 1]}, "twice"),
    ],
)
def test_bad_spaces(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        space_from_dict(data, source="inline.yaml")
    assert needle in str(ei.value) and str(ei.value).startswith("inline.yaml")


def test_left_out_knob_stays_default() -> None:
    sp = space_from_dict({"block_n": [64, 128]})
    assert sp.choices("pingpong") == (True,)
    assert sp.size() == 2
    assert sp.to_dict() == {"block_n": [64, 128]}


def test_missing_space_file() -> None:
    with pytest.raises(ConfigError, match="cannot read search space"):
        load_space("no_such_space")
