"""Imports every pass module in this package, which registers the built-in passes."""

import importlib
import pkgutil

from . import __path__ as _path

_INFRA = {"manager", "rewrite", "builtin"}

for _m in sorted(m.name for m in pkgutil.iter_modules(_path)):
    if _m not in _INFRA and not _m.startswith("_"):
        importlib.import_module(f"{__package__}.{_m}")
