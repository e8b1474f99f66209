"""fa-tune profile's parsers on what ncu really prints: output captured on the H200
(ncu 2025.3.1; tests/data/ncu_h200/README.md says when and how), not made-up CSV.

One kernel: the 2026-11-30 capture. Two kernels (the side-by-side of ``--vs-trial`` and ``--vs
fa3``): the 2026-12-01 captures of study p17, parsed by the product's parser and printed by the
CLI's own function. Other ncu versions' layouts are the one-kernel capture rewritten into them;
each test names the difference it stands for."""

from __future__ import annotations

import csv
import io
import random
import re
import sys
from pathlib import Path

import pytest

from tuner.analysis import ncu_report, profile
from tuner.problem import Problem

FIX = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIX))
import ncu_two_kernels as two  # noqa: E402

# Every row's value in the capture (raw page: full precision), in the rows' shown units.
REAL = {
    "duration_ms": 2.9872, "sm_clock_ghz": 1.688374, "sm_throughput_pct": 81.902339,
    "tensor_pipe_pct": 82.775845, "xu_pipe_pct": 42.721091, "fma_pipe_pct": 17.173652,
    "alu_pipe_pct": 20.432176, "issued_ipc": 1.615585, "warp_cycles_per_issue": 5.571454,
    "achieved_occupancy_pct": 14.063333, "smem_bank_conflicts": 288944,
    "l2_hit_rate_pct": 86.2815, "memory_throughput_pct": 43.375816,
    "dram_read_mb": 807.621376, "dram_write_mb": 263.810304, "dram_gbs": 358.674237,
    "registers_per_thread": 168, "smem_per_cta_kib": 197632 / 1024,
}


def test_details_page_gives_every_headline_metric() -> None:
    h = ncu_report.parse_details_csv(two.real_details())
    assert h.kernel_name == two.OURS
    # The values in the captured CSV (its metric rows end with a trailing comma).
    assert h.duration_ms == pytest.approx(2.99)
    assert h.metrics["sm_throughput_pct"] == pytest.approx(81.9)
    assert h.metrics["memory_throughput_pct"] == pytest.approx(43.38)
    assert h.metrics["achieved_occupancy_pct"] == pytest.approx(14.06)
    assert h.metrics["l2_hit_rate_pct"] == pytest.approx(86.28)
    assert h.metrics["sm_clock_ghz"] == pytest.approx(1.69)
    assert h.metrics["issued_ipc"] == pytest.approx(1.62)
    assert h.metrics["dram_gbs"] == pytest.approx(358.67)
    assert h.metrics["registers_per_thread"] == 168
    # 1.02 Kbyte driver-reserved is not the kernel's: static 0 byte + dynamic 197.63 Kbyte.
    assert h.metrics["smem_per_cta_kib"] == pytest.approx(197630 / 1024)


def test_raw_page_gives_the_tensor_pipe() -> None:
    assert ncu_report.parse_raw_tensor_pipe(two.real_raw()) == pytest.approx(82.775845)


def test_every_row_from_the_real_report() -> None:
    [k] = ncu_report.parse_report(two.real_details(), two.real_raw())
    assert (k.id, k.name) == ("0", two.OURS)
    h = ncu_report.headline(k)
    for key, want in REAL.items():
        assert h[key] == pytest.approx(want), key
    assert h["power_w"] is None  # ncu 2025.3.1 reports none
    # Stall reasons, largest first; "selected" (issuing) is not one; with "selected" (1.0)
    # they add up to the warp cycles per issued instruction.
    stalls = [k for k in h if k.startswith("stall_")]
    assert stalls[:3] == ["stall_wait", "stall_dispatch_stall", "stall_long_scoreboard"]
    assert "stall_selected" not in h
    assert sum(h[s] or 0 for s in stalls) + 1.0 == pytest.approx(h["warp_cycles_per_issue"],
                                                                  abs=0.01)
    assert ncu_report.launch_text(k) == "grid 132 x block 384, cluster 2"
    tab = ncu_report.build_table([h])
    cells = {r.label: r.cells[0] for r in tab.rows}
    assert cells["duration [ms]"] == "2.987"
    assert cells["SM clock [GHz]"] == "1.688"
    assert cells["tensor pipe (GMMA) [%]"] == "82.8"
    assert cells["shared-memory bank conflicts"] == "288,944"
    assert cells["stall: wait [cycles/issue]"] == "1.77"
    assert "n/a" not in cells.values()
    # Power is the one row ncu lacks: said once, under the table, not as a row.
    assert not any(r.label.startswith("board power") for r in tab.rows)
    [note] = tab.notes
    assert note.startswith("board power: n/a, Nsight Compute reports no board power")
    assert not any(r.highlight or r.ratio for r in tab.rows)  # one kernel: nothing to compare


# ---- two kernels in one ncu run: the real captures of --vs-trial and --vs fa3 ----------------
# Study p17 on the H200, 2026-12-01: trial 0 = config 3b52d82beee5 (the default preset), trial 1
# = 1b01fdf6ccfd (default with 3 K / 3 V stages); FA3 = flash-attn-4's sm90 CuTe DSL kernel.
FA3_LABEL = "FlashAttention-3 (flash-attn-4, sm90)"
TRIAL0 = profile.Subject("trial 0", "trial0.so", 0, "3b52d82beee5")
SUBJECTS = {"vs_trial": [TRIAL0, profile.Subject("trial 1", "trial1.so", 1, "1b01fdf6ccfd")],
            "vs_fa3": [TRIAL0, profile.Subject(FA3_LABEL, "fa3")]}
BANK = "shared-memory bank conflicts"
DRAM_READ = "DRAM read [MB]"
SMEM = "shared memory / CTA (static + dynamic) [KiB]"


def _pair(which: str) -> list[ncu_report.KernelReport]:
    return ncu_report.parse_report(*two.real_pair(which))


REPORTS = {"vs_trial": "p17-trial0-trial1-4x32x8192", "vs_fa3": "p17-trial0-fa3-4x32x8192"}


def _result(which: str) -> profile.ProfileResult:
    """What profile_trial returns for the capture (what the CLI prints)."""
    cols = [profile.Column(s, k, ncu_report.headline(k))
            for s, k in zip(SUBJECTS[which], _pair(which), strict=True)]
    return profile.ProfileResult(
        Path(f"studies/profiles/{REPORTS[which]}.ncu-rep"), Problem.parse("4x32x8192"),
        "2025.3.1.0", "2026-12-01T00:27:00Z", cols, stored=[0])


@pytest.mark.parametrize("which", two.PAIRS)
def test_two_kernels_split_by_id_in_launch_order(which: str) -> None:
    details, _ = two.real_pair(which)
    ids = [r[0] for r in csv.reader(io.StringIO(details))][1:]
    assert ids == sorted(ids) and set(ids) == {"0", "1"}  # ncu prints result 0's rows, then 1's
    ks = _pair(which)
    assert [k.id for k in ks] == ["0", "1"]
    for k in ks:  # each result has its own full set of rows, on both pages
        assert len(k.details) == 87 and len(k.raw) == 2226, k.id
        assert k.launch["Block Size"] == "(384, 1, 1)"
    # The filter fa-tune gave ncu matches both kernels' demangled names as ncu reports them.
    pattern = profile.kernel_regex(SUBJECTS[which]).removeprefix("regex:")
    assert all(re.search(pattern, k.name) for k in ks)
    # The details page alone (a raw page that cannot be read) splits the same way.
    alone = ncu_report.parse_report(details, None)
    assert [(k.id, k.name) for k in alone] == [(k.id, k.name) for k in ks]
    assert [ncu_report.headline(k)["duration_ms"] for k in alone] == pytest.approx(
        [3.09, 3.09] if which == "vs_trial" else [3.09, 3.06])


def test_trial_against_trial_told_apart_by_id_alone() -> None:
    """Both results are attention_fwd_kernel: launch order (trial 0, then trial 1) is the
    only tell, and the values show it: trial 1's 3 K / 3 V stages take 225 KiB, not 161."""
    a, b = _pair("vs_trial")
    assert a.name == b.name == two.OURS
    assert ncu_report.launch_text(a) == ncu_report.launch_text(b) == "grid 64x32x4 x block 384"
    ha, hb = ncu_report.headline(a), ncu_report.headline(b)
    assert (ha["smem_per_cta_kib"], hb["smem_per_cta_kib"]) == pytest.approx((161.0, 225.0))
    assert ha["duration_ms"] == pytest.approx(3.091104)
    assert hb["duration_ms"] == pytest.approx(3.087584)
    assert (ha["smem_bank_conflicts"], hb["smem_bank_conflicts"]) == (244149, 165352)
    tab = _result("vs_trial").table()
    # The config's one difference is what stands out; everything else is within 1.4%.
    assert {r.label for r in tab.rows if r.highlight} == {BANK, SMEM}
    by = {r.label: r for r in tab.rows}
    assert by[SMEM].ratio == "1.40x" and by[BANK].ratio == "0.68x"
    assert all((r.rel or 0.0) < 0.015 for r in tab.rows if not r.highlight)


def test_vs_fa3_kernel_1_is_fa3() -> None:
    ours, fa3 = _pair("vs_fa3")
    assert "attention_fwd_kernel" in ours.name and "flash" not in ours.name.lower()
    assert "flash" in fa3.name and "FlashAttentionForwardSm90" in fa3.name
    assert fa3.name.startswith("kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90")
    assert not re.search(profile.KERNEL_PATTERN, fa3.name)
    assert re.search("|".join(profile.FA3_PATTERNS), fa3.name)
    assert ncu_report.launch_text(ours) == "grid 64x32x4 x block 384"
    assert ncu_report.launch_text(fa3) == "grid 8192 x block 384"  # FA3's grid is flat


def test_vs_fa3_values() -> None:
    a, b = (ncu_report.headline(k) for k in _pair("vs_fa3"))
    assert (a["duration_ms"], b["duration_ms"]) == pytest.approx((3.089152, 3.061568))
    assert (a["smem_bank_conflicts"], b["smem_bank_conflicts"]) == (243275, 45)
    assert (a["dram_read_mb"], b["dram_read_mb"]) == pytest.approx((805.3632, 1003.551488))
    by = {r.label: r for r in _result("vs_fa3").table().rows}
    assert by["duration [ms]"].cells == ["3.089", "3.062"]
    assert by["duration [ms]"].ratio == "0.99x"
    assert by[BANK].cells == ["243,275", "45"] and by[BANK].ratio == "0.00x"
    assert by[DRAM_READ].cells == ["805.4", "1003.6"] and by[DRAM_READ].ratio == "1.25x"
    # Q, K and V are 3 x 4x32x8192x128 BF16 = 805.3 MB: ours reads each byte once.
    assert a["dram_read_mb"] == pytest.approx(3 * 4 * 32 * 8192 * 128 * 2 / 1e6, rel=1e-4)


@pytest.mark.parametrize("which", two.PAIRS)
def test_every_row_has_both_values_but_board_power(which: str) -> None:
    res = _result(which)
    assert all(c.metrics["power_w"] is None for c in res.columns)
    tab = res.table()
    assert [r.label for r in tab.rows[:2]] == ["kernel", "launch"]
    for r in tab.rows:
        assert len(r.cells) == 2 and "n/a" not in r.cells, r.label
        assert r.label in ("kernel", "launch") or r.ratio.endswith("x"), r.label
    assert not any(r.label.startswith("board power") for r in tab.rows)
    [note] = tab.notes  # said once, with why; no "n/a in one column"
    assert note.startswith("board power: n/a, Nsight Compute reports no board power")
    # Every metric row and the top stall reasons of each kernel (their union) are there.
    labels = [r.label for r in tab.rows]
    for m in ncu_report.METRICS:
        assert (m.key == "power_w") != (ncu_report._unit_label(m) in labels), m.key
    assert [r for r in labels if r.startswith("stall:")] == [
        "stall: wait [cycles/issue]",
        *(["stall: barrier [cycles/issue]", "stall: long scoreboard [cycles/issue]"]
          if which == "vs_trial" else
          ["stall: long scoreboard [cycles/issue]", "stall: barrier [cycles/issue]"])]


def test_vs_fa3_rows_that_differ_most() -> None:
    rows = _result("vs_fa3").table().rows
    hot = sorted((r for r in rows if r.highlight), key=lambda r: -(r.rel or 0.0))
    assert [r.label for r in hot] == [
        BANK, DRAM_READ, "stall: long scoreboard [cycles/issue]", "stall: wait [cycles/issue]",
        "DRAM throughput [GB/s]"]
    by = {r.label: r for r in rows}
    assert by[BANK].rel == pytest.approx(1 - 45 / 243275)
    assert not by["ALU pipe [%]"].highlight  # 0.84x, the sixth largest: only 5 are marked


def test_side_by_side_printed_as_the_cli_prints_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table through study_cmds._print_profile, the function `fa-tune profile` prints with."""
    from rich.console import Console

    from tuner.cli import study_cmds

    buf = io.StringIO()
    monkeypatch.setattr(study_cmds, "console", Console(file=buf, width=200, color_system=None))
    study_cmds._print_profile(_result("vs_fa3"))
    out = buf.getvalue()
    lines = out.splitlines()
    assert lines[0].strip() == f"trial 0 (3b52d82beee5) vs {FA3_LABEL} on 4x32x8192"
    head = next(ln for ln in lines if "metric" in ln)
    assert "trial 0 (3b52d82beee5)" in head and FA3_LABEL in head and "fa3 / trial 0" in head

    def row(label: str) -> list[str]:
        [hit] = [ln for ln in lines if ln.startswith(f"│ {label} ")]
        return [c.strip() for c in hit.strip("│").split("│")]

    assert row("duration [ms]") == ["duration [ms]", "3.089", "3.062", "0.99x"]
    assert row(BANK) == [BANK, "243,275", "45", "0.00x *"]
    assert row(DRAM_READ) == [DRAM_READ, "805.4", "1003.6", "1.25x *"]
    assert row("ALU pipe [%]") == ["ALU pipe [%]", "21.5", "18.1", "0.84x"]
    assert row("launch") == ["launch", "grid 64x32x4 x block 384", "grid 8192 x block 384", ""]
    assert sum(ln.rstrip("│ ").endswith("*") for ln in lines if ln.startswith("│")) == 5
    assert "ncu 2025.3.1.0, one launch each, clocks not locked" in out
    assert "* the rows that differ most (relative difference)" in lines
    [power] = [ln for ln in lines if "board power" in ln]  # once, with why, not as a row
    assert power.startswith("board power: n/a, Nsight Compute reports no board power")
    assert out.count("n/a") == 1
    assert ("kernel 0: void fa_tune::attention_fwd_kernel<<unnamed>::Config>(fa_tune::Params)"
            in lines)
    assert any(ln.startswith("kernel 1: kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90"
                             "FlashAttentionForwardSm90_") for ln in lines)
    assert "report: studies/profiles/p17-trial0-fa3-4x32x8192.ncu-rep" in lines
    assert lines[-1] == ("headline stored with trial 0 (user attr 'profile'; `fa-tune show` "
                         "lists it)")


def test_rows_in_any_order_split_by_id() -> None:
    details, _ = two.real_pair("vs_fa3")
    head, *body = details.splitlines()
    random.Random(7).shuffle(body)
    ks = ncu_report.parse_details("\n".join([head, *body]))
    assert [k.id for k in ks] == ["0", "1"] and "FlashAttentionForwardSm90" in ks[1].name
    assert [ncu_report.headline(k)["duration_ms"] for k in ks] == pytest.approx([3.09, 3.06])


def _csv(rows: list[list[str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def _relayout(cols: list[str], const: dict[str, str] | None = None,
              units: dict[str, tuple[str, str]] | None = None) -> str:
    """The capture's details page with the columns ``cols`` (each row as wide as the header,
    a column the capture lacks from ``const``), and some metrics in other units: the layouts
    other ncu versions print."""
    rows = list(csv.reader(io.StringIO("\n".join(
        ln for ln in two.real_details().splitlines() if ln.startswith('"')))))
    head = rows[0]
    out = [cols]
    for r in rows[1:]:
        d = dict(zip(head, r + [""] * (len(head) - len(r)), strict=True))
        d.update(const or {})
        if units and d["Metric Name"] in units:
            d["Metric Unit"], d["Metric Value"] = units[d["Metric Name"]]
        out.append([d[c] for c in cols])
    return _csv(out)


FULL_HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context",
             "Stream", "Block Size", "Grid Size", "Device", "CC", "Section Name", "Metric Name",
             "Metric Unit", "Metric Value", "Rule Name", "Rule Type", "Rule Description",
             "Estimated Speedup Type", "Estimated Speedup"]
OLD_HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time",
            "Context", "Stream", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]


@pytest.mark.parametrize("layout", ["full-width", "2023.1 (15 columns)", "kernel time"])
def test_other_ncu_layouts(layout: str) -> None:
    """Documented differences between ncu versions' details CSV, each read the same.

    full-width: every metric row as wide as the 20-column header (empty rule fields), as
    versions before 2025.3's trailing-comma rows print it. 2023.1 (15 columns): no rule
    columns (ncu 2023.1.0 prints 15 fields a row: jiashenC/gpudb-char-and-opt PR #1). kernel
    time: the older layout with a "Kernel Time" column and no Block/Grid/Device/CC, whose units
    were "usecond" and "cycle/nsecond". No ncu 2024.x capture was at hand, and no 2024.x
    difference beyond these is known here.
    """
    if layout == "full-width":
        text, want_ms = _relayout(FULL_HEAD), 2.99
    elif layout == "2023.1 (15 columns)":
        text, want_ms = _relayout(FULL_HEAD[:15]), 2.99
    else:
        text, want_ms = _relayout(OLD_HEAD, {"Kernel Time": "2024-Jan-01 00:00:00"}, {
            "Duration": ("usecond", "2,987.20"), "SM Frequency": ("cycle/nsecond", "1.69")}), 2.9872
    [k] = ncu_report.parse_details(text)
    h = ncu_report.headline(k)
    assert h["duration_ms"] == pytest.approx(want_ms)
    assert h["sm_clock_ghz"] == pytest.approx(1.69)
    assert h["l2_hit_rate_pct"] == pytest.approx(86.28)
    assert h["registers_per_thread"] == 168


@pytest.mark.parametrize("which", two.PAIRS)
def test_raw_page_in_base_units(which: str) -> None:
    """``--print-units base`` (what fa-tune asks the raw page for): ncu 2025.3.1 writes "ns",
    "hz", "byte", "byte/s", "byte/block" with thousands separators; every value read from it
    agrees with the details page's scaled one ("ms", "Ghz", "Gbyte/s", "Kbyte/block") to the
    details page's rounding."""
    details, raw = two.real_pair(which)
    head, units, *_ = csv.reader(io.StringIO(raw))
    unit = dict(zip(head, units, strict=True))
    assert [unit[n] for n in ("gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second",
                              "dram__bytes_read.sum", "dram__bytes.sum.per_second",
                              "launch__shared_mem_per_block_dynamic")] == [
        "ns", "hz", "byte", "byte/s", "byte/block"]
    full = ncu_report.parse_report(details, raw)
    alone = ncu_report.parse_report(details, None)
    for k, d in zip(full, alone, strict=True):
        h, hd = ncu_report.headline(k), ncu_report.headline(d)
        shared = [key for key, v in hd.items() if v is not None]
        assert {"duration_ms", "sm_clock_ghz", "dram_gbs", "smem_per_cta_kib"} <= set(shared)
        for key in shared:
            assert h[key] == pytest.approx(hd[key], rel=2e-3), (k.id, key)


@pytest.mark.parametrize("value, unit, kind, want", [
    (2.99, "ms", "time", 2.99e-3), (2987.2, "usecond", "time", 2.9872e-3),
    (2987200, "nsecond", "time", 2.9872e-3), (1.69, "Ghz", "freq", 1.69e9),
    (1.69, "cycle/nsecond", "freq", 1.69e9), (1690, "Mhz", "freq", 1.69e9),
    (1.69e9, "cycle/second", "freq", 1.69e9), (807.6, "Mbyte", "bytes", 807.6e6),
    (197.632, "Kbyte/block", "bytes", 197632), (358.67, "Gbyte/s", "byte_rate", 358.67e9),
    (358.67, "Gbyte/second", "byte_rate", 358.67e9), (43.4, "%", "pct", 43.4),
    # --print-units base, as ncu 2025.3.1 writes it (the two-kernel captures)
    (3089152, "ns", "time", 3.089152e-3), (1707777134.8, "hz", "freq", 1707777134.8),
    (346105991547.19, "byte/s", "byte_rate", 346105991547.19),
    (164864, "byte/block", "bytes", 164864),
])
def test_units(value: float, unit: str, kind: str, want: float) -> None:
    assert ncu_report.to_base(value, unit, kind) == pytest.approx(want)


def test_unknown_unit_is_not_guessed() -> None:
    assert ncu_report.to_base(1.0, "furlong", "time") is None
    assert ncu_report.to_base(358.67, "Gbyte/s", "pct") is None  # a % row found by name alone
