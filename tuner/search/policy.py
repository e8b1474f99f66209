"""The search's measurement policy: which protocol screens, surveys and confirms a candidate,
and when a candidate stops early. It plays the part of an Optuna pruner, asked by the search
at two points of every trial:

* after the screen (gate + SCREEN on the cheapest shape): ``prune_reason`` says whether the
  candidate is too slow next to the incumbent's screen to be worth timing on every shape;
* after the survey (SURVEY on every shape; value = geometric-mean TFLOPS):
  ``needs_confirming`` says whether the value could be a new best, which is then re-measured
  with ``confirm`` (CONFIRM: the protocol of ``fa-tune run`` and ``fa-tune compare``, settle
  phase included, rounds stopped near 4 s for kernels over 16 ms a launch) and stored as the
  trial's ``confirmed`` number, the only "best" ever shown.

The protocols are tuner.measure.timing's named ones; SCREEN and SURVEY only rank candidates
against each other, FULL is what a user measures.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.measure.timing import CONFIRM, SCREEN, SURVEY, Protocol
from tuner.search import final
from tuner.search.trials import confirmed_ms, confirmed_value

# A candidate whose screening median is more than this fraction slower than the incumbent's
# screening median (same shape, same short protocol) is pruned.
PRUNE_SLOWER_FRACTION = 0.08


@dataclass(frozen=True)
class SearchPolicy:
    prune_slower_fraction: float = PRUNE_SLOWER_FRACTION
    screen: Protocol = field(default=SCREEN)
    survey: Protocol = field(default=SURVEY)
    confirm: Protocol = field(default=CONFIRM)
    # The final (tuner.search.final): this many top configs timed against each other when the
    # search ends, interleaved; 0 or 1: none.
    final_top: int = final.TOP
    final_turns: int | None = None  # None: final.turns_for(the study's problems)
    final_protocol: Protocol = field(default=final.PROTOCOL)
    # Confirming: a calibrated survey value within this fraction of the best confirmed one
    # (a margin under 1 % is a tie; the final times the top ones against each other), once
    # this many confirmations calibrate the survey.
    confirm_margin: float = 0.01
    calibrate_after: int = 3

    def prune_reason(self, screen: dict[str, Any], incumbent: Any | None,
                     ratios: Sequence[float] = ()) -> str | None:
        """Why a candidate with this screen row ({shape, median_ms, ...}) is pruned against
        the incumbent (a FrozenTrial with ``screen`` and ``confirmed`` attrs), or None to go on.

        ``ratios``: the study's screen / confirmed times so far (trials.screen_ratios). From
        ``calibrate_after`` of them on, the incumbent's reference is its confirmed time on the
        screen's shape scaled by their median, not its own screen: one screen reads 0.87-0.98
        of the full protocol (H100, docs/PERF.md step 60), so an incumbent screened fast on a
        cool card pruned candidates as good as itself."""
        if incumbent is None:
            return None
        inc = incumbent.user_attrs.get("screen") or {}
        ref_ms, what = inc.get("median_ms"), "screen"
        conf_ms = confirmed_ms(incumbent.user_attrs, screen.get("shape"))
        if len(ratios) >= self.calibrate_after and conf_ms:
            ref_ms = conf_ms * statistics.median(ratios)
            what = "confirmed time x the study's screen / confirmed median"
        if not ref_ms or screen["median_ms"] <= ref_ms * (1.0 + self.prune_slower_fraction):
            return None
        slower = screen["median_ms"] / ref_ms - 1.0
        return (f"screen {screen['median_ms']:.4f} ms on {screen.get('shape', '?')} is "
                f"{100 * slower:.1f}% slower than trial {incumbent.number}'s {ref_ms:.4f} ms "
                f"({what}; limit {100 * self.prune_slower_fraction:.0f}%)")

    def needs_confirming(self, value: float, incumbent: Any | None,
                         ratios: Sequence[float] = ()) -> bool:
        """Whether a survey value could be a new best, so is re-measured (confirmed).

        ``ratios``: the study's confirmed / survey values so far (trials.confirm_ratios). From
        ``calibrate_after`` of them on, the survey value is scaled by their median and must
        come within ``confirm_margin`` of the best confirmed number. Before that, any value
        above the best confirmed one is confirmed. The survey reads a cooler card than the
        full protocol: on an H100 (step 58) by a median 2.8 %, so the uncalibrated rule
        confirmed 50 of 158 trials, 7 s each, 70 % of the search's GPU time."""
        best = confirmed_value(incumbent) if incumbent is not None else None
        if best is None:
            return True
        if len(ratios) < self.calibrate_after:
            return value > best
        return value * statistics.median(ratios) > best * (1.0 - self.confirm_margin)

    def is_new_best(self, trial: Any, incumbent: Any | None) -> bool:
        """Whether a told trial's confirmed number beats the incumbent's."""
        mine = confirmed_value(trial)
        if mine is None:
            return False
        return incumbent is None or mine > (confirmed_value(incumbent) or 0.0)
