"""Recurrent ops: rnn, gru, lstm (ONNX semantics: forward/reverse/bidirectional, layouts 0 and 1,
sequence lengths, initial states, clip, custom activations, LSTM peepholes and input_forget).

Each op always produces every ONNX output (``Y``, ``Y_h`` and for LSTM ``Y_c``); the importer binds the
ones the model uses. With ``layout=0`` ``X`` is ``(seq, batch, input)`` and ``Y`` is
``(seq, num_directions, batch, hidden)``; with ``layout=1`` the batch comes first.
Steps at or past a sequence's length leave its state unchanged and output zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import UNKNOWN, Dim, TensorType

_ALPHA_DEFAULTS: dict[str, tuple[float | None, float | None]] = {
    "relu": (None, None), "tanh": (None, None), "sigmoid": (None, None), "softsign": (None, None),
    "softplus": (None, None), "affine": (1.0, 0.0), "leakyrelu": (0.01, None),
    "thresholdedrelu": (1.0, None), "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}


def _activation(name: str, alpha: float | None, beta: float | None) -> Callable[[np.ndarray], np.ndarray]:
    n = name.lower()
    a = alpha if alpha is not None else _ALPHA_DEFAULTS[n][0]
    b = beta if beta is not None else _ALPHA_DEFAULTS[n][1]
    if n == "sigmoid":
        return lambda x: 1.0 / (1.0 + np.exp(-x))
    if n == "tanh":
        return np.tanh
    if n == "relu":
        return lambda x: np.maximum(x, 0)
    if n == "affine":
        return lambda x: a * x + b
    if n == "leakyrelu":
        return lambda x: np.where(x >= 0, x, a * x)
    if n == "thresholdedrelu":
        return lambda x: np.where(x > a, x, 0.0)
    if n == "scaledtanh":
        return lambda x: a * np.tanh(b * x)
    if n == "hardsigmoid":
        return lambda x: np.clip(a * x + b, 0, 1)
    if n == "elu":
        return lambda x: np.where(x >= 0, x, a * (np.exp(x) - 1))
    if n == "softsign":
        return lambda x: x / (1 + np.abs(x))
    if n == "softplus":
        return lambda x: np.logaddexp(0, x)
    raise OpError(f"unknown activation {name!r}")


@dataclass(frozen=True, eq=False)
class _Recurrent(Op):
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 6)
    gates: ClassVar[int] = 1
    default_activations: ClassVar[tuple[str, ...]] = ("Tanh",)
    num_outputs: ClassVar[int] = 2
    hidden_size: int = 0
    direction: str = "forward"
    layout: int = 0
    activations: tuple[str, ...] = ()
    activation_alpha: tuple[float, ...] = ()
    activation_beta: tuple[float, ...] = ()
    clip: float | None = None

    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    def _acts(self) -> list[list[Callable[[np.ndarray], np.ndarray]]]:
        k = len(self.default_activations)
        names = list(self.activations) or list(self.default_activations) * self.num_directions
        if len(names) != k * self.num_directions:
            raise OpError(f"expected {k * self.num_directions} activations, got {self.activations}")
        alphas, betas = list(self.activation_alpha), list(self.activation_beta)
        fns = []
        for nm in names:
            if nm.lower() not in _ALPHA_DEFAULTS:
                raise OpError(f"unknown activation {nm!r}")
            da, db = _ALPHA_DEFAULTS[nm.lower()]
            a = alphas.pop(0) if da is not None and alphas else None
            b = betas.pop(0) if db is not None and betas else None
            fns.append(_activation(nm, a, b))
        return [fns[d * k:(d + 1) * k] for d in range(self.num_directions)]

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "input X")
        w = require(inputs[1], "W")
        require(inputs[2], "R")
        if not x.dtype.is_float:
            raise OpError(f"X must be float, got {x}")
        if self.direction not in ("forward", "reverse", "bidirectional"):
            raise OpError(f"direction {self.direction!r} is not forward, reverse or bidirectional")
        if self.layout not in (0, 1):
            raise OpError(f"layout must be 0 or 1, got {self.layout}")
        self._acts()
        hs: Dim = self.hidden_size or UNKNOWN
        if not self.hidden_size and w.shape is not None and isinstance(w.shape[1], int):
            hs = w.shape[1] // self.gates
        if w.shape is not None and isinstance(w.shape[0], int) and w.shape[0] != self.num_directions:
            raise OpError(f"W {w} has {w.shape[0]} directions, direction={self.direction!r} needs "
                          f"{self.num_directions}")
        nd = self.num_directions
        if x.shape is None:
            seq: Dim = UNKNOWN
            batch: Dim = UNKNOWN
        else:
            if len(x.shape) != 3:
                raise OpError(f"X must be 3-d, got {x}")
            seq, batch = (x.shape[0], x.shape[1]) if self.layout == 0 else (x.shape[1], x.shape[0])
        if self.layout == 0:
            y, h = (seq, nd, batch, hs), (nd, batch, hs)
        else:
            y, h = (batch, seq, nd, hs), (batch, nd, hs)
        return [TensorType(x.dtype, y)] + [TensorType(x.dtype, h)] * (self.num_outputs - 1)

    # -- shared execution ------------------------------------------------------------------------
    def _run(self, x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None,
             seq_lens: np.ndarray | None, init: list[np.ndarray | None],
             step: Callable[..., tuple[np.ndarray, ...]], extra: np.ndarray | None = None
             ) -> list[np.ndarray]:
        dtype = x.dtype
        acc = np.float64
        if self.layout == 1:
            x = x.transpose(1, 0, 2)
            init = [None if s is None else s.transpose(1, 0, 2) for s in init]
        T, B, _ = x.shape
        nd = self.num_directions
        H = r.shape[-1]
        G = self.gates
        xs = x.astype(acc)
        lens = np.full(B, T, np.int64) if seq_lens is None else seq_lens.astype(np.int64)
        acts = self._acts()
        Y = np.zeros((T, nd, B, H), acc)
        finals: list[list[np.ndarray]] = []
        for d in range(nd):
            reverse = self.direction == "reverse" or d == 1
            wd, rd = w[d].astype(acc), r[d].astype(acc)
            bd = np.zeros(2 * G * H, acc) if b is None else b[d].astype(acc)
            states = [np.zeros((B, H), acc) if s is None else s[d].astype(acc) for s in init]
            xw = xs @ wd.T + bd[: G * H]  # (T, B, G*H)
            for t in range(T):
                if reverse:  # each sequence runs backwards from its own last element
                    ti = lens - 1 - t
                    active = ti >= 0
                    xt = xw[np.clip(ti, 0, T - 1), np.arange(B)]
                else:
                    ti = np.full(B, t)
                    active = t < lens
                    xt = xw[t]
                new = step(xt, states, rd, bd[G * H:], acts[d], None if extra is None else extra[d])
                m = active[:, None]
                states = [np.where(m, n, s) for n, s in zip(new, states)]
                out = np.where(m, new[0], 0.0)
                rows = np.nonzero(active)[0]
                Y[ti[rows], d, rows] = out[rows]
            finals.append(states)
        hs = [np.stack([f[i] for f in finals]) for i in range(len(finals[0]))]  # (nd, B, H) each
        if self.layout == 1:
            Y = Y.transpose(2, 0, 1, 3)
            hs = [h.transpose(1, 0, 2) for h in hs]
        return [Y.astype(dtype)] + [h.astype(dtype) for h in hs]

    def _clip(self, v: np.ndarray) -> np.ndarray:
        return v if self.clip is None else np.clip(v, -self.clip, self.clip)


@register
@dataclass(frozen=True, eq=False)
class Rnn(_Recurrent):
    """ONNX RNN: inputs ``X, W, R, B?, sequence_lens?, initial_h?``."""

    name: ClassVar[str] = "rnn"

    def ref(self, x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None = None,
            seq_lens: np.ndarray | None = None, h0: np.ndarray | None = None) -> list[np.ndarray]:
        def step(xt, states, rd, rb, acts, _):
            return (acts[0](self._clip(xt + states[0] @ rd.T + rb)),)

        return self._run(x, w, r, b, seq_lens, [h0], step)


@register
@dataclass(frozen=True, eq=False)
class Gru(_Recurrent):
    """ONNX GRU (gate order z, r, h): inputs ``X, W, R, B?, sequence_lens?, initial_h?``."""

    name: ClassVar[str] = "gru"
    gates: ClassVar[int] = 3
    default_activations: ClassVar[tuple[str, ...]] = ("Sigmoid", "Tanh")
    linear_before_reset: bool = False

    def ref(self, x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None = None,
            seq_lens: np.ndarray | None = None, h0: np.ndarray | None = None) -> list[np.ndarray]:
        def step(xt, states, rd, rb, acts, _):
            h = states[0]
            H = h.shape[1]
            f, g = acts
            xz, xr, xh = xt[:, :H], xt[:, H:2 * H], xt[:, 2 * H:]
            rz, rr, rh = rd[:H], rd[H:2 * H], rd[2 * H:]
            z = f(self._clip(xz + h @ rz.T + rb[:H]))
            rt = f(self._clip(xr + h @ rr.T + rb[H:2 * H]))
            if self.linear_before_reset:
                ht = g(self._clip(xh + rt * (h @ rh.T + rb[2 * H:])))
            else:
                ht = g(self._clip(xh + (rt * h) @ rh.T + rb[2 * H:]))
            return ((1 - z) * ht + z * h,)

        return self._run(x, w, r, b, seq_lens, [h0], step)


@register
@dataclass(frozen=True, eq=False)
class Lstm(_Recurrent):
    """ONNX LSTM (gate order i, o, f, c; peepholes i, o, f):
    inputs ``X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?``."""

    name: ClassVar[str] = "lstm"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 8)
    gates: ClassVar[int] = 4
    default_activations: ClassVar[tuple[str, ...]] = ("Sigmoid", "Tanh", "Tanh")
    num_outputs: ClassVar[int] = 3
    input_forget: bool = False

    def ref(self, x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None = None,
            seq_lens: np.ndarray | None = None, h0: np.ndarray | None = None, c0: np.ndarray | None = None,
            p: np.ndarray | None = None) -> list[np.ndarray]:
        def step(xt, states, rd, rb, acts, pd):
            h, c = states
            H = h.shape[1]
            f, g, hf = acts
            gates = xt + h @ rd.T + rb
            pi, po, pf = (pd[:H], pd[H:2 * H], pd[2 * H:]) if pd is not None else (0.0, 0.0, 0.0)
            i = f(self._clip(gates[:, :H] + pi * c))
            if self.input_forget:
                fg = 1 - i
            else:
                fg = f(self._clip(gates[:, 2 * H:3 * H] + pf * c))
            ct = g(self._clip(gates[:, 3 * H:]))
            cn = fg * c + i * ct
            o = f(self._clip(gates[:, H:2 * H] + po * cn))
            return (o * hf(cn), cn)

        extra = None if p is None else p.astype(np.float64)
        return self._run(x, w, r, b, seq_lens, [h0, c0], step, extra)


__all__ = ["Rnn", "Gru", "Lstm"]
