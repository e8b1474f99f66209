"""Search spaces: a YAML mapping knob -> choices, checked against KernelConfig's knob table.

File format (``search_spaces/<name>.yaml``)::

    block_m: [64, 128, 192]                 # a list of choices
    block_n: {low: 64, high: 192, step: 16} # an integer range, both ends included

A knob left out stays at its default. Every value must be one the knob allows; a bad file is a
ConfigError naming the file and the knob.

The reserved key ``seeds`` lists the known-good points a new study measures first, each a preset
plus optional knob changes (``- {preset: default, k_stages: 3}``; its source is named
``preset:default+k_stages=3`` unless ``name:`` says otherwise). ``first_for: [window]`` (problem
class flags) puts a seed ahead of the others in studies of such a class: a short search then
measures the seeds made for its problems before its budget ends. Each head dim has its own space
file (``default`` for D 128, ``d64``, ``d256``: DEFAULT_SPACES), since tiles, stages and the
register split that fit differ per head dim.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner import _paths
from tuner.errors import ConfigError
from tuner.kernel.config import KNOBS, KernelConfig
from tuner.problem_class import ProblemClass
from tuner.yaml_file import load_yaml


@dataclass(frozen=True)
class Dimension:
    """One knob's choices, in file order. ``int_range`` keeps (low, high, step) when given so."""

    knob: str
    choices: tuple[Any, ...]
    int_range: tuple[int, int, int] | None = None


# The space a search uses when --space is not given, per head dim of its problems.
DEFAULT_SPACES: dict[int, str] = {64: "d64", 128: "default", 256: "d256"}


@dataclass(frozen=True)
class Seed:
    """A known-good point: a preset with knob changes, named ``source`` in the study."""

    source: str
    preset: str
    changes: tuple[tuple[str, Any], ...] = ()
    first_for: tuple[str, ...] = ()  # ProblemClass flags: measured first in such a class

    def leads(self, pclass: ProblemClass) -> bool:
        """Whether this seed goes first in a study of ``pclass`` (all its flags set there)."""
        return bool(self.first_for) and all(getattr(pclass, f) for f in self.first_for)


# The problem class flags a seed's ``first_for`` may name.
SEED_CLASS_FLAGS = ("window", "softcap", "sinks", "paged", "varlen")


@dataclass(frozen=True)
class SearchSpace:
    source: str
    dims: dict[str, Dimension]
    seeds: tuple[Seed, ...] = ()

    def choices(self, knob: str) -> tuple[Any, ...]:
        """The values a knob may take (its default alone when the space leaves it out)."""
        if knob in self.dims:
            return self.dims[knob].choices
        if knob not in KNOBS:
            raise ConfigError(f"unknown knob '{knob}'")
        return (getattr(KernelConfig(), knob),)

    @property
    def free_knobs(self) -> list[str]:
        """Knobs with more than one choice, in knob-table order."""
        return [k for k in KNOBS if len(self.choices(k)) > 1]

    def size(self) -> int:
        """Number of raw combinations (before validate() prunes invalid ones)."""
        return math.prod(len(self.choices(k)) for k in KNOBS)

    def contains(self, cfg: KernelConfig) -> bool:
        return all(getattr(cfg, k) in self.choices(k) for k in KNOBS)

    def for_class(self, pclass: ProblemClass) -> SearchSpace:
        """The space of a study of one problem class: a knob that cannot change that class's
        kernel (its knob table entry's ``classes``) stays at its default."""
        dims = {k: d for k, d in self.dims.items()
                if all(getattr(pclass, flag) for flag in KNOBS[k].classes)}
        return SearchSpace(self.source, dims, self.seeds)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, d in self.dims.items():
            if d.int_range:
                lo, hi, st = d.int_range
                out[k] = {"low": lo, "high": hi, "step": st}
            else:
                out[k] = list(d.choices)
        return out


def _dimension(source: str, knob: str, spec: Any) -> Dimension:
    where = f"{source}: knob '{knob}'"
    k = KNOBS[knob]
    if isinstance(spec, Mapping):
        extra = set(spec) - {"low", "high", "step"}
        if k.kind != "int" or extra or not {"low", "high"} <= set(spec):
            raise ConfigError(
                f"{where}: a range is {{low, high, step}} and only for integer knobs; "
                f"use a list of choices from {k.allowed_text()}"
            )
        lo, hi, st = spec["low"], spec["high"], spec.get("step", 1)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi, st)) or st < 1:
            raise ConfigError(f"{where}: low, high and step must be integers, step >= 1")
        if hi < lo:
            raise ConfigError(f"{where}: high {hi} is below low {lo}")
        values = tuple(range(lo, hi + 1, st))
        rng: tuple[int, int, int] | None = (lo, hi, st)
    elif isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{where}: the list of choices is empty")
        values = tuple(spec)
        rng = None
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(f"{where}: a choice is listed twice")
    else:
        # A bare scalar means a fixed value; accept it so one-off spaces stay short.
        values = (spec,)
        rng = None
    for v in values:
        try:
            k.check(v)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
    return Dimension(knob, values, rng)


def _seeds(source: str, spec: Any) -> tuple[Seed, ...]:
    where = f"{source}: seeds"
    if not isinstance(spec, list):
        raise ConfigError(f"{where} must be a list of {{preset: NAME, knob: value, ...}}")
    out: list[Seed] = []
    for item in spec:
        if not isinstance(item, Mapping) or not isinstance(item.get("preset"), str):
            raise ConfigError(f"{where}: each seed needs 'preset: NAME' (got {item!r})")
        changes = {k: v for k, v in item.items() if k not in ("preset", "name", "first_for")}
        first = item.get("first_for", [])
        first = [first] if isinstance(first, str) else first
        if not isinstance(first, list) or any(f not in SEED_CLASS_FLAGS for f in first):
            raise ConfigError(f"{where}: first_for lists problem class flags, some of "
                              f"{', '.join(SEED_CLASS_FLAGS)} (got {item.get('first_for')!r})")
        for k, v in changes.items():
            if k not in KNOBS:
                raise ConfigError(f"{where}: unknown knob '{k}' in a seed")
            try:
                KNOBS[k].check(v)
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from None
        name = item.get("name") or "preset:" + item["preset"] + "".join(
            f"+{k}={v}" for k, v in changes.items())
        out.append(Seed(str(name), item["preset"], tuple(changes.items()), tuple(first)))
    return tuple(out)


def space_from_dict(data: Any, source: str = "<space>") -> SearchSpace:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: a search space must be a mapping of knob: choices")
    dims: dict[str, Dimension] = {}
    seeds: tuple[Seed, ...] = ()
    for knob, spec in data.items():
        if knob == "seeds":
            seeds = _seeds(source, spec)
            continue
        if knob not in KNOBS:
            raise ConfigError(
                f"{source}: unknown knob '{knob}'; known knobs: {', '.join(KNOBS)}"
            )
        dims[knob] = _dimension(source, knob, spec)
    return SearchSpace(source, dims, seeds)


def default_space_name(head_dim: int) -> str:
    """The space a search of head dim ``head_dim`` uses when none is named."""
    return DEFAULT_SPACES.get(head_dim, "default")


def load_space(name_or_path: str | Path = "default") -> SearchSpace:
    """Load ``search_spaces/<name>.yaml`` or a YAML file path."""
    p = Path(name_or_path)
    if not p.suffix and not p.exists():
        p = _paths.search_spaces_dir() / f"{name_or_path}.yaml"
    data = load_yaml(p, "search space", ConfigError)
    return space_from_dict(data, source=str(p))
