"""Warm the build cache on the GPU host while the other calls of a session run (16 cores):
every preset for both masks, and the planted-bug variants of the gate tests.

    python3 lab/h200/prebuild.py > .device/prebuild.log 2>&1 &
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner import build  # noqa: E402
from tuner.config import list_presets, load_preset  # noqa: E402


def main() -> None:
    t0 = time.time()
    build.build_oracle()
    presets = [load_preset(p) for p in list_presets()]
    for causal in (True, False):
        for o in build.build_many(presets, causal=causal):
            print(f"{'causal' if causal else 'full'} {o.config.config_id()} "
                  f"{'ok' if o.ok else o.error}", flush=True)
    default = load_preset("default")
    with ThreadPoolExecutor(7) as ex:  # each build is one nvcc process
        for bug, r in zip(range(1, 8), ex.map(
                lambda b: build.build_config(default, defines={"FA_TUNE_PLANT_BUG": b}),
                range(1, 8)), strict=True):
            print(f"bug {bug} {r.so_path}", flush=True)
    print(f"built in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
