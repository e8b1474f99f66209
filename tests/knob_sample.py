"""A small set of configs that together touch every value of every knob (issue 3's coverage).

Test helper, not a test module: tests/test_knob_sample.py compiles the whole sample on the CPU,
tests/gpu/test_knob_sample_gpu.py gates the first few configs on the seed shapes.

The generator is a seeded greedy set cover: draw many random configs that ``validate()`` admits,
then repeatedly take the one that covers the most (knob, value) pairs not yet covered, until
every pair is covered. The first configs cover the most, so a prefix is a good smaller sample.
Everything is deterministic for a given KNOBS table and validate().

Host-only knobs stay at fixed values (PINNED) and their other values are listed in
TODO_NOT_COVERED: fixed_cost and persistent_ctas change the static scheduler's task lists and
the launch grid, not the compiled device code, so compiling one value per config says nothing
about the others; tests/test_task_list.py covers every fixed_cost and many CTA counts on the
host. The coverage tests assert the two together account for every value of every knob, so a
new knob or value cannot silently go uncovered.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable

from tuner.errors import ConfigError
from tuner.kernel.config import KNOBS, KernelConfig, validate

# Host-only knobs (see the module docstring): one value compiled, the rest covered on the host.
PINNED: dict[str, object] = {
    "fixed_cost": KernelConfig().fixed_cost,
    "persistent_ctas": KernelConfig().persistent_ctas,
}
TODO_NOT_COVERED: dict[str, tuple[object, ...]] = {
    "fixed_cost": tuple(v for v in KNOBS["fixed_cost"].choices if v != PINNED["fixed_cost"]),
    "persistent_ctas": tuple(
        v for v in KNOBS["persistent_ctas"].choices if v != PINNED["persistent_ctas"]
    ),
}

# Values validate() admits only at another head dim than the sample's (D 128), with a config
# of that head dim that uses them: compiled by tests/test_kernel_build.py (its presets, each
# at its head dim, and test_sum_in_pv_...) and gated by tests/gpu/test_family_gpu.py.
OTHER_HEAD_DIM: dict[str, tuple[tuple[object, ...], int, str]] = {
    "sum_in_pv": ((True,), 64, "d64-sumpv"),
}

Pair = tuple[str, object]


def other_head_dim_values(name: str) -> tuple[object, ...]:
    """The values of knob ``name`` left to another head dim (OTHER_HEAD_DIM), if any."""
    return OTHER_HEAD_DIM[name][0] if name in OTHER_HEAD_DIM else ()


def pairs_to_cover() -> set[Pair]:
    """Every (knob, value) the sample must touch: all of KNOBS minus TODO_NOT_COVERED and
    OTHER_HEAD_DIM."""
    out: set[Pair] = set()
    for name, knob in KNOBS.items():
        skip = set(TODO_NOT_COVERED.get(name, ())) | set(other_head_dim_values(name))
        out |= {(name, v) for v in knob.choices if v not in skip}
    return out


def pairs_of(cfg: KernelConfig) -> set[Pair]:
    return set(cfg.to_dict().items())


def _random_config(rng: random.Random) -> KernelConfig | None:
    values = {
        name: PINNED[name] if name in PINNED else rng.choice(knob.choices)
        for name, knob in KNOBS.items()
    }
    cfg = KernelConfig.from_dict(values)
    try:
        return validate(cfg)
    except ConfigError:
        return None


def _candidates(rng: random.Random, n: int, max_draws: int) -> list[KernelConfig]:
    seen: dict[KernelConfig, None] = {}
    for _ in range(max_draws):
        c = _random_config(rng)
        if c is not None:
            seen.setdefault(c)
            if len(seen) >= n:
                break
    return list(seen)


def knob_sample(seed: int = 2026, candidates: int = 6000) -> list[KernelConfig]:
    """Valid configs covering every value of pairs_to_cover(); most-covering first."""
    return list(_knob_sample(seed, candidates))


@functools.lru_cache(maxsize=4)
def _knob_sample(seed: int, candidates: int) -> tuple[KernelConfig, ...]:
    rng = random.Random(seed)
    todo = pairs_to_cover()
    pool = _candidates(rng, candidates, candidates * 50)
    # Values random draws rarely reach inside validate()'s limits (a narrow register window):
    # add one-knob changes of the defaults and of the pool's first configs as extra candidates.
    pool += _single_changes([KernelConfig(), *pool[:200]])
    chosen: list[KernelConfig] = []
    while todo:
        best = max(pool, key=lambda c: len(pairs_of(c) & todo))
        gain = pairs_of(best) & todo
        if not gain:
            raise AssertionError(
                f"no admitted config covers {sorted(todo, key=str)[:5]}: either validate() "
                "rejects every config with these values (then they should not be choices) or "
                "the generator needs more candidates"
            )
        chosen.append(best)
        todo -= gain
    return tuple(chosen)


def _single_changes(bases: Iterable[KernelConfig]) -> list[KernelConfig]:
    out: list[KernelConfig] = []
    for base in bases:
        for name, knob in KNOBS.items():
            if name in PINNED:
                continue
            for v in knob.choices:
                try:
                    out.append(validate(base.replace(**{name: v})))
                except ConfigError:
                    pass
    return out


def gpu_sample(n: int = 4) -> list[KernelConfig]:
    """The first n configs of knob_sample(): the widest coverage for a GPU gate run."""
    return knob_sample()[:n]


if __name__ == "__main__":  # print the sample: python -m tests.knob_sample (from the repo root)
    sample = knob_sample()
    for c in sample:
        print(c.config_id(), c.diff_from_default())
    print(f"{len(sample)} configs cover {len(pairs_to_cover())} (knob, value) pairs")
