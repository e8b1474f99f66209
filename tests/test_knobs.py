"""The knob table (issue 35): KernelConfig's fields are the one definition of the knobs; KNOBS,
the template's ``struct Config`` and docs/ARCHITECTURE.md's table are derived from them, and
every published config id stayed what it was. CPU only."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tuner import _paths
from tuner.kernel import build, knobs
from tuner.kernel.config import (
    KNOBS,
    NEUTRAL_LATER_KNOBS,
    KernelConfig,
    list_presets,
    load_preset,
)
from tuner.kernel.knobs import Knob, knob

ROOT = Path(__file__).resolve().parents[1]

# Every preset's id before the knob table drove KernelConfig (commit 775b414): the table must
# keep field names, defaults and the canonical JSON, so studies, caches and docs keep naming
# the same kernels. Changed on purpose since: multicast and d64-sumpv (k_release after_max,
# docs/PERF.md step 57; before, c56645a97701 and 908668a8f5d7).
PRESET_IDS = {
    "baseline": "688a6e9e810d", "d256": "7723ed0ae918", "d256-multicast": "b01cd72f2b55",
    "d64": "c1e1c538ff95", "d64-static": "43f1a23d68a1", "d64-static128": "f42c3bf4887e",
    "d64-sumpv": "91bf1f090957", "d64-wgskip": "e8668068c1d4", "d64-window": "535250a97cad",
    "default": "3b52d82beee5",
    "dynamic": "30293bdae313", "fa3": "3b52d82beee5", "full-multicast": "aabef762eece",
    "full-pair192": "997ae661a830", "full-qregs": "f91aec0dd3cc", "gqa-cluster": "d62ee59f79f1",
    "llama3": "f9db5b7a6d4c", "multicast": "f49295e345c3", "static": "d3a15d037587",
}


def test_preset_ids_unchanged() -> None:
    assert set(PRESET_IDS) <= set(list_presets())
    assert {p: load_preset(p).config_id() for p in PRESET_IDS} == PRESET_IDS
    # The knobs left out of the id at their neutral value, away from it, as before.
    assert [KernelConfig(**{k: v}).config_id() for k, v in
            (("wg_skip", True), ("head_cluster", 2), ("sum_in_pv", True))] == [
        "11b7ddaf3b91", "ffb042daa165", "c2266ef450c2"]
    assert set(NEUTRAL_LATER_KNOBS) == {"sum_in_pv", "wg_skip", "head_cluster", "ctas_per_sm",
                                       "softcap_tanh", "pack_gqa"}


def test_knobs_are_the_dataclass_fields() -> None:
    fields = dataclasses.fields(KernelConfig)
    assert list(KNOBS) == [f.name for f in fields]
    default = KernelConfig()
    for f in fields:
        k = KNOBS[f.name]
        assert k.name == f.name and k.default == f.default == getattr(default, f.name)
        assert k.default in k.choices and k.doc.endswith(".")
        assert (k.kind == "enum") == (k.cpp_type is not None)


def test_knob_declaration_errors() -> None:
    with pytest.raises(TypeError, match="not among its choices"):
        knob(3, (1, 2), doc="x.")
    with pytest.raises(TypeError, match="cpp_type"):
        knob("a", ("a", "b"), doc="x.")

    @dataclasses.dataclass(frozen=True)
    class Mistyped:
        n: str = knob(1, (1, 2), doc="x.")

    with pytest.raises(TypeError, match="the int knob is annotated str"):
        knobs.table(Mistyped)

    @dataclasses.dataclass(frozen=True)
    class Undeclared:
        n: int = 1

    with pytest.raises(TypeError, match="not declared with knob"):
        knobs.table(Undeclared)


def test_cpp_member_lines() -> None:
    cfg = KernelConfig(block_n=96, hint_o="evict_normal", pingpong=False, scheduler="static")
    lines = cfg.cpp_members().splitlines()
    assert len(lines) == len(KNOBS)
    assert lines[0] == "  static constexpr int block_m = 128;"
    assert "  static constexpr int block_n = 96;" in lines
    assert "  static constexpr bool pingpong = false;" in lines
    assert ("  static constexpr fa_tune::CacheHint hint_o = fa_tune::CacheHint::EvictNormal;"
            in lines)
    assert "  static constexpr fa_tune::Scheduler scheduler = fa_tune::Scheduler::Static;" in lines
    assert Knob("x", "enum", ("after_last_qk",), "after_last_qk", "QRelease").cpp_value(
        "after_last_qk") == "fa_tune::QRelease::AfterLastQk"


@pytest.mark.parametrize("template", ["kernel", "tiny"])
def test_templates_render_struct_config_from_the_table(template: str, data_dir: Path) -> None:
    """Both templates take the knobs from one ${config_members}, none by its own placeholder,
    and the rendered struct Config holds each knob's member once."""
    path = _paths.kernel_template() if template == "kernel" else data_dir / "tiny_template.cu"
    text = path.read_text()
    assert text.splitlines().count("${config_members}") == 1  # a line of its own
    assert not set(re.findall(r"\$\{(\w+)\}", text)) & set(KNOBS)
    cfg = load_preset("multicast")
    src = build.render(cfg, path if template == "tiny" else None)
    struct = src[src.index("struct Config {"):src.index("};", src.index("struct Config {"))]
    for line in cfg.cpp_members().splitlines():
        assert struct.count(line) == 1, line
    if template == "kernel":  # the problem class and the JSON stay the template's own
        assert "static constexpr int head_dim = 128;" in struct
        assert "static constexpr bool causal = true;" in struct
        assert "static constexpr const char* json = " in struct


def test_docs_knob_table_is_generated() -> None:
    """docs/ARCHITECTURE.md's knob table is the generated one: after changing a knob, run
    `python scripts/knob_table.py --write`."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert knobs.docs_table(text) == knobs.markdown_table(KNOBS), (
        "docs/ARCHITECTURE.md's knob table is stale: python scripts/knob_table.py --write")
    rows = knobs.markdown_table(KNOBS).splitlines()[2:]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == list(KNOBS)
