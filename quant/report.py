"""The quantization report: ``quant_report.json`` in the artifact, a table, a per-layer plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPORT = "quant_report.json"
PLOT = "quant_report.png"


def write_report(report: dict[str, Any], directory: Path) -> dict[str, Path]:
    """``quant_report.json`` (and ``quant_report.png`` when matplotlib is installed) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {REPORT: directory / REPORT}
    files[REPORT].write_text(json.dumps(report, indent=1) + "\n")
    if write_plot(report, directory / PLOT):
        files[PLOT] = directory / PLOT
    return files


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``quantization`` entry: the global figures without the per-layer rows."""
    return {k: v for k, v in report.items() if k not in ("layers", "search")}


def report_table(report: dict[str, Any]) -> Any:
    """A rich ``Table`` of the layers, titled with the global figures."""
    from rich.table import Table

    ev, b = report.get("eval"), report["bytes"]
    title = f"quantization ({report['format']}, target {report['target']})"
    if ev:
        title += f": top1 {ev['top1']:.4f}, KL {ev['kl']:.5f} over {ev['tokens']} tokens"
    if report.get("budget"):
        budget = ",".join(f"{k}={v:g}" for k, v in report["budget"].items() if v is not None)
        title += f"; budget {budget} {'met' if report.get('met') else 'MISSED'}"
    t = Table(title=title, title_justify="left")
    for col in ("layer", "format", "activations", "weight MB", "SNR dB", "fell back"):
        t.add_column(col, justify="right" if col in ("weight MB", "SNR dB") else "left")
    for r in report["layers"]:
        snr = "-" if r["snr_db"] is None else f"{r['snr_db']:.1f}"
        t.add_row(r["name"], r["spec"], r["activations"], f"{r['weight_bytes'] / 1e6:.2f}", snr,
                  f"from {r['requested']}" if r["fell_back"] else "")
    t.caption = (f"linear weights {b['linear_quantized'] / 1e6:.1f} MB (f32 {b['linear_f32'] / 1e6:.1f} MB), "
                 f"{100 * b['fp4_param_fraction']:.0f}% of linear parameters in FP4, {report['fallbacks']} fallbacks")
    return t


def write_plot(report: dict[str, Any], path: Path) -> bool:
    """Per-layer SNR bars coloured by the final format; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = report["layers"]
    colors = {"nvfp4": "tab:blue", "mxfp4": "tab:cyan", "fp8": "tab:orange", "bf16": "tab:green"}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.12 * len(rows) + 2), 4))
    xs = range(len(rows))
    ax.bar(xs, [r["snr_db"] or 0.0 for r in rows], color=[colors.get(r["format"], "gray") for r in rows])
    for x, r in zip(xs, rows):
        if r["fell_back"]:
            ax.plot(x, (r["snr_db"] or 0.0) + 1, "v", color="red", markersize=3)
    ax.set_xlabel("linear layer (graph order)")
    ax.set_ylabel("output SNR on calibration data (dB)")
    ev = report.get("eval")
    ax.set_title(f"{report['format']}: " + (f"top1 {ev['top1']:.4f}, KL {ev['kl']:.4f}" if ev else "not evaluated"))
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
