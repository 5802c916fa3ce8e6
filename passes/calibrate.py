"""``calibrate``: run the unquantized serving-form graph on the CPU backend over calibration data and
record activation ranges in ``graph.meta["quant_calibration"]`` (per linear: input amax and the clip
value of each static activation scale; per attention layer: K/V amax per KV head).

Runs after: ``llm-lower`` or a checkpoint frontend; before ``quantize``.
Needs: the serving form (``graph.meta["kv_cache"]``) and unquantized ``linear`` nodes.
Preserves: the graph itself (only ``meta`` changes).

Options (``ctx.option("calibrate", ...)``):

- ``sequences``: token-id arrays; or ``data``: a ``.npz``/``.npy``/``.txt``/``.jsonl`` file
  (``ingot.quant.calibration.load_calibration_file``) with ``tokenizer``: a directory with
  ``tokenizer.json`` for text; without either, the built-in stdlib-docstring calibration set
  (``ingot.quant.eval_data``, needs ``tokenizer``).
- ``method``: ``amax`` (default), ``percentile`` (``percentile``: 99.99) or ``mse``.
- ``tokens``: most calibration tokens used (2048); ``seq_len``: tokens per sequence (512).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir.graph import Graph
from ..quant import calibration as C
from ..quant.config import parse_spec
from .manager import Pass, PassContext, PassError, register_pass
from .quantize import resolve_config


def calibration_sequences(ctx: PassContext) -> list[np.ndarray]:
    """The calibration token sequences the ``calibrate`` options name, cut to ``tokens`` in total."""
    seqs = ctx.option("calibrate", "sequences")
    data = ctx.option("calibrate", "data")
    tok_dir = ctx.option("calibrate", "tokenizer")
    limit = int(ctx.option("calibrate", "tokens", 2048))
    encode = None
    if tok_dir is not None:
        from ..runtime.tokenizer import Tokenizer

        tok = Tokenizer(tok_dir)

        def encode(text: str) -> list[int]:
            return tok.encode(text, add_special_tokens=False)
    try:
        if seqs is None and data is not None:
            seqs = C.load_calibration_file(data, encode)
        elif seqs is None:
            if encode is None:
                raise PassError("calibrate: no calibration data (options 'sequences' or 'data') and no tokenizer "
                                "for the built-in set")
            from ..quant.eval_data import calibration_tokens

            seqs = [calibration_tokens(encode, min(limit, 2048))]
    except ValueError as e:
        raise PassError(str(e)) from None
    out: list[np.ndarray] = []
    left = limit
    for s in seqs:
        s = np.asarray(s, np.int64).reshape(-1)[:left]
        if len(s):
            out.append(s)
            left -= len(s)
        if left <= 0:
            break
    return out


def candidate_specs(ctx: PassContext) -> Sequence:
    cfg = resolve_config(ctx)
    labels = {cfg.default, *cfg.layers.values(), *(ctx.option("quantize", "plan") or {}).values()}
    return [parse_spec(s, cfg.target) if isinstance(s, str) else s for s in labels]


@register_pass
class Calibrate(Pass):
    __doc__ = __doc__
    name = "calibrate"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        if not isinstance(graph.meta.get("kv_cache"), dict):
            raise PassError("calibrate runs serving-form graphs (LLM checkpoints or lowered decoders)")
        method = ctx.option("calibrate", "method", "amax")
        if method not in C.METHODS:
            raise PassError(f"calibrate: unknown method {method!r}; known: {', '.join(C.METHODS)}")
        seqs = calibration_sequences(ctx)
        stats = C.collect(graph, seqs, seq_len=int(ctx.option("calibrate", "seq_len", 512)))
        graph.meta["quant_calibration"] = C.summary(stats, candidate_specs(ctx), method,
                                                    float(ctx.option("calibrate", "percentile", 99.99)))
        self.stats["tokens"] = stats.tokens
        return False
