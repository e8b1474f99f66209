#!/usr/bin/env python3
"""Build every preset (or the named ones) and keep each kernel's SASS, to show that a
refactor left the machine code as it was.

    python scripts/sass_snapshot.py --out DIR [--cache DIR] [--fixed | --shape PROBLEM] [PRESET...]
    python scripts/sass_snapshot.py --compare BEFORE_DIR AFTER_DIR

Each preset is built for its own problem class (head dim from its name, non-causal for the
``full-*`` presets) with the varlen kernel where the config can serve varlen, so both kernels of
an exported library are covered (``--fixed``: without it, as the search builds candidates); all
at once, one nvcc per usable CPU (``--shape``: every named preset for that problem's class, and
timed on it, e.g. a packed or paged batch; no PRESET: those of its head dim). DIR gets
``<preset>.sass.xz`` (cuobjdump --dump-sass) and ``index.json`` (per preset: its class, the
library's path, a problem of its class to time it on (scripts/ab_libs.py), and the sha256 and
instruction count of each kernel function's SASS).
--compare prints one line per preset: same, or which functions differ and by how many
instructions. Exit 1 when any differ, 2 for a usage error (one line).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fail(msg: str) -> None:
    sys.stderr.write(f"sass_snapshot: error: {msg}\n")
    raise SystemExit(2)


def functions(sass: str) -> dict[str, list[str]]:
    """SASS instruction lines per kernel function (cuobjdump's `Function : NAME` sections),
    keyed by order of appearance and the name's first 40 characters ("0 _ZN7fa_tune20atte..."):
    a refactor that renames a parameter type or the anonymous namespace a rendered template
    puts Config in (named after the source's hash) still pairs the same kernels."""
    out: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = out.setdefault(f"{len(out)} {m.group(1)[:40]}", [])
        elif cur is not None and re.match(r"\s*/\*[0-9a-f]{4,}\*/", line):
            cur.append(line.strip())
    return out


def masked(lines: list[str]) -> list[str]:
    """The instructions without their encodings and with constant-bank offsets masked: the same
    code reading its kernel parameters from other offsets (a reordered params struct) reads as
    equal here, and as different in the exact hash."""
    out = []
    for ln in lines:
        text = re.sub(r"/\* 0x[0-9a-f]+ \*/", "", ln)
        out.append(re.sub(r"c\[0x[0-9a-f]+\]\[0x[0-9a-f]+\]", "c[*][*]", text).strip())
    return out


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def sass_entry(sass: str) -> dict:
    """One library's index entry from its cuobjdump --dump-sass text: per kernel function, the
    exact and the masked digest and the instruction count."""
    fns = functions(sass)
    return {"functions": {f: digest(lines) for f, lines in fns.items()},
            "masked": {f: digest(masked(lines)) for f, lines in fns.items()},
            "instructions": {f: len(lines) for f, lines in fns.items()}}


# The problem each head dim's presets are timed on (scripts/ab_libs.py): Llama-3-8B's heads at
# D 128 and 64, half of them at D 256 (the same FLOPs per token as D 128's 32).
SHAPE_HEADS = {64: "1x32/8", 128: "1x32/8", 256: "1x16/8"}


def snapshot(out: Path, cache: Path | None, names: list[str], fixed: bool = False,
             shape: str | None = None) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tuner.errors import FaTuneError
    from tuner.kernel import build, toolchain
    from tuner.kernel import config as C
    from tuner.problem import Problem, ProblemClass

    unknown = sorted(set(names) - set(C.list_presets()))
    if unknown:
        fail(f"unknown preset {', '.join(unknown)}; available: {', '.join(C.list_presets())}")
    shape_class = None
    if shape is not None:
        from tuner.kernel.support import check_problems

        try:
            problem = Problem.parse(shape)
        except FaTuneError as e:
            fail(f"--shape: {e}")
        shape_class = problem.problem_class
        names = names or [n for n in C.list_presets()
                          if C.preset_head_dim(n) == shape_class.head_dim]
        other = [n for n in names if C.preset_head_dim(n) != shape_class.head_dim]
        if other:
            fail(f"--shape {shape} has head dim {shape_class.head_dim}; these presets are for "
                 f"another: {', '.join(other)} (name presets of its head dim)")
        for n in names:
            try:
                check_problems(C.load_preset(n), [problem])
            except FaTuneError as e:
                fail(f"preset {n} cannot run {shape}: {e}")
    out.mkdir(parents=True, exist_ok=True)
    tool = toolchain.find_tool("cuobjdump")
    if tool is None:
        fail("cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")

    def one(name: str) -> tuple[str, dict]:
        cfg = C.load_preset(name)
        d = C.preset_head_dim(name)
        causal = not name.startswith("full")
        try:
            C.check_varlen(cfg, d)
            varlen = not fixed
        except FaTuneError:
            varlen = False
        pclass = ProblemClass(d, causal, varlen)
        if shape_class is not None:
            pclass = shape_class
        res = build.build_config(cfg, cache_root=cache, pclass=pclass)
        sass = subprocess.run([str(tool), "--dump-sass", str(res.so_path)], check=True,
                              capture_output=True, text=True).stdout
        (out / f"{name}.sass.xz").write_bytes(lzma.compress(sass.encode()))
        suffix = ("" if d == 128 else f":d{d}") + ("" if causal else ":full")
        return name, {"class": str(pclass), "so_path": str(res.so_path),
                      "shape": shape or f"{SHAPE_HEADS[d]}x8192{suffix}", **sass_entry(sass)}

    with ThreadPoolExecutor(max_workers=toolchain.usable_cpus()) as ex:
        index = dict(ex.map(one, names or C.list_presets()))
    for name, e in index.items():
        print(f"{name:16s} {e['class']:32s} " + " ".join(map(str, e["instructions"].values())))
    (out / "index.json").write_text(json.dumps(index, indent=1))


def read_index(folder: Path) -> dict:
    try:
        return json.loads((folder / "index.json").read_text())
    except (OSError, ValueError) as e:
        fail(f"{folder} is not a snapshot (its index.json: {e}); make one with --out")
        raise  # unreachable: fail exits


def compare(a: Path, b: Path) -> int:
    return compare_indexes(read_index(a), read_index(b))


def compare_indexes(ia: dict, ib: dict) -> int:
    """Print one line per preset (or per differing function); 1 when any differ."""
    differ = 0
    for name in sorted(set(ia) | set(ib)):
        if name not in ia or name not in ib:
            print(f"{name:16s} only in {'before' if name in ia else 'after'}")
            differ += 1
            continue
        fa, fb = ia[name]["functions"], ib[name]["functions"]
        if fa == fb:
            print(f"{name:16s} same SASS ({len(fa)} functions)")
            continue
        differ += 1
        for f in sorted(set(fa) | set(fb)):
            if fa.get(f) == fb.get(f):
                continue
            na = ia[name]["instructions"].get(f, 0)
            nb = ib[name]["instructions"].get(f, 0)
            same_code = ia[name].get("masked", {}).get(f) == ib[name].get("masked", {}).get(f)
            print(f"{name:16s} differs: {f[:70]} {na} -> {nb} instructions"
                  + ("; the same but for constant-bank offsets" if same_code else ""))
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("presets", nargs="*")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--cache", type=Path, default=None, help="Build cache root.")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--fixed", action="store_true",
                    help="Build the fixed-length kernel only (a search candidate's library).")
    ap.add_argument("--shape", help="Build for this problem's class and time on it (PRESETs "
                    "of its head dim; default: all of them).")
    a = ap.parse_args(argv)
    if a.compare:
        return compare(*a.compare)
    if a.out is None:
        fail("--out DIR or --compare BEFORE AFTER")
    snapshot(a.out, a.cache, a.presets, a.fixed, a.shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
