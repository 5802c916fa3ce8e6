"""Streaming safetensors writer and memory-mapped reader.

The ``safetensors`` package's numpy API needs every tensor in memory at once to write, and cannot
hold the narrow float types ingot stores (fp8, fp4, e8m0, int4). This module writes the same file
format one tensor at a time: types the format knows keep their own code (F32, BF16, ...); the others
are stored as raw ``U8`` bytes, and the real dtype and shape go into the header's ``__metadata__``
under ``ingot.dtype.NAME``. Files stay readable by any safetensors reader; tests check this one
against the ``safetensors`` package.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ..ir.types import DType

_CODES: dict[DType, str] = {
    DType.f64: "F64", DType.f32: "F32", DType.f16: "F16", DType.bf16: "BF16",
    DType.i8: "I8", DType.i16: "I16", DType.i32: "I32", DType.i64: "I64",
    DType.u8: "U8", DType.u16: "U16", DType.u32: "U32", DType.u64: "U64", DType.bool: "BOOL",
}
_FROM_CODE = {v: k for k, v in _CODES.items()}
_ALIGN = 8


class SafetensorsError(ValueError):
    pass


def write(path: Path, tensors: Iterable[tuple[str, tuple[DType, tuple[int, ...]], Callable[[], np.ndarray]]],
          metadata: dict[str, str] | None = None,
          progress: Callable[[str, int], None] | None = None) -> None:
    """Write tensors given as ``(name, (dtype, shape), load)``; ``load`` is called once, in order."""
    entries = list(tensors)
    header: dict[str, object] = {}
    meta = dict(metadata or {})
    offset = 0
    for name, (dtype, shape), _ in entries:
        numel = int(np.prod(shape, dtype=np.int64))
        nbytes = numel * dtype.np.itemsize
        if dtype in _CODES:
            header[name] = {"dtype": _CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        else:
            header[name] = {"dtype": "U8", "shape": [nbytes], "data_offsets": [offset, offset + nbytes]}
            meta[f"ingot.dtype.{name}"] = json.dumps({"dtype": dtype.value, "shape": list(shape)})
        offset += nbytes
    if meta:
        header["__metadata__"] = meta
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % _ALIGN)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, (dtype, shape), load in entries:
            arr = np.asarray(load(), order="C")
            if arr.dtype != dtype.np or arr.shape != tuple(shape):
                raise SafetensorsError(f"tensor {name!r} is {arr.dtype}{list(arr.shape)}, declared "
                                       f"{dtype.value}{list(shape)}")
            f.write(arr.tobytes())
            if progress is not None:
                progress(name, arr.nbytes)


def read_header(path: Path) -> tuple[dict[str, dict], dict[str, str], int]:
    """Return (tensor entries, metadata, offset of the data section)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise SafetensorsError(f"{path}: too short to be a safetensors file")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            raise SafetensorsError(f"{path}: header length {n} exceeds the file size {size}")
        try:
            header = json.loads(f.read(n))
        except json.JSONDecodeError as e:
            raise SafetensorsError(f"{path}: header is not valid JSON: {e}") from None
    meta = header.pop("__metadata__", {}) or {}
    return header, meta, 8 + n


class SafetensorsFile:
    """Memory-mapped access to a safetensors file; tensors are views, loaded on touch."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.entries, self.metadata, self._base = read_header(self.path)
        self._size = self.path.stat().st_size
        self._mmap: np.memmap | None = None

    def keys(self) -> list[str]:
        return list(self.entries)

    def info(self, name: str) -> tuple[DType, tuple[int, ...]]:
        extra = self.metadata.get(f"ingot.dtype.{name}")
        if extra:
            d = json.loads(extra)
            return DType(d["dtype"]), tuple(d["shape"])
        e = self.entries[name]
        if e["dtype"] not in _FROM_CODE:
            raise SafetensorsError(f"{self.path}: tensor {name!r} has unsupported dtype {e['dtype']}")
        return _FROM_CODE[e["dtype"]], tuple(e["shape"])

    def get(self, name: str) -> np.ndarray:
        if name not in self.entries:
            raise SafetensorsError(f"{self.path}: no tensor {name!r}")
        dtype, shape = self.info(name)
        begin, end = self.entries[name]["data_offsets"]
        if self._base + end > self._size:
            raise SafetensorsError(f"{self.path}: tensor {name!r} runs past the end of the file")
        if self._mmap is None:
            self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._mmap[self._base + begin : self._base + end]
        return raw.view(dtype.np).reshape(shape)
