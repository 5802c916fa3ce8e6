"""A request's state as the scheduler sees it: its tokens, how many of them are in the KV cache, its status.

The tokens of a request are its prompt followed by what it has generated so far::

    all_token_ids:  | prompt (num_prompt_tokens)          | output (generated)   |
                    |<---- num_computed_tokens ---->|                            |
                      K/V already in the cache        still to compute

``num_computed_tokens`` counts the leading tokens whose K/V the cache holds (prefix-cache hits
included). Each step the scheduler gives a request some of the tokens in
``[num_computed_tokens, num_tokens)``; a request samples a new token only in the step that brings
``num_computed_tokens`` up to ``num_tokens``. Preemption (by recompute) resets it to 0.

The sampling parameters are opaque here: the scheduler only reads the stopping fields
(``max_tokens``, ``eos_token_id``, ``stop_token_ids``, ``min_tokens``) and passes
``sampling_params`` through to the engine untouched. Stop *strings* are the detokenizer's job; it
ends a request through ``Scheduler.finish_request``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Sequence
from typing import Any


class RequestStatus(enum.IntEnum):
    """Where a request is. Every status after ``PREEMPTED`` is final."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # back in the waiting queue, its blocks freed; will recompute
    FINISHED_STOPPED = 3  # eos, a stop token id, or a stop string (external finish)
    FINISHED_LENGTH = 4  # max_tokens or max_model_len
    FINISHED_ABORTED = 5  # cancelled by the client

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED


#: The OpenAI ``finish_reason`` of each final status.
FINISH_REASONS: dict[RequestStatus, str] = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """One sequence: prompt token ids, generated token ids, cache progress, status and ordering keys.

    ``n > 1`` is n requests: the engine adds n of them sharing a prompt (the prefix cache shares
    the prompt's blocks within one step) or forks children off a parent (``Scheduler.fork_request``).
    """

    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "all_token_ids",
        "output_token_ids",
        "num_prompt_tokens",
        "num_computed_tokens",
        "status",
        "priority",
        "arrival_time",
        "sampling_params",
        "max_tokens",
        "min_tokens",
        "eos_token_id",
        "stop_token_ids",
        "block_hashes",
        "num_cached_tokens",
        "num_preemptions",
        "stop_reason",
        "_seq",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int = 16,
        min_tokens: int = 0,
        eos_token_id: int | None = None,
        stop_token_ids: Iterable[int] = (),
        priority: int = 0,
        arrival_time: float | None = None,
        sampling_params: Any = None,
    ) -> None:
        if len(prompt_token_ids) == 0:
            raise ValueError(f"request {request_id!r}: empty prompt")
        if max_tokens < 1:
            raise ValueError(f"request {request_id!r}: max_tokens must be >= 1, got {max_tokens}")
        self.request_id = request_id
        self.prompt_token_ids: list[int] = [int(t) for t in prompt_token_ids]
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.priority = priority
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.sampling_params = sampling_params
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.eos_token_id = eos_token_id
        self.stop_token_ids: frozenset[int] = frozenset(int(t) for t in stop_token_ids)
        #: chained hashes of the full blocks of ``all_token_ids`` computed so far (see block_pool)
        self.block_hashes: list[int] = []
        #: prompt tokens found in the prefix cache when first scheduled (-1: not scheduled yet)
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        #: the stop token id or stop string that ended the request, if any
        self.stop_reason: int | str | None = None
        self._seq = 0  # tie-breaker among equal arrival times, set by the scheduler

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def append_output_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
        self.output_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
