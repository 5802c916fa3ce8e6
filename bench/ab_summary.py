"""Medians of alternating end-to-end runs per artifact variant: what an A/B of compile-time switches reports.

    python bench/ab_summary.py RUN_DIR [--format bf16] [--json OUT]

``RUN_DIR`` holds ``bench/bench_e2e.py --out`` JSON files named ``e2e_<i>_<variant>.json`` (what
``bench/run_ab_gpu.sh`` writes: run ``i`` of variant ``variant``, the variants' runs interleaved). Per variant and
per decode configuration (``1``, ``1:k8``, ``64``, ``64:k8``: batch, and ``kK`` for ``K`` decode steps a call) it
prints the median tokens/s with the runs' range, the median GPU ms a token (batch 1, from the breakdown), the
fraction of the weight-bandwidth bound (batch 1: the weight bytes a token reads, from the JSON's ``model`` section,
over ``HBM_BYTES_PER_S``, as bench_e2e's own table), and the variant's median against the first variant's, in one
table; ``--json`` writes the same figures.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

NAME = re.compile(r"^e2e_(\d+)_(.+)\.json$")
#: the decode configurations bench_e2e writes, in print order
CONFIGS = ("1", "1:k8", "64", "64:k8")
#: the H200's measured copy bandwidth (../shared/GPU.md), bench_e2e's bound
HBM_BYTES_PER_S = 4.19e12


def load(run_dir: Path, fmt: str) -> tuple[dict[str, list[dict[str, Any]]], float | None]:
    """(variant -> its runs' ``ingot[fmt]`` sections in run order, the batch-1 bound in tokens/s or None)."""
    found: list[tuple[int, str, dict[str, Any]]] = []
    bound = None
    for path in sorted(run_dir.iterdir()):
        m = NAME.match(path.name)
        if not m:
            continue
        data = json.loads(path.read_text())
        section = data.get("ingot", {}).get(fmt)
        if section is None:
            raise SystemExit(f"{path}: no ingot figures for format {fmt!r} (has {sorted(data.get('ingot', {}))})")
        found.append((int(m.group(1)), m.group(2), section))
        per_token = data.get("model", {}).get("weight_bytes_per_token", {}).get(fmt)
        if per_token:
            bound = HBM_BYTES_PER_S / float(per_token)
    if not found:
        raise SystemExit(f"{run_dir}: no e2e_<i>_<variant>.json files")
    runs: dict[str, list[dict[str, Any]]] = {}
    for _, variant, section in sorted(found, key=lambda f: f[0]):
        runs.setdefault(variant, []).append(section)
    return runs, bound


Figures = dict[str, dict[str, dict[str, float]]]


def _config_order(config: str) -> tuple[int, str]:
    """``CONFIGS``' order first, then any other batch (``BATCHES`` in run_ab_gpu.sh) by size."""
    return (CONFIGS.index(config), "") if config in CONFIGS else (len(CONFIGS) + int(config.split(":")[0]), config)


def summarize(runs: dict[str, list[dict[str, Any]]], bound: float | None = None) -> Figures:
    """Variant -> config -> {tok_s (median), lo, hi, runs, gpu_ms_token (batch 1), fraction_of_bound (batch 1,
    given ``bound`` tokens/s)}."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for variant, sections in runs.items():
        per: dict[str, dict[str, float]] = {}
        found = {c for sec in sections for c in sec.get("decode", {})}
        for config in sorted(found, key=_config_order):
            rows = [s["decode"][config] for s in sections if config in s.get("decode", {})]
            if not rows:
                continue
            tok = [float(r["tokens_per_s"]) for r in rows]
            fig = {"tok_s": statistics.median(tok), "lo": min(tok), "hi": max(tok), "runs": float(len(tok))}
            steps = [float(r["decode_steps"]) for r in rows if "decode_steps" in r]
            gpu = [float(r["breakdown"]["gpu_ms"]) / (steps[i] if i < len(steps) else 1.0)
                   for i, r in enumerate(rows) if r.get("breakdown", {}).get("gpu_ms")]
            if gpu:
                fig["gpu_ms_token"] = statistics.median(gpu)
            if bound and config.split(":")[0] == "1":
                fig["fraction_of_bound"] = fig["tok_s"] / bound
            per[config] = fig
        out[variant] = per
    return out


def table(figures: Figures) -> str:
    """The figures as text, each variant against the first one's medians."""
    variants = list(figures)
    base = figures[variants[0]]
    lines = [f"{'variant':<16} {'config':<6} {'tok/s (median)':>15} {'runs range':>19} {'GPU ms/token':>13} "
             f"{'of bound':>9} {'vs ' + variants[0]:>12}"]
    for variant in variants:
        for config, fig in figures[variant].items():
            gpu = f"{fig['gpu_ms_token']:.4f}" if "gpu_ms_token" in fig else "-"
            frac = f"{fig['fraction_of_bound']:.1%}" if "fraction_of_bound" in fig else "-"
            ref = base.get(config)
            rel = f"{fig['tok_s'] / ref['tok_s']:.3f}x" if ref else "-"
            rng = f"{fig['lo']:.1f}-{fig['hi']:.1f} ({int(fig['runs'])})"
            lines.append(f"{variant:<16} {config:<6} {fig['tok_s']:>15.1f} {rng:>19} {gpu:>13} {frac:>9} {rel:>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--format", default="bf16", help="the artifact format in the JSON files (bench_e2e --formats)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if not args.run_dir.is_dir():
        raise SystemExit(f"{args.run_dir}: not a directory")
    figures = summarize(*load(args.run_dir, args.format))
    print(table(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
