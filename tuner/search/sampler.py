"""What the search's sampler proposes: the space as Optuna parameters, the samplers, and a
wrapper that proposes only configs the search can use (valid and not yet seen).

``suggest_config`` and ``distributions`` map the space's free knobs to Optuna parameters (the
two must agree); ``config_from_params`` maps them back to the config a trial measures;
``make_sampler`` builds the sampler ``fa-tune search --sampler`` names.

Why the wrapper: most combinations of the kernel's knobs are invalid (shared memory,
registers, knobs that need each other). Asked through Optuna, every invalid proposal is a
stored trial, an SQLite transaction and a sampler fit, and with TPE it also skews the model: on
the H200 (2026-11-30) a search asked 320 trials in 104 s for one compiled candidate, 300 static
rejects in a row.

``FeasibleSampler`` samples all free knobs jointly (one relative search space) and checks each
proposal in Python before Optuna stores anything:

* the base sampler's joint proposal over the knobs it models (TPE after its startup trials:
  all of them), completed by uniform draws for the others, is kept if ``accept`` takes it;
  otherwise the base sampler is asked again, up to ``model_tries`` times;
* otherwise (startup trials, a sampler with no joint model such as random, or no accepted
  proposal) a uniform draw over the knobs' choices, repeated until ``accept`` takes one, up to
  ``random_tries`` draws; the last draw is returned regardless (the search's own static check
  then refuses it) and ``starved`` is set, which the search reads as an exhausted space.

Enqueued trials (the seed points, requeued ones) keep their fixed parameters untouched. The
grid sampler is not wrapped: it enumerates its points itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler

from tuner.errors import ConfigError, SearchError, ShapeError
from tuner.kernel.config import KNOBS, KernelConfig, validate
from tuner.kernel.support import check_problems
from tuner.problem import Problem
from tuner.search.space import SearchSpace

Accept = Callable[[dict[str, Any]], bool]
SAMPLERS = ("tpe", "random", "grid", "cmaes")
GRID_MAX_POINTS = 100_000


# ---- the space <-> Optuna parameters ----------------------------------------------------------
def suggest_config(trial: Any, space: SearchSpace) -> KernelConfig:
    """Ask the trial for every free knob; fixed knobs take their single value."""
    params: dict[str, Any] = {}
    for knob in space.free_knobs:
        dim = space.dims.get(knob)
        if dim is not None and dim.int_range is not None:
            lo, hi, st = dim.int_range
            params[knob] = trial.suggest_int(knob, lo, hi, step=st)
        else:
            params[knob] = trial.suggest_categorical(knob, list(space.choices(knob)))
    return config_from_params(params, space)


def config_from_params(params: dict[str, Any], space: SearchSpace) -> KernelConfig:
    """The config a trial with these free-knob params measures (fixed knobs from the space)."""
    values = {knob: params[knob] if knob in params else space.choices(knob)[0] for knob in KNOBS}
    # Knobs that cannot matter under the others (e.g. fixed_cost with the grid scheduler) go to
    # their defaults, so such trials repeat an already-measured config instead of re-timing it.
    return KernelConfig.from_dict(values).effective()


def static_check(cfg: KernelConfig, shapes: Sequence[Problem]) -> None:
    """What the search refuses without compiling: ConfigError or ShapeError saying why."""
    if shapes:
        check_problems(cfg, shapes)  # validates cfg for the problems' class
    else:
        validate(cfg)


def valid_config(params: dict[str, Any], space: SearchSpace,
                 shapes: Sequence[Problem] = ()) -> KernelConfig | None:
    """The config these params measure, or None if the static check refuses it."""
    try:
        cfg = config_from_params(params, space)
        static_check(cfg, shapes)
    except (ConfigError, ShapeError):
        return None
    return cfg


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """The Optuna distribution of every free knob, exactly as ``suggest_config`` asks for it."""
    out: dict[str, BaseDistribution] = {}
    for knob in space.free_knobs:
        dim = space.dims.get(knob)
        if dim is not None and dim.int_range is not None:
            lo, hi, st = dim.int_range
            out[knob] = IntDistribution(lo, hi, step=st)
        else:
            out[knob] = CategoricalDistribution(list(space.choices(knob)))
    return out


class FeasibleSampler(BaseSampler):
    def __init__(self, base: BaseSampler, space: SearchSpace, accept: Accept, *,
                 seed: int | None = None, model_tries: int = 16,
                 random_tries: int = 5_000) -> None:
        self.base = base
        self.dists = distributions(space)
        self.accept = accept
        self.model_tries = model_tries
        self.random_tries = random_tries
        self._rng = np.random.RandomState(seed)
        # Counters for the search's progress and the lab notebook.
        self.model_proposals = 0  # joint proposals the base sampler made
        self.model_accepted = 0
        self.random_draws = 0
        self.starved = False  # the last ask found no acceptable config in random_tries draws
        # The config has_room found: the next uniform draw starts from it, and the next check
        # is free while it stays acceptable (the search checks before every ask).
        self._spare: dict[str, Any] | None = None

    # -- BaseSampler
    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, BaseDistribution]:
        return dict(self.dists)

    def sample_relative(self, study: Any, trial: Any,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space or "fixed_params" in trial.system_attrs:
            return {}
        # The base sampler proposes over the part of the space it models itself (TPE: every
        # knob once trials are complete; CMA-ES: the integer knobs); the rest is drawn uniformly.
        modelled = {k: d for k, d in self.base.infer_relative_search_space(study, trial).items()
                    if k in search_space}
        rest = {k: d for k, d in search_space.items() if k not in modelled}
        for _ in range(self.model_tries if modelled else 0):
            part = self.base.sample_relative(study, trial, modelled)
            if not part:
                break  # no model yet (startup trials)
            self.model_proposals += 1
            params = {**self._draw(rest), **part}
            if self.accept(params):
                self.model_accepted += 1
                return params
        return self._random(search_space)

    def sample_independent(self, study: Any, trial: Any, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Any, trial: Any) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: Any, trial: Any, state: Any,
                    values: Sequence[float] | None) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
        self._rng.seed()

    # -- uniform draws over the valid, unseen configs (rejection sampling in Python)
    def _draw(self, space: dict[str, BaseDistribution]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, dist in space.items():
            if isinstance(dist, CategoricalDistribution):
                out[name] = dist.choices[self._rng.randint(len(dist.choices))]
            elif isinstance(dist, IntDistribution):
                n = (dist.high - dist.low) // dist.step + 1
                out[name] = int(dist.low + dist.step * self._rng.randint(n))
            else:  # no other kind comes from a SearchSpace
                raise TypeError(f"unsupported distribution for {name}: {dist!r}")
        return out

    def has_room(self) -> bool:
        """Whether a config ``accept`` takes turns up in ``random_tries`` uniform draws, asked
        before any trial is created: a re-run of an exhausted study then adds no trial (an ask
        that finds nothing still creates one, told as a duplicate)."""
        if self._spare is not None and self.accept(self._spare):
            return True
        self._spare = None
        for _ in range(self.random_tries):
            params = self._draw(self.dists)
            self.random_draws += 1
            if self.accept(params):
                self._spare = params
                return True
        return False

    def _random(self, space: dict[str, BaseDistribution]) -> dict[str, Any]:
        spare, self._spare = self._spare, None
        if spare is not None and spare.keys() == space.keys() and self.accept(spare):
            self.starved = False
            return spare
        params: dict[str, Any] = {}
        for _ in range(self.random_tries):
            params = self._draw(space)
            self.random_draws += 1
            if self.accept(params):
                self.starved = False
                return params
        self.starved = True
        return params


# ---- the samplers -----------------------------------------------------------------------------
def make_sampler(name: str, seed: int | None, space: SearchSpace,
                 accept: Accept | None = None) -> Any:
    """The named sampler. With ``accept`` (the search's: valid and not yet measured), every
    sampler but grid proposes only configs it takes (FeasibleSampler)."""
    import optuna

    def feasible(base: Any) -> Any:
        return base if accept is None else FeasibleSampler(base, space, accept, seed=seed)

    if name == "tpe":
        return feasible(optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                                   constant_liar=True, n_startup_trials=10))
    if name == "random":
        return feasible(optuna.samplers.RandomSampler(seed=seed))
    if name == "grid":
        free = space.free_knobs
        n = math.prod(len(space.choices(k)) for k in free)
        if n > GRID_MAX_POINTS:
            raise SearchError(
                f"the grid sampler needs a space of at most {GRID_MAX_POINTS} points; "
                f"{space.source} has {n}: give a smaller --space"
            )
        return AskTellGridSampler({k: list(space.choices(k)) for k in free}, seed=seed)
    if name == "cmaes":
        import importlib.util

        if importlib.util.find_spec("cmaes") is None:
            raise SearchError("the cmaes sampler needs the cmaes package: `pip install cmaes`")
        return feasible(optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False))
    raise SearchError(f"unknown sampler '{name}'; choose one of {', '.join(SAMPLERS)}")


class AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler whose after_trial does not call study.stop() (which only works inside
    study.optimize); the search asks ``is_exhausted`` itself."""

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        return None

    def all_started(self, study: Any) -> bool:
        """Whether every grid point has a trial running or finished. GridSampler then hands
        out the running points again, so an ask would only make a duplicate of a trial in
        flight: the search waits for verdicts instead (is_exhausted follows)."""
        from optuna.trial import TrialState

        states = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        started = {t.system_attrs.get("grid_id")
                   for t in study.get_trials(deepcopy=False, states=states)}
        return set(range(self._n_min_trials)) <= started  # the base class's grid size
