"""Signal ops: dft, stft, window functions, mel_weight_matrix, det.

Complex tensors follow ONNX: a trailing dimension of 2 holds (real, imaginary); a trailing 1 is real.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import UNKNOWN, Dim, DType, TensorType, normalize_axis


def _complex(x: np.ndarray) -> np.ndarray:
    """The complex signal, in the input's precision (float32 stays single, as ONNX's reference)."""
    ft = np.float64 if x.dtype == np.float64 else np.float32
    if x.shape[-1] == 1:
        return x[..., 0].astype(ft)
    ct = np.complex128 if ft is np.float64 else np.complex64
    return (x[..., 0].astype(ft) + np.asarray(1j, ct) * x[..., 1].astype(ft)).astype(ct)


def _pack(c: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1).astype(dtype)


@register
@dataclass(frozen=True, eq=False)
class Dft(Op):
    """ONNX DFT over ``axis`` (not the trailing complex axis); ``dft_length`` pads or truncates."""

    name: ClassVar[str] = "dft"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 3)
    const_inputs: ClassVar[dict[int, str]] = {1: "dft_length", 2: "axis"}
    axis: int = -2
    inverse: bool = False
    onesided: bool = False
    dft_length: int | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "input")
        if not x.dtype.is_float:
            raise OpError(f"input must be float, got {x}")
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        r = len(x.shape)
        if r < 2 or x.shape[-1] not in (1, 2, UNKNOWN):
            raise OpError(f"input must end in a complex dimension of 1 or 2, got {x}")
        if len(inputs) > 2 and inputs[2] is not None:  # axis known at run time only
            last = 1 if self.inverse and self.onesided else 2
            return [TensorType(x.dtype, (UNKNOWN,) * (r - 1) + (last,))]
        ax = normalize_axis(self.axis, r)
        if ax == r - 1:
            raise OpError("axis must not be the trailing complex dimension")
        dynamic_len = self.dft_length is None and len(inputs) > 1 and inputs[1] is not None
        n: Dim = x.shape[ax]
        if dynamic_len:
            n = UNKNOWN
        elif self.dft_length is not None:
            n = self.dft_length
        elif self.inverse and self.onesided:
            n = 2 * (n - 1) if isinstance(n, int) else UNKNOWN
        shape = list(x.shape)
        if self.inverse and self.onesided:
            shape[ax], shape[-1] = n, 1
        else:
            if self.onesided:
                n = n // 2 + 1 if isinstance(n, int) else UNKNOWN
            shape[ax] = n
            shape[-1] = 2
        return [TensorType(x.dtype, tuple(shape))]

    def ref(self, x: np.ndarray, dft_length: np.ndarray | None = None,
            axis: np.ndarray | None = None) -> np.ndarray:
        a = self.axis if axis is None else int(np.asarray(axis).reshape(-1)[0])
        ax = normalize_axis(a, x.ndim)
        n = int(np.asarray(dft_length).reshape(-1)[0]) if dft_length is not None else self.dft_length
        c = _complex(x)
        if n is None:
            n = 2 * (x.shape[ax] - 1) if self.inverse and self.onesided else x.shape[ax]
        if self.inverse:
            if self.onesided:
                return np.fft.irfft(c, n=n, axis=ax)[..., None].astype(x.dtype)
            return _pack(np.fft.ifft(c, n=n, axis=ax), x.dtype)
        y = np.fft.fft(c, n=n, axis=ax)
        if self.onesided:
            y = np.take(y, np.arange(n // 2 + 1), axis=ax)
        return _pack(y, x.dtype)


@register
@dataclass(frozen=True, eq=False)
class Stft(Op):
    """ONNX STFT: ``signal (B, L, 1|2)``, window? -> ``(B, frames, bins, 2)``."""

    name: ClassVar[str] = "stft"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 4)
    const_inputs: ClassVar[dict[int, str]] = {1: "frame_step", 3: "frame_length"}
    frame_step: int = 0
    frame_length: int | None = None
    onesided: bool = True

    def _length(self, inputs: Sequence[TensorType | None]) -> Dim:
        if self.frame_length is not None:
            return self.frame_length
        w = inputs[2] if len(inputs) > 2 else None
        if w is not None and w.shape is not None:
            return w.shape[0]
        return UNKNOWN

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "signal")
        if x.shape is None or len(x.shape) != 3:
            raise OpError(f"signal must be (batch, length, 1|2), got {x}")
        if not self.frame_step and (len(inputs) < 2 or inputs[1] is None):
            raise OpError("frame_step is required")
        fl = self._length(inputs)
        L = x.shape[1]
        step_known = self.frame_step > 0 and (len(inputs) < 2 or inputs[1] is None)
        frames: Dim = (1 + (L - fl) // self.frame_step) if (
            step_known and isinstance(L, int) and isinstance(fl, int)) else UNKNOWN
        bins: Dim = (fl // 2 + 1 if self.onesided else fl) if isinstance(fl, int) else UNKNOWN
        return [TensorType(x.dtype, (x.shape[0], frames, bins, 2))]

    def ref(self, x: np.ndarray, frame_step: np.ndarray | None = None, window: np.ndarray | None = None,
            frame_length: np.ndarray | None = None) -> np.ndarray:
        step = int(np.asarray(frame_step).reshape(-1)[0]) if frame_step is not None else self.frame_step
        if frame_length is not None:
            fl = int(np.asarray(frame_length).reshape(-1)[0])
        elif self.frame_length is not None:
            fl = self.frame_length
        else:
            fl = window.shape[0] if window is not None else x.shape[1]
        c = _complex(x)  # (B, L)
        frames = np.lib.stride_tricks.sliding_window_view(c, fl, axis=1)[:, ::step]  # (B, F, fl)
        frames = frames[:, : 1 + (x.shape[1] - fl) // step]
        if window is not None:
            frames = frames * window.astype(np.float64)
        y = np.fft.fft(frames, axis=-1)
        if self.onesided:
            y = y[..., : fl // 2 + 1]
        return _pack(y, x.dtype)


@dataclass(frozen=True, eq=False)
class _Window(Op):
    num_inputs: ClassVar[tuple[int, int | None]] = (0, 1)
    const_inputs: ClassVar[dict[int, str]] = {0: "size"}
    size: int | None = None
    output_dtype: DType = DType.f32
    periodic: bool = True

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        n: Dim = self.size if self.size is not None else UNKNOWN
        if self.size is None and (not inputs or inputs[0] is None):
            raise OpError("size is required")
        return [TensorType(self.output_dtype, (n,))]

    def _n(self, size: np.ndarray | None) -> tuple[np.ndarray, int]:
        n = int(np.asarray(size).reshape(-1)[0]) if size is not None else int(self.size or 0)
        return np.arange(n, dtype=np.float64), (n if self.periodic else n - 1)

    def _out(self, y: np.ndarray) -> np.ndarray:
        return y.astype(self.output_dtype.np)


@register
@dataclass(frozen=True, eq=False)
class HannWindow(_Window):
    name: ClassVar[str] = "hann_window"

    def ref(self, size: np.ndarray | None = None) -> np.ndarray:
        i, N = self._n(size)
        return self._out(np.sin(i * np.pi / N) ** 2)


@register
@dataclass(frozen=True, eq=False)
class HammingWindow(_Window):
    name: ClassVar[str] = "hamming_window"

    def ref(self, size: np.ndarray | None = None) -> np.ndarray:
        i, N = self._n(size)
        a = 25.0 / 46.0
        return self._out(a - (1 - a) * np.cos(2 * np.pi * i / N))


@register
@dataclass(frozen=True, eq=False)
class BlackmanWindow(_Window):
    name: ClassVar[str] = "blackman_window"

    def ref(self, size: np.ndarray | None = None) -> np.ndarray:
        i, N = self._n(size)
        return self._out(0.42 - 0.5 * np.cos(2 * np.pi * i / N) + 0.08 * np.cos(4 * np.pi * i / N))


@register
@dataclass(frozen=True, eq=False)
class MelWeightMatrix(Op):
    """ONNX MelWeightMatrix; the five scalar inputs fold into attributes when constant."""

    name: ClassVar[str] = "mel_weight_matrix"
    num_inputs: ClassVar[tuple[int, int | None]] = (0, 5)
    const_inputs: ClassVar[dict[int, str]] = {
        0: "num_mel_bins", 1: "dft_length", 2: "sample_rate", 3: "lower_edge_hertz", 4: "upper_edge_hertz"
    }
    num_mel_bins: int | None = None
    dft_length: int | None = None
    sample_rate: int | None = None
    lower_edge_hertz: float | None = None
    upper_edge_hertz: float | None = None
    output_dtype: DType = DType.f32

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        rows: Dim = self.dft_length // 2 + 1 if self.dft_length is not None else UNKNOWN
        cols: Dim = self.num_mel_bins if self.num_mel_bins is not None else UNKNOWN
        return [TensorType(self.output_dtype, (rows, cols))]

    def ref(self, *args: np.ndarray | None) -> np.ndarray:
        names = ["num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz"]
        vals = []
        for i, nm in enumerate(names):
            a = args[i] if i < len(args) else None
            v = np.asarray(a).reshape(-1)[0].item() if a is not None else getattr(self, nm)
            if v is None:
                raise OpError(f"{nm} is required")
            vals.append(v)
        nmel, dft, sr, lo, hi = int(vals[0]), int(vals[1]), vals[2], vals[3], vals[4]
        nspec = dft // 2 + 1
        bins = np.arange(0, nmel + 2)
        lo_mel = 2595 * np.log1p(lo / 700) / np.log(10)
        hi_mel = 2595 * np.log1p(hi / 700) / np.log(10)
        step = (hi_mel - lo_mel) / bins.shape[0]
        f = 700 * np.expm1((bins * step + lo_mel) / 2595 * np.log(10))
        fb = (((dft + 1) * f) // sr).astype(int)
        out = np.zeros((nspec, nmel))
        for i in range(nmel):
            left, center, right = fb[i], fb[i + 1], fb[i + 2]
            if center - left == 0:
                out[center, i] = 1
            else:
                j = np.arange(left, center + 1)
                out[j, i] = (j - left) / (center - left)
            if right - center > 0:
                j = np.arange(center, right)
                out[j, i] = (right - j) / (right - center)
        return out.astype(self.output_dtype.np)


@register
@dataclass(frozen=True, eq=False)
class Det(Op):
    """Determinant of the trailing square matrices."""

    name: ClassVar[str] = "det"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "input")
        if not x.dtype.is_float:
            raise OpError(f"input must be float, got {x}")
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        if len(x.shape) < 2:
            raise OpError(f"input must have rank >= 2, got {x}")
        a, b = x.shape[-2:]
        if isinstance(a, int) and isinstance(b, int) and a != b:
            raise OpError(f"matrices must be square, got {x}")
        return [TensorType(x.dtype, tuple(x.shape[:-2]))]

    def ref(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(np.linalg.det(x.astype(np.float64))).astype(x.dtype)


__all__ = ["Dft", "Stft", "HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix", "Det"]
