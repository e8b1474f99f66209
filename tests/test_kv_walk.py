"""kv_walk (cuda_src/fa_tune/walk.cuh): a CTA walks a strip of query tiles of one head and keeps
the K/V tiles neighbours share in its rings.

The producer and the consumer agree on the rings only through walk.cuh's tile arithmetic, so
its host side is compiled with nvcc into a small driver and replayed here: every tile a task
reads is in the rings, each tile is loaded and handed back once, in the rings' FIFO order, and
never more at once than the scheduler's check (``most_tiles``) lets a call walk with.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
from prebuild import Artifact

from tuner.errors import ConfigError
from tuner.kernel import build, toolchain
from tuner.kernel.config import KernelConfig, load_preset, validate
from tuner.kernel.walk import most_tiles, walks
from tuner.problem import Problem, ProblemClass
from tuner.search.space import load_space

ROOT = Path(__file__).resolve().parents[1]
WALK = load_preset("d64-window").replace(kv_walk=8, k_stages=4, v_stages=4)

_DRIVER = r"""
#include <cstdio>
#include "fa_tune/config.cuh"
#include "fa_tune/walk.cuh"
struct Config {
  static constexpr int head_dim = 64;
  static constexpr bool causal = true;
  static constexpr bool window = true;
%MEMBERS%
  static constexpr const char* json = "{}";
};
using W = fa_tune::KvWalk<fa_tune::Derived<Config>, true>;
// stdin: Sq Sk window shift per line (the kernel's window: keys left of the diagonal; the
// strip's log2). stdout: the rings' need, then per query tile: lo hi first_new keep (keep for a
// successor m + 1).
int main() {
  int sq, sk, w, shift;
  while (std::scanf("%d %d %d %d", &sq, &sk, &w, &shift) == 4) {
    std::printf("%d", W::most_tiles(sq, sk, w));
    const int num_m = (sq + Config::block_m - 1) / Config::block_m;
    for (int m = 0; m < num_m; ++m) {
      const W::Tiles t = W::tiles(sq, sk, w, m);
      std::printf(" %d,%d,%d,%d", t.lo, t.hi, W::first_new(sq, sk, w, m, t, shift),
                  W::keep(sq, sk, w, t, m + 1 < num_m ? m + 1 : -1, shift));
    }
    std::printf("\n");
  }
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if toolchain.find_nvcc() is None:
        pytest.skip("needs nvcc")
    d = tmp_path_factory.mktemp("walk")
    src = d / "walk_driver.cu"
    src.write_text(_DRIVER.replace("%MEMBERS%", WALK.cpp_members()))
    exe = d / "walk_driver"
    subprocess.run([str(toolchain.find_nvcc()), "-std=c++17", "-I", str(ROOT / "cuda_src"),
                    str(src), "-o", str(exe)], check=True, capture_output=True, text=True)
    return exe


def replay(driver: Path, shapes: list[tuple[int, int, int, int]]) -> list[tuple[int, list]]:
    lines = "".join(" ".join(map(str, s)) + "\n" for s in shapes)
    out = subprocess.run([str(driver)], input=lines, check=True, capture_output=True,
                         text=True).stdout
    rows = []
    for line in out.splitlines():
        most, *tasks = line.split()
        rows.append((int(most), [tuple(int(x) for x in t.split(",")) for t in tasks]))
    return rows


def shapes() -> list[tuple[int, int, int, int]]:
    """(S_q, S_k, the kernel's window, the strip's log2)."""
    rng = random.Random(7)
    fixed = [(8192, 8192, 127), (8192, 8192, 4095), (1000, 1000, 127), (64, 64, 127),
             (2048, 8192, 127), (500, 9000, 100), (8192, 8192, 0), (130, 131, 1)]
    for _ in range(60):
        sk = rng.randint(1, 5000)
        fixed.append((rng.randint(1, sk), sk, rng.choice([0, 1, 63, 64, 65, 127, 200, 511])))
    return [(*s, shift) for s in fixed for shift in (1, 3, 4)]


def test_the_rings_hold_what_each_task_reads_and_hand_back_each_tile_once(driver: Path) -> None:
    for (sq, sk, w, shift), (most, tasks) in zip(shapes(), replay(driver, shapes()), strict=True):
        strip = 1 << shift
        # The reports' count (tuner/kernel/walk.py) is the kernel's.
        assert most == most_tiles(Problem(1, 1, sq, Sk=sk, D=64, window=w + 1), 64, 64)
        for m0 in range(0, len(tasks), strip):  # one CTA's strip, replayed as a FIFO ring
            loaded: list[int] = []  # tiles in load order; the ring's positions
            head = 0                # the oldest tile not yet handed back
            base = 0                # the consumer's cursor: position of its task's lowest tile
            for m in range(m0, min(m0 + strip, len(tasks))):
                lo, hi, first, keep = tasks[m]
                loaded += range(first, hi)  # the producer: all K (and V) of what is new
                assert loaded == sorted(set(loaded)), (sq, sk, w, m)  # once each, ascending
                for n in range(lo, hi):  # the consumer reads tile n at base + n - lo
                    assert head <= base + n - lo < len(loaded) and loaded[base + n - lo] == n
                assert len(loaded) - head <= most  # never more in the rings than checked
                last = m + 1 == min(m0 + strip, len(tasks))
                assert keep == (hi if last else min(tasks[m + 1][0], hi))
                head += keep - lo  # handed back in FIFO order
                base += keep - lo
                assert head == base
            assert head == len(loaded)  # the strip leaves the rings empty


class _Rings:
    """One CTA's Q ring (1 stage) and K / V rings (R stages) as counters of loads and
    releases; a release must be the oldest unreleased load (FIFO), a load needs its slot's
    previous load released."""

    def __init__(self, stages: int) -> None:
        self.stages = stages
        self.q_loaded = self.q_released = 0
        self.tile = {"k": [], "v": []}  # the tile each load put in the ring, in load order
        self.released = {"k": 0, "v": 0}

    def free(self, ring: str) -> bool:
        return len(self.tile[ring]) - self.released[ring] < self.stages

    def loaded(self, ring: str, index: int, n: int) -> bool:
        if index >= len(self.tile[ring]):
            return False
        assert self.tile[ring][index] == n, (ring, index, n)  # the consumer's position
        return True

    def release(self, ring: str, first: int, count: int) -> None:
        assert first == self.released[ring], (ring, first)  # FIFO
        self.released[ring] += count


def _producer(r: _Rings, tasks: list):
    for i, (_lo, hi, first, _keep) in enumerate(tasks):
        yield lambda i=i: r.q_released >= i  # Q's one stage: the previous Q handed back
        r.q_loaded += 1
        for ring in ("k", "v"):  # all K, then all V
            for n in range(first, hi):
                yield lambda ring=ring: r.free(ring)
                r.tile[ring].append(n)


def _consumer(r: _Rings, tasks: list, early_next: bool):
    base = 0
    if early_next and tasks:  # the first task's first QK, before the loop
        lo, hi, _, _ = tasks[0]
        yield lambda: r.q_loaded > 0
        yield lambda: r.loaded("k", hi - 1 - lo, hi - 1)
    for i, (lo, hi, _first, keep) in enumerate(tasks):
        def at(n: int, base: int = base, lo: int = lo) -> int:
            return base + n - lo
        if not early_next:
            yield lambda i=i: r.q_loaded > i
            yield lambda at=at, hi=hi: r.loaded("k", at(hi - 1), hi - 1)

        def last_qk_done(lo: int = lo, keep: int = keep, base: int = base) -> None:
            if early_next:  # q_release after_last_qk
                r.q_released += 1
            r.release("k", base, keep - lo)
        if hi - lo == 1:
            last_qk_done()
        for n in range(hi - 2, lo - 1, -1):  # QK[n] beside PV[n + 1]
            yield lambda at=at, n=n: r.loaded("k", at(n), n)
            yield lambda at=at, n=n: r.loaded("v", at(n + 1), n + 1)
            if n == lo:
                last_qk_done()
        yield lambda at=at, lo=lo: r.loaded("v", at(lo), lo)  # the drain's PV
        if early_next and i + 1 < len(tasks):  # the next task's first QK, in the drain
            nlo, nhi, _, _ = tasks[i + 1]
            top = base + keep - lo + nhi - 1 - nlo
            yield lambda i=i: r.q_loaded > i + 1
            yield lambda top=top, nhi=nhi: r.loaded("k", top, nhi - 1)
        r.release("v", base, keep - lo)
        if not early_next:  # q_release at_end
            r.q_released += 1
        base += keep - lo


def _run(stages: int, tasks: list, early_next: bool) -> bool:
    """Both roles to the end (True), or stuck with both waiting (False)."""
    r = _Rings(stages)
    roles = [_producer(r, tasks), _consumer(r, tasks, early_next)]
    waits = [next(g, None) for g in roles]
    while any(w is not None for w in waits):
        progress = False
        for j, g in enumerate(roles):
            while waits[j] is not None and waits[j]():
                waits[j] = next(g, None)
                progress = True
        if not progress:
            return False
    return True


def test_the_walk_never_deadlocks_where_the_tiles_fit(driver: Path) -> None:
    """The walk's order of waits and releases (kernel.cuh, mainloop.cuh, producer.cuh) played
    out for one CTA walking every strip of a head in turn, with and without early_next_qk:
    with as many stages as a query tile's tiles it always finishes, each wait finding the
    tile the consumer computed; with one stage fewer a task cannot hold its tiles, which is
    why the scheduler walks only where they fit."""
    for (sq, sk, w, shift), (most, tasks) in zip(shapes(), replay(driver, shapes()), strict=True):
        if len(tasks) > 40:
            tasks = tasks[:40]  # two or more strips of every length are enough
            most = max(hi - lo for lo, hi, _, _ in tasks)
        for early in (True, False):
            assert _run(most, tasks, early), (sq, sk, w, shift, early)
            assert _run(most + 1, tasks, early), (sq, sk, w, shift, early)
            if most > 1 and shift > 0:
                assert not _run(most - 1, tasks, early), (sq, sk, w, shift, early)


def test_reports_say_which_calls_walk() -> None:
    pclass = ProblemClass(64, True, True, window=True)
    assert walks(WALK, Problem.parse("1x64/8x8192:d64:w128"), pclass)
    assert walks(WALK, Problem.parse("1x8x2000:d64:w150"), pclass)  # 4 tiles, 4 stages
    assert not walks(WALK.replace(k_stages=3, v_stages=3), Problem.parse("1x8x2000:d64:w150"),
                     pclass)
    for text in ("1x64/8x8192:d64:w4096", "1x64/8x8192:d64", "64/8x[8192,4096]:d64:w128"):
        assert not walks(WALK, Problem.parse(text), pclass), text
    assert not walks(WALK, Problem.parse("1x64/8x8192:d64:w128"), ProblemClass(64, True))
    assert walks(WALK, Problem.parse("1x8x200:d64"), pclass)  # no window, but 4 tiles at most


def test_a_search_offers_kv_walk_to_causal_window_classes_only() -> None:
    space = load_space("d64")
    assert len(space.choices("kv_walk")) > 1
    window = space.for_class(ProblemClass(64, True, window=True))
    assert window.choices("kv_walk") == space.choices("kv_walk")
    for other in (ProblemClass(64, True), ProblemClass(64, False, window=True)):
        narrowed = space.for_class(other)
        assert narrowed.choices("kv_walk") == (1,) and "kv_walk" not in narrowed.free_knobs
        assert narrowed.choices("block_m") == space.choices("block_m")


def test_a_study_searches_kv_walk_only_over_causal_windows(tmp_path: Path) -> None:
    """`fa-tune search --create-only` stores the space it searches: the D 64 space narrowed to
    the study's class."""
    import optuna
    from typer.testing import CliRunner

    from tuner.cli import app

    url = f"sqlite:///{tmp_path / 's.db'}"
    for study, shape, free in (("win", "1x8/2x1024:d64:w128", True),
                               ("plain", "1x8/2x1024:d64", False)):
        r = CliRunner().invoke(app, ["search", "--study", study, "--storage", url,
                                     "--create-only", "--shape", shape])
        assert r.exit_code == 0, r.output
        attrs = optuna.load_study(study_name=study, storage=url).user_attrs
        assert ("kv_walk" in attrs["space"]) is free, (study, sorted(attrs["space"]))


@pytest.mark.parametrize("change,message", [
    ({"block_m": 128, "consumer_regs": 200}, "needs block_m 64"),
    ({"scheduler": "static"}, "the dynamic scheduler"),
    ({"v_stages": 3}, "k_stages = v_stages"),
    ({"intra_wg_overlap": False, "early_next_qk": False}, "intra_wg_overlap"),
])
def test_validate_says_what_kv_walk_needs(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(WALK.replace(**change), 64)
    validate(WALK, 64)
    assert "kv_walk" not in KernelConfig().canonical_json()  # id-neutral at 1


WALK_ART = Artifact(WALK, ProblemClass(64, True, True, window=True, sinks=True))


@pytest.mark.slow
@pytest.mark.builds(WALK_ART)
def test_a_walking_kernel_compiles_clean_beside_its_varlen_kernel() -> None:
    r = build.build_config(WALK_ART.config, pclass=WALK_ART.pclass)
    assert r.unfit is None, r.unfit  # no local memory, wgmma not serialized
    assert r.sass["has_hgmma"] and len(r.ptxas["entries"]) >= 2  # fixed and varlen kernels
    for e in r.ptxas["entries"].values():
        assert e["spill_stores"] == 0 and e["spill_loads"] == 0
