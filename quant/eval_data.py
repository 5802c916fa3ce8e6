"""Calibration and evaluation text that ingot makes itself, without downloads.

The corpus is English prose from the Python standard library's own documentation strings: for each
module of ``MODULES`` (in this order) its docstring, then the docstrings of the classes and functions
it defines, by name (``inspect.getdoc``; docstrings shorter than 80 characters and repeats are
left out), joined by blank lines. Tokenized once, the stream is cut into a calibration part (the
first ``CALIB_TOKENS``) and an evaluation part (the rest), which never overlap.

Docstrings change between Python releases, so the token ids are cached: ``quant/data/`` ships the
stream for SmolLM2's tokenizer, and any other tokenizer's stream is generated on first use and
cached under ``~/.cache/ingot/`` (``INGOT_CACHE_DIR``), keyed by a fingerprint of the tokenizer.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

MODULES = (
    "argparse", "asyncio.locks", "asyncio.queues", "base64", "bisect", "calendar", "collections", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum",
    "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac", "http.client",
    "http.cookiejar", "imaplib", "inspect", "ipaddress", "json", "logging", "mailbox", "mimetypes", "numbers",
    "optparse", "os", "pathlib", "pickle", "pickletools", "platform", "pprint", "queue", "random", "re",
    "sched", "secrets", "selectors", "shlex", "shutil", "smtplib", "socket", "statistics", "string",
    "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace", "traceback",
    "typing", "unittest.case", "unittest.mock", "urllib.parse", "urllib.request", "uuid", "warnings", "wave",
    "weakref", "zipfile",
)
#: Tokens at the start of the stream used for calibration; evaluation uses what follows.
CALIB_TOKENS = 2048
#: Tokens kept in the cache (calibration + evaluation).
STREAM_TOKENS = 2048 + 24576
_PROBE = "The quick brown fox jumps over the lazy dog; 1234 + 5678 = 6912.\n\tdef f(x): return x ** 2"
_DATA = Path(__file__).resolve().parent / "data"


def stdlib_docs(modules: Sequence[str] = MODULES) -> list[str]:
    """The docstrings of ``modules`` in the deterministic order described above."""
    seen: set[str] = set()
    out: list[str] = []

    def add(doc: str | None) -> None:
        if doc and len(doc) >= 80 and doc not in seen:
            seen.add(doc)
            out.append(doc.strip())

    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        add(inspect.getdoc(mod))
        for attr in sorted(vars(mod)):
            obj = vars(mod)[attr]
            if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isclass(obj):
                add(inspect.getdoc(obj))
                for meth in sorted(vars(obj)):
                    fn = vars(obj)[meth]
                    if not meth.startswith("_") and inspect.isfunction(fn):
                        add(inspect.getdoc(fn))
            elif inspect.isfunction(obj):
                add(inspect.getdoc(obj))
    return out


def tokenizer_fingerprint(encode: Callable[[str], Sequence[int]]) -> str:
    ids = np.asarray(list(encode(_PROBE)), np.int64)
    return hashlib.sha256(ids.tobytes()).hexdigest()[:12]


def _cache_dir() -> Path:
    return Path(os.environ.get("INGOT_CACHE_DIR") or Path.home() / ".cache" / "ingot")


def token_stream(encode: Callable[[str], Sequence[int]], n_tokens: int = STREAM_TOKENS) -> np.ndarray:
    """The first ``n_tokens`` of the corpus tokenized by ``encode`` (text -> ids, no special tokens).

    Read from the shipped or user cache when there is one for this tokenizer, else generated and
    cached. Raises ``ValueError`` when the corpus is shorter than ``n_tokens``.
    """
    name = f"stdlib_docs.{tokenizer_fingerprint(encode)}.npy"
    for path in (_DATA / name, _cache_dir() / name):
        if path.is_file():
            ids = np.load(path, allow_pickle=False)
            if len(ids) >= n_tokens:
                return ids[:n_tokens].astype(np.int64)
    ids = np.asarray(list(encode("\n\n".join(stdlib_docs()))), np.int64)
    if len(ids) < n_tokens:
        raise ValueError(f"the stdlib docstring corpus has {len(ids)} tokens, fewer than {n_tokens}")
    ids = ids[: max(n_tokens, STREAM_TOKENS)]
    dtype = np.uint16 if ids.max() < 1 << 16 else np.uint32
    try:
        path = _cache_dir() / name
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, ids.astype(dtype))
    except OSError:
        pass
    return ids[:n_tokens]


def calibration_tokens(encode: Callable[[str], Sequence[int]], n_tokens: int = CALIB_TOKENS) -> np.ndarray:
    if n_tokens > CALIB_TOKENS:
        raise ValueError(f"the built-in calibration set has {CALIB_TOKENS} tokens; pass --calib for more")
    return token_stream(encode)[:n_tokens]


def eval_tokens(encode: Callable[[str], Sequence[int]], n_tokens: int = 20480) -> np.ndarray:
    """``n_tokens`` evaluation tokens (disjoint from the calibration tokens)."""
    return token_stream(encode, CALIB_TOKENS + n_tokens)[CALIB_TOKENS:]


def write_shipped_cache(encode: Callable[[str], Sequence[int]]) -> Path:
    """Regenerate the stream and write it into ``quant/data/`` (for the tokenizer ingot ships data for)."""
    ids = np.asarray(list(encode("\n\n".join(stdlib_docs()))), np.int64)[:STREAM_TOKENS]
    path = _DATA / f"stdlib_docs.{tokenizer_fingerprint(encode)}.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, ids.astype(np.uint16))
    return path
