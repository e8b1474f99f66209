"""Where a kernel's warps wait, per SASS instruction: ncu's source page, summed by opcode.

    python3 lab/h200/sass_profile.py VARIANTS_FILE SHAPE [INDEX...] [--fa3]   (on the H200)
    python3 lab/h200/sass_profile.py --summarize PAGE.csv[.xz]          (anywhere, a kept page)

Builds (or takes from the cache) the variants at INDEX (0-based lines of the file, default all),
runs each once under ``ncu --set full`` through tuner.profile_driver, and reads the report's
source page as SASS (``--page source --print-source sass --csv``). Writes the page of each to
$OUT/sass_<file>_<i>.csv and prints, per variant, the warp-stall samples summed by opcode, by
phase of the consumer's step (MUFU, the row max, the waits, ...) and by stall reason. The
measurement itself is ncu's; this only adds the sums (docs/PERF.md step 42). --fa3 profiles
FlashAttention-3 on the same problem in the same ncu run as each variant (tuner.profile_driver's
--vs fa3) and writes its page beside it as sass_<file>_<i>_fa3.csv.
"""

from __future__ import annotations

import csv
import io
import json
import lzma
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner import build  # noqa: E402
from tuner.config import KernelConfig  # noqa: E402
from tuner.problem import Problem  # noqa: E402
from tuner.profile import Subject, find_ncu, kernel_regex  # noqa: E402


def variants(path: Path) -> list[tuple[KernelConfig, dict[str, int]]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip().startswith("{"):
            knobs = json.loads(line)
            lab = {str(k): int(v) for k, v in knobs.pop("_lab", {}).items()}
            out.append((KernelConfig(**knobs), lab))
    return out


def opcode(src: str) -> str:
    s = re.sub(r"^@!?U?P\w+\s+", "", src.strip())
    return s.split(" ")[0].split(".")[0] if s else "?"


def summarize(text: str) -> tuple[dict[str, dict[str, float]], list[str]]:
    rows = list(csv.reader(io.StringIO(text)))
    head_i = next(i for i, r in enumerate(rows) if "Source" in r)
    head = rows[head_i]
    src = head.index("Source")
    by_op: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    numeric: list[str] = []
    for r in rows[head_i + 1:]:
        if len(r) != len(head):
            continue
        op = opcode(r[src])
        for j, name in enumerate(head):
            if j == src:
                continue
            try:
                v = float(r[j].replace(",", ""))
            except ValueError:
                continue
            if name not in numeric:
                numeric.append(name)
            by_op[op][name] += v
    return by_op, numeric


def phase(src: str, executed: float, busiest: float) -> str:
    """The step phase an instruction belongs to. Instructions run far less often than the
    busiest ones (the producer's, the prologue's, the epilogue's) form one bucket."""
    s = src.strip()
    op = re.sub(r"^@!?U?P\w+\s+", "", s).split(" ")[0]
    if executed < busiest / 10:
        return "producer, prologue, epilogue"
    for prefix, name in (("MUFU", "MUFU (exp2)"), ("FMNMX", "row max (FMNMX, SHFL)"),
                         ("SHFL", "row max (FMNMX, SHFL)"), ("FFMA", "FFMA"), ("F2FP", "F2FP"),
                         ("FMUL", "O rescale"), ("HGMMA", "wgmma issue"),
                         ("WARPGROUP.ARRIVE", "wgmma issue")):
        if op.startswith(prefix):
            return name
    if op.startswith("WARPGROUP.DEPBAR"):
        return f"wgmma wait ({s.split()[-1]} pending)"
    if op == "BRA" and s.startswith("@"):
        return "mbarrier wait (K/V full)"
    return "uniform ops" if op.startswith("U") else "other"


def report(by_op: dict[str, dict[str, float]], cols: list[str], text: str) -> None:
    samp = next((c for c in cols if "Sampling (All" in c), None)
    if samp is None:
        print("    no warp-stall sampling column in this page")
        return
    total = sum(v[samp] for v in by_op.values()) or 1.0
    for op, v in sorted(by_op.items(), key=lambda kv: -kv[1][samp])[:14]:
        print(f"    {op:<12} {v[samp] / total:6.1%}")
    rows = list(csv.reader(io.StringIO(text)))
    head_i = next(i for i, r in enumerate(rows) if "Source" in r)
    head = rows[head_i]
    src, si = head.index("Source"), head.index(samp)
    ex = next((head.index(c) for c in head if c == "Instructions Executed"), None)
    body = [r for r in rows[head_i + 1:] if len(r) == len(head)]

    def num(x: str) -> float:
        try:
            return float(x.replace(",", ""))
        except ValueError:
            return 0.0

    busiest = max((num(r[ex]) for r in body), default=0.0) if ex is not None else 0.0
    phases: dict[str, float] = defaultdict(float)
    for r in body:
        phases[phase(r[src], num(r[ex]) if ex is not None else busiest, busiest)] += num(r[si])
    print("    by phase:")
    for name, v in sorted(phases.items(), key=lambda kv: -kv[1]):
        print(f"      {name:<32} {v / total:6.1%}")
    for c in [c for c in cols if "stall" in c.lower() and "Sampling" not in c][:40]:
        tot = sum(v[c] for v in by_op.values())
        if tot:
            top = sorted(by_op.items(), key=lambda kv: -kv[1][c])[:3]
            print(f"    {c[:60]:<60} {tot:10.0f}  " + ", ".join(
                f"{op} {v[c] / tot:.0%}" for op, v in top))


def main() -> int:
    if sys.argv[1:2] == ["--summarize"]:
        path = Path(sys.argv[2])
        text = (lzma.open(path, "rt") if path.suffix == ".xz" else path.open()).read()
        print(path.name)
        report(*summarize(text), text)
        return 0
    args = sys.argv[1:]
    with_fa3 = "--fa3" in args
    args = [a for a in args if a != "--fa3"]
    vf, shape = Path(args[0]), args[1]
    picks = [int(a) for a in args[2:]]
    problem = Problem.parse(shape)
    out = Path(os.environ.get("OUT", ".device/out"))
    ncu = find_ncu()
    allv = variants(vf)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    for i in picks or range(len(allv)):
        cfg, lab = allv[i]
        r = build.build_config(cfg, pclass=problem.problem_class, defines=lab or None)
        rep = out / f"sass_{vf.stem}_{i}"
        subjects = [Subject("kernel", r.so_path)] + ([Subject("fa3", "fa3")] if with_fa3 else [])
        driver = ["tuner.profile_driver", r.so_path, shape] + (["--vs", "fa3"] if with_fa3 else [])
        p = subprocess.run([str(ncu), "--set", "full", "--import-source", "no",
                            "--profile-from-start", "off", "--launch-count", str(len(subjects)),
                            "--kernel-name-base", "demangled",
                            "--kernel-name", kernel_regex(subjects), "--clock-control", "none",
                            "--force-overwrite", "-o", str(rep), sys.executable, "-m", *driver],
                           capture_output=True, text=True, env=env, timeout=300)
        if p.returncode != 0:
            print(f"[{i}] ncu failed: {(p.stdout + p.stderr)[-600:]}")
            continue
        for k, s in enumerate(subjects):  # the import's launch filters pick one result each
            q = subprocess.run([str(ncu), "--import", f"{rep}.ncu-rep", "--csv", "--page",
                                "source", "--print-source", "sass", "--launch-skip", str(k),
                                "--launch-count", "1"],
                               capture_output=True, text=True, timeout=300)
            tag = "" if k == 0 else f"_{s.label}"
            (out / f"sass_{vf.stem}_{i}{tag}.csv").write_text(q.stdout)
            if "Source" not in q.stdout:
                print(f"[{i}] {s.label}: no source page ({(q.stdout + q.stderr)[-300:]})")
                continue
            by_op, cols = summarize(q.stdout)
            who = f"{cfg.config_id()} {lab or ''}" if k == 0 else "FlashAttention-3"
            print(f"[{i}] {who}: {len(cols)} columns")
            report(by_op, cols, q.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
