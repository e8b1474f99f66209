"""A search's events in a log: piped (a log file, nohup), the live view draws only its last frame,
so `fa-tune search` and `tune` print each event as a line with the search's seconds, once."""

from __future__ import annotations

import re

from tuner.cli import search_cmds
from tuner.cli.common import console
from tuner.search.fleet import FleetProgress
from tuner.search.session import Progress


def test_each_event_is_printed_once_with_its_seconds_when_piped() -> None:
    p = Progress(study="s", shapes=["1x2x256"], n_trials=None, deadline=None)
    lines = search_cmds._EventLines()
    lines.on = True  # as piped (pytest's -s on a terminal would say otherwise)
    with console.capture() as cap:
        p.event("trial 0: 388.0 TFLOPS (survey, geomean)")
        p.event("new best: trial 0, 373.7 TFLOPS confirmed")
        lines.show(p.events, True)
        lines.show(p.events, True)  # nothing new: nothing printed
        p.event("trial 1 pruned (screen slower than trial 0)")
        lines.show(p.events, True)
    out = cap.get().splitlines()
    assert len(out) == 3, out
    assert all(re.fullmatch(r"\[\s*\d+ s\] .+", ln) for ln in out), out
    assert out[0].endswith("trial 0: 388.0 TFLOPS (survey, geomean)")
    assert out[2].endswith("trial 1 pruned (screen slower than trial 0)")
    assert p.events.items[-1][1] == "trial 1 pruned (screen slower than trial 0)"  # the view's


def test_a_burst_past_what_progress_keeps_says_how_many_were_dropped() -> None:
    p = Progress(study="s", shapes=[], n_trials=None, deadline=None)
    lines = search_cmds._EventLines()
    lines.on = True
    for i in range(70):
        p.event(f"trial {i} pruned")
    with console.capture() as cap:
        lines.show(p.events, True)
    out = cap.get().splitlines()
    assert out[0] == "(6 events not kept)" and len(out) == 65
    assert out[1].endswith("trial 6 pruned") and out[-1].endswith("trial 69 pruned")
    assert len(p.events.items) == 64 and p.events.count == 70


def test_a_fleet_prints_each_workers_events_under_its_gpu() -> None:
    fp = FleetProgress(study="s", workers={}, deadline=None)
    w0 = Progress(study="s", shapes=[], n_trials=None, deadline=None, device=0)
    w1 = Progress(study="s", shapes=[], n_trials=None, deadline=None, device=1)
    lines = search_cmds._EventLines()
    lines.on = True
    with console.capture() as cap:
        fp.event("timeout: the workers settle their trials")
        w0.event("trial 3: 500.1 TFLOPS (survey, geomean)")
        w1.event("trial 4: 499.0 TFLOPS (survey, geomean)")
        lines.show(fp.events, True)
        lines.show(w0.events, True, 0, "GPU 0: ")
        lines.show(w1.events, True, 1, "GPU 1: ")
        lines.show(w1.events, True, 1, "GPU 1: ")
    out = cap.get().splitlines()
    assert len(out) == 3 and "GPU 0: trial 3" in out[1] and "GPU 1: trial 4" in out[2], out


def test_nothing_is_printed_on_a_terminal() -> None:
    p = Progress(study="s", shapes=[], n_trials=None, deadline=None)
    lines = search_cmds._EventLines()
    lines.on = False  # as on a terminal, where the live view shows the newest events
    p.event("trial 0: 388.0 TFLOPS (survey, geomean)")
    with console.capture() as cap:
        lines.show(p.events, True)
    assert cap.get() == ""


def test_nothing_is_printed_before_the_search_is_ready_then_all_of_it() -> None:
    # A refusal (no GPU, another GPU model) comes before `ready`: its one line stays alone.
    p = Progress(study="s", shapes=[], n_trials=None, deadline=None)
    lines = search_cmds._EventLines()
    lines.on = True
    p.event("stale RUNNING trials: failed none, back to waiting none")
    with console.capture() as cap:
        lines.show(p.events, p.ready)
    assert cap.get() == ""
    p.ready = True
    with console.capture() as cap:
        lines.show(p.events, p.ready)
    assert cap.get().rstrip().endswith("stale RUNNING trials: failed none, back to waiting none")
