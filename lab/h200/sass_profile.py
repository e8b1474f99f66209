"""Where a kernel's warps wait, per SASS instruction: ncu's source page, summed by opcode.

    python3 lab/h200/sass_profile.py VARIANTS_FILE SHAPE [INDEX...] [--fa3]   (on the H200)
    python3 lab/h200/sass_profile.py --summarize PAGE.csv[.xz]          (anywhere, a kept page)

Builds (or takes from the cache) the variants at INDEX (0-based lines of the file, default all),
runs each once under ``ncu --set full`` through tuner.analysis.profile_driver, and reads the
report's source page as SASS (``--page source --print-source sass --csv``). Writes the page of each
to $OUT/sass_<file>_<i>.csv and prints, per variant, the warp-stall samples summed by opcode, by
phase of the consumer's step (MUFU, the row max, the waits, ...) and by stall reason. The
measurement itself is ncu's; this only adds the sums (docs/PERF.md step 42). --fa3 profiles
FlashAttention-3 on the same problem in the same ncu run as each variant
(tuner.analysis.profile_driver's --vs fa3) and writes its page beside it as sass_<file>_<i>_fa3.csv.
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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner.analysis.profile import Subject, find_ncu, kernel_regex  # noqa: E402
from tuner.errors import FaTuneError  # noqa: E402
from tuner.kernel import build  # noqa: E402
from tuner.kernel.config import KernelConfig  # noqa: E402
from tuner.problem import Problem  # noqa: E402


def variants(path: Path) -> list[tuple[KernelConfig, dict[str, int]]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip().startswith("{"):
            knobs = json.loads(line)
            lab = {str(k): int(v) for k, v in knobs.pop("_lab", {}).items()}
            out.append((KernelConfig(**knobs), lab))
    return out


_PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def instruction(src: str) -> str:
    """A SASS line without its guard predicate ("@!P0 BRA 0x..." -> "BRA 0x...")."""
    return _PREDICATE.sub("", src.strip())


def opcode(src: str) -> str:
    s = instruction(src)
    return s.split(" ")[0].split(".")[0] if s else "?"


def phase(src: str, executed: float, busiest: float) -> str:
    """The step phase an instruction belongs to. Instructions run far less often than the
    busiest ones (the producer's, the prologue's, the epilogue's) form one bucket."""
    s = instruction(src)
    op = s.split(" ")[0]
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
    if op == "BRA" and src.strip().startswith("@"):
        return "mbarrier wait (K/V full)"
    return "uniform ops" if op.startswith("U") else "other"


def _num(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


@dataclass
class Page:
    """One kernel's source page, summed: per opcode and per phase, every numeric column."""

    by_op: dict[str, dict[str, float]]
    by_phase: dict[str, float]  # warp-stall samples (all) per phase
    columns: list[str]
    samples: str | None  # the "Warp Stall Sampling (All Samples)" column, if the page has it

    def share(self, name: str) -> float:
        total = sum(self.by_phase.values()) or 1.0
        return self.by_phase.get(name, 0.0) / total


def summarize(text: str) -> Page:
    """Sum ncu's ``--page source --print-source sass --csv`` output. ValueError when the text
    is no such page."""
    rows = list(csv.reader(io.StringIO(text)))
    head_i = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if head_i is None:
        raise ValueError("no 'Source' column: not ncu's source page (--page source --csv)")
    head = rows[head_i]
    body = [r for r in rows[head_i + 1:] if len(r) == len(head)]
    src = head.index("Source")
    samples = next((c for c in head if "Sampling (All" in c), None)
    ex = head.index("Instructions Executed") if "Instructions Executed" in head else None
    busiest = max((_num(r[ex]) or 0.0 for r in body), default=0.0) if ex is not None else 0.0
    by_op: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_phase: dict[str, float] = defaultdict(float)
    columns: list[str] = []
    for r in body:
        op = opcode(r[src])
        for j, name in enumerate(head):
            v = _num(r[j]) if j != src else None
            if v is None:
                continue
            if name not in columns:
                columns.append(name)
            by_op[op][name] += v
        if samples is not None:
            executed = (_num(r[ex]) or 0.0) if ex is not None else busiest
            by_phase[phase(r[src], executed, busiest)] += _num(r[head.index(samples)]) or 0.0
    return Page(by_op, dict(by_phase), columns, samples)


def report(page: Page) -> None:
    if page.samples is None:
        print("    no warp-stall sampling column in this page")
        return
    samp = page.samples
    total = sum(v[samp] for v in page.by_op.values()) or 1.0
    for op, v in sorted(page.by_op.items(), key=lambda kv: -kv[1][samp])[:14]:
        print(f"    {op:<12} {v[samp] / total:6.1%}")
    print("    by phase:")
    for name in sorted(page.by_phase, key=lambda n: -page.by_phase[n]):
        print(f"      {name:<32} {page.share(name):6.1%}")
    for c in [c for c in page.columns if "stall" in c.lower() and "Sampling" not in c][:40]:
        tot = sum(v[c] for v in page.by_op.values())
        if tot:
            top = sorted(page.by_op.items(), key=lambda kv: -kv[1][c])[:3]
            print(f"    {c[:60]:<60} {tot:10.0f}  " + ", ".join(
                f"{op} {v[c] / tot:.0%}" for op, v in top))


USAGE = ("usage: sass_profile.py VARIANTS_FILE SHAPE [INDEX...] [--fa3]  |  "
         "sass_profile.py --summarize PAGE.csv[.xz]")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--summarize"]:
        if len(argv) != 2:
            raise ValueError(USAGE)
        path = Path(argv[1])
        text = (lzma.open(path, "rt") if path.suffix == ".xz" else path.open()).read()
        page = summarize(text)
        print(path.name)
        report(page)
        return 0
    with_fa3 = "--fa3" in argv
    args = [a for a in argv if a != "--fa3"]
    if len(args) < 2 or not all(a.isdigit() for a in args[2:]):
        raise ValueError(USAGE)
    vf, shape = Path(args[0]), args[1]
    problem = Problem.parse(shape)
    allv = variants(vf)
    picks = [int(a) for a in args[2:]] or list(range(len(allv)))
    if not allv or any(i >= len(allv) for i in picks):
        raise ValueError(f"{vf} has {len(allv)} variants; INDEX counts them from 0")
    out = Path(os.environ.get("OUT", ".device/out"))
    ncu = find_ncu()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    for i in picks:
        cfg, lab = allv[i]
        r = build.build_config(cfg, pclass=problem.problem_class, defines=lab or None)
        rep = out / f"sass_{vf.stem}_{i}"
        subjects = [Subject("kernel", r.so_path)] + ([Subject("fa3", "fa3")] if with_fa3 else [])
        driver = ["tuner.analysis.profile_driver", r.so_path, shape]
        driver += ["--vs", "fa3"] if with_fa3 else []
        p = subprocess.run([str(ncu), "--set", "full", "--import-source", "no",
                            "--profile-from-start", "off", "--launch-count", str(len(subjects)),
                            "--kernel-name-base", "demangled",
                            "--kernel-name", kernel_regex(subjects), "--clock-control", "none",
                            "--force-overwrite", "-o", str(rep), sys.executable, "-m", *driver],
                           capture_output=True, text=True, env=env, timeout=300)
        if p.returncode != 0:
            print(f"[{i}] ncu failed: {(p.stdout + p.stderr)[-600:]}")
            continue
        for k, subject in enumerate(subjects):  # the import's launch filters pick one result
            q = subprocess.run([str(ncu), "--import", f"{rep}.ncu-rep", "--csv", "--page",
                                "source", "--print-source", "sass", "--launch-skip", str(k),
                                "--launch-count", "1"],
                               capture_output=True, text=True, timeout=300)
            tag = "" if k == 0 else f"_{subject.label}"
            (out / f"sass_{vf.stem}_{i}{tag}.csv").write_text(q.stdout)
            try:
                page = summarize(q.stdout)
            except ValueError:
                print(f"[{i}] {subject.label}: no source page ({(q.stdout + q.stderr)[-300:]})")
                continue
            who = f"{cfg.config_id()} {lab or ''}" if k == 0 else "FlashAttention-3"
            print(f"[{i}] {who}: {len(page.columns)} columns")
            report(page)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main(sys.argv[1:]))
    except (ValueError, OSError, FaTuneError, json.JSONDecodeError, TypeError) as e:
        # json.JSONDecodeError is a ValueError; TypeError: a variant line with an unknown knob.
        print(f"sass_profile: {e}", file=sys.stderr)
        raise SystemExit(2 if str(e) == USAGE else 1) from None
