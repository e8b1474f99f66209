"""Warm the build cache on the GPU host with all cores, so the GPU tests that follow only load:

    python3 lab/h200/prebuild.py [plain] [masks] [paged] [JOBS]

``paged``: the kernels of tests/gpu/test_paged_gpu.py and issue 37's table.
``plain``: every preset for its head dim (config.preset_head_dim) and both masks, and the
planted-bug variants (tests/gpu/test_planted_bugs_gpu.py). ``masks``: the kernels of
tests/gpu/test_masks_gpu.py (and its planted bugs 9 and 10), lab/h200/softcap_forms.py and
issue 36's table (lab/h200/s19.sh masks-fa3). Each build is one nvcc process; a failed build is
printed and the rest go on.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "gpu")]

from tuner.kernel import build  # noqa: E402
from tuner.kernel.config import KernelConfig, list_presets, load_preset, preset_head_dim  # noqa: E402
from tuner.kernel.toolchain import usable_cpus  # noqa: E402
from tuner.problem import HEAD_DIMS, Problem, ProblemClass  # noqa: E402

Job = tuple[str, KernelConfig, ProblemClass, dict | None]


def plain_jobs() -> list[Job]:
    jobs: list[Job] = []
    for causal in (True, False):
        for d in HEAD_DIMS:
            jobs += [(n, load_preset(n), ProblemClass(d, causal), None)
                     for n in list_presets() if preset_head_dim(n) == d]
    default = load_preset("default")
    jobs += [(f"bug {b}", default, ProblemClass(), {"FA_TUNE_PLANT_BUG": b}) for b in range(1, 9)]
    return jobs


def mask_jobs() -> list[Job]:
    import test_masks_gpu as T  # the GPU test's own list of cases

    jobs: list[Job] = [(n, load_preset(n), p.problem_class, None) for n, p in T.ALL]
    for bug, text in ((9, "2x8/2x1000:w128"), (9, "1x8/2x300:k1500:w200"),
                      (10, "1x8/2x1000:sinks")):
        jobs.append((f"bug {bug}", load_preset("default"), Problem.parse(text).problem_class,
                     {"FA_TUNE_PLANT_BUG": bug}))
    for preset, d in (("default", 128), ("d256", 256)):  # softcap_forms.py: three builds each
        cap = ProblemClass(d, True, softcap=True)
        jobs += [(preset, load_preset(preset), ProblemClass(d, True), None),
                 (preset, load_preset(preset), cap, None),
                 ("tanh.approx", load_preset(preset).replace(softcap_tanh="approx"), cap, None)]
    for preset, text in (("default", "1x32/8x16384:w4096"), ("d64", "1x64/8x8192:d64:w128"),
                         ("d64", "1x64/8x8192:d64:w128:sinks"), ("d64", "1x64/8x8192:d64:sinks"),
                         ("d256", "1x16/8x8192:d256:cap50")):
        jobs.append((preset, load_preset(preset), Problem.parse(text).problem_class, None))
    return jobs


def paged_jobs() -> list[Job]:
    import test_paged_gpu as T  # the GPU test's own list of cases

    jobs: list[Job] = [(n, load_preset(n), p.problem_class, None) for n, p in T.ALL]
    for preset in ("default", "llama3", "static"):  # issue 37's table (fa-tune compare)
        for text in ("4x32/8x2048:k8192:p64", "4x32/8x2048:k8192"):
            jobs.append((preset, load_preset(preset), Problem.parse(text).problem_class, None))
    return jobs


def main() -> None:
    args = sys.argv[1:] or ["plain"]
    jobs_n = next((int(a) for a in args if a.isdigit()), usable_cpus())
    jobs: list[Job] = []
    if "plain" in args:
        jobs += plain_jobs()
    if "masks" in args:
        jobs += mask_jobs()
    if "paged" in args:
        jobs += paged_jobs()
    seen: set = set()
    todo = []
    for name, cfg, pc, defs in jobs:
        key = (cfg, pc, tuple(sorted((defs or {}).items())))
        if key not in seen:
            seen.add(key)
            todo.append((name, cfg, pc, defs))
    t0 = time.time()
    print(f"{len(todo)} builds on {jobs_n} jobs", flush=True)
    build.build_oracle()

    def one(job: Job) -> str:
        name, cfg, pc, defs = job
        try:
            r = build.build_config(cfg, defines=defs, pclass=pc)
            return f"{name:12s} {pc}: ok{' (local memory!)' if r.local_memory else ''}"
        except Exception as e:  # noqa: BLE001 - report and go on
            return f"{name:12s} {pc}: FAILED {str(e).splitlines()[0][:160]}"

    with ThreadPoolExecutor(jobs_n) as ex:
        for line in ex.map(one, todo):
            print(line, flush=True)
    print(f"built in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
