"""kv_walk (cuda_src/fa_tune/walk.cuh): a CTA walks a strip of query tiles of one head and keeps
the K/V tiles neighbours share in its rings.

The producer and the consumer agree on the rings only through walk.cuh's tile arithmetic, so
its host side is compiled with nvcc into a small driver and replayed here: every tile a task
reads is in the rings, each tile is loaded and handed back once, in the rings' FIFO order, and
never more at once than the launcher's check allows (the same number support.py computes).
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
from tuner.kernel.support import unsupported, walk_reason, walk_tiles
from tuner.problem import Problem, ProblemClass

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
// stdin: Sq Sk window per line (the kernel's window: keys left of the diagonal). stdout: the
// rings' need, then per query tile: lo hi first_new keep (keep for a successor m + 1).
int main() {
  int sq, sk, w;
  while (std::scanf("%d %d %d", &sq, &sk, &w) == 3) {
    std::printf("%d", W::most_tiles(sq, sk, w));
    const int num_m = (sq + Config::block_m - 1) / Config::block_m;
    for (int m = 0; m < num_m; ++m) {
      const W::Tiles t = W::tiles(sq, sk, w, m);
      std::printf(" %d,%d,%d,%d", t.lo, t.hi, W::first_new(sq, sk, w, m, t),
                  W::keep(sq, sk, w, t, m + 1 < num_m ? m + 1 : -1));
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


def replay(driver: Path, shapes: list[tuple[int, int, int]]) -> list[tuple[int, list]]:
    out = subprocess.run([str(driver)], input="".join(f"{a} {b} {c}\n" for a, b, c in shapes),
                         check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        most, *tasks = line.split()
        rows.append((int(most), [tuple(int(x) for x in t.split(",")) for t in tasks]))
    return rows


def shapes() -> list[tuple[int, int, int]]:
    rng = random.Random(7)
    fixed = [(8192, 8192, 127), (8192, 8192, 4095), (1000, 1000, 127), (64, 64, 127),
             (2048, 8192, 127), (500, 9000, 100), (8192, 8192, 0), (130, 131, 1)]
    for _ in range(60):
        sk = rng.randint(1, 5000)
        fixed.append((rng.randint(1, sk), sk, rng.choice([0, 1, 63, 64, 65, 127, 200, 511])))
    return fixed


def test_the_rings_hold_what_each_task_reads_and_hand_back_each_tile_once(driver: Path) -> None:
    strip = WALK.kv_walk
    for (sq, sk, w), (most, tasks) in zip(shapes(), replay(driver, shapes()), strict=True):
        # The launcher's and support.py's need agree.
        assert most == walk_tiles(Problem(1, 1, sq, Sk=sk, D=64, window=w + 1), 64, 64), (sq, sk, w)
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


def test_support_refuses_a_window_the_rings_cannot_hold() -> None:
    w128 = Problem.parse("1x64/8x8192:d64:w128")
    assert walk_tiles(w128, 64, 64) == 3
    assert walk_reason(w128, WALK) is None and unsupported(w128, WALK) is None
    why = unsupported(Problem.parse("1x64/8x8192:d64:w4096"), WALK)
    assert why and "needs 65 of them" in why and "kv_walk 1" in why
    three = WALK.replace(k_stages=3, v_stages=3)
    assert walk_reason(w128, three) is None
    # Keys off the tiles' grid (S_k - S_q = 32): a tile more.
    shifted = Problem.parse("1x64/8x8160:k8192:d64:w128")
    assert walk_tiles(shifted, 64, 64) == 4 and "needs 4" in (walk_reason(shifted, three) or "")
    # Where the walk does not apply, nothing to refuse: no window, non-causal, a packed batch.
    for text in ("1x64/8x8192:d64", "1x64/8x8192:d64:full:w4096", "64/8x[8192,4096]:d64:w4096"):
        assert walk_reason(Problem.parse(text), WALK) is None, text
    # A built library's config is a dict.
    assert "needs 65" in (walk_reason(Problem.parse("1x64/8x8192:d64:w4096"), WALK.to_dict())
                          or "")


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
