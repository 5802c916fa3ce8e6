"""Sampling: per-request parameters and a batched sampler over a step's logits (numpy, CPU).

One step's work for ``S`` sequences is ``Sampler()(logits[S, vocab], seqs)``. Each row goes
through, in this order (HF transformers' order for the warpers)::

    logits -> repetition penalty -> frequency/presence penalties      (the "penalized" logits)
           -> / temperature                                           (the "processed" logits)
           -> top-k -> top-p -> min-p -> sample from what is left

* ``temperature < 1e-5`` (``GREEDY_EPS``) is greedy: argmax of the penalized logits; top-k/p and
  min-p cannot change an argmax, so they are not applied.
* top-p is taken over the distribution renormalized after top-k (as HF and vLLM do); min-p keeps
  tokens with ``p >= min_p * p_max``. Since min-p compares a ratio to the most likely token, which
  every filter keeps, the kept set is the intersection of the three filters.
* Ties in value are broken by the lower token id, so the kept set is a function of the row alone.
* Logprobs ("processed" mode, as vLLM's ``logprobs_mode="processed_logprobs"`` names it) are the
  log-softmax of the processed logits: after penalties and temperature, before top-k/top-p/min-p
  truncation. Greedy rows report the log-softmax of the penalized logits (temperature 1).

Determinism: every random row draws exactly one uniform from its own ``numpy.random.Generator``
per step (inverse-CDF sampling over the kept tokens, best first on top-k/top-p rows and in
vocabulary order on the others), and all arithmetic is row-local, so a seeded request produces
the same tokens whatever else is in the batch. Greedy rows draw nothing.

Penalties follow OpenAI/vLLM and HF semantics: ``repetition_penalty`` divides positive logits and
multiplies negative ones for every token seen in prompt + output; ``frequency_penalty`` subtracts
``penalty * count`` and ``presence_penalty`` subtracts ``penalty`` for each token present in the
output so far.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

GREEDY_EPS = 1e-5
MAX_LOGPROBS = 20
MAX_N = 128
_U64 = (1 << 64) - 1
# Candidate search works on per-block maxima: the k-th largest block maximum is a threshold that at
# least k tokens reach, found without a partition of the whole row (argpartition costs ~2 ms a row).
_BLOCK = 128
# blocks whose tokens are tried first for a top-p nucleus
_TOP_P_BLOCKS = 32
# the mass histogram for larger nuclei: buckets over [0, span) of (max logit - logit)
_MASS_BUCKETS = 2048
_MASS_SPAN = 64.0
_PAD_KEY = np.uint64(_U64)


class SamplingParamsError(ValueError):
    """A sampling parameter is out of range; the message starts with the field's name."""


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks of sampling and stopping. Validated on construction.

    ``top_k`` 0 or -1 is off; ``max_tokens`` None runs to the model's context; ``logprobs`` None
    returns none, 0 only the chosen token's, ``k`` also the top ``k`` alternatives; ``seed`` None
    draws from OS entropy. ``stop`` accepts a string or a sequence of strings and is stored as a
    tuple; the output stops before (and excludes) the first stop string found.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    # derived in __post_init__; read by the sampler every step
    greedy: bool = field(init=False, repr=False, compare=False)
    truncates: bool = field(init=False, repr=False, compare=False)
    has_penalties: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        def fail(name: str, why: str) -> None:
            raise SamplingParamsError(f"{name}: {why}, got {getattr(self, name)!r}")

        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            fail("n", f"must be an integer in [1, {MAX_N}]")
        if not _is_real(self.temperature) or self.temperature < 0:
            fail("temperature", "must be a finite number >= 0")
        if not _is_int(self.top_k) or self.top_k < -1:
            fail("top_k", "must be an integer >= 1, or 0 or -1 to turn it off")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            fail("top_p", "must be in (0, 1]")
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:
            fail("min_p", "must be in [0, 1]")
        if not _is_real(self.repetition_penalty) or self.repetition_penalty <= 0:
            fail("repetition_penalty", "must be a finite number > 0")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_real(v) or not -2 <= v <= 2:
                fail(name, "must be in [-2, 2]")
        if self.seed is not None and not _is_int(self.seed):
            fail("seed", "must be an integer or None")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            fail("max_tokens", "must be an integer >= 1 or None")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if stop is None:
            stop = ()
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            fail("stop", "must be a non-empty string or a sequence of non-empty strings")
        object.__setattr__(self, "stop", tuple(stop))
        ids = () if self.stop_token_ids is None else self.stop_token_ids
        if not isinstance(ids, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in ids):
            fail("stop_token_ids", "must be a sequence of non-negative integers")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "must be a bool")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            fail("logprobs", f"must be an integer in [0, {MAX_LOGPROBS}] or None")

        greedy = self.temperature < GREEDY_EPS
        object.__setattr__(self, "greedy", greedy)
        object.__setattr__(self, "truncates", not greedy and (self.top_k > 0 or self.top_p < 1))
        object.__setattr__(self, "has_penalties", self.repetition_penalty != 1 or self.presence_penalty != 0
                           or self.frequency_penalty != 0)

    def make_generator(self, index: int = 0) -> np.random.Generator:
        """The RNG for sample ``index`` of ``n``: seeded from (seed, index), or fresh OS entropy."""
        if self.seed is None:
            return np.random.default_rng()
        return np.random.default_rng([int(self.seed) & _U64, index])


class SamplingSequence(Protocol):
    """What the sampler reads of one running sequence (a request satisfies it as it is)."""

    @property
    def sampling_params(self) -> SamplingParams: ...
    @property
    def generator(self) -> np.random.Generator | None: ...
    @property
    def prompt_token_ids(self) -> Sequence[int]: ...
    @property
    def output_token_ids(self) -> Sequence[int]: ...


@dataclass
class SequenceState:
    """A plain :class:`SamplingSequence`: tests and callers without a request object use it."""

    sampling_params: SamplingParams
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    generator: np.random.Generator | None = None

    def __post_init__(self) -> None:
        if self.generator is None:
            self.generator = self.sampling_params.make_generator()


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token's logprob and rank (1 = most likely) and the top alternatives, best first."""

    token_id: int
    logprob: float
    rank: int
    top_token_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass
class SamplerOutput:
    token_ids: np.ndarray  # int64 [S]
    logprobs: list[TokenLogprobs | None]  # per row; None where the row did not ask


def apply_penalties(logits: np.ndarray, params: Sequence[SamplingParams], prompt_ids: Sequence[Sequence[int]],
                    output_ids: Sequence[Sequence[int]]) -> None:
    """Apply repetition, then frequency and presence penalties to ``logits`` [R, V] in place.

    Rows without penalties are left alone. All other rows go together: one (row, token) key per
    history entry, deduplicated (and counted) by one sort.
    """
    R, V = logits.shape
    rep = np.array([p.repetition_penalty for p in params], dtype=np.float32)
    freq = np.array([p.frequency_penalty for p in params], dtype=np.float32)
    pres = np.array([p.presence_penalty for p in params], dtype=np.float32)
    rep_rows = np.flatnonzero(rep != 1)
    if len(rep_rows):
        keys = _unique_counts(_history_keys(rep_rows, [prompt_ids[r] for r in rep_rows], V, "prompt_token_ids"),
                              _history_keys(rep_rows, [output_ids[r] for r in rep_rows], V, "output_token_ids"))[0]
        r, t = np.divmod(keys, V)
        x = logits[r, t]
        logits[r, t] = np.where(x > 0, x / rep[r], x * rep[r])
    fp_rows = np.flatnonzero((freq != 0) | (pres != 0))
    if len(fp_rows):
        keys, counts = _unique_counts(_history_keys(fp_rows, [output_ids[r] for r in fp_rows], V, "output_token_ids"))
        r, t = np.divmod(keys, V)
        logits[r, t] -= freq[r] * counts.astype(np.float32) + pres[r]


def _history_keys(rows: np.ndarray, histories: Sequence[Sequence[int]], vocab: int, name: str) -> np.ndarray:
    arrays = [np.asarray(h, dtype=np.int64).reshape(-1) for h in histories]
    ids = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
    _check_ids(ids, vocab, name)
    return np.repeat(rows.astype(np.int64), [len(a) for a in arrays]) * vocab + ids


def _unique_counts(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k = np.sort(np.concatenate(keys))
    if not len(k):
        return k, k
    first = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]]))
    return k[first], np.diff(np.append(first, len(k)))


def _check_ids(ids: np.ndarray, vocab: int, name: str) -> None:
    if len(ids) and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"{name}: token ids must be in [0, {vocab}), got {ids.min()}..{ids.max()}")


def _desc_keys(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """uint64 keys whose ascending order is (value descending, token id ascending); float32 values."""
    bits = (values.astype(np.float32) + np.float32(0)).view(np.int32).astype(np.int64)  # + 0: -0.0 -> 0.0
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # monotone in the float's value
    return ((0x7FFFFFFF - ordered).astype(np.uint64) << np.uint64(32)) | ids.astype(np.uint64)


def _candidates(x: np.ndarray, threshold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the ids of tokens with ``x >= threshold``, best first (ties: lower id first).

    Returns ``ids`` [R, C] (padding 0) and ``valid`` [R, C]. Being a threshold on value, the set
    holds every token tied with any member, so the order of its prefix is that of a full sort.
    """
    R, V = x.shape
    flat = np.flatnonzero(x >= threshold[:, None])
    rows, cols = np.divmod(flat, V)
    counts = np.bincount(rows, minlength=R)
    C = int(counts.max())
    keys = np.full((R, C), _PAD_KEY, dtype=np.uint64)
    pos = np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)
    keys[rows, pos] = _desc_keys(x.reshape(-1)[flat], cols)
    keys.sort(axis=1)
    valid = np.arange(C)[None] < counts[:, None]
    ids = np.where(valid, (keys & np.uint64(0xFFFFFFFF)).astype(np.int64), 0)
    return ids, valid


def _kth_block_max(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per row, the ``k``-th largest block maximum (-inf where ``k`` exceeds the blocks): >= k tokens reach it."""
    V = x.shape[1]
    block_max = np.maximum.reduceat(x, np.arange(0, V, _BLOCK), axis=1)
    nb = block_max.shape[1]
    ranked = -np.sort(-block_max, axis=1)
    t = ranked[np.arange(len(k)), np.clip(k, 1, nb) - 1]
    return np.where(k <= nb, t, -np.inf).astype(np.float32)


def _inverse_cdf(weights: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per row, the first index whose cumulative weight exceeds ``u * total``; zero weights never win.

    Long rows go by blocks (block sums, then a cumsum inside one block): a cumsum over a whole
    49k-token row costs ~0.5 ms, the block sums a tenth of it.
    """
    R, C = weights.shape
    rows = np.arange(R)
    if C <= 4 * _BLOCK:
        cum = np.cumsum(weights, axis=1, dtype=np.float64)
        idx = (cum <= (u * cum[:, -1])[:, None]).sum(axis=1)
        return _clamp_to_nonzero(weights, idx)
    starts = np.arange(0, C, _BLOCK)
    block_sum = np.add.reduceat(weights, starts, axis=1).astype(np.float64)
    block_cum = np.cumsum(block_sum, axis=1)
    target = u * block_cum[:, -1]
    b = _clamp_to_nonzero(block_sum, (block_cum <= target[:, None]).sum(axis=1))
    cols = starts[b][:, None] + np.arange(_BLOCK)[None]
    inner = np.where(cols < C, weights[rows[:, None], np.minimum(cols, C - 1)], 0)
    before = np.where(b > 0, block_cum[rows, b - 1], 0.0)
    cum = before[:, None] + np.cumsum(inner, axis=1, dtype=np.float64)
    i = _clamp_to_nonzero(inner, (cum <= target[:, None]).sum(axis=1))
    return starts[b] + i


def _clamp_to_nonzero(weights: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``idx``, except where rounding ran it past the row's last nonzero weight: that weight's index."""
    over = idx >= weights.shape[1]
    over[~over] = weights[np.flatnonzero(~over), idx[~over]] <= 0
    for r in np.flatnonzero(over):
        idx[r] = np.flatnonzero(weights[r] > 0)[-1]
    return idx


class Sampler:
    """Samples one token per row of a step's logits; see the module docstring for the semantics.

    ``logits`` [S, V] (float32) is not modified. Rows whose sequence has no generator draw from
    the sampler's own, freshly seeded one, so only seeded requests are reproducible.
    """

    def __init__(self) -> None:
        self._fallback_rng = np.random.default_rng()

    def __call__(self, logits: np.ndarray, seqs: Sequence[SamplingSequence]) -> SamplerOutput:
        if logits.ndim != 2 or logits.shape[0] != len(seqs):
            raise ValueError(f"logits: expected [{len(seqs)}, vocab], got {list(logits.shape)}")
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        S = logits.shape[0]
        params = [s.sampling_params for s in seqs]
        tokens = np.zeros(S, dtype=np.int64)
        logprobs: list[TokenLogprobs | None] = [None] * S
        greedy = np.array([p.greedy for p in params], dtype=bool)
        truncates = np.array([p.truncates for p in params], dtype=bool)
        for rows, kind in ((np.flatnonzero(greedy), "greedy"), (np.flatnonzero(truncates), "truncated"),
                           (np.flatnonzero(~greedy & ~truncates), "full")):
            if not len(rows):
                continue
            ps = [params[r] for r in rows]
            x = _processed(logits, rows, seqs, ps)
            if kind == "greedy":
                tok = np.argmax(x, axis=1)
            else:
                u = np.array([self._uniform(seqs[r]) for r in rows])
                tok = _sample_truncated(x, ps, u) if kind == "truncated" else _sample_full(x, ps, u)
            tokens[rows] = tok
            want = [i for i, p in enumerate(ps) if p.logprobs is not None]
            if want:
                for i, lp in zip(want, _logprobs(x[want], tok[want], [ps[i].logprobs for i in want])):
                    logprobs[rows[i]] = lp
        return SamplerOutput(tokens, logprobs)

    def _uniform(self, seq: SamplingSequence) -> float:
        rng = seq.generator if seq.generator is not None else self._fallback_rng
        return float(rng.random())


def _processed(logits: np.ndarray, rows: np.ndarray, seqs: Sequence[SamplingSequence],
               params: Sequence[SamplingParams]) -> np.ndarray:
    """The rows' logits after penalties and temperature: a copy, or a view when nothing changes them."""
    pen = [i for i, p in enumerate(params) if p.has_penalties]
    temps = np.array([1.0 if p.greedy else p.temperature for p in params], dtype=np.float32)
    scale = bool((temps != 1).any())
    whole = len(rows) == logits.shape[0]
    if not pen and not scale:
        return logits if whole else logits[rows]
    x = logits.copy() if whole else logits[rows]
    if pen:
        apply_penalties(x, params, [seqs[r].prompt_token_ids for r in rows], [seqs[r].output_token_ids for r in rows])
    if scale:
        x /= temps[:, None]
    return x


def _sample_full(x: np.ndarray, params: Sequence[SamplingParams], u: np.ndarray) -> np.ndarray:
    """Rows without top-k/top-p: inverse CDF over the whole vocabulary, min-p as a mask."""
    w = x - x.max(axis=1, keepdims=True)
    np.exp(w, out=w)  # the largest weight is exactly 1, so min-p compares w itself
    min_p = np.array([p.min_p for p in params], dtype=np.float32)
    if (min_p > 0).any():
        w[w < min_p[:, None]] = 0
    return _inverse_cdf(w, u)


def _sample_truncated(x: np.ndarray, params: Sequence[SamplingParams], u: np.ndarray) -> np.ndarray:
    """Rows with top-k and/or top-p: sort only candidates above a threshold, mask, sample.

    A top-k row's threshold is reached by at least k tokens, so its kept set is exact at once. A
    top-p-only row's candidates are exact when their mass reaches top_p (the next token's
    exclusive cumulative probability is then >= top_p). Its first threshold comes from block
    maxima (enough for a peaked distribution), the second from a histogram of the mass over
    logit buckets, the last takes the whole row.
    """
    R, V = x.shape
    top_k = np.array([p.top_k if p.top_k > 0 else V for p in params], dtype=np.int64).clip(max=V)
    top_p = np.array([p.top_p for p in params], dtype=np.float64)
    min_p = np.array([p.min_p for p in params], dtype=np.float64)
    m = x.max(axis=1)
    over_vocab = top_k >= V  # top-p normalizes over the whole vocabulary on these rows
    z_full = np.zeros(R)
    w_full = None
    if over_vocab.any():
        w_full = np.exp(x[over_vocab] - m[over_vocab, None])
        z_full[over_vocab] = w_full.sum(axis=1, dtype=np.float64)
        full_row = np.cumsum(over_vocab) - 1  # row of x -> row of w_full
    out = np.zeros(R, dtype=np.int64)
    pending = np.arange(R)
    for attempt in range(3):
        xs = x if len(pending) == R else x[pending]
        if attempt == 0:
            t = _kth_block_max(xs, np.where(over_vocab[pending], _TOP_P_BLOCKS, top_k[pending]))
        elif attempt == 1:
            t = _mass_threshold(xs, m[pending], w_full[full_row[pending]], top_p[pending])
        else:
            t = np.full(len(pending), -np.inf, np.float32)
        ids, valid = _candidates(xs, t)
        vals = np.take_along_axis(xs, ids, axis=1).astype(np.float64)
        w = np.exp(vals - m[pending, None]) * valid
        in_k = np.arange(ids.shape[1])[None] < top_k[pending, None]
        wk = w * in_k
        z = np.where(over_vocab[pending], z_full[pending], wk.sum(axis=1))
        p = wk / z[:, None]
        cum = np.cumsum(p, axis=1)
        keep = in_k & valid & (cum - p < top_p[pending, None]) & (w >= min_p[pending, None])
        keep[:, 0] = True
        exact = ~over_vocab[pending] | ~np.isfinite(t) | (cum[:, -1] >= top_p[pending])
        idx = _inverse_cdf(w * keep, u[pending])
        out[pending[exact]] = ids[np.flatnonzero(exact), idx[exact]]
        pending = pending[~exact]
        if not len(pending):
            break
    return out


def _mass_threshold(x: np.ndarray, m: np.ndarray, w: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """Per row, a logit threshold above which the mass reaches ``top_p``: a histogram of the weights
    ``w`` over buckets of ``m - x``, summed from the top. -inf where the crossing is in the last bucket.
    """
    R = len(x)
    scale = np.float32(_MASS_BUCKETS / _MASS_SPAN)
    b = np.minimum((m[:, None] - x) * scale, _MASS_BUCKETS - 1).astype(np.int64)
    b += np.arange(R)[:, None] * _MASS_BUCKETS
    mass = np.bincount(b.reshape(-1), weights=w.reshape(-1), minlength=R * _MASS_BUCKETS).reshape(R, -1)
    cum = np.cumsum(mass, axis=1)
    j = (cum < top_p[:, None] * cum[:, -1:]).sum(axis=1)
    # one bucket of margin below the crossing absorbs rounding between the two mass sums
    t = m - (j + 2) / scale
    return np.where(j + 2 < _MASS_BUCKETS, t, -np.inf).astype(np.float32)


def _logprobs(x: np.ndarray, tokens: np.ndarray, nums: Sequence[int]) -> list[TokenLogprobs]:
    """log-softmax of rows ``x`` at ``tokens``, with ranks and each row's top ``nums[i]`` alternatives."""
    R, V = x.shape
    m = x.max(axis=1)
    lse = m + np.log(np.exp(x - m[:, None]).sum(axis=1, dtype=np.float64))
    chosen = x[np.arange(R), tokens]
    ranks = (x > chosen[:, None]).sum(axis=1) + 1
    n = np.minimum(np.asarray(nums, dtype=np.int64), V)
    top_ids = np.zeros((R, 0), dtype=np.int64)
    if n.max() > 0:
        top_ids, _ = _candidates(x, _kth_block_max(x, np.maximum(n, 1)))
    out = []
    for i in range(R):
        ids = top_ids[i, : n[i]]
        out.append(TokenLogprobs(int(tokens[i]), float(chosen[i] - lse[i]), int(ranks[i]),
                                 tuple(int(t) for t in ids), tuple(float(v) for v in x[i, ids] - lse[i])))
    return out
