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
    # one its studies were created with; pack_gqa and block_n 48 until a GPU has measured them
    # there (PERF step 76).
    narrowed = {"write_lse": {True}, "persistent_ctas": {0, 128}, "ctas_per_sm": {1, 2},
                "consumer_regs": set(range(160, 241, 8)), "sum_in_pv": {False},
                "wg_skip": {False}, "pack_gqa": {False}, "block_n": set(range(64, 193, 16))}
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


def test_a_knob_bound_to_classes_is_searched_for_those_classes_only() -> None:
    """softcap_tanh changes only a softcap class's kernel: every other class's search keeps it
    at exact (SearchSpace.for_class), so no trial times a twin of another."""
    from tuner.problem import ProblemClass

    for name in ("default", "d64", "d256"):
        space = load_space(name)
        assert space.choices("softcap_tanh") == ("exact", "approx"), name
        capped = space.for_class(ProblemClass(128, True, softcap=True, window=True))
        assert "softcap_tanh" in capped.free_knobs
        plain = space.for_class(ProblemClass(128, True, window=True, sinks=True))
        assert plain.choices("softcap_tanh") == ("exact",)
        assert "softcap_tanh" not in plain.free_knobs
        assert plain.choices("block_n") == space.choices("block_n")


def test_a_study_stores_the_space_of_its_class(tmp_path: Path) -> None:
    """`fa-tune search --create-only` stores the space it searches: its class's."""
    import optuna
    from typer.testing import CliRunner

    from tuner.cli import app

    url = f"sqlite:///{tmp_path / 's.db'}"
    for study, shape, free in (("capped", "1x8/2x1024:d256:cap50", True),
                               ("plain", "1x8/2x1024:d256", False)):
        r = CliRunner().invoke(app, ["search", "--study", study, "--storage", url,
                                     "--create-only", "--shape", shape])
        assert r.exit_code == 0, r.output
        attrs = optuna.load_study(study_name=study, storage=url).user_attrs
        assert ("softcap_tanh" in attrs["space"]) is free, (study, sorted(attrs["space"]))
