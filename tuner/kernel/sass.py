"""What a build says about its kernel: the ptxas resource report (registers, spills, stack,
shared memory per entry) and the SASS check (HGMMA present, no local-memory LDL/STL) read with
cuobjdump."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from tuner.kernel.toolchain import find_tool

_ENTRY_RE = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for '(\w+)'")
_PROPS_RE = re.compile(r"ptxas info\s*: Function properties for (\S+)")
_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED_RE = re.compile(r"ptxas info\s*: Used (\d+) registers(.*)")
_WARN_RE = re.compile(r"ptxas (?:warning|error)\s*:.*")
# ptxas's notice that it gave up on asynchronous wgmma (C7510-C7520): every wgmma then waits
# for the previous one, which costs 35-60% (measured 2026-11-29, early_next_qk, docs/PERF.md).
_SERIAL_RE = re.compile(
    r"ptxas (?:info|warning)\s*: \((C75\d\d)\) Potential Performance Loss: "
    r"wgmma\.mma_async instructions are serialized due to (.*?)"
    r"(?: in the function '[^']*'|\s*\.?\s*$)"
)


def parse_ptxas(log: str) -> dict[str, Any]:
    """Per-entry resources from ``-Xptxas -v`` output (CUDA 12 and 13 formats).

    Returns {"entries": {name: {...}}, "main": name | None, "warnings": [...],
    "wgmma_serialized": ["C7514: <ptxas's reason>", ...]}; "main" is the entry using the most
    registers (then shared memory): the attention kernel in our .so files.
    """
    entries: dict[str, dict[str, Any]] = {}
    current: str | None = None
    props_for: str | None = None
    warnings: list[str] = []
    serialized: list[str] = []
    for line in log.splitlines():
        if m := _SERIAL_RE.search(line):
            why = f"{m.group(1)}: {m.group(2).strip()}"
            if why not in serialized:
                serialized.append(why)
            continue
        if m := _ENTRY_RE.search(line):
            current = m.group(1)
            entries[current] = {
                "arch": m.group(2),
                "registers": 0,
                "spill_stores": 0,
                "spill_loads": 0,
                "stack_frame": 0,
                "smem": 0,
                "cmem": {},
                "barriers": 0,
            }
            props_for = None
            continue
        if m := _PROPS_RE.search(line):
            props_for = m.group(1)
            continue
        if (m := _FRAME_RE.search(line)) and props_for is not None and props_for in entries:
            e = entries[props_for]
            e["stack_frame"], e["spill_stores"], e["spill_loads"] = map(int, m.groups())
            continue
        if (m := _USED_RE.search(line)) and current is not None:
            e = entries[current]
            e["registers"] = int(m.group(1))
            rest = m.group(2)
            if s := re.search(r"(\d+) bytes smem", rest):
                e["smem"] = int(s.group(1))
            if b := re.search(r"used (\d+) barriers", rest):
                e["barriers"] = int(b.group(1))
            for c in re.finditer(r"(\d+) bytes cmem\[(\d+)\]", rest):
                e["cmem"][c.group(2)] = int(c.group(1))
            continue
        if m := _WARN_RE.search(line):
            warnings.append(m.group(0).strip())
    main = None
    if entries:
        main = max(entries, key=lambda n: (entries[n]["registers"], entries[n]["smem"]))
    return {"entries": entries, "main": main, "warnings": warnings,
            "wgmma_serialized": serialized}


_SASS_FUNC_RE = re.compile(r"^\s*Function : (\S+)")
_SASS_INSN_RE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)")


def parse_sass(text: str) -> dict[str, Any]:
    """Opcode counts per function from ``cuobjdump --dump-sass`` (HGMMA, LDL, STL, total)."""
    funcs: dict[str, dict[str, int]] = {}
    cur: dict[str, int] | None = None
    for line in text.splitlines():
        if m := _SASS_FUNC_RE.match(line):
            cur = funcs.setdefault(m.group(1), {"instructions": 0, "hgmma": 0, "ldl": 0, "stl": 0})
            continue
        if cur is None:
            continue
        if m := _SASS_INSN_RE.search(line):
            op = m.group(1)
            cur["instructions"] += 1
            if op == "HGMMA":
                cur["hgmma"] += 1
            elif op == "LDL":
                cur["ldl"] += 1
            elif op == "STL":
                cur["stl"] += 1
    total = {k: sum(f[k] for f in funcs.values()) for k in ("instructions", "hgmma", "ldl", "stl")}
    return {
        "functions": funcs,
        **total,
        "has_hgmma": total["hgmma"] > 0,
        "has_local_mem": (total["ldl"] + total["stl"]) > 0,
    }


def sass_report(so_path: Path, nvcc: Path | None = None) -> tuple[dict[str, Any] | None, str]:
    """(summary, "") or (None, why it could not be checked)."""
    cuobjdump = find_tool("cuobjdump", nvcc)
    if cuobjdump is None:
        return None, "cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"
    env = dict(os.environ)
    nvdisasm = find_tool("nvdisasm", nvcc)
    if nvdisasm is not None:
        # cuobjdump runs nvdisasm; the wheels may put it in a folder not on PATH.
        env["PATH"] = f"{nvdisasm.parent}{os.pathsep}{env.get('PATH', '')}"
        env["NVDISASM_PATH"] = str(nvdisasm.parent)
    try:
        out = subprocess.run(
            [str(cuobjdump), "--dump-sass", str(so_path)],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"cuobjdump failed: {e}"
    if out.returncode != 0:
        msg = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[0]
        return None, f"cuobjdump failed: {msg}"
    return parse_sass(out.stdout), ""
