"""Measure SmolLM2-135M quantized against itself: top-1 agreement and mean KL of next-token
distributions on the stdlib-docstring eval set (``ingot.quant.eval_data``), weight bytes.

    python bench/quant_smollm2.py fp8 nvfp4:wo mxfp4:wo nvfp4:w4a4 mxfp4:w4a4 --tokens 20480
    python bench/quant_smollm2.py nvfp4 --budget top1=0.95
    python bench/quant_smollm2.py fp8 nvfp4:wo --rounding gptq
    python bench/quant_smollm2.py fp8 nvfp4:w4a4 --rounding gptq --smooth 0.5 0.8   # SmoothQuant alphas

Every spec is measured once per ``--smooth`` alpha (``none``: without smoothing), reusing the
reference's hidden states.

Writes one JSON line per spec to stdout (the figures in docs/QUANTIZATION.md).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from ingot.api import _tokenizer_files, import_model, resolve_model
from ingot.quant import eval_data as E
from ingot.quant.config import load_config
from ingot.quant.evaluate import Evaluator
from ingot.quant.gate import quantize_model
from ingot.runtime.tokenizer import Tokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--tokens", type=int, default=20480)
    ap.add_argument("--budget", default=None)
    ap.add_argument("--kv-cache", default=None)
    ap.add_argument("--rounding", default="nearest", choices=["nearest", "gptq"])
    ap.add_argument("--smooth", nargs="+", default=["none"], metavar="ALPHA",
                    help="SmoothQuant alpha(s) for activation-quantized layers; 'none': off")
    args = ap.parse_args()
    src = resolve_model("smollm2")
    graph = import_model(src)
    tmp = Path(tempfile.mkdtemp())
    _tokenizer_files(src, tmp)
    tok = Tokenizer(tmp)

    def encode(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False)

    calib = [E.calibration_tokens(encode)]
    ev = Evaluator(graph, E.eval_tokens(encode, args.tokens))
    alphas = [None if a == "none" else float(a) for a in args.smooth]
    for spec, alpha in [(s, a) for s in args.specs for a in alphas]:
        t0 = time.perf_counter()
        cfg = load_config({"default": spec, "kv_cache": args.kv_cache, "accuracy_budget": args.budget,
                           "rounding": args.rounding, "smooth": alpha})
        r = quantize_model(graph, cfg, calib_sequences=calib, eval_tokens=None, evaluator=ev,
                           log=lambda s: print(s, flush=True))
        rep = r.report
        print(json.dumps({"spec": spec, "rounding": args.rounding, "smooth": alpha, "budget": args.budget,
                          "kv_cache": args.kv_cache, **rep["eval"],
                          "fallbacks": rep["fallbacks"], "bytes": rep["bytes"],
                          "fell_back": [(x["name"], x["spec"]) for x in rep["layers"] if x["fell_back"]],
                          "wall_s": round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
