"""``fa-tune compare``'s outputs: the result folder (compare.json, summary.csv, summary.md, the
chart) and the console table. They need no torch and no GPU: a payload of tuner.analysis.compare
in, files and text out."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tuner.measure.accuracy import ratio_text
from tuner.problem import DEFAULT_LAYOUT, LAYOUTS, Problem, describe

SUMMARY_COLUMNS = (
    "shape",
    "B",
    "H",
    "Hq",
    "Hkv",
    "S",
    "Sk",
    "D",
    "causal",
    "layout",
    "backend",
    "label",
    "status",
    "median_ms",
    "min_ms",
    "max_ms",
    "tflops",
    "tflops_min",
    "tflops_max",
    "ratio_to_fa3",
    "max_abs_err",
    "fa_ratio",
    "err_vs_default",
    "rms_vs_default",
    "lse_ratio",
    "reason",
)
# The error ratios (tuner.measure.accuracy): max|err| / the BF16 implementation's (FlashAttention's
# test rule allows 2), max|err| and relative L2 / fa-tune's default config's on the same inputs,
# the LSE's max|err| / its bound's 2^-9.
ACCURACY_COLUMNS = ("fa_ratio", "err_vs_default", "rms_vs_default", "lse_ratio")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def new_result_dir(root: str | Path) -> Path:
    """``root/<UTC timestamp>/`` through tuner.measure.store, the one owner of result-folder
    names."""
    from tuner.measure.store import new_result_dir as store_new_result_dir

    return store_new_result_dir(root)


def write_summary_csv(payload: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for row in payload.get("summary", []):
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in SUMMARY_COLUMNS})
    os.replace(tmp, path)


def _layout_text(shapes: Sequence[Problem]) -> str:
    """The payload's input layout: BSHD contiguous, plus each other layout among the problems
    (every backend reads q, k, v in that layout, through the same views)."""
    text = "BSHD contiguous (Q, O [B, S_q, Hq, D]; K, V [B, S_k, Hkv, D]), BF16"
    others = sorted({p.layout for p in shapes} - {DEFAULT_LAYOUT})
    if others:
        text += "; O always, and q, k, v of the problems marked " + ", ".join(
            f":{x} as {LAYOUTS[x]}" for x in others) + " (every backend on the same views)"
    return text


def _layouts_note(payload: dict[str, Any]) -> str:
    """'' or '; :qkv: q, k, v views of ...' for the problems' other layouts (summary.md)."""
    others = sorted({p.layout for p in _problems(payload)} - {DEFAULT_LAYOUT})
    return "".join(f"; :{x}: {LAYOUTS[x]}" for x in others)


def _problems(payload: dict[str, Any]) -> list[Problem]:
    """The payload's problems (an old payload's {B, H, S, D} entries read as MHA, causal)."""
    return [Problem.from_dict(s) for s in payload.get("shapes", [])]


def _shape_headers(payload: dict[str, Any]) -> list[tuple[str, str]]:
    """[(shape key, column title)]; 'S=4096' when only S differs among the problems (and each
    has as many keys as queries)."""
    shapes = payload.get("shapes", [])
    ps = _problems(payload)
    same = (len({(p.B, p.Hq, p.Hkv, p.D, p.causal, p.layout) for p in ps}) <= 1
            and all(p.S_k == p.S_q and not p.is_varlen for p in ps))
    return [(s["shape"], f"S={s['S']}" if same else s["shape"]) for s in shapes]


def problems_title(payload: dict[str, Any]) -> str:
    """What the payload's problems are, for titles: 'causal, D=128, MHA, B=4, H=32'."""
    ps = _problems(payload)
    if not ps:
        return "no problems"
    text = describe(ps)
    if len({p.B for p in ps}) == 1:
        text += f", B={ps[0].B}"
    if len({(p.Hq, p.Hkv) for p in ps}) == 1 and ps[0].kind == "MHA":
        text += f", H={ps[0].Hq}"
    return text


def _backend_order(payload: dict[str, Any]) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for row in payload.get("summary", []):
        seen.setdefault(row["backend"], row["label"])
    return list(seen.items())


def summary_markdown(payload: dict[str, Any]) -> str:
    rows = {(r["shape"], r["backend"]): r for r in payload.get("summary", [])}
    cols = _shape_headers(payload)
    order = _backend_order(payload)
    gpu = payload.get("gpu") or {}
    proto = payload.get("protocol") or {}
    ver = payload.get("versions") or {}
    ref = payload.get("reference_peer")
    lines = [
        "# fa-tune compare",
        "",
        f"- date: {payload.get('created_utc', '?')}; status: **{payload.get('status', '?')}**",
        f"- GPU: {gpu.get('name') or gpu.get('torch_name', '?')}, driver "
        f"{gpu.get('driver_version', '?')}, power limit {gpu.get('power_limit_w', '?')} W",
        f"- torch {ver.get('torch', '?')} (CUDA {ver.get('torch_cuda', '?')}, cuDNN "
        f"{ver.get('cudnn', '?')}), triton {ver.get('triton', '?')}, flash-attn-4 "
        f"{ver.get('flash_attn_4', '?')}"
        + (f", flashinfer-python {ver['flashinfer_python']}"
           if ver.get("flashinfer_python", "unknown") != "unknown" else ""),
        f"- protocol: {proto.get('warmup', '?')} warm-up, {proto.get('repeat', '?')} timed "
        f"launches, {proto.get('rounds', '?')} rounds, CUDA events, median of round medians; "
        f"before each round an NVML wait (bounded) to <= {proto.get('temp_limit_c', '?')} C and "
        f"{proto.get('settle_s', '?')} s of untimed launches",
        f"- problems: {problems_title(payload)} "
        "(columns: BxHq[/Hkv]xS[:kSK][:dD][:full][:qkv|:bhsd])",
        f"- inputs: seed {proto.get('seed', '?')}, Q/K uniform [-2, 2], V uniform [-1, 1], BSHD "
        f"BF16{_layouts_note(payload)}; every backend gated "
        f"({(payload.get('gate') or {}).get('rule', '?')})",
        "- TFLOPS = FLOPs / time; FLOPs causal 2*B*Hq*S^2*D (not halved for causality, as in "
        "the seeds), non-causal 4*B*Hq*S^2*D; with S_q queries over S_k keys 4*B*Hq*D times "
        "the (query, key) pairs the mask keeps (causal, bottom-right: S_q*S_k - S_q^2/2)",
        "",
        "| implementation | " + " | ".join(f"{t} ms / TFLOPS" for _, t in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for name, label in order:
        cells = []
        for key, _ in cols:
            r = rows.get((key, name))
            cells.append(_cell(r, lambda r: f"{r['median_ms']:.3f} / {r['tflops']:.0f}",
                               _down(payload)))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [""]
    if ref:
        lines += [
            "Speed relative to FlashAttention-3 (FA3 time / backend time; > 1 is faster):",
            "",
            "| implementation | " + " | ".join(t for _, t in cols) + " |",
            "|---|" + "---|" * len(cols),
        ]
        for name, label in order:
            cells = [
                _cell(
                    rows.get((key, name)),
                    lambda r: f"{r['ratio_to_fa3']:.3f}x" if r["ratio_to_fa3"] else "-",
                    _down(payload),
                )
                for key, _ in cols
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    else:
        lines += ["FlashAttention-3 was not available: no ratios to FA3.", ""]
    lines += [
        "Error ratios, max|err| / the BF16 implementation's (FlashAttention's test rule: <= 2) "
        "and / fa-tune's default config's, on the same inputs (worst input set):",
        "",
        "| implementation | " + " | ".join(t for _, t in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for name, label in order:
        cells = [_cell(rows.get((key, name)), _err_ratios, _down(payload)) for key, _ in cols]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    drifts = [(s["shape"], s.get("drift")) for s in payload.get("shapes", []) if s.get("drift")]
    if drifts:
        lines.append(f"Drift check ({drifts[0][1]['backend']} first and last on each shape):")
        lines.append("")
        for shape, d in drifts:
            b, a = d.get("before_ms"), d.get("after_ms")
            ch = d.get("change_pct")
            lines.append(
                f"- {shape}: before {_ms(b)}, after {_ms(a)}"
                + (f" ({ch:+.2f}%)" if ch is not None else "")
            )
        lines.append("")
    conf = confirmed_lines(payload)
    if conf:
        lines += [conf[0], "", *(f"- {x.strip()}" for x in conf[1:]), ""]
    uneven = uneven_lines(payload)
    if uneven:
        lines += [uneven[0], "", *(f"- {x}" for x in uneven[1:]), ""]
    hot = [
        f"{r['backend']} on {s['shape']}"
        for s in payload.get("shapes", [])
        for r in s.get("runs", [])
        if (r.get("timing") or {}).get("temp_wait_bound_hit")
    ]
    if hot:
        lines += [f"Temperature wait bound hit (GPU above the limit) for: {', '.join(hot)}.", ""]
    notes = []
    for b in payload.get("backends", []):
        if not b["available"]:
            notes.append(f"- {b['label']}: not run ({b['reason']})")
    down = _down(payload)
    for r in payload.get("summary", []):
        if r["status"] == "unavailable" and r["backend"] not in down:
            notes.append(f"- {r['label']} on {r['shape']}: unsupported ({r['reason']})")
        elif r["status"] not in ("ok", "unavailable"):
            notes.append(f"- {r['label']} on {r['shape']}: {r['status']} ({r['reason']})")
    if notes:
        lines += ["Not measured:", "", *notes, ""]
    for a in payload.get("artifacts", []):
        if a.get("sha256"):
            lines.append(f"- {a['name']} artifact: {a.get('so_path')} (sha256 {a['sha256']})")
    return "\n".join(lines).rstrip() + "\n"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f} ms"


# A backend whose median launch is this far over its fastest one is not timing its kernel alone:
# a short problem whose host-side launch sets the pace (FA3 at 0.08-0.2 ms, docs/PERF.md step
# 78: ranges 2-3x its minimum), or a card busy with something else.
UNEVEN = 1.25


def uneven_lines(payload: dict[str, Any]) -> list[str]:
    """A title and one line per backend and problem whose launches were uneven (median over
    UNEVEN x its fastest launch), each other backend's ratio to FA3 by the fastest launches
    beside it; [] when every row ran even."""
    ok = [r for r in payload.get("summary", [])
          if r.get("status") == "ok" and r.get("median_ms") and r.get("min_ms")]
    ref = payload.get("reference_peer")
    out = []
    for r in ok:
        if r["median_ms"] < UNEVEN * r["min_ms"]:
            continue
        line = (f"{r['label']} on {r['shape']}: median {r['median_ms']:.3f} ms, fastest launch "
                f"{r['min_ms']:.3f} ms")
        fa3 = next((x for x in ok if x["shape"] == r["shape"] and x["backend"] == ref), None)
        if fa3 is not None:
            by_min = [f"{x['label']} {fa3['min_ms'] / x['min_ms']:.2f}x" for x in ok
                      if x["shape"] == r["shape"] and x["backend"] != ref]
            if by_min:
                line += "; by fastest launches: " + ", ".join(by_min) + " FA3"
        out.append(line)
    if not out:
        return []
    return [f"Uneven launches (median over {UNEVEN:g}x the fastest: a launch-bound short "
            "problem or a busy card; its ratio says more about the launch than the kernel):",
            *out]


def _cell(r: dict[str, Any] | None, fmt: Callable[[dict[str, Any]], str],
          down: frozenset[str] = frozenset()) -> str:
    """A table cell: the numbers, or why there are none. ``down``: backends that did not run
    at all (not installed, no GPU); another unavailable row is a problem the backend declined
    (S_q != S_k on FA2's SDPA backend, GQA on Triton, ...)."""
    if r is None:
        return "-"
    if r["status"] == "ok":
        return fmt(r)
    if r["status"] == "unavailable":
        return "not installed" if r["backend"] in down else "unsupported"
    return {"gate_failed": "gate failed"}.get(r["status"], r["status"])


def _down(payload: dict[str, Any]) -> frozenset[str]:
    """The backends that did not run at all (payload["backends"]' unavailable ones)."""
    return frozenset(b["name"] for b in payload.get("backends", []) if not b.get("available"))


def write_chart(payload: dict[str, Any], path: Path) -> bool:
    """Grouped bars of TFLOPS per shape per backend, min-max whiskers, zero-based axis.

    Returns False (and writes nothing) when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless: no display on GPU hosts or CI
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = {(r["shape"], r["backend"]): r for r in payload.get("summary", [])}
    cols = _shape_headers(payload)
    order = [
        (n, lbl)
        for n, lbl in _backend_order(payload)
        if any((rows.get((k, n)) or {}).get("status") == "ok" for k, _ in cols)
    ]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 + 0.45 * len(cols) * max(len(order), 1)), 5.6))
    width = 0.8 / max(len(order), 1)
    for i, (name, label) in enumerate(order):
        xs, ys, lo, hi = [], [], [], []
        for j, (key, _) in enumerate(cols):
            r = rows.get((key, name))
            if r and r["status"] == "ok":
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(r["tflops"])
                lo.append(r["tflops"] - r["tflops_min"])
                hi.append(r["tflops_max"] - r["tflops"])
        bars = ax.bar(
            xs, ys, width, label=label, yerr=[lo, hi], capsize=3, error_kw={"elinewidth": 1}
        )
        for bar, y in zip(bars, ys, strict=True):
            ax.annotate(
                f"{y:.0f}",
                (bar.get_x() + bar.get_width() / 2, 0),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="white",
            )
    ax.set_xticks(range(len(cols)), [t for _, t in cols])
    ax.set_ylim(bottom=0)  # zero-based: bar lengths compare honestly
    ax.set_ylabel("TFLOPS (FLOPs / median time)")
    gpu = (payload.get("gpu") or {}).get("name") or "GPU"
    ax.set_title(
        f"FlashAttention forward, BF16, {problems_title(payload)}\n"
        f"{gpu}; bar = median, whiskers = min-max",
        fontsize=9,
    )
    # Legend under the plot: peer labels are long, and a side legend squeezes the bars.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=130)
    plt.close(fig)
    os.replace(tmp, path)
    return True


def write_outputs(payload: dict[str, Any], result_dir: str | Path) -> dict[str, Path]:
    """results.json, summary.csv, summary.md and chart.png (when matplotlib exists)."""
    d = Path(result_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = {"json": d / "results.json", "csv": d / "summary.csv", "md": d / "summary.md"}
    _atomic_write(paths["json"], json.dumps(payload, indent=1, default=str) + "\n")
    write_summary_csv(payload, paths["csv"])
    _atomic_write(paths["md"], summary_markdown(payload))
    if write_chart(payload, d / "chart.png"):
        paths["png"] = d / "chart.png"
    return paths


def rich_table(payload: dict[str, Any]) -> Any:
    from rich.table import Table

    cols = _shape_headers(payload)
    rows = {(r["shape"], r["backend"]): r for r in payload.get("summary", [])}
    t = Table(title="fa-tune compare: median ms / TFLOPS (x FA3); max|err| / the BF16 "
                    "implementation's and / the default config's")
    t.add_column("implementation")
    for _, title in cols:
        t.add_column(title, justify="right")
    for name, label in _backend_order(payload):
        t.add_row(label, *(_cell(rows.get((k, name)), _ms_tflops_ratio, _down(payload))
                           for k, _ in cols))
    return t


def _ms_tflops_ratio(r: dict[str, Any]) -> str:
    ratio = f" ({r['ratio_to_fa3']:.2f}x)" if r.get("ratio_to_fa3") else ""
    return f"{r['median_ms']:.3f} / {r['tflops']:.0f}{ratio}\nerr {_err_ratios(r)}"


def _err_ratios(r: dict[str, Any]) -> str:
    """'0.41x bf16, 1.03x def, LSE 0.00x tol': max|err| over the BF16 implementation's and
    the default's; the LSE's over its bound."""
    return (f"{ratio_text(r.get('fa_ratio'))}x bf16, "
            f"{ratio_text(r.get('err_vs_default'))}x def, "
            f"LSE {ratio_text(r.get('lse_ratio'))}x tol")


def format_table(payload: dict[str, Any]) -> str:
    """Plain-text table (median ms, min, max, TFLOPS, ratio to FA3), one line per row."""
    head = (
        f"{'shape':<16} {'backend':<28} {'median':>9} {'min':>9} {'max':>9} {'TFLOPS':>7} "
        f"{'xFA3':>7} {'errxBF16':>8} {'errxdef':>7} {'LSExtol':>7}  status"
    )
    lines = [head, "-" * len(head)]
    for r in payload.get("summary", []):
        if r["status"] == "ok":
            ratio = f"{r['ratio_to_fa3']:.3f}" if r.get("ratio_to_fa3") else "-"
            lines.append(
                f"{r['shape']:<16} {r['backend'][:28]:<28} {r['median_ms']:>9.4f} "
                f"{r['min_ms']:>9.4f} {r['max_ms']:>9.4f} {r['tflops']:>7.1f} {ratio:>7} "
                f"{ratio_text(r.get('fa_ratio')):>8} {ratio_text(r.get('err_vs_default')):>7} "
                f"{ratio_text(r.get('lse_ratio')):>7}  ok"
            )
        else:
            lines.append(
                f"{r['shape']:<16} {r['backend'][:28]:<28} {'':>9} {'':>9} {'':>9} "
                f"{'':>7} {'':>7} {'':>8} {'':>7} {'':>7}  {r['status']}: {r['reason']}"
            )
    for s in payload.get("shapes", []):
        d = s.get("drift")
        if d and d.get("change_pct") is not None:
            lines.append(
                f"drift {s['shape']}: {d['backend']} {d['before_ms']:.4f} -> "
                f"{d['after_ms']:.4f} ms ({d['change_pct']:+.2f}%)"
            )
    return "\n".join(lines)


def check_confirmed(payload: dict[str, Any], confirmed: dict[str, Any],
                    kernel: str = "fa-tune") -> dict[str, Any]:
    """Per shape: the TFLOPS the search confirmed for the study's best, compare's TFLOPS for the
    same kernel now, and their ratio (compare / confirmed). Both use the protocol stored with
    them; the search confirms with FULL, compare's default (fewer launches a round past 16 ms a
    launch), so they should agree within noise."""
    conf_shapes = confirmed.get("shapes") or {}
    rows = []
    for r in payload.get("summary", []):
        if r["backend"] != kernel or r["status"] != "ok":
            continue
        c = (conf_shapes.get(r["shape"]) or {}).get("tflops")
        if not isinstance(c, (int, float)) or not c > 0:
            continue
        rows.append({"shape": r["shape"], "confirmed_tflops": float(c),
                     "compare_tflops": r["tflops"], "ratio": r["tflops"] / float(c)})
    return {"confirmed_protocol": confirmed.get("protocol"),
            "compare_protocol": payload.get("protocol"), "shapes": rows}


def confirmed_lines(payload: dict[str, Any]) -> list[str]:
    chk = payload.get("search_confirmed")
    if not chk or not chk.get("shapes"):
        return []
    lines = ["search's confirmed number vs this compare (same kernel; compare / confirmed):"]
    for r in chk["shapes"]:
        lines.append(f"  {r['shape']}: confirmed {r['confirmed_tflops']:.1f} TFLOPS, compare "
                     f"{r['compare_tflops']:.1f} TFLOPS, ratio {r['ratio']:.3f}")
    return lines
