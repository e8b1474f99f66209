"""Compile kernel variants with nvcc into a content-addressed cache.

One config -> ``render`` (string.Template over templates/fa_fwd_sm90.cu) -> one ``.so`` under
``studies/cache/<key>/`` where key = sha256 of everything that decides the binary: the rendered
source, every file under cuda_src/ (the source may include any of them), the logical flags
and the nvcc version. An entry is built in a temp folder and renamed into
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
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any, cast

from tuner import _paths, child_process
from tuner.errors import BuildError, ConfigError, FaTuneError
from tuner.kernel import shared_cache
from tuner.kernel.config import KernelConfig, check_varlen, validate
from tuner.kernel.sass import parse_ptxas, sass_report
from tuner.kernel.toolchain import compile_jobs, find_nvcc, nvcc_version
from tuner.problem import DEFAULT_CLASS, ProblemClass

ARCH_FLAG = "-gencode=arch=compute_90a,code=sm_90a"  # -arch=sm_90a has failed with nvcc 13.0
# Placeholders stand for include dirs so the cache key depends on their content (hashed
# separately), not on where the checkout happens to live.
CUDA_SRC_INC = "-I<cuda_src>"
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
)
# Hidden visibility: a kernel library exports only its C ABI, so many of them can share a
# process without interposing each other's template instantiations.
KERNEL_FLAGS: tuple[str, ...] = (
    *COMMON_FLAGS[:4], "--use_fast_math", "-Xcompiler", "-fvisibility=hidden", *COMMON_FLAGS[4:]
)
# The reference must be an exact FP32 computation: no fast-math approximations of expf.
ORACLE_FLAGS: tuple[str, ...] = COMMON_FLAGS

NVCC_TIMEOUT_S = float(os.environ.get("FA_TUNE_NVCC_TIMEOUT", "1800"))


# A build whose nvcc was killed by a signal says this (session._is_transient_build reads it).
KILLED = "killed by"


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


def render(cfg: KernelConfig, template: Path | None = None, *,
           pclass: ProblemClass = DEFAULT_CLASS) -> str:
    """The compilation unit for cfg: the template with ${config_members} (struct Config's
    member per knob, from the knob table), ${config_json} (and any ${knob}: its C++ literal)
    set, and ${head_dim} / ${causal} / ${varlen} / ${mask_members}, the problem class it serves
    (compiled in, not knobs)."""
    text = template_text(template)
    values = {
        **cfg.cpp_constants(),
        "config_members": cfg.cpp_members(),
        "head_dim": str(pclass.head_dim),
        "causal": "true" if pclass.causal else "false",
        "varlen": "1" if pclass.varlen else "0",
        # The models' masks the class has, as Config members (fa_tune/config.cuh reads an absent
        # one as false, so a class without them renders the same unit as before them).
        "mask_members": "".join(f"\n  static constexpr bool {name} = true;"
                                for name in ("window", "softcap", "sinks", "paged")
                                if getattr(pclass, name)),
        "config_json": c_string_literal(cfg.canonical_json()),
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


# Lab and test builds pre-include the header that sets the kernel's hook points from their
# macros (cuda_src/lab/hooks.cuh; found through the cuda_src include path).
LAB_HOOKS_FLAG = "--pre-include=lab/hooks.cuh"


def define_flags(defines: Defines | None) -> list[str]:
    """The lab hooks' pre-include, then ``-DNAME=VALUE`` flags sorted by name (so the cache key
    does not depend on dict order). None or {} gives no flags: the build, and its cache key,
    are exactly those without defines. For test and lab builds (FA_TUNE_PLANT_BUG,
    FA_TUNE_LAB_*: cuda_src/lab/hooks.cuh); never a knob."""
    out: list[str] = [LAB_HOOKS_FLAG] if defines else []
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
        share = shared_cache.active()  # another host may have compiled it (issue 38)
        if share is not None and share.fetch(key, entry):
            hit = _cached(entry, name, nvcc)
            if hit is not None:
                return hit
        result = _compile(text, flags, extra_inc, nvcc, ver, logical_flags, key, root, name,
                          config, template_sha256)
        if share is not None:
            share.publish(key, entry)
        return result


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
    # nvcc's intermediates (in a temp folder either way) are kept there, so the SASS check reads
    # the cubin: cuobjdump takes half as long on it as on the .so (docs/PERF.md step 49). Not
    # in the key: the library is the same.
    keep = Path(tempfile.mkdtemp(prefix="fa-tune-nvcc-"))
    try:
        src = tmp / f"{name}.cu"
        src.write_text(text)
        so = tmp / f"{name}.so"
        cmd = [str(nvcc), *_resolve_flags(flags, extra_inc), "--keep", "--keep-dir", str(keep),
               "-o", str(so), str(src)]
        t0 = time.monotonic()
        try:
            proc = child_process.run(cmd, cwd=tmp, timeout=NVCC_TIMEOUT_S)
            log = f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
            ok = proc.returncode == 0 and so.is_file()
            if proc.returncode < 0:
                # Killed (Ctrl-C reaches the process group, an OOM killer): not the config's
                # fault, so no failure is recorded and the next build compiles it again.
                shutil.rmtree(tmp, ignore_errors=True)
                raise BuildError(f"nvcc for {name} was {KILLED} "
                                 f"{signal.Signals(-proc.returncode).name}; it is compiled again "
                                 "next time")
        except subprocess.TimeoutExpired as e:  # child_process.run's carries text, not bytes
            out, err = cast("str | None", e.stdout), cast("str | None", e.stderr)
            log = f"$ {' '.join(cmd)}\n{out or ''}{err or ''}\nerror: nvcc timed out"
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
        cubin = keep / f"{name}.cubin"
        sass, note = sass_report(cubin if cubin.is_file() else so, nvcc)
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
        shutil.rmtree(keep, ignore_errors=True)


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
    jobs = compile_jobs(jobs)
    if todo:
        find_nvcc()  # fail once, in the parent, with the clear message
        define_flags(defines)  # a bad define fails here, once, not in every worker
        tpl = str(template) if template else None
        root = str(cache_root) if cache_root else None
        defs = dict(defines) if defines else None
        if jobs == 1 or len(todo) == 1:
            raw = [_worker(c.to_dict(), tpl, root, defs, pclass, check) for c in todo]
        else:
            ex = ProcessPoolExecutor(max_workers=min(jobs, len(todo)))
            try:
                raw = list(ex.map(_worker, [c.to_dict() for c in todo],
                                  [tpl] * len(todo), [root] * len(todo), [defs] * len(todo),
                                  [pclass] * len(todo), [check] * len(todo)))
            except BaseException:
                # Interrupted (Ctrl-C, SIGTERM unwinding): the pool's exit would wait for
                # every compile in flight; its processes and their nvcc trees go now.
                for pid in list(getattr(ex, "_processes", None) or {}):
                    child_process.kill_pid_tree(pid)
                ex.shutdown(wait=False, cancel_futures=True)
                raise
            ex.shutdown()
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
