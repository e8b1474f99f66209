"""A small set of configs that together touch every value of every knob (issue 3's coverage).

Test helper, not a test module: tests/test_knob_sample.py compiles the whole sample on the CPU,
tests/gpu/test_knob_sample_gpu.py gates the first few extra configs on the seed shapes.

The sample starts from the configs the suite compiles anyway: the D 128 presets
(SEED_PRESETS, built for the default class by tests/test_kernel_build.py), so in one session
they are cache hits. A seeded greedy set cover then adds configs for the (knob, value) pairs
they leave uncovered: draw many random configs that ``validate()`` admits, then repeatedly take
the one that covers the most pairs not yet covered, until every pair is covered. The first
extras cover the most, so a prefix of them is a good smaller sample. Everything is
deterministic for a given KNOBS table, validate() and set of presets.

Host-only knobs stay at fixed values (PINNED) in the drawn configs and their other values are
listed in TODO_NOT_COVERED: fixed_cost and persistent_ctas change the static scheduler's task
lists and the launch grid, not the compiled device code, so compiling one value per config says
nothing about the others; tests/test_task_list.py covers every fixed_cost and many CTA counts on
the host. The coverage tests assert the two together account for every value of every knob, so
a new knob or value cannot silently go uncovered.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable

import yaml

from tuner.errors import ConfigError
from tuner.kernel.config import (
    HEAD_DIM,
    KNOBS,
    KernelConfig,
    list_presets,
    load_preset,
    preset_head_dim,
    validate,
)

# Knobs that change only kernels of some problem classes (the knob table's ``classes``): the
# sample, built for the default class, keeps them at their default; their other values are
# compiled for their class by the test file named here.
CLASS_BOUND: dict[str, str] = {"softcap_tanh": "tests/test_kernel_build.py"}

# Values only some problems exercise (pack_gqa: a GQA group of an even size; block_n 48: a packed
# short window's band), never drawn for the sample; the test file named here compiles them (and
# tests/gpu/test_pack_gqa_gpu.py gates them). A knob with no other value left stays at its
# default without a draw, so the sample is the one from before these values.
BUILT_ELSEWHERE: dict[str, tuple[tuple[object, ...], str]] = {
    "pack_gqa": ((True,), "tests/test_kernel_build.py"),
    "block_n": ((48,), "tests/test_kernel_build.py"),
}

# Host-only knobs (see the module docstring): one value compiled, the rest covered on the host;
# the class-bound ones and those whose other values are all built elsewhere at their default.
PINNED: dict[str, object] = {
    "fixed_cost": KernelConfig().fixed_cost,
    "persistent_ctas": KernelConfig().persistent_ctas,
    **{name: KNOBS[name].default for name in CLASS_BOUND},
    **{name: KNOBS[name].default for name, (values, _) in BUILT_ELSEWHERE.items()
       if set(KNOBS[name].choices) - {KNOBS[name].default} <= set(values)},
}
TODO_NOT_COVERED: dict[str, tuple[object, ...]] = {
    "fixed_cost": tuple(v for v in KNOBS["fixed_cost"].choices if v != PINNED["fixed_cost"]),
    "persistent_ctas": tuple(
        v for v in KNOBS["persistent_ctas"].choices if v != PINNED["persistent_ctas"]
    ),
}

# Values validate() admits only at another head dim than the sample's (D 128), each with a
# config of that head dim that uses it (a preset, or ``preset+knob=value...``): compiled by
# tests/test_kernel_build.py (its presets, each at its head dim, test_sum_in_pv_... and
# test_few_consumer_registers_...) and gated by tests/gpu/test_family_gpu.py. Three CTAs per
# SM leave 80 registers a thread at launch, a 24 + 136 producer / consumer pair or less, which
# fits D 64's O and not D 128's; two CTAs of two consumer warpgroups leave 24 + 2 x 104.
OTHER_HEAD_DIM: dict[str, tuple[int, dict[object, str]]] = {
    "sum_in_pv": (64, {True: "d64-sumpv"}),
    "ctas_per_sm": (64, {3: "d64-window3"}),
    "consumer_regs": (64, {
        104: "d64-window-shared",
        112: "d64-window3+block_n=48+q_in_regs=False+consumer_regs=112",
        120: "d64-window-packed+consumer_regs=120",
        128: "d64-window-packed+consumer_regs=128",
        136: "d64-window3",
    }),
}


def config_of(spec: str) -> KernelConfig:
    """``preset[+knob=value...]`` (OTHER_HEAD_DIM's spelling) as a config."""
    name, *changes = spec.split("+")
    return load_preset(name).replace(**{k: yaml.safe_load(v) for k, v in
                                        (c.split("=", 1) for c in changes)})

Pair = tuple[str, object]


def other_head_dim_values(name: str) -> tuple[object, ...]:
    """The values of knob ``name`` left to another head dim (OTHER_HEAD_DIM), if any."""
    return tuple(OTHER_HEAD_DIM[name][1]) if name in OTHER_HEAD_DIM else ()


def other_class_values(name: str) -> tuple[object, ...]:
    """The values of a class-bound knob (CLASS_BOUND) other than its default."""
    if name not in CLASS_BOUND:
        return ()
    return tuple(v for v in KNOBS[name].choices if v != KNOBS[name].default)


def built_elsewhere_values(name: str) -> tuple[object, ...]:
    """The values of knob ``name`` another test file compiles (BUILT_ELSEWHERE), if any."""
    return BUILT_ELSEWHERE[name][0] if name in BUILT_ELSEWHERE else ()


def pairs_to_cover() -> set[Pair]:
    """Every (knob, value) the sample must touch: all of KNOBS minus TODO_NOT_COVERED,
    OTHER_HEAD_DIM, CLASS_BOUND's other values and BUILT_ELSEWHERE."""
    out: set[Pair] = set()
    for name, knob in KNOBS.items():
        skip = (set(TODO_NOT_COVERED.get(name, ())) | set(other_head_dim_values(name))
                | set(other_class_values(name)) | set(built_elsewhere_values(name)))
        out |= {(name, v) for v in knob.choices if v not in skip}
    return out


def pairs_of(cfg: KernelConfig) -> set[Pair]:
    return {(name, getattr(cfg, name)) for name in KNOBS}  # == set(cfg.to_dict().items())


def seed_presets() -> list[str]:
    """The presets made for D 128 (preset_head_dim), which tests/test_kernel_build.py compiles
    for the default class (D 128, causal): the sample's first configs."""
    return [p for p in list_presets() if preset_head_dim(p) == HEAD_DIM]


def seed_configs() -> list[KernelConfig]:
    """The seed presets' configs, each once (two presets may name the same config)."""
    return list(dict.fromkeys(validate(load_preset(p)) for p in seed_presets()))


def _random_config(rng: random.Random) -> KernelConfig | None:
    # Values left to another head dim or not covered are never drawn: D 128 rejects them.
    values = {
        name: PINNED[name] if name in PINNED else
        rng.choice([v for v in knob.choices if v not in other_head_dim_values(name)
                    and v not in TODO_NOT_COVERED.get(name, ())
                    and v not in built_elsewhere_values(name)])
        for name, knob in KNOBS.items()
    }
    cfg = KernelConfig(**values)  # every value is one of its knob's choices
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
    """Valid configs covering every value of pairs_to_cover(): the seed presets' configs, then
    the extra configs (most-covering first)."""
    return [*seed_configs(), *_knob_sample_extras(seed, candidates)]


def knob_sample_extras(seed: int = 2026, candidates: int = 6000) -> list[KernelConfig]:
    """The configs knob_sample() adds to the seed presets (none of them a seed)."""
    return list(_knob_sample_extras(seed, candidates))


@functools.lru_cache(maxsize=4)
def _knob_sample_extras(seed: int, candidates: int) -> tuple[KernelConfig, ...]:
    rng = random.Random(seed)
    seeds = seed_configs()
    todo = pairs_to_cover() - set().union(*(pairs_of(c) for c in seeds))
    pool = _candidates(rng, candidates, candidates * 50)
    # Values random draws rarely reach inside validate()'s limits (a narrow register window):
    # add one-knob changes of the defaults and of the pool's first configs as extra candidates.
    pool += _single_changes([KernelConfig(), *pool[:200]])
    pool = [c for c in dict.fromkeys(pool) if c not in seeds]
    pool_pairs = [frozenset(pairs_of(c)) for c in pool]
    chosen: list[KernelConfig] = []
    while todo:
        best = max(range(len(pool)), key=lambda i: len(pool_pairs[i] & todo))
        gain = pool_pairs[best] & todo
        if not gain:
            raise AssertionError(
                f"no admitted config covers {sorted(todo, key=str)[:5]}: either validate() "
                "rejects every config with these values (then they should not be choices) or "
                "the generator needs more candidates"
            )
        chosen.append(pool[best])
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
    """The first n extra configs of knob_sample(): the widest coverage beyond the presets (every
    preset passes the gate in tests/gpu/test_planted_bugs_gpu.py) for a GPU gate run."""
    return knob_sample_extras()[:n]


if __name__ == "__main__":  # print the sample: python -m tests.knob_sample (from the repo root)
    seeds, extras = seed_configs(), knob_sample_extras()
    for c in seeds:
        print("seed ", c.config_id(), c.diff_from_default())
    for c in extras:
        print("extra", c.config_id(), c.diff_from_default())
    print(f"{len(seeds)} presets + {len(extras)} extra configs cover {len(pairs_to_cover())} "
          "(knob, value) pairs")
