"""``ingot.compile(..., quant=...)``: the quantization step of a compile, between the passes and the
artifact writer. Resolves the config, the calibration and eval data and runs the accuracy gate
(``gate.quantize_model``); returns the quantized graph, the report files and the manifest entry."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..codegen.target import get_target
from ..ir.graph import Graph
from .config import QuantConfigError, load_config, parse_budget
from .gate import QuantizationError, quantize_model
from .report import summary, write_report

#: Eval tokens when an accuracy budget is given, and when only the report needs figures.
EVAL_TOKENS_BUDGET = 20480
EVAL_TOKENS_REPORT = 4096


def _encoder(tokenizer_dir: Path | None) -> Callable[[str], list[int]] | None:
    if tokenizer_dir is None or not (tokenizer_dir / "tokenizer.json").is_file():
        return None
    from ..runtime.tokenizer import Tokenizer

    tok = Tokenizer(tokenizer_dir)
    return lambda text: tok.encode(text, add_special_tokens=False)


def quantize_for_compile(
    graph: Graph,
    quant: str | None,
    *,
    target: str = "cpu",
    tokenizer_dir: Path | None = None,
    config: str | os.PathLike | Mapping[str, Any] | None = None,
    calib: str | os.PathLike | None = None,
    accuracy_budget: str | Mapping[str, float] | None = None,
    rounding: str | None = None,
    eval_tokens: int | None = None,
    workdir: Path | None = None,
    log: Callable[[str], None] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[Graph, dict[str, Path], dict[str, Any]]:
    """Quantize ``graph`` (serving form) for ``target``. Raises ``QuantizationError`` with a clear message
    when it cannot (bad config, no data, budget impossible)."""
    from ..quant import calibration as C
    from ..quant import eval_data as E

    try:
        cfg = load_config(config if not isinstance(config, os.PathLike) else Path(config), default=quant,
                          target=target)
        if accuracy_budget is not None:
            cfg.budget = parse_budget(accuracy_budget)
        if rounding is not None:
            cfg.rounding = rounding
            cfg.validate()
    except QuantConfigError as e:
        raise QuantizationError(str(e)) from None
    encode = _encoder(tokenizer_dir)
    cal = cfg.calibration
    n_calib = int(cal.get("tokens", E.CALIB_TOKENS))
    if calib is not None:
        try:
            seqs = C.load_calibration_file(calib, encode)
        except ValueError as e:
            raise QuantizationError(str(e)) from None
        calib_seqs = _limit(seqs, n_calib)
    elif encode is not None:
        calib_seqs = [E.calibration_tokens(encode, min(n_calib, E.CALIB_TOKENS))]
    else:
        calib_seqs = None
    n_eval = eval_tokens if eval_tokens is not None else cfg.eval_tokens
    if n_eval is None:
        n_eval = EVAL_TOKENS_BUDGET if cfg.budget is not None else EVAL_TOKENS_REPORT
    tokens = E.eval_tokens(encode, n_eval) if encode is not None and n_eval > 0 else None
    result = quantize_model(graph, cfg, calib_sequences=calib_seqs, eval_tokens=tokens,
                            calib_method=str(cal.get("method", "amax")), log=log, progress=progress)
    qgraph = result.graph
    if get_target(target).is_gpu:  # the CUDA kernels' layouts: per-channel FP8 scales, sm_100 FP4 scale atoms
        from ..passes import PassContext, run_passes

        run_passes(qgraph, ["fp8-channel-scales", *(["pack-sm100"] if target == "b200" else [])],
                   PassContext(target=target))
    directory = workdir or Path(tempfile.mkdtemp(prefix="ingot-quant-"))
    files = write_report(result.report, directory)
    return qgraph, files, {"quantization": summary(result.report)}


def _limit(seqs: list[np.ndarray], n: int) -> list[np.ndarray]:
    out, left = [], n
    for s in seqs:
        if left <= 0:
            break
        out.append(np.asarray(s, np.int64)[:left])
        left -= len(out[-1])
    return out
