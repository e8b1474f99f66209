"""The feasibility filter in front of the search's samplers (tuner/search/sampler.py), on a real
SQLite study over the default space. Outcomes told to the sampler are synthetic (a hash of the
config): these tests check what is proposed, not how fast anything runs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tuner.kernel.config import ConfigError, validate
from tuner.search.loop import seed_params
from tuner.search.sampler import (
    FeasibleSampler,
    config_from_params,
    make_sampler,
    suggest_config,
    valid_config,
)
from tuner.search.space import load_space, space_from_dict
from tuner.search.study import open_storage


def _run(tmp: Path, sampler_name: str, asks: int, seed: int = 3) -> tuple[list[Any], Any]:
    """Seed points first, then ``asks`` more; valid trials stay open 8 asks (a compile queue)."""
    space = load_space("default")
    seen: set[str] = set()

    def accept(params: dict[str, Any]) -> bool:
        cfg = valid_config(params, space)
        return cfg is not None and cfg.config_id() not in seen

    sampler = make_sampler(sampler_name, seed, space, accept=accept)
    study = optuna.create_study(direction="maximize", sampler=sampler,
                                storage=open_storage(f"sqlite:///{tmp / 's.db'}"))
    seeds = [params for _, params in seed_params(space)]
    for params in seeds:
        study.enqueue_trial(params)
    open_: list[tuple[Any, Any]] = []
    proposed: list[Any] = []
    for _ in range(len(seeds) + asks):
        trial = study.ask()
        try:
            cfg = validate(suggest_config(trial, space))
        except ConfigError:
            proposed.append(None)
            study.tell(trial, state=TrialState.FAIL)
            continue
        proposed.append(cfg)
        seen.add(cfg.config_id())
        open_.append((trial, cfg))
        if len(open_) >= 8:
            t, c = open_.pop(0)
            h = int(hashlib.sha256(c.canonical_json().encode()).hexdigest()[:8], 16)
            study.tell(t, 700.0 if t.number < len(seeds) else 500.0 + h % 140)
    return proposed, study


@pytest.mark.parametrize("name", ["tpe", "random"])
def test_only_valid_unseen_configs_are_proposed(tmp_path: Path, name: str) -> None:
    proposed, study = _run(tmp_path, name, asks=30)
    assert all(cfg is not None for cfg in proposed)  # no static reject at all
    ids = [cfg.config_id() for cfg in proposed]
    assert len(set(ids)) == len(ids)  # and no duplicate
    # The seed points went through untouched (enqueued trials keep their fixed params).
    space = load_space("default")
    for t, (_, params) in zip(study.trials, seed_params(space), strict=False):
        assert t.params == params
    if name == "tpe":
        s = study.sampler
        assert isinstance(s, FeasibleSampler) and s.model_proposals > 0  # TPE's model was used


def test_random_is_reproducible_for_a_seed(tmp_path: Path) -> None:
    a, _ = _run(tmp_path / "a", "random", asks=10, seed=5)
    b, _ = _run(tmp_path / "b", "random", asks=10, seed=5)
    assert [c.config_id() for c in a] == [c.config_id() for c in b]


def test_starved_when_nothing_is_left(tmp_path: Path) -> None:
    space = space_from_dict({"block_n": [112, 128]}, "tiny")
    taken = {config_from_params({"block_n": n}, space).config_id() for n in (112, 128)}
    s = FeasibleSampler(optuna.samplers.RandomSampler(seed=0), space,
                        lambda p: config_from_params(p, space).config_id() not in taken,
                        seed=0, random_tries=50)
    study = optuna.create_study(sampler=s, storage=open_storage(f"sqlite:///{tmp_path / 't.db'}"))
    study.ask().suggest_categorical("block_n", [112, 128])
    assert s.starved and s.random_draws == 50


@pytest.mark.parametrize("space_name, plain, capped", [
    ("d256", "1x16/8x8192:d256", "1x16/8x8192:d256:cap50"),
    ("d64", "1x64/8x8192:d64:w128", "1x64/8x8192:d64:w128:cap50"),
    ("default", "1x32/8x8192", "1x32/8x8192:cap50"),
])
def test_softcap_seeds_seed_softcap_studies_only(space_name: str, plain: str,
                                                  capped: str) -> None:
    # A seed with tanh.approx is a point of a softcap class's space; elsewhere the knob is fixed
    # (SearchSpace.for_class), so the seed is left out, not enqueued nor reported as outside.
    from tuner.problem import Problem

    base = load_space(space_name)
    head_dim = Problem.parse(plain).problem_class.head_dim
    without = base.for_class(Problem.parse(plain).problem_class)
    with_cap = base.for_class(Problem.parse(capped).problem_class)
    sources = [s for s, _ in seed_params(without, head_dim)]
    capped_seeds = dict(seed_params(with_cap, head_dim))
    approx = [s for s in capped_seeds if "softcap_tanh=approx" in s]
    assert approx and not [s for s in sources if "softcap_tanh" in s]
    assert len(capped_seeds) == len(sources) + len(approx)
    for s in approx:
        assert capped_seeds[s] is not None and capped_seeds[s]["softcap_tanh"] == "approx"


@pytest.mark.parametrize("shape, first", [
    ("1x64/8x2048:d64:w128:sinks", ["preset:d64-window-shared", "preset:d64-window-packed",
                                    "preset:d64-window3", "preset:d64-window"]),
    ("1x16/8x8192:d256:w4096:cap50", ["preset:d256-window",
                                      "preset:d256-multicast+softcap_tanh=approx"]),
    ("1x32/8x16384:w4096", ["preset:llama3+lazy"]),
    ("4x32/8x2048:k8192:p128", ["preset:llama3"]),
])
def test_a_new_study_measures_its_classs_seeds_first(tmp_path: Path, shape: str,
                                                      first: list[str]) -> None:
    # A 60 s bucket of gpt-oss-20b's windowed layers ran 11 trials and never reached the window
    # seeds while they came last (docs/PERF.md step 78): `first_for` puts them ahead, and the
    # study `search --create-only` makes enqueues them in that order.
    from typer.testing import CliRunner

    from tuner.cli import app

    url = f"sqlite:///{tmp_path / 'w.db'}"
    r = CliRunner().invoke(app, ["search", "--study", "w", "--storage", url, "--create-only",
                                 "--shape", shape])
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="w", storage=url)
    sources = [t.user_attrs.get("source") for t in study.trials]
    assert sources[:len(first)] == first
    assert all(t.state == TrialState.WAITING for t in study.trials)


def test_seeds_keep_file_order_outside_their_class() -> None:
    from tuner.problem import Problem

    space = load_space("d64")
    plain = Problem.parse("1x64/8x8192:d64:sinks").problem_class
    order = [s for s, _ in seed_params(space.for_class(plain), 64, plain)]
    assert order == [s for s, _ in seed_params(space.for_class(plain), 64)]
    assert order[:2] == ["preset:d64-wgskip", "preset:d64+static128+sumpv+lazy"]


@pytest.mark.parametrize("bad", ["gqa", ["window", "causal"], 3])
def test_first_for_names_class_flags_only(bad: Any) -> None:
    with pytest.raises(ConfigError, match="first_for lists problem class flags"):
        space_from_dict({"block_n": [64, 128], "seeds": [{"preset": "default", "first_for": bad}]},
                        "s.yaml")


def test_the_chunks_searched_pick_is_a_seed_inside_the_default_space() -> None:
    # s28-chunk's pick (docs/PERF.md step 62): a D 128 GQA study measures it among its seeds,
    # which needs every knob it sets inside the default space (params None would drop it).
    from tuner.problem import Problem

    pclass = Problem.parse("1x32/8x2048:k8192").problem_class
    seeds = dict(seed_params(load_space("default").for_class(pclass), 128, pclass))
    params = seeds["preset:llama3+chunk"]
    assert params is not None
    assert (params["v_stages"], params["q_in_regs"], params["fixed_cost"]) == (3, False, 14)
