"""A search's last step: its winner chosen with confidence (issue 38).

Confirmed numbers of different trials were measured minutes apart, at other clocks and
temperatures, and near-tied configs flip between runs (FlashInfer's autotuner RFC: 86 of 191
choices differed between two identical tunes). So before a search reports its best, its top
configs (by confirmed TFLOPS, one trial per config) are timed again against each other in one
process, interleaved (A B C, then C B A, ...) on every problem of the study. A turn gives each
config the geometric mean of its TFLOPS over the problems. The fastest (by median turn) beats
another config when its lead over it exceeds the pair's noise band. Both come from the turns
paired: the per-turn ratio of the two (measured seconds apart, so the clock's drift cancels);
the lead is their geometric mean, the band the 95 % half-width of that mean (Student's t over
the turns), and never under 1 % (a margin under 1 % is a tie). More turns narrow it. It is
declared the best only when it beats every other finalist. Otherwise it ties with those it does
not beat, and the pick among them is the one closest to the default config (fewest knobs
changed), then the most accurate (least err_vs_default), then the fastest. (The band was once
the widest spread of any finalist, then the wider spread of each pair: a range that grows with
the turns, and five or six per cent on H100 twins, docs/PERF.md steps 62 and 69.)

The verdict is the study's user attribute ``final`` (``Verdict.to_dict``); ``show best`` prints
it and tuner.search.trials' picks (export, profile, ``study:`` buckets) take its pick.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.kernel.config import KernelConfig
from tuner.measure.timing import Protocol, geomean
from tuner.problem import Problem

TOP = 3    # configs in the final
# Interleaved turns (A B C, C B A, ...): enough that each config is measured about MEASUREMENTS
# times in all, at least MIN_TURNS. On H100 twins (docs/PERF.md step 69) 16 one-problem turns
# told a 2.2 % lead from its 1.6 % band; 4 and 8 could not (bands of 4.6-5.8 %: one slow turn
# of a config weighs a quarter or an eighth of the mean). A turn's geometric mean over the
# problems averages them, so more problems need fewer turns.
MEASUREMENTS = 16
MIN_TURNS = 4


def turns_for(n_problems: int) -> int:
    """The final's turns for a study of ``n_problems`` problems."""
    return max(MIN_TURNS, -(-MEASUREMENTS // max(1, n_problems)))


TURNS = turns_for(1)
# Shorter than the confirmation's protocol (FULL): the interleaving, not the length of one
# measurement, is what evens out the clock; a settle phase before each still starts it at the
# card's power-capped steady state. The cooling wait is the screens' 10 s, not the
# confirmation's 60: a card that idles above 65 C would otherwise hold each of the final's
# measurements a minute after --timeout, and the turns even out the temperature too.
# Its rounds stop near 2 s, as the survey's: three finalists of a 32k-token causal bucket
# (tens of milliseconds a launch, estimated from its FLOPs) would take about 5 minutes at 120
# launches each.
PROTOCOL = Protocol(warmup=20, repeat=100, rounds=1, settle_s=1.0, temp_wait_s=10.0,
                    max_round_s=2.0)
ATTR = "final"
MIN_BAND = 0.01  # a margin under 1 % is a tie, however steady the turns
# Student's t, two-sided 95 %, by degrees of freedom (1..20; beyond, 2.0).
_T95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14,
        2.13, 2.12, 2.11, 2.10, 2.09, 2.09)


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """The lead of ``a`` over ``b`` (turn by turn: the geometric mean of a_i / b_i, less 1) and
    the pair's noise band (the 95 % half-width of that mean, at least MIN_BAND)."""
    n = min(len(a), len(b))
    if n < 1:
        raise ValueError("a pair needs turns")
    d = [math.log(x / y) for x, y in zip(a[:n], b[:n], strict=True)]
    mean = sum(d) / n
    if n < 2:
        return math.exp(mean) - 1.0, math.inf
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    t = _T95[n - 2] if n - 1 <= len(_T95) else 2.0
    return math.exp(mean) - 1.0, max(MIN_BAND, t * sd / math.sqrt(n))


@dataclass(frozen=True)
class Verdict:
    """The final's outcome: each trial's turns (geomean TFLOPS over the problems) and median,
    the noise band, whether a winner was declared, who tied, and the pick."""

    turns: dict[int, list[float]]
    tflops: dict[int, float]
    band: float
    winner: int | None
    tied: tuple[int, ...]
    pick: int
    why: str

    @property
    def ranked(self) -> list[int]:
        return sorted(self.tflops, key=lambda n: -self.tflops[n])

    def text(self) -> str:
        """One line: who won by how much beyond the band, or who tied and which was picked."""
        r = self.ranked
        if self.winner is not None:
            lead = paired(self.turns[r[0]], self.turns[r[1]])[0]
            return (f"trial {self.winner} beats trial {r[1]} by {100 * lead:.1f} % in the final "
                    f"(noise band {100 * self.band:.1f} %)")
        others = ", ".join(str(n) for n in self.tied if n != self.pick)
        return (f"trials {', '.join(map(str, self.tied))} tie in the final (within the noise "
                f"band of {100 * self.band:.1f} %); picked trial {self.pick} ({self.why}; "
                f"tied: {others})")

    def standings(self) -> str:
        """One line: each finalist's median turn, fastest first, with the fastest one's lead
        over it and their band (what the verdict was read from)."""
        r = self.ranked
        n_turns = min(len(v) for v in self.turns.values())
        parts = [f"trial {r[0]} {self.tflops[r[0]]:.1f}"]
        for n in r[1:]:
            lead, band = paired(self.turns[r[0]], self.turns[n])
            parts.append(f"trial {n} {self.tflops[n]:.1f} (lead over it {100 * lead:.1f} %, band "
                         f"{100 * band:.1f} %)")
        return f"{n_turns} turns, median TFLOPS: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"turns": {str(n): v for n, v in self.turns.items()},
                "tflops": {str(n): v for n, v in self.tflops.items()}, "band": self.band,
                "winner": self.winner, "tied": list(self.tied), "pick": self.pick,
                "why": self.why, "text": self.text()}

    @classmethod
    def from_dict(cls, d: Any) -> Verdict | None:
        """The stored verdict, or None when there is none or it cannot be read (its turns must
        be positive numbers, at least one per finalist, and its medians name the same trials:
        ``text`` and ``standings`` read them)."""
        try:
            v = cls({int(k): [float(x) for x in v] for k, v in d["turns"].items()},
                    {int(k): float(v) for k, v in d["tflops"].items()}, float(d["band"]),
                    None if d["winner"] is None else int(d["winner"]),
                    tuple(int(n) for n in d["tied"]), int(d["pick"]), str(d["why"]))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        ok = (len(v.turns) >= 2 and v.turns.keys() == v.tflops.keys()
              and all(x and min(x) > 0 for x in v.turns.values()))
        return v if ok else None


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def decide(turns: dict[int, list[float]], distance: dict[int, int],
           error: dict[int, float | None]) -> Verdict:
    """The verdict on each trial's turns (TFLOPS, higher is better); ``distance``: knobs changed
    from the default config; ``error``: its err_vs_default (None: not recorded)."""
    if len(turns) < 2 or any(not v for v in turns.values()):
        raise ValueError("a final needs two or more trials, each with turns")
    med = {n: _median(v) for n, v in turns.items()}
    ranked = sorted(med, key=lambda n: -med[n])
    best = ranked[0]
    pair = {n: paired(turns[best], turns[n]) for n in ranked[1:]}  # (lead, band)
    tied = (best,) + tuple(n for n in ranked[1:] if pair[n][0] <= pair[n][1])
    if len(tied) == 1:
        return Verdict(turns, med, pair[ranked[1]][1], best, (best,), best,
                       "beyond the noise band")
    band = max(pair[n][1] for n in tied[1:])

    def key(n: int) -> tuple[int, float, float]:
        err = error.get(n)
        return (distance.get(n, 0), err if err is not None else math.inf, -med[n])

    pick = min(tied, key=key)
    d_min = distance.get(pick, 0)
    if sum(1 for n in tied if distance.get(n, 0) == d_min) == 1:
        why = f"closest to the default: {d_min} knob{'s' if d_min != 1 else ''} changed"
    elif error.get(pick) is not None:
        why = f"as close to the default as another, and more accurate (err_vs_default " \
              f"{error[pick]:.2f})"
    else:
        why = "as close to the default and as accurate as another, and faster"
    return Verdict(turns, med, band, None, tied, pick, why)


def knobs_changed(config: dict[str, Any], default: KernelConfig) -> int:
    """How many knobs of ``config`` (a trial's config dict) differ from the default's."""
    base = default.to_dict()
    full = KernelConfig.from_dict(config).to_dict()
    return sum(1 for k, v in full.items() if base.get(k) != v)


def finalists(trials: Sequence[Any], confirmed: Callable[[Any], float | None],
              top: int = TOP) -> list[Any]:
    """The top trials by confirmed TFLOPS, one per config."""
    ranked = sorted((t for t in trials if confirmed(t)), key=lambda t: -(confirmed(t) or 0.0))
    return one_per_config(ranked, top)


def one_per_config(ordered: Sequence[Any], most: int, skip: Sequence[str] = ()) -> list[Any]:
    """The first trial of each config in ``ordered`` (none of a duplicate trial, none of the
    configs in ``skip``), at most ``most``."""
    out: list[Any] = []
    seen = set(skip)
    for t in ordered:
        cid = t.user_attrs.get("config_id", "")
        if cid in seen or "duplicate_of" in t.user_attrs:
            continue
        seen.add(cid)
        out.append(t)
        if len(out) == most:
            break
    return out


def play(measure: Callable[[str, Problem], float], so_paths: dict[int, str],
         problems: Sequence[Problem], turns: int = TURNS) -> dict[int, list[float]]:
    """Each trial's turns: ``measure(so_path, problem)`` (TFLOPS) interleaved, the order
    reversed every other turn, the geometric mean over the problems per turn."""
    order = list(so_paths)
    out: dict[int, list[float]] = {n: [] for n in order}
    for i in range(turns):
        per: dict[int, list[float]] = {n: [] for n in order}
        for p in problems:
            for n in order if i % 2 == 0 else order[::-1]:
                per[n].append(measure(so_paths[n], p))
        for n in order:
            out[n].append(geomean(per[n]))
    return out
