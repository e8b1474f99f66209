"""Compile kernel variants with nvcc into a content-addressed cache.

One config -> ``render`` (string.Template over templates/fa_fwd_sm90.cu) -> one ``.so`` under
``studies/cache/<key>/`` where key = sha256 of everything that decides the binary: the rendered
source, every file under cuda_src/ (the source may include any of them), the logical flags,
the nvcc version and the CUTLASS version. An entry is built in a temp folder and renamed into
place, ``artifact.json`` included, so a killed build never leaves half an entry and a present
entry is always a cache hit. Failed builds keep their log under ``studies/cache/failed/``.

Several builders share one cache (the compile pools of several search workers, ``fa-tune
search --gpus``; separate processes): a build holds an exclusive lock on its key (``flock`` on
``studies/.cache.locks/<key>.lock``) from its cache lookup to the published entry, so a config
is compiled once; one that waited for the lock finds the entry and returns it as a cache hit,
or, when the build it waited for failed, that failure (a failure is not cached otherwise).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import Any

from tuner import _paths
from tuner.errors import BuildError, ConfigError, FaTuneError
from tuner.kernel.config import KernelConfig, check_varlen, validate
from tuner.problem import DEFAULT_CLASS, ProblemClass

ARCH_FLAG = "-gencode=arch=compute_90a,code=sm_90a"  # -arch=sm_90a has failed with nvcc 13.0
# Placeholders stand for include dirs so the cache key depends on their content (hashed
# separately), not on where the checkout happens to live.
CUDA_SRC_INC = "-I<cuda_src>"
CUTLASS_INC = "-I<cutlass>"
COMMON_FLAGS: tuple[str, ...] = (
    "-std=c++17",
    "-O3",
    ARCH_FLAG,
    "--expt-relaxed-constexpr",
    "-Xptxas",
    "-v",
    "-shared",
    "-Xcompiler",
    "-fPIC",
    "-lineinfo",
    "-DNDEBUG",
    CUDA_SRC_INC,
    CUTLASS_INC,
)
# Hidden visibility: a kernel library exports only its C ABI, so many of them can share a
# process without interposing each other's template instantiations.
KERNEL_FLAGS: tuple[str, ...] = (
    *COMMON_FLAGS[:4], "--use_fast_math", "-Xcompiler", "-fvisibility=hidden", *COMMON_FLAGS[4:]
)
# The reference must be an exact FP32 computation: no fast-math approximations of expf.
ORACLE_FLAGS: tuple[str, ...] = COMMON_FLAGS

NVCC_TIMEOUT_S = float(os.environ.get("FA_TUNE_NVCC_TIMEOUT", "1800"))


# ---- tool discovery ------------------------------------------------------------------------
def _wheel_bin_dirs() -> list[Path]:
    """bin/ folders of NVIDIA's pip wheels (nvidia/cu13/bin, nvidia/cuda_nvcc/bin, ...)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs: list[Path] = []
    for loc in spec.submodule_search_locations:
        dirs.extend(sorted(p for p in Path(loc).glob("*/bin") if p.is_dir()))
    return dirs


def _candidate_bin_dirs() -> list[Path]:
    dirs: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(Path(os.environ[var]) / "bin")
    dirs.extend(Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p)
    dirs.extend(_wheel_bin_dirs())
    dirs.append(Path("/usr/local/cuda/bin"))
    return dirs


def _is_exe(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers and taskset narrow;
    os.cpu_count() reports the whole host)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def find_nvcc() -> Path:
    """nvcc from CUDA_HOME/bin, then PATH, then the nvidia-cuda-nvcc wheel; else BuildError."""
    for d in _candidate_bin_dirs():
        if _is_exe(d / "nvcc"):
            return d / "nvcc"
    raise BuildError(
        "nvcc not found (looked in CUDA_HOME/bin, PATH and the nvidia-cuda-nvcc wheel); install "
        "the CUDA toolkit >= 12.3 and set CUDA_HOME, or `pip install nvidia-cuda-nvcc`"
    )


def _real_cuda_bin(nvcc: Path) -> Path:
    """The toolkit's bin/ behind nvcc, which may be a symlink or a wrapper script."""
    try:
        # --dryrun prints the driver's own folder without compiling anything.
        out = subprocess.run(
            [str(nvcc), "--dryrun", "-c", "fa_tune_probe.cu"],
            capture_output=True, text=True, timeout=60,
        )
        m = re.search(r"#\$ _HERE_=(\S+)", out.stderr + out.stdout)
        if m:
            return Path(m.group(1))
    except (OSError, subprocess.SubprocessError):
        pass
    return nvcc.resolve().parent


def find_tool(name: str, nvcc: Path | None = None) -> Path | None:
    """A CUDA binary (cuobjdump, nvdisasm, ...): next to nvcc first, then the usual places."""
    dirs: list[Path] = []
    if nvcc is not None:
        dirs += [nvcc.parent, _real_cuda_bin(nvcc)]
    dirs += _candidate_bin_dirs()
    for d in dirs:
        if _is_exe(d / name):
            return d / name
    return None


@lru_cache(maxsize=8)
def _nvcc_version_of(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"cannot run {nvcc} --version: {e}") from None
    m = re.search(r"release [\d.]+, V([\d.]+)", out.stdout)
    if not m:
        raise BuildError(f"cannot read the version from `{nvcc} --version`")
    return m.group(1)


def nvcc_version(nvcc: Path | None = None) -> str:
    """Full nvcc version, e.g. '13.0.88'."""
    return _nvcc_version_of(str(nvcc or find_nvcc()))


def cutlass_include() -> Path:
    """CUTLASS/CuTe headers shipped by the nvidia-cutlass wheel (found without importing it)."""
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            inc = Path(loc) / "source" / "include"
            if (inc / "cute" / "tensor.hpp").is_file():
                return inc
    raise BuildError("CUTLASS headers not found; `pip install nvidia-cutlass`")


def cutlass_version() -> str:
    try:
        return importlib.metadata.version("nvidia-cutlass")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# ---- hashing ------------------------------------------------------------------------------
def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_hash(root: Path) -> str:
    """sha256 over (relative path, content) of every file under root, sorted by path."""
    h = hashlib.sha256()
    if root.is_dir():
        for p in sorted(q for q in root.rglob("*") if q.is_file() and "__pycache__" not in q.parts):
            h.update(p.relative_to(root).as_posix().encode() + b"\0")
            h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


# ---- rendering -----------------------------------------------------------------------------
def c_string_literal(text: str) -> str:
    """A C string literal (quotes included) holding text exactly."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "?":
            out.append("\\?")  # no trigraphs
        elif 0x20 <= ord(ch) < 0x7F:
            out.append(ch)
        else:
            for b in ch.encode():
                out.append(f"\\{b:03o}")
    out.append('"')
    return "".join(out)


def template_text(template: Path | None = None) -> str:
    path = template or _paths.kernel_template()
    try:
        return path.read_text()
    except OSError as e:
        raise BuildError(f"cannot read kernel template {path}: {e.strerror or e}") from None


# 64xN wgmma atoms CuTe defines without CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED (among block_n's
# values); the others compile only with the extended atoms, which cost ~30 s of nvcc time.
STANDARD_WGMMA_N = frozenset({64, 96, 128, 192})


def render(cfg: KernelConfig, template: Path | None = None, *,
           pclass: ProblemClass = DEFAULT_CLASS) -> str:
    """The compilation unit for cfg: the template with every ${knob} and ${config_json} set,
    and ${head_dim} / ${causal} / ${varlen}, the problem class it serves (compiled in, not
    knobs)."""
    text = template_text(template)
    values = {
        **cfg.cpp_constants(),
        "head_dim": str(pclass.head_dim),
        "causal": "true" if pclass.causal else "false",
        "varlen": "1" if pclass.varlen else "0",
        "config_json": c_string_literal(cfg.canonical_json()),
        # Not a knob: does block_n need CuTe's extended wgmma atoms (fa_tune/config.cuh)?
        # sum_in_pv's 64 x 72 PV atom is an extended one too.
        "extended_mma": "0" if cfg.block_n in STANDARD_WGMMA_N and not cfg.sum_in_pv else "1",
    }
    try:
        return Template(text).substitute(values)
    except KeyError as e:
        raise BuildError(
            f"template {template or _paths.kernel_template()} uses unknown placeholder "
            f"${{{e.args[0]}}} (write $$ for a literal $)"
        ) from None
    except ValueError as e:
        raise BuildError(f"template {template or _paths.kernel_template()}: {e}") from None


# ---- ptxas and SASS reports -----------------------------------------------------------------
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


# ---- the cache -----------------------------------------------------------------------------
@dataclass
class BuildResult:
    """One cached artifact; ``artifact.json`` is this, as JSON."""

    key: str
    name: str  # "kernel" or "oracle" or another build_source name
    cache_dir: str
    so_path: str
    config: dict[str, Any] | None
    config_id: str | None
    cache_hit: bool
    compile_seconds: float
    ptxas: dict[str, Any]
    sass: dict[str, Any] | None
    sass_checked: bool
    sass_note: str
    so_sha256: str
    source_sha256: str
    template_sha256: str | None
    nvcc_version: str
    cutlass_version: str
    flags: list[str]
    created_utc: str = ""
    smem_dynamic: int | None = None  # fa_tune_smem_bytes() of the .so, when it exports one
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def main_entry(self) -> dict[str, Any]:
        """ptxas resources of the main kernel entry ({} if ptxas reported none)."""
        m = self.ptxas.get("main")
        return self.ptxas.get("entries", {}).get(m, {}) if m else {}

    @property
    def any_spills(self) -> bool:
        return any(
            e["spill_stores"] or e["spill_loads"] for e in self.ptxas.get("entries", {}).values()
        )

    @property
    def local_memory(self) -> str | None:
        """Why this artifact touches local memory (stack or LDL/STL), or None if it does not.

        Measured 2026-11-29 on an H200: such kernels ran ~30x slower (docs/PERF.md).
        """
        e = self.main_entry
        stack = int(e.get("stack_frame") or 0)
        ldst = int((self.sass or {}).get("ldl", 0)) + int((self.sass or {}).get("stl", 0))
        if stack or ldst or self.any_spills:
            return f"stack frame {stack} B, {ldst} LDL/STL instructions"
        return None

    @property
    def wgmma_serialized(self) -> str | None:
        """ptxas's reason for serializing the wgmma pipeline, or None if it kept it async."""
        why = self.ptxas.get("wgmma_serialized") or []
        return "; ".join(why) if why else None

    @property
    def unfit(self) -> str | None:
        """Why timing this artifact would measure a compiler fallback instead of the design
        (local memory, or wgmma serialized by ptxas), or None."""
        if why := self.local_memory:
            return f"local memory ({why})"
        if why := self.wgmma_serialized:
            return f"ptxas serialized its wgmma ({why})"
        return None

    def require_timeable(self) -> None:
        """Refuse an artifact that would time a compiler fallback instead of the design."""
        if why := self.unfit:
            label = f"config {self.config_id}" if self.config_id else self.name
            raise BuildError(
                f"{label} compiles to {why}; it would run far slower than the design, so it "
                "is not timed: lower block_n or raise consumer_regs"
            )

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("cache_hit")  # a property of one lookup, not of the artifact
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], cache_hit: bool) -> BuildResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names}, cache_hit=cache_hit)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _resolve_flags(flags: Sequence[str], extra_includes: Sequence[Path] = ()) -> list[str]:
    out: list[str] = []
    for f in flags:
        if f == CUDA_SRC_INC:
            out.append(f"-I{_paths.cuda_src_dir()}")
        elif f == CUTLASS_INC:
            out.append(f"-I{cutlass_include()}")
        else:
            out.append(f)
    out += [f"-I{p}" for p in extra_includes]
    return out


def cache_key(source: str, flags: Sequence[str], nvcc_ver: str) -> str:
    h = hashlib.sha256()
    for part in (
        "fa-tune-cache-v1",
        source,
        tree_hash(_paths.cuda_src_dir()),
        "\0".join(flags),
        nvcc_ver,
        cutlass_version(),
    ):
        h.update(part.encode() + b"\0\0")
    return h.hexdigest()


def _exported_smem_bytes(so: Path) -> int | None:
    """The kernel's own dynamic shared memory figure (fa_tune_smem_bytes), read without a GPU
    through the one binding of the C ABI (the function returns a compile-time constant; loading
    the .so runs no CUDA call)."""
    from tuner.kernel.runtime import KernelModule

    try:
        return KernelModule(so).smem_bytes()
    except FaTuneError:
        return None


def _first_error_line(log: str) -> str:
    for line in log.splitlines():
        if re.search(r"\berror\b", line, re.IGNORECASE):
            return line.strip()[:300]
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


_DEFINE_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFINE_VALUE_RE = re.compile(r"[A-Za-z0-9_.+-]*")

Defines = Mapping[str, "str | int"]


def define_flags(defines: Defines | None) -> list[str]:
    """``-DNAME=VALUE`` flags, sorted by name (so the cache key does not depend on dict order).
    None or {} gives no flags: the build, and its cache key, are exactly those without defines.
    For test builds (e.g. FA_TUNE_PLANT_BUG, cuda_src/fa_tune/config.cuh); never a knob."""
    out: list[str] = []
    for name in sorted(defines or {}):
        value = (defines or {})[name]
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise BuildError(f"define {name}: value must be an int or a string, got {value!r}")
        text = str(value)
        if not _DEFINE_NAME_RE.fullmatch(name) or not _DEFINE_VALUE_RE.fullmatch(text):
            raise BuildError(f"bad define {name}={text!r}: want an identifier = [A-Za-z0-9_.+-]*")
        out.append(f"-D{name}={text}")
    return out


def build_source(
    source: str | Path,
    flags: Sequence[str] = KERNEL_FLAGS,
    *,
    name: str = "kernel",
    config: KernelConfig | None = None,
    template_sha256: str | None = None,
    cache_root: Path | None = None,
    defines: Defines | None = None,
) -> BuildResult:
    """Compile a CUDA source (a path, or the text itself) into ``<name>.so``, cached.

    A path's folder is added to the include path (so relative #includes work) and to the key.
    ``defines`` become -D flags after ``flags`` (part of the key; None = none).
    """
    flags = [*flags, *define_flags(defines)]
    extra_inc: list[Path] = []
    if isinstance(source, Path):
        try:
            text = source.read_text()
        except OSError as e:
            raise BuildError(f"cannot read {source}: {e.strerror or e}") from None
        extra_inc.append(source.resolve().parent)
    else:
        text = source
    nvcc = find_nvcc()
    ver = nvcc_version(nvcc)
    logical_flags = list(flags) + [f"-I<{p.name}>" for p in extra_inc]
    key = cache_key(text + "".join(tree_hash(p) for p in extra_inc), logical_flags, ver)
    root = Path(cache_root or _paths.cache_root())
    entry = root / key
    hit = _cached(entry, name, nvcc)
    if hit is not None:
        return hit
    with _key_lock(root, key) as waited_since:
        # Another builder may have published the entry while we waited: a hit, not a compile.
        hit = _cached(entry, name, nvcc)
        if hit is not None:
            return hit
        if waited_since is not None:
            _raise_failure_since(root, key, waited_since)
        return _compile(text, flags, extra_inc, nvcc, ver, logical_flags, key, root, name,
                        config, template_sha256)


def _cached(entry: Path, name: str, nvcc: Path) -> BuildResult | None:
    """The cache entry's result (a hit), or None when there is no readable entry."""
    art = entry / "artifact.json"
    if not art.is_file():
        return None
    try:
        result = BuildResult.from_json(json.loads(art.read_text()), cache_hit=True)
    except (ValueError, TypeError):
        shutil.rmtree(entry, ignore_errors=True)  # unreadable entry (older format): rebuild
        return None
    result.cache_dir, result.so_path = str(entry), str(entry / f"{name}.so")
    if not result.sass_checked:
        # cuobjdump may have been installed since; checking needs no recompile.
        sass, note = sass_report(Path(result.so_path), nvcc)
        if sass is not None:
            result.sass, result.sass_checked, result.sass_note = sass, True, ""
            _atomic_write(art, json.dumps(result.to_json(), indent=2))
    return result


def _lock_dir(root: Path) -> Path:
    # Beside the cache, not in it: the cache folder holds entries (and failed/) only.
    return root.parent / f".{root.name}.locks"


@contextlib.contextmanager
def _key_lock(root: Path, key: str) -> Iterator[float | None]:
    """Hold the cache key's lock (threads and processes alike: each open() is its own lock
    owner to flock). Yields None when it was free, else the time.time() we started waiting."""
    d = _lock_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        waited: float | None = None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = time.time()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield waited
    finally:
        os.close(fd)  # releases the lock


def _record_failure(root: Path, key: str, message: str, log_path: str) -> None:
    """What a builder waiting on this key reads instead of compiling the same failure again."""
    with contextlib.suppress(OSError):
        _atomic_write(_lock_dir(root) / f"{key}.failed",
                      json.dumps({"message": message, "log_path": log_path}))


def _raise_failure_since(root: Path, key: str, since: float) -> None:
    """Raise the failure of the build we waited for (recorded after ``since``), if it failed."""
    marker = _lock_dir(root) / f"{key}.failed"
    try:
        if marker.stat().st_mtime < since:
            return
        rec = json.loads(marker.read_text())
    except (OSError, ValueError):
        return
    raise BuildError(str(rec.get("message")), log_path=rec.get("log_path"))


def _compile(text: str, flags: Sequence[str], extra_inc: Sequence[Path], nvcc: Path, ver: str,
             logical_flags: list[str], key: str, root: Path, name: str,
             config: KernelConfig | None, template_sha256: str | None) -> BuildResult:
    """nvcc into a temp folder, then the entry published by one rename (key lock held)."""
    entry = root / key
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=root))
    try:
        src = tmp / f"{name}.cu"
        src.write_text(text)
        so = tmp / f"{name}.so"
        cmd = [str(nvcc), *_resolve_flags(flags, extra_inc), "-o", str(so), str(src)]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, cwd=tmp, timeout=NVCC_TIMEOUT_S
            )
            log = f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
            ok = proc.returncode == 0 and so.is_file()
        except subprocess.TimeoutExpired as e:
            log = f"$ {' '.join(cmd)}\n{e.stdout or ''}{e.stderr or ''}\nerror: nvcc timed out"
            ok = False
        seconds = time.monotonic() - t0
        (tmp / "build.log").write_text(log)
        if not ok:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            failed = root / "failed" / f"{stamp}-{key[:16]}"
            failed.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(failed, ignore_errors=True)
            os.replace(tmp, failed)
            what = f"config {config.config_id()}" if config else name
            # Name the source by its file name; the temp folder it lived in is gone.
            first = _first_error_line(log.split("\n", 1)[-1]).replace(f"{tmp}/", "")
            message = f"nvcc failed for {what}: {first} (log: {failed / 'build.log'})"
            _record_failure(root, key, message, str(failed / "build.log"))
            raise BuildError(message, log_path=str(failed / "build.log"))
        sass, note = sass_report(so, nvcc)
        smem_dyn = _exported_smem_bytes(so)
        result = BuildResult(
            key=key,
            name=name,
            cache_dir=str(entry),
            so_path=str(entry / so.name),
            config=config.to_dict() if config else None,
            config_id=config.config_id() if config else None,
            cache_hit=False,
            compile_seconds=round(seconds, 3),
            ptxas=parse_ptxas(log),
            sass=sass,
            sass_checked=sass is not None,
            sass_note=note,
            so_sha256=sha256_file(so),
            source_sha256=sha256_bytes(text.encode()),
            template_sha256=template_sha256,
            nvcc_version=ver,
            cutlass_version=cutlass_version(),
            flags=logical_flags,
            created_utc=_utc_now(),
            smem_dynamic=smem_dyn,
        )
        (tmp / "artifact.json").write_text(json.dumps(result.to_json(), indent=2))
        try:
            os.rename(tmp, entry)  # atomic publish of the whole entry
        except OSError:
            # Another process published the same key first: theirs is equally good.
            if not (entry / "artifact.json").is_file():
                raise
            return BuildResult.from_json(
                {**json.loads((entry / "artifact.json").read_text()), "cache_dir": str(entry),
                 "so_path": str(entry / so.name)},
                cache_hit=True,
            )
        return result
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_config(
    cfg: KernelConfig, template: Path | None = None, cache_root: Path | None = None,
    defines: Defines | None = None, *, pclass: ProblemClass = DEFAULT_CLASS, check: bool = True,
) -> BuildResult:
    """Validate, render and compile one config for one problem class (cached). ``defines``:
    extra -D flags for test builds (build_source); None builds exactly the config's artifact.
    ``pclass``: the head dim and mask compiled in (tuner.problem.ProblemClass). ``check=False``
    skips validate (the lab's --unchecked: configs it refuses until they ran on a GPU; the
    kernel's own static_asserts still hold)."""
    if check:
        validate(cfg, pclass.head_dim, pclass.causal)
    if pclass.varlen:  # its varlen kernel must work too (multicast cannot; spills are refused)
        check_varlen(cfg, pclass.head_dim)
    tpl = template or _paths.kernel_template()
    return build_source(
        render(cfg, tpl, pclass=pclass),
        KERNEL_FLAGS,
        name="kernel",
        config=cfg,
        template_sha256=sha256_bytes(template_text(tpl).encode()),
        cache_root=cache_root,
        defines=defines,
    )


def build_oracle(cache_root: Path | None = None) -> BuildResult:
    """cuda_src/oracle.cu -> oracle.so (same cache; exact FP32, no fast math)."""
    path = _paths.cuda_src_dir() / "oracle.cu"
    try:
        text = path.read_text()
    except OSError as e:
        raise BuildError(f"cannot read {path}: {e.strerror or e}") from None
    # Text, not path: cuda_src/ is already on the include path and in the key.
    return build_source(text, ORACLE_FLAGS, name="oracle", cache_root=cache_root)


# ---- parallel builds ------------------------------------------------------------------------
@dataclass
class BuildOutcome:
    config: KernelConfig
    result: BuildResult | None
    error: FaTuneError | None

    @property
    def ok(self) -> bool:
        return self.result is not None


def _worker(
    cfg_dict: dict[str, Any], template: str | None, cache_root: str | None,
    defines: dict[str, str | int] | None = None, pclass: ProblemClass = DEFAULT_CLASS,
    check: bool = True,
) -> tuple[str, Any, str | None]:
    # Exceptions are flattened to (kind, message, log) because FaTuneError subclasses with
    # extra constructor arguments do not survive pickling between processes intact.
    cfg = KernelConfig.from_dict(cfg_dict)
    try:
        r = build_config(cfg, Path(template) if template else None,
                         Path(cache_root) if cache_root else None, defines, pclass=pclass,
                         check=check)
        return ("ok", r, None)
    except BuildError as e:
        return ("BuildError", str(e), e.log_path)
    except ConfigError as e:
        return ("ConfigError", str(e), None)
    except FaTuneError as e:
        return ("FaTuneError", str(e), None)


def build_many(
    configs: Iterable[KernelConfig],
    jobs: int | None = None,
    template: Path | None = None,
    cache_root: Path | None = None,
    defines: Defines | None = None,
    *,
    pclass: ProblemClass = DEFAULT_CLASS,
    check: bool = True,
) -> list[BuildOutcome]:
    """Build configs in parallel worker processes; one outcome per input config, in order.

    Invalid configs fail fast without compiling; duplicates compile once. ``defines``,
    ``pclass`` (the problem class) and ``check`` apply to every config (build_config).
    """
    cfgs = list(configs)
    outcomes: dict[KernelConfig, BuildOutcome] = {}
    todo: list[KernelConfig] = []
    for c in cfgs:
        if c in outcomes or c in todo:
            continue
        try:
            if check:
                validate(c, pclass.head_dim, pclass.causal)
            if pclass.varlen:
                check_varlen(c, pclass.head_dim)
        except ConfigError as e:
            outcomes[c] = BuildOutcome(c, None, e)
            continue
        todo.append(c)
    jobs = max(1, jobs or usable_cpus())
    if todo:
        find_nvcc()  # fail once, in the parent, with the clear message
        define_flags(defines)  # a bad define fails here, once, not in every worker
        tpl = str(template) if template else None
        root = str(cache_root) if cache_root else None
        defs = dict(defines) if defines else None
        if jobs == 1 or len(todo) == 1:
            raw = [_worker(c.to_dict(), tpl, root, defs, pclass, check) for c in todo]
        else:
            with ProcessPoolExecutor(max_workers=min(jobs, len(todo))) as ex:
                raw = list(ex.map(_worker, [c.to_dict() for c in todo],
                                  [tpl] * len(todo), [root] * len(todo), [defs] * len(todo),
                                  [pclass] * len(todo), [check] * len(todo)))
        for c, (kind, payload, log) in zip(todo, raw, strict=True):
            if kind == "ok":
                outcomes[c] = BuildOutcome(c, payload, None)
            elif kind == "BuildError":
                outcomes[c] = BuildOutcome(c, None, BuildError(payload, log_path=log))
            elif kind == "ConfigError":
                outcomes[c] = BuildOutcome(c, None, ConfigError(payload))
            else:
                outcomes[c] = BuildOutcome(c, None, FaTuneError(payload))
    return [outcomes[c] for c in cfgs]
