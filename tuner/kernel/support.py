"""Can fa-tune's kernel run this problem? The one answer, for every caller.

Before anything is built (the CLI's commands, the search, compare, profile, the lab scripts):
``check_problem(cfg, p)`` / ``check_runnable(problems)`` (the default config: the grid limits
only). For a built library (``KernelModule.unsupported``): ``unsupported(p, library=...)``, which
adds what the library was compiled for (head dim, mask, the varlen kernel). Both say it in one
sentence, through ``unsupported``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tuner.errors import ConfigError, ShapeError
from tuner.kernel.config import (
    DEFAULT_PRESETS,
    HEAD_DIM,
    KNOBS,
    KernelConfig,
    check_varlen,
    validate,
)
from tuner.kernel.runtime import problem_dims
from tuner.problem import Problem, ProblemClass, class_of

GRID_LIMIT = 65535  # gridDim.y and gridDim.z (heads and batch of the grid launch)


def head_cluster_reason(head_cluster: int, group: int) -> str | None:
    """Why a kernel with ``head_cluster`` cannot run a problem of ``group`` = Hq/Hkv query heads
    per K/V head (None: it can); the config check and a built library's refusal both say this."""
    if group % head_cluster == 0:
        return None
    fits = [str(c) for c in KNOBS["head_cluster"].choices if group % c == 0]
    return (f"head_cluster {head_cluster} runs that many query heads of one K/V head together, "
            f"but Hq/Hkv is {group}; use a config with head_cluster {' or '.join(fits)} for it")


def class_reason(shape: Any, *, causal: bool = True, head_dim: int = HEAD_DIM) -> str | None:
    """Why a kernel library compiled for (head_dim, causal) cannot run ``shape`` (None: it can).
    Hq and Hkv are run-time arguments of its C ABI (any Hkv that divides Hq); the head dim and
    the mask are compiled in; S_q and S_k are run-time values (any S_q <= S_k)."""
    _, hq, hkv, _, _, D, p_causal = problem_dims(shape)
    what = []
    if hq % hkv:
        what.append(f"Hkv={hkv} does not divide Hq={hq}")
    if D != head_dim:
        what.append(f"D={D}")
    if p_causal != causal:
        what.append("non-causal" if causal else "causal")
    if not what:
        return None
    mask = "causal" if causal else "non-causal"
    return f"this kernel library runs D {head_dim}, {mask} problems; got {', '.join(what)}"


def unsupported(problem: Any, cfg: KernelConfig | None = None, *,
                library: Any = None) -> str | None:
    """Why the kernel cannot run ``problem`` (None: it can), in one sentence.

    Without ``library``: with cfg's knobs (default: the default config), before building:
    head_cluster against the problem's GQA group, then the grid limits (B and Hq index the
    grid, at most 65535 in y and z), as ``problem <p>: <why>``. With ``library`` (a loaded
    ``KernelModule``: head_dim, causal, config, has_varlen): what it was compiled for, its
    head_cluster, and whether it has the varlen kernel a packed batch needs.

    The kernel runs MHA, GQA and MQA (Hkv a run-time argument), head dim 64, 128 or 256 and
    causal or not (both compiled in: a kernel is built per problem class, tuner.kernel.build's
    ``pclass``). It masks ragged query and KV tiles (TMA fills out-of-bounds rows), so any S
    works, and S_q queries over S_k keys are run-time values too (Problem itself refuses a
    causal S_q > S_k). Whether cfg fits the problem's head dim (shared memory, registers) is
    validate(cfg, problem.D)'s ConfigError.
    """
    if library is not None:
        why = class_reason(problem, causal=library.causal, head_dim=library.head_dim)
        if why is None:
            _, hq, hkv, *_ = problem_dims(problem)
            why = head_cluster_reason(int(library.config.get("head_cluster", 1)), hq // hkv)
        if why is None and bool(getattr(problem, "seqlens", ())) and not library.has_varlen:
            why = ("this kernel library has no varlen kernel (built for fixed-length problems, "
                   "for example); build it for a varlen problem class")
        if why is None and isinstance(problem, Problem):  # the models' masks
            masks = library.problem_class.serves(problem)
            why = f"this kernel library cannot run {problem}: {masks}" if masks else None
        return why
    cfg = cfg or KernelConfig()
    why = head_cluster_reason(cfg.head_cluster, problem.group)
    if why is None:
        for name in ("B", "Hq"):
            v = getattr(problem, name)
            if v > GRID_LIMIT:
                why = f"{name}={v} exceeds the kernel's grid limit {GRID_LIMIT}"
                break
    return None if why is None else f"problem {problem}: {why}"


def check_problem(cfg: KernelConfig, problem: Problem) -> None:
    """Raise ShapeError (one sentence: ``unsupported``) if the kernel cannot run cfg on
    problem; before building."""
    why = unsupported(problem, cfg)
    if why is not None:
        raise ShapeError(why)


def check_runnable(problems: Iterable[Problem]) -> ProblemClass:
    """Every problem one the kernel runs (check_problem with the default config: the first it
    cannot run raises) and all of one problem class (head dim and mask: one kernel library
    serves one; class_of says why not). Returns the class: what to build for."""
    problems = list(problems)
    for p in problems:
        check_problem(KernelConfig(), p)
    return class_of(problems)


def _fits(cfg: KernelConfig, head_dim: int, causal: bool) -> bool:
    try:
        validate(cfg, head_dim, causal)
    except ConfigError:
        return False
    return True


def check_class(cfg: KernelConfig, pclass: ProblemClass) -> None:
    """validate(cfg) for the class's head dim and mask; its ConfigError names that head dim's
    default preset and, at the default head dim, another head dim cfg fits (`--preset d64` on
    the default problems is the usual cause)."""
    try:
        validate(cfg, pclass.head_dim, pclass.causal)
    except ConfigError as e:
        d = pclass.head_dim
        # At the default head dim the user may not have named one: the config may be made for
        # another. At another, they chose it: its default preset is the hint.
        fits = [o for o in DEFAULT_PRESETS if d == HEAD_DIM and o != d
                and _fits(cfg, o, pclass.causal)]
        other = (f"; this config fits head dim {fits[0]}: give --head-dim {fits[0]} or "
                 f":d{fits[0]} problems") if fits else ""
        if d != HEAD_DIM or fits:
            raise ConfigError(f"{e} (for head dim {d} problems; preset "
                              f"'{DEFAULT_PRESETS[d]}' is the default there{other})") from None
        raise


def check_problems(cfg: KernelConfig, problems: Iterable[Problem]) -> ProblemClass:
    """check_problem for each (the first one the kernel cannot run raises), one problem class
    (head dim and mask) for all of them (a kernel library serves one: class_of), and cfg valid
    for that class (validate). Returns the class: what to build cfg for."""
    problems = list(problems)
    for p in problems:
        check_problem(cfg, p)
    pclass = class_of(problems)
    check_class(cfg, pclass)
    if pclass.varlen:  # its own hint: the default preset may be the config it refuses
        check_varlen(cfg, pclass.head_dim)
    return pclass
