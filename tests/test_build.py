"""build.py against the real nvcc: sm_90a compiles, ptxas parsing, SASS, cache, failures."""

from __future__ import annotations

import ctypes
import json
import os
import re
from pathlib import Path

import pytest

from tuner.errors import BuildError, ConfigError
from tuner.kernel import build, sass, toolchain
from tuner.kernel.config import KernelConfig


def test_find_nvcc_and_version() -> None:
    nvcc = toolchain.find_nvcc()
    assert os.access(nvcc, os.X_OK)
    ver = toolchain.nvcc_version(nvcc)
    assert ver.count(".") == 2 and int(ver.split(".")[0]) >= 12


def test_find_nvcc_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(toolchain, "_wheel_bin_dirs", lambda: [])
    monkeypatch.setattr(toolchain, "_candidate_bin_dirs", lambda: [Path("/nonexistent")])
    with pytest.raises(BuildError, match="nvcc not found.*CUDA_HOME"):
        toolchain.find_nvcc()


def test_find_nvcc_prefers_cuda_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "nvcc"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexec nvcc \"$@\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert toolchain.find_nvcc() == fake


def test_c_string_literal() -> None:
    assert build.c_string_literal('a"b\\c') == '"a\\"b\\\\c"'
    assert build.c_string_literal("é") == '"\\303\\251"'


def test_ptxas_parsing_of_real_output(studies: Path, data_dir: Path) -> None:
    r = build.build_source(data_dir / "spill_kernel.cu", build.ORACLE_FLAGS, name="spill")
    entries = r.ptxas["entries"]
    spill = entries["_Z12spill_kernelILi64EEvPfPKf"]
    small = entries["small_kernel"]
    assert spill["arch"] == "sm_90a" and small["arch"] == "sm_90a"
    assert spill["smem"] == 4096  # float buf[1024]
    assert spill["spill_stores"] > 0 and spill["spill_loads"] > 0
    assert spill["stack_frame"] >= spill["spill_stores"]
    assert 128 <= spill["registers"] <= 255
    assert 0 < small["registers"] < 32 and small["spill_stores"] == 0 and small["smem"] == 0
    assert r.ptxas["main"] == "_Z12spill_kernelILi64EEvPfPKf"
    assert r.any_spills
    # The SASS of spilled code has local memory traffic.
    if r.sass_checked:
        assert r.sass["has_local_mem"] and not r.sass["has_hgmma"]


def test_parse_ptxas_cuda12_format() -> None:
    log = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
        "ptxas info    : Function properties for k\n"
        "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 168 registers, 1024 bytes smem, 560 bytes cmem[0], 8 bytes cmem[2]\n"
        "ptxas warning : (C7515) Potential Performance Loss: wgmma.mma_async serialized\n"
    )
    p = sass.parse_ptxas(log)
    k = p["entries"]["k"]
    assert (k["registers"], k["smem"], k["spill_stores"], k["stack_frame"]) == (168, 1024, 4, 8)
    assert k["cmem"] == {"0": 560, "2": 8}
    assert p["warnings"] and "C7515" in p["warnings"][0]


def test_parse_ptxas_wgmma_serialization() -> None:
    # Real ptxas 13.0 lines from our kernels (early_next_qk before its fix, block_n 160 at 200
    # registers, block_n 176): each makes every wgmma wait for the one before it.
    fn = ("_ZN7fa_tune20attention_fwd_kernelIN41_GLOBAL__N__cd2d5899_9_kernel_cu_0f27bb6d6Config"
          "EEEvNS_6ParamsE")
    log = (
        f"ptxas info    : (C7517) warpgroup.wait is injected in around line 9060 by compiler to "
        f"allow use of registers defined by GMMA in function '{fn}'\n"
        f"ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
        f"serialized due to non wgmma instructions reading accumulator registers of  a wgmma "
        f"between start and end of the pipeline stage in the function '{fn}'\n"
        f"ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are "
        f"serialized due to insufficient register resources for the function '{fn}'\n"
        "ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are "
        "serialized due to program dependence on compiler-inserted WG.AR in divergent path\n"
    )
    p = sass.parse_ptxas(log)
    assert [w.split(":")[0] for w in p["wgmma_serialized"]] == ["C7514", "C7512", "C7520"]
    assert "insufficient register resources" in p["wgmma_serialized"][1]
    assert p["wgmma_serialized"][2].endswith("divergent path")
    # An injected wait alone (C7517) keeps the pipeline: not a serialization.
    assert sass.parse_ptxas(log.splitlines()[0])["wgmma_serialized"] == []
    r = build.BuildResult(
        key="k", name="kernel", cache_dir="", so_path="", config=None, config_id="abc",
        cache_hit=False, compile_seconds=0.0, ptxas=p, sass={"ldl": 0, "stl": 0},
        sass_checked=True, sass_note="", so_sha256="", source_sha256="", template_sha256=None,
        nvcc_version="", flags=[],
    )
    assert r.local_memory is None and r.unfit and "C7514" in r.unfit
    with pytest.raises(BuildError, match="serialized its wgmma"):
        r.require_timeable()


def test_wgmma_kernel_sass_and_cache_hit(studies: Path, data_dir: Path) -> None:
    cfg = KernelConfig(block_n=96)
    tpl = data_dir / "tiny_template.cu"
    r1 = build.build_config(cfg, template=tpl)
    assert not r1.cache_hit and r1.compile_seconds > 0
    assert r1.sass_checked, r1.sass_note  # cuobjdump ships with fa-tune's dependencies
    assert r1.sass["has_hgmma"] and not r1.sass["has_local_mem"]
    assert r1.ptxas["entries"] and not r1.any_spills
    so = Path(r1.so_path)
    art = json.loads((so.parent / "artifact.json").read_text())
    assert art["so_sha256"] == build.sha256_file(so)
    assert art["config"] == cfg.to_dict() and art["key"] == so.parent.name
    assert art["nvcc_version"] == toolchain.nvcc_version()
    mtime = so.stat().st_mtime_ns

    r2 = build.build_config(cfg, template=tpl)
    assert r2.cache_hit and r2.so_path == r1.so_path and r2.key == r1.key
    assert so.stat().st_mtime_ns == mtime  # not recompiled
    # One entry, no temp folders left behind.
    assert [p.name for p in (studies / "cache").iterdir()] == [r1.key]

    # The rendered config JSON survives the C string literal: ask the .so itself.
    lib = ctypes.CDLL(str(so))
    lib.fa_tune_config_json.restype = ctypes.c_char_p
    lib.tiny_dollar.restype = ctypes.c_char_p
    assert lib.fa_tune_config_json().decode() == cfg.canonical_json()
    assert lib.tiny_block_m() == 128
    assert lib.tiny_dollar() == b"$"

    # Any change to the config is a different artifact.
    assert build.cache_key(build.render(KernelConfig(), tpl), build.KERNEL_FLAGS,
                           toolchain.nvcc_version()) != r1.key


def test_render_unknown_placeholder(tmp_path: Path) -> None:
    tpl = tmp_path / "t.cu"
    tpl.write_text("int x = ${block_m}; int y = ${no_such_knob};\n")
    with pytest.raises(BuildError, match=r"unknown placeholder \$\{no_such_knob\}"):
        build.render(KernelConfig(), tpl)


def test_compile_error_is_one_line_with_log(studies: Path) -> None:
    src = "__global__ void broken(float* o) { o[0] = undefined_symbol; }\n"
    for _ in range(2):  # a failure is never cached: the second attempt compiles and fails again
        with pytest.raises(BuildError) as ei:
            build.build_source(src, name="broken")
        msg = str(ei.value)
        assert "\n" not in msg and "undefined_symbol" in msg and "log:" in msg
        log = Path(ei.value.log_path)
        assert log.is_file() and "undefined_symbol" in log.read_text()
        assert log.parent.parent == studies / "cache" / "failed"
    assert [p.name for p in (studies / "cache").iterdir()] == ["failed"]


def test_build_many_parallel(studies: Path, data_dir: Path) -> None:
    tpl = data_dir / "tiny_template.cu"
    good = [KernelConfig(block_n=64), KernelConfig(block_n=80)]
    bad = KernelConfig(block_m=64, pingpong=True)  # invalid: fails without compiling
    outs = build.build_many([good[0], bad, good[1], good[0]], jobs=2, template=tpl)
    assert [o.ok for o in outs] == [True, False, True, True]
    assert isinstance(outs[1].error, ConfigError)
    assert outs[0].result.key == outs[3].result.key != outs[2].result.key
    again = build.build_many(good, jobs=2, template=tpl)
    assert all(o.result.cache_hit for o in again)


# ---- -D defines (test builds: FA_TUNE_PLANT_BUG, cuda_src/lab/hooks.cuh) ---------------------
def planted_bugs() -> dict[int, str]:
    """The planted bugs the lab hooks header documents: {N: "file  what it does"}."""
    text = (Path(build._paths.cuda_src_dir()) / "lab" / "hooks.cuh").read_text()
    block = text[text.index("FA_TUNE_PLANT_BUG = N"):text.index("#pragma once")]
    return {int(m.group(1)): m.group(2).strip()
            for m in re.finditer(r"^//\s+(\d+) (\w+\.cuh .*)$", block, re.MULTILINE)}


def test_define_flags() -> None:
    assert build.define_flags(None) == [] and build.define_flags({}) == []
    assert build.define_flags({"B": "x1", "A": 3}) == [build.LAB_HOOKS_FLAG, "-DA=3",
                                                       "-DB=x1"]  # sorted
    for bad in ({"1A": 1}, {"A B": 1}, {"A": "x y"}, {"A": "$(rm)"}, {"A": True}, {"A": 1.5}):
        with pytest.raises(BuildError, match="define"):
            build.define_flags(bad)  # type: ignore[arg-type]


_PROBE_TEMPLATE = """#include "fa_tune/config.cuh"
#define API extern "C" __attribute__((visibility("default")))
API int probe_plant_bug(void) { return fa_tune::Hooks::adjust_normalize ? 4 : 0; }
API const char* fa_tune_config_json(void) { return ${config_json}; }
"""


def test_defines_are_part_of_the_key_and_none_changes_nothing(studies: Path,
                                                               tmp_path: Path) -> None:
    tpl = tmp_path / "probe.cu"
    tpl.write_text(_PROBE_TEMPLATE)
    cfg = KernelConfig()
    plain = build.build_config(cfg, template=tpl)
    # No defines: the key is exactly the one the code computed before defines existed.
    assert plain.key == build.cache_key(build.render(cfg, tpl), build.KERNEL_FLAGS,
                                        toolchain.nvcc_version())
    assert plain.flags == list(build.KERNEL_FLAGS)
    for none in (None, {}):
        again = build.build_config(cfg, template=tpl, defines=none)
        assert again.cache_hit and again.key == plain.key
    lib = ctypes.CDLL(plain.so_path)
    assert lib.probe_plant_bug() == 0  # the default: no planted bug

    bug = build.build_config(cfg, template=tpl, defines={"FA_TUNE_PLANT_BUG": 4})
    assert not bug.cache_hit and bug.key != plain.key
    assert bug.flags == [*build.KERNEL_FLAGS, build.LAB_HOOKS_FLAG, "-DFA_TUNE_PLANT_BUG=4"]
    assert bug.config_id == plain.config_id  # the same config, another artifact
    assert ctypes.CDLL(bug.so_path).probe_plant_bug() == 4
    # build_many passes the defines to its workers (a cache hit here).
    (out,) = build.build_many([cfg], jobs=1, template=tpl, defines={"FA_TUNE_PLANT_BUG": "4"})
    assert out.ok and out.result.key == bug.key and out.result.cache_hit
    with pytest.raises(BuildError, match="bad define"):
        build.build_many([cfg], template=tpl, defines={"FA_TUNE_PLANT_BUG": "4; rm"})


def test_planted_bugs_are_documented_and_out_of_the_product_headers() -> None:
    """Each planted bug is set in the lab hooks header and reaches the product file it names
    through a hook point (Hooks::); no product header names a planted bug or a lab macro."""
    bugs = planted_bugs()
    assert sorted(bugs) == list(range(1, 11)), bugs
    root = Path(build._paths.cuda_src_dir())
    lab = (root / "lab" / "hooks.cuh").read_text()
    assert "#define FA_TUNE_PLANT_BUG 0" in lab and "#define FA_TUNE_HOOKS" in lab
    for n, what in bugs.items():
        assert re.search(rf"kPlantBug [!=]= {n}\b", lab), n
        assert "Hooks::" in (root / "fa_tune" / what.split()[0]).read_text(), (n, what)
    for header in (root / "fa_tune").glob("*"):
        text = header.read_text()
        for word in ("kPlantBug", "FA_TUNE_PLANT_BUG", "FA_TUNE_LAB_", "planted"):
            assert word not in text, (header.name, word)


def _planted_bug_artifacts() -> list:
    from prebuild import Artifact

    from tuner.kernel.config import load_preset
    from tuner.problem import ProblemClass

    # A bug of one of the models' masks ("[window]") is built for the class it changes.
    def pclass(what: str) -> ProblemClass:
        mask = re.search(r"\[(window|softcap|sinks)\]", what)
        return ProblemClass(**({mask.group(1): True} if mask else {}))

    return [Artifact.of(load_preset("default"), pclass(what), defines={"FA_TUNE_PLANT_BUG": n})
            for n, what in sorted(planted_bugs().items())]


@pytest.mark.slow
@pytest.mark.builds(lambda: _planted_bug_artifacts())
def test_planted_bug_variants_compile() -> None:
    """Every planted bug compiles into the default preset through the product's build path,
    ptxas happy, no local memory (tests/gpu/test_planted_bugs_gpu.py runs them). All variants
    at once, one nvcc per usable CPU."""
    from concurrent.futures import ThreadPoolExecutor

    from tuner.kernel.config import load_preset

    cfg = load_preset("default")
    plain = build.cache_key(build.render(cfg), build.KERNEL_FLAGS, toolchain.nvcc_version())
    arts = _planted_bug_artifacts()
    bugs = [dict(a.defines)["FA_TUNE_PLANT_BUG"] for a in arts]
    with ThreadPoolExecutor(max_workers=toolchain.usable_cpus()) as ex:
        results = list(ex.map(
            lambda a: build.build_config(a.config, defines=dict(a.defines), pclass=a.pclass),
            arts))
    for bug, r in zip(bugs, results, strict=True):
        assert r.local_memory is None, (bug, r.local_memory)
        assert r.sass_checked and r.sass["has_hgmma"], bug
        assert r.flags[-1] == f"-DFA_TUNE_PLANT_BUG={bug}" and r.key != plain
    assert len({r.key for r in results}) == len(bugs)
