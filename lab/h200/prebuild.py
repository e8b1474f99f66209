"""Warm the build cache on the GPU host while the other calls of a session run (16 cores):
every preset for its head dim (config.preset_head_dim) and both masks, and the planted-bug
variants of the gate tests.

    python3 lab/h200/prebuild.py > .device/prebuild.log 2>&1 &
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner.kernel import build  # noqa: E402
from tuner.kernel.config import list_presets, load_preset, preset_head_dim  # noqa: E402
from tuner.problem import HEAD_DIMS, ProblemClass  # noqa: E402


def main() -> None:
    t0 = time.time()
    build.build_oracle()
    for causal in (True, False):
        for d in HEAD_DIMS:
            names = [n for n in list_presets() if preset_head_dim(n) == d]
            pclass = ProblemClass(d, causal)
            for n, o in zip(names, build.build_many([load_preset(n) for n in names],
                                                    pclass=pclass), strict=True):
                print(f"{pclass} {n} {'ok' if o.ok else o.error}", flush=True)
    default = load_preset("default")
    with ThreadPoolExecutor(7) as ex:  # each build is one nvcc process
        for bug, r in zip(range(1, 8), ex.map(
                lambda b: build.build_config(default, defines={"FA_TUNE_PLANT_BUG": b}),
                range(1, 8)), strict=True):
            print(f"bug {bug} {r.so_path}", flush=True)
    print(f"built in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
