#!/usr/bin/env python3
"""Calibrate the static register check per head dim: compile configs around its boundary
WITHOUT validate() and report what ptxas did (registers, stack, local memory, serialized wgmma).

    python scripts/reg_calibration.py --head-dim 256 --jobs 2 [--out FILE.json]   (64, 128, 256)

Each row: config id, the knobs that vary, the static estimate (config.consumer_reg_estimate)
vs consumer_regs, and the build's verdict. Used for CONSUMER_REG_OVERHEAD (D 128, both masks:
docs/PERF.md step 35) and CONSUMER_REG_OVERHEAD_D (step 26) in tuner/kernel/config.py. CPU only:
nvcc 13.0 builds sm_90a without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.kernel import build  # noqa: E402
from tuner.kernel.config import KernelConfig, consumer_reg_estimate  # noqa: E402
from tuner.problem import ProblemClass  # noqa: E402

# D 128 with overlap (2026-12-01, docs/PERF.md step 35): grid and multicast, both masks
# ("_causal": False is the non-causal class), block_n 144-192 with and without Q in registers.
_MC = dict(scheduler="static", fixed_cost=4, producer_regs=24, consumer_regs=240,
           kv_multicast=True)
_MCL = dict(_MC, q_release="after_last_qk", lazy_rescale=True)
_D128: list[dict] = [
    *(dict(kn, _causal=False) for kn in (
        dict(_MCL, block_n=144), dict(_MCL, block_n=160), dict(_MCL, block_n=144, q_in_regs=True),
        dict(_MCL, block_n=160, q_in_regs=True), dict(_MCL, block_n=176, q_release="at_end"),
        dict(_MC, block_n=176), dict(_MC, block_n=192),
        dict(_MC, block_n=176, producer_regs=40, consumer_regs=232),
        dict(block_n=160), dict(block_n=176), dict(block_n=144, q_in_regs=True),
        dict(block_n=192, consumer_regs=224))),
    dict(block_n=144), dict(block_n=160), dict(block_n=176), dict(block_n=192),
    dict(block_n=176, consumer_regs=232), dict(_MCL, block_n=160),
    dict(_MCL, block_n=176, q_release="at_end"), dict(_MCL, block_n=144, q_in_regs=True),
    dict(_MC, block_n=176, q_in_regs=True),
    # early_next_qk (docs/PERF.md step 36): 160 and 176 spill at 232 and 240 alike, 144 fits.
    *(dict(scheduler="static", fixed_cost=5, producer_regs=pr, consumer_regs=r,
           q_release="after_last_qk", early_next_qk=True, block_n=bn)
      for bn, pr, r in ((144, 40, 232), (160, 40, 232), (160, 24, 240), (176, 24, 240))),
]

# Configs around the boundary, per head dim: (block_m, block_n, overlap, q_in_regs, regs).
GRID: dict[int, list[dict]] = {
    128: _D128,
    64: [dict(block_m=bm, block_n=bn, intra_wg_overlap=ov, consumer_regs=r, producer_regs=p,
              pingpong=bm > 64)
         for bm, r, p in ((192, 160, 24), (128, 240, 24))
         for bn in (128, 176, 192) for ov in (True, False)],
    256: [dict(block_m=128, block_n=bn, intra_wg_overlap=ov, consumer_regs=240, producer_regs=24,
               k_stages=2, v_stages=2, pingpong=True)
          for bn in (64, 80, 96, 112) for ov in (True, False)]
          + [dict(block_m=64, block_n=bn, intra_wg_overlap=True, consumer_regs=240,
                  producer_regs=24, pingpong=False, k_stages=2, v_stages=2)
             for bn in (96, 128)],
}


def one(args: tuple[dict, int]) -> dict:
    knobs, d = args
    causal = knobs.get("_causal", True)
    knobs = {k: v for k, v in knobs.items() if k != "_causal"}
    cfg = KernelConfig.from_dict(knobs)
    src = build.render(cfg, pclass=ProblemClass(d, causal))
    row = {"head_dim": d, "causal": causal, **knobs, "estimate": consumer_reg_estimate(cfg, d)}
    try:
        r = build.build_source(src, build.KERNEL_FLAGS, name="kernel", config=cfg)
    except Exception as e:  # noqa: BLE001 - a failed build is a row, not the end
        row["error"] = str(e).splitlines()[0][:200]
        return row
    e = r.main_entry
    row.update(registers=e.get("registers"), stack=e.get("stack_frame"),
               spills=r.any_spills, local=r.local_memory, sass=r.sass_note,
               serialized=r.wgmma_serialized,
               compile_s=round(r.compile_seconds, 1))
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, choices=sorted(GRID), required=True)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    with ProcessPoolExecutor(a.jobs) as ex:
        rows = list(ex.map(one, [(k, a.head_dim) for k in GRID[a.head_dim]]))
    for r in rows:
        print(json.dumps(r))
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
