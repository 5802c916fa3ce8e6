"""The ``tvm`` family: the fallback for every node no template family takes (tried last).

``plan(op, inputs, target)`` infers the node's output types, requires static shapes and dtypes
TVM kernels are generated for (f32, f64, integers, bool), builds the op's TE compute (the builders
in this package, one module per op class), schedules and compiles it through TVM
(``codegen/tvm/build.py``) and returns one ``KernelSpec`` per ``__global__`` kernel of the result.

The generated module is cached by content: the key is the sha256 of the op's name and attributes
(constant arrays by their hash), the input/output types, the architecture and ``BUILDER_VERSION``.
Entries live in ``$INGOT_TVM_CACHE_DIR`` (default: ``<kernel cache>/tvm``, see
``codegen/compile.py``) as JSON (the CUDA source and each kernel's parameters and launch
configuration). A machine without TVM plans and compiles every node whose entry is in the cache,
so kernels generated here can be carried to a GPU machine as a cache folder.

A spec's ``values`` hold the cache key and the kernel's index; its launch configuration is static
(``GridDim(const=...)``: shapes are fixed at compile time); its parameters are the node's tensors
by position, ``in0``, ``in1``, ... (absent optional inputs have none) and ``out0``, ...
``source(spec)`` returns the CUDA source with the kernel renamed to ``spec.entry``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...ir.op import Op
from ...ir.types import DType, TensorType
from ..family import Family
from ..kernel import GridDim, KernelSpec
from ..target import Target

#: bump when a builder's output changes (invalidates the cache)
BUILDER_VERSION = 3
FAMILY_NAME = "tvm"
#: op-class modules holding the builders
MODULES = ("elementwise", "reduce", "layout", "nn")
#: op names with a builder (kept in sync with the modules by a test; read without importing TVM)
OPS = (
    "abs", "neg", "sign", "relu", "exp", "log", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
    "asinh", "acosh", "atanh", "tanh", "erf", "reciprocal", "floor", "ceil", "round", "sigmoid", "softplus",
    "softsign", "hardswish", "mish", "isnan", "not", "bitwise_not", "is_inf",
    "leaky_relu", "elu", "selu", "celu", "hard_sigmoid", "thresholded_relu", "swish", "gelu", "shrink",
    "add", "sub", "mul", "div", "mod", "fmod", "pow", "max", "min", "prelu", "and", "or", "xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "equal", "less", "greater", "less_equal", "greater_equal",
    "where", "clip", "cast", "identity",
    "reduce_sum", "reduce_sum_square", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_l1",
    "reduce_l2", "reduce_log_sum", "reduce_log_sum_exp", "arg_max", "arg_min", "cumulative",
    "softmax", "log_softmax", "batch_norm", "lrn", "layer_norm", "rms_norm",
    "reshape", "flatten", "squeeze", "unsqueeze", "transpose", "concat", "slice", "split", "gather",
    "gather_elements", "gather_nd", "expand", "tile", "pad", "trilu", "range", "constant", "shape", "size",
    "constant_of_shape", "dropout",
    "matmul", "gemm", "conv", "max_pool", "avg_pool", "lp_pool", "global_avg_pool", "global_max_pool",
)
#: dtypes generated kernels load and store
DTYPES = (DType.f32, DType.f64, DType.i8, DType.i16, DType.i32, DType.i64, DType.u8, DType.u16, DType.u32,
          DType.u64, DType.bool)

#: why the last plans of an op failed (op name -> message), for the lowering's error
FAILURES: dict[str, str] = {}
_MEMORY: dict[str, dict[str, Any]] = {}


def available() -> bool:
    """Whether Apache TVM is importable here (``pip install 'ingot[tvm]'``)."""
    return importlib.util.find_spec("tvm") is not None


@functools.cache
def tvm_version() -> str | None:
    if not available():
        return None
    try:
        from importlib.metadata import version

        return version("apache-tvm")
    except Exception:
        return "unknown"


def cache_root() -> Path:
    env = os.environ.get("INGOT_TVM_CACHE_DIR")
    if env:
        return Path(env)
    from ..compile import cache_dir

    return cache_dir() / "tvm"


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return {"dtype": v.dtype.str, "shape": list(v.shape), "sha256": hashlib.sha256(v.tobytes()).hexdigest()}
    if isinstance(v, DType):
        return v.value
    if isinstance(v, tuple | list):
        return [_jsonable(x) for x in v]
    if isinstance(v, float | int | str | bool) or v is None:
        return v
    return str(v)


def describe(op: Op, inputs: Sequence[TensorType | None], outputs: Sequence[TensorType]) -> dict[str, Any]:
    return {"op": op.name, "attrs": {k: _jsonable(v) for k, v in op.attrs().items()},
            "inputs": [str(t) if t is not None else None for t in inputs], "outputs": [str(t) for t in outputs]}


def cache_key(desc: dict[str, Any], arch: str) -> str:
    text = json.dumps({"version": BUILDER_VERSION, "arch": arch, **desc}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _path(key: str) -> Path:
    return cache_root() / key[:2] / f"{key}.json"


def load_entry(key: str) -> dict[str, Any] | None:
    if key in _MEMORY:
        return _MEMORY[key]
    p = _path(key)
    if p.is_file():
        entry = json.loads(p.read_text())
        _MEMORY[key] = entry
        return entry
    return None


def _store(key: str, entry: dict[str, Any]) -> None:
    _MEMORY[key] = entry
    p = _path(key)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, p)
    except OSError:
        pass  # an unwritable cache only costs a rebuild


@functools.cache
def builders() -> dict[str, Any]:
    for m in MODULES:
        importlib.import_module(f"{__package__}.{m}")
    from .common import BUILDERS

    return BUILDERS


def generate(op: Op, inputs: Sequence[TensorType | None], outputs: Sequence[TensorType], arch: str,
             key: str) -> dict[str, Any]:
    """Build the op through TVM (raises ``Unsupported`` / ``TvmBuildError`` / ``ImportError``)."""
    from tvm import te

    from .build import build_module
    from .common import static_shape, tdtype

    fn = builders()[op.name]
    ins = []
    params: list[tuple[str, Any]] = []
    for i, t in enumerate(inputs):
        if t is None:
            ins.append(None)
            continue
        ph = te.placeholder(static_shape(t), tdtype(t.dtype), name=f"in{i}")
        ins.append(ph)
        params.append((f"in{i}", ph))
    outs = fn(op, ins, list(inputs), list(outputs))
    if len(outs) != len(outputs):
        raise ValueError(f"{op.name}: builder gave {len(outs)} outputs for {len(outputs)}")
    for k, (o, t) in enumerate(zip(outs, outputs)):
        want = static_shape(t)
        got = tuple(int(d) for d in o.shape)
        if got != want or str(o.dtype) != tdtype(t.dtype):
            raise ValueError(f"{op.name}: output {k} is {o.dtype}{list(got)}, the op's type is {t}")
        params.append((f"out{k}", o))
    module = build_module(f"tvm_{op.name}", params, outs, arch)
    return {**module.to_dict(), "desc": describe(op, inputs, outputs), "arch": arch, "tvm": tvm_version(),
            "builder_version": BUILDER_VERSION, "key": key}


def _numel(t: TensorType) -> int:
    n = 1
    for d in t.shape or ():
        n *= int(d)
    return n


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    if not target.is_gpu or op.name not in OPS:
        return None
    try:
        outputs = op.infer(list(inputs))
    except Exception as e:
        FAILURES[op.name] = f"type inference failed: {e}"
        return None
    for t in [*inputs, *outputs]:
        if t is None:
            continue
        if t.shape is None or not all(isinstance(d, int) for d in t.shape):
            FAILURES[op.name] = f"{t} is not static (bind the model's symbolic dims at compile time)"
            return None
        if t.dtype not in DTYPES:
            FAILURES[op.name] = f"dtype {t.dtype.value} (generated kernels handle {', '.join(d.value for d in DTYPES)})"
            return None
    if all(_numel(t) == 0 for t in outputs):
        return []
    arch = target.arch
    desc = describe(op, inputs, outputs)
    key = cache_key(desc, arch)
    entry = load_entry(key)
    if entry is None:
        if not available():
            FAILURES[op.name] = "Apache TVM is not installed (pip install 'ingot[tvm]') and no cached kernel matches"
            return None
        try:
            entry = generate(op, inputs, outputs, arch, key)
        except Exception as e:  # Unsupported, TvmBuildError, TVM's own errors
            FAILURES[op.name] = f"{type(e).__name__}: {str(e).strip()[:500]}"
            return None
        _store(key, entry)
    return specs_from_entry(entry, key, op.name, arch)


def specs_from_entry(entry: dict[str, Any], key: str, op_name: str, arch: str) -> list[KernelSpec]:
    kernels = entry["kernels"]
    summary = f"{entry['desc']['op']} {entry['desc']['inputs']} -> {entry['desc']['outputs']}"
    return [
        KernelSpec.make(FAMILY_NAME, "tvm", f"tvm_{op_name}", arch, {"key": key, "kernel": i, "kernels": len(kernels)},
                        [(p, "ptr") for p in k["params"]], tuple(k["block"]),
                        [GridDim(const=int(g)) for g in k["grid"]],
                        doc=f"generated by Apache TVM: {summary}, kernel {i + 1} of {len(kernels)}")
        for i, k in enumerate(kernels)
    ]


def source(spec: KernelSpec) -> str:
    """The CUDA source of a ``tvm`` spec (from the cache), kernel ``i`` renamed to ``spec.entry``."""
    key = str(spec.value("key"))
    entry = load_entry(key)
    if entry is None:
        raise FileNotFoundError(f"no generated TVM kernel {key} in {cache_root()} (plan the node first)")
    i = int(spec.value("kernel"))
    text = entry["source"]
    for j, k in enumerate(entry["kernels"]):
        new = spec.entry if j == i else f"{spec.entry}_other{j}"
        text = re.sub(rf"\b{re.escape(k['name'])}\b", new, text)
    desc = entry["desc"]
    header = (f"// Generated by ingot.codegen.tvm with Apache TVM {entry.get('tvm')} for {spec.arch}: "
              f"kernel {i + 1} of {len(entry['kernels'])} of\n// {desc['op']} {json.dumps(desc['attrs'])}\n"
              f"// inputs {desc['inputs']} -> outputs {desc['outputs']}\n// cache key {key}\n")
    return header + text


def bind(node: Any, specs: Sequence[KernelSpec]) -> list[dict[str, dict[str, Any]]]:
    """Launch arguments: ``inK`` -> the node's input K, ``outK`` -> its output K."""
    out = []
    for spec in specs:
        args: dict[str, dict[str, Any]] = {}
        for p in spec.params:
            idx = int(p.name[3:]) if p.name.startswith("out") else int(p.name[2:])
            v = node.outputs[idx] if p.name.startswith("out") else node.inputs[idx]
            args[p.name] = {"buffer": v.name}
        out.append(args)
    return out


def failure_hint(op_names: Sequence[str]) -> str:
    """Why the fallback did not take these ops (for ``LoweringError``)."""
    lines = []
    for name in op_names:
        if name not in OPS:
            lines.append(f"  {name}: no generated kernel for this op (codegen/tvm has no builder)")
        elif name in FAILURES:
            lines.append(f"  {name}: {FAILURES[name]}")
    return "\n".join(lines)


FAMILY = Family(name=FAMILY_NAME, ops=OPS, plan=plan)
