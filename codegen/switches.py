"""Compile-time switches read from the environment (docs/ENVIRONMENT.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


def env_choice(name: str, choices: Mapping[str, T], expected: str) -> T:
    """Environment variable ``name``, stripped and lowercased (unset reads as ``""``), looked up in ``choices``;
    another value is a ``ValueError`` naming the variable and its value, then ``expected: ...``."""
    raw = os.environ.get(name, "").strip().lower()
    try:
        return choices[raw]
    except KeyError:
        raise ValueError(f"{name}={raw!r}: expected {expected}") from None


def env_on(name: str) -> bool:
    """An on/off switch that is on by default: ``name`` unset, empty or ``1`` reads as on, ``0`` as off; another
    value is a ``ValueError`` naming the variable (``env_choice``)."""
    return env_choice(name, {"": True, "1": True, "0": False}, "0 or 1")
