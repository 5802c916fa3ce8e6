"""JSON between the router and the workers: sampling parameters, output deltas, worker info.

Outputs travel as deltas (this step's tokens, text and logprobs); the router keeps the running totals
(``OutputAccumulator``), so a long stream costs O(tokens), not O(tokens^2).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..engine import CompletionOutput, RequestOutput
from ..sampling import SamplingParams, TokenLogprobs

_PARAM_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams) if f.init)


def params_to_json(p: SamplingParams) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k in _PARAM_FIELDS for v in (getattr(p, k),)}


def params_from_json(d: Any) -> SamplingParams:
    """Validated by ``SamplingParams`` itself; unknown keys are refused."""
    if not isinstance(d, dict) or set(d) - set(_PARAM_FIELDS):
        raise ValueError(f"bad sampling params (known fields: {list(_PARAM_FIELDS)})")
    d = dict(d)
    for k in ("stop", "stop_token_ids"):
        if isinstance(d.get(k), list):
            d[k] = tuple(d[k])
    return SamplingParams(**d)


def logprobs_to_json(lps: list[TokenLogprobs] | None) -> list[list[Any]] | None:
    if lps is None:
        return None
    return [[lp.token_id, lp.logprob, lp.rank, list(lp.top_token_ids), list(lp.top_logprobs)] for lp in lps]


def logprobs_from_json(d: Any) -> list[TokenLogprobs] | None:
    if d is None:
        return None
    return [TokenLogprobs(int(t), float(lp), int(r), tuple(int(i) for i in ti), tuple(float(v) for v in tl))
            for t, lp, r, ti, tl in d]


def delta_to_json(out: RequestOutput, finished: bool | None = None) -> dict[str, Any]:
    """One engine output as a delta (one completion: disaggregated requests have ``n == 1``)."""
    c = out.outputs[0] if out.outputs else None
    return {
        "finished": out.finished if finished is None else finished,
        "num_cached_tokens": out.num_cached_tokens,
        "error": out.error,
        "token_ids": [] if c is None else list(c.delta_token_ids),
        "text": "" if c is None else c.delta_text,
        "logprobs": None if c is None else logprobs_to_json(c.delta_logprobs),
        "finish_reason": None if c is None else c.finish_reason,
        "stop_reason": None if c is None else c.stop_reason,
    }


class OutputAccumulator:
    """Turns a request's deltas (from the prefill worker, then the decode worker) into ``RequestOutput``s."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], arrival_time: float) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.arrival_time = arrival_time
        self.first_token_time: float | None = None
        self.token_ids: list[int] = []
        self.text = ""
        self.logprobs: list[TokenLogprobs] | None = None
        self.num_cached_tokens = 0

    def add(self, d: dict[str, Any], now: float, final: bool | None = None) -> RequestOutput:
        toks = [int(t) for t in d.get("token_ids") or ()]
        text = str(d.get("text") or "")
        lps = logprobs_from_json(d.get("logprobs"))
        self.token_ids.extend(toks)
        self.text += text
        if lps is not None:
            self.logprobs = (self.logprobs or []) + lps
        if toks and self.first_token_time is None:
            self.first_token_time = now
        if d.get("num_cached_tokens"):
            self.num_cached_tokens = int(d["num_cached_tokens"])
        finished = bool(d.get("finished")) if final is None else final
        c = CompletionOutput(index=0, text=self.text, token_ids=list(self.token_ids),
                             logprobs=list(self.logprobs) if self.logprobs is not None else None,
                             finish_reason=d.get("finish_reason"), stop_reason=d.get("stop_reason"),
                             delta_text=text, delta_token_ids=toks, delta_logprobs=lps)
        return RequestOutput(self.request_id, self.prompt_token_ids, [c], finished, self.num_cached_tokens,
                             self.arrival_time, self.first_token_time)
