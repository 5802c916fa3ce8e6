"""ONNX importer: ``onnx.ModelProto`` -> ``ir.Graph``.

Each ONNX op is converted by a function registered with ``@converter("OpType", ...)`` in a module
of ``frontend/onnx_ops/``; a converter reads the node's attributes and inputs from a ``NodeContext``
and emits ingot ops, normalizing ONNX's variants (attribute vs. input forms across opsets) onto one
core op each. Ops without a converter are expanded through their ONNX function body when the schema
has one, and model-local functions are inlined. Before anything is converted, every node is checked,
so a model with unsupported parts fails once, listing all of them.

Initializers become lazy weights: external-data tensors are memory-mapped from their files, never
read until used. Constant inputs that ops take as attributes (axes, shapes, pads, ...) are folded
into those attributes at import (see ``ir.op.fold_const_input``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..ir.graph import Graph, Value, Weight
from ..ir.op import Op, OpError, fold_const_input
from ..ir.types import UNKNOWN, DType, TensorType

Converter = Callable[["NodeContext"], Sequence[Value | None] | Value]

CONVERTERS: dict[tuple[str, str], Converter] = {}
STANDARD_DOMAINS = ("", "ai.onnx")
#: Constants with at most this many elements may be folded into attributes.
FOLD_LIMIT = 4096


class ImportError_(ValueError):
    """The model cannot be imported; the message names the file, node and op."""


class UnsupportedOpsError(ImportError_):
    def __init__(self, problems: list[tuple[str, str, str, int, str]]) -> None:
        self.problems = problems
        lines = [
            f"  {op_type} (domain {domain or 'ai.onnx'}, opset {opset}) at node {name!r}: {why}"
            for name, domain, op_type, opset, why in problems
        ]
        ops = sorted({p[2] for p in problems})
        super().__init__(
            f"the model uses {len(ops)} unsupported op(s) ({', '.join(ops)}) in {len(problems)} node(s):\n"
            + "\n".join(lines)
        )


class Unsupported(Exception):  # noqa: N818 - raised by converters for unsupported variants
    """A converter met a variant (attribute value, dtype) it cannot express."""


def converter(*op_types: str, domain: str = "") -> Callable[[Converter], Converter]:
    def deco(fn: Converter) -> Converter:
        for t in op_types:
            CONVERTERS[(domain, t)] = fn
        return fn

    return deco


# -- dtypes ----------------------------------------------------------------------------------------

_ONNX_DTYPES: dict[int, DType] = {
    onnx.TensorProto.FLOAT: DType.f32,
    onnx.TensorProto.DOUBLE: DType.f64,
    onnx.TensorProto.FLOAT16: DType.f16,
    onnx.TensorProto.BFLOAT16: DType.bf16,
    onnx.TensorProto.FLOAT8E4M3FN: DType.f8e4m3fn,
    onnx.TensorProto.FLOAT8E4M3FNUZ: DType.f8e4m3fnuz,
    onnx.TensorProto.FLOAT8E5M2: DType.f8e5m2,
    onnx.TensorProto.FLOAT8E5M2FNUZ: DType.f8e5m2fnuz,
    onnx.TensorProto.FLOAT4E2M1: DType.f4e2m1fn,
    onnx.TensorProto.INT4: DType.i4,
    onnx.TensorProto.UINT4: DType.u4,
    onnx.TensorProto.INT8: DType.i8,
    onnx.TensorProto.INT16: DType.i16,
    onnx.TensorProto.INT32: DType.i32,
    onnx.TensorProto.INT64: DType.i64,
    onnx.TensorProto.UINT8: DType.u8,
    onnx.TensorProto.UINT16: DType.u16,
    onnx.TensorProto.UINT32: DType.u32,
    onnx.TensorProto.UINT64: DType.u64,
    onnx.TensorProto.BOOL: DType.bool,
}
if hasattr(onnx.TensorProto, "FLOAT8E8M0"):
    _ONNX_DTYPES[onnx.TensorProto.FLOAT8E8M0] = DType.f8e8m0
_TO_ONNX = {v: k for k, v in _ONNX_DTYPES.items()}


def dtype_from_onnx(elem_type: int, where: str = "") -> DType:
    try:
        return _ONNX_DTYPES[elem_type]
    except KeyError:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "undefined"
        raise Unsupported(f"element type {name}{' of ' + where if where else ''} is not supported") from None


def dtype_to_onnx(dtype: DType) -> int:
    return _TO_ONNX[dtype]


def _type_from_value_info(vi: onnx.ValueInfoProto) -> TensorType:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise Unsupported(f"{vi.name!r} is not a tensor (sequence/map/optional types are not supported)")
    dtype = dtype_from_onnx(tt.elem_type, repr(vi.name))
    if not tt.HasField("shape"):
        return TensorType(dtype, None)
    dims: list[int | str] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(UNKNOWN)
    return TensorType(dtype, tuple(dims))


# -- attributes ------------------------------------------------------------------------------------


def _attr_value(a: onnx.AttributeProto) -> Any:
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode("utf-8", "replace") for x in v]
    return v


# -- the node context handed to converters ----------------------------------------------------------


@dataclasses.dataclass
class NodeContext:
    graph: Graph
    node: onnx.NodeProto
    inputs: list[Value | None]
    attrs: dict[str, Any]
    opset: int
    importer: _Importer

    @property
    def name(self) -> str:
        return self.node.name or f"{self.node.op_type}({', '.join(self.node.output)})"

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def add(self, op: Op, inputs: Sequence[Value | None], num: int | None = None) -> list[Value]:
        """Add ``op``; constant inputs it lists in ``const_inputs`` become attributes."""
        ins = list(inputs)
        for idx in op.const_inputs:
            if idx < len(ins) and ins[idx] is not None:
                arr = self.const_value(ins[idx])
                if arr is not None:
                    op = fold_const_input(op, idx, arr)
                    ins[idx] = None
        while ins and ins[-1] is None:
            ins.pop()
        return self.graph.add(op, ins, source=self.name)

    def add1(self, op: Op, inputs: Sequence[Value | None]) -> Value:
        return self.add(op, inputs)[0]

    def const(self, array: np.ndarray | float | int, dtype: DType | None = None) -> Value:
        from ..ir.ops.core import Constant

        arr = np.asarray(array, dtype=dtype.np if dtype is not None else None)
        return self.graph.add1(Constant(value=arr), [], source=self.name)

    def const_value(self, v: Value | None) -> np.ndarray | None:
        """The value of ``v`` if it is known at import time (a small constant or weight)."""
        return self.importer.const_value(v)

    def unsupported(self, why: str) -> Unsupported:
        return Unsupported(why)


# -- the importer ----------------------------------------------------------------------------------


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Read an .onnx file without loading its external data (that stays memory-mapped)."""
    path = Path(path)
    if not path.exists():
        raise ImportError_(f"{path}: no such file")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and friends
        raise ImportError_(
            f"{path}: not a valid ONNX model (truncated or corrupt file?): {type(e).__name__}: {e}"
        ) from None


def import_onnx(model: onnx.ModelProto | str | os.PathLike, name: str = "main") -> Graph:
    """Import an ONNX model (a ModelProto or a path) into an ingot graph."""
    from . import onnx_ops  # noqa: F401  (registers the converters)

    base_dir: Path | None = None
    source = "<ModelProto>"
    if not isinstance(model, onnx.ModelProto):
        base_dir = Path(model).parent
        source = str(model)
        model = load_model(model)
    return _Importer(model, base_dir, source).run(name)


class _Importer:
    def __init__(self, model: onnx.ModelProto, base_dir: Path | None, source: str) -> None:
        self.model = model
        self.base_dir = base_dir
        self.source = source
        self.opsets = {(o.domain or ""): o.version for o in model.opset_import}
        if "ai.onnx" in self.opsets:
            self.opsets.setdefault("", self.opsets["ai.onnx"])
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.graph = Graph()
        self._const_cache: dict[Value, np.ndarray] = {}

    # -- constants -------------------------------------------------------------------------------
    def const_value(self, v: Value | None) -> np.ndarray | None:
        if v is None:
            return None
        if v in self._const_cache:
            return self._const_cache[v]
        arr = None
        if v.producer is not None and v.producer.op.name == "constant":
            arr = v.producer.op.value  # type: ignore[attr-defined]
        elif v.name in self.graph.weights and self.graph.weight_values.get(v.name) is v:
            numel = v.type.numel()
            if numel is not None and numel <= FOLD_LIMIT:
                arr = self.graph.weights[v.name].load()
        if arr is not None and arr.size <= FOLD_LIMIT:
            self._const_cache[v] = arr
            return arr
        return None

    # -- weights ---------------------------------------------------------------------------------
    def _weight(self, t: onnx.TensorProto) -> Weight:
        dtype = dtype_from_onnx(t.data_type, f"initializer {t.name!r}")
        shape = tuple(int(d) for d in t.dims)
        ttype = TensorType(dtype, shape)
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            if self.base_dir is None:
                raise ImportError_(f"initializer {t.name!r} uses external data, but the model has no path")
            file = self.base_dir / info["location"]
            if not file.exists():
                raise ImportError_(
                    f"initializer {t.name!r}: external data file {str(file)!r} does not exist"
                )
            offset = int(info.get("offset", 0))
            nbytes = (int(np.prod(shape, dtype=np.int64)) * dtype.itemsize_bits + 7) // 8
            length = int(info.get("length", nbytes))
            if offset + length > file.stat().st_size:
                raise ImportError_(
                    f"initializer {t.name!r}: external data file {str(file)!r} is too short "
                    f"({file.stat().st_size} bytes, need {offset + length})"
                )

            def load(file: Path = file, offset: int = offset, shape: tuple = shape) -> np.ndarray:
                if dtype.itemsize_bits < 8:
                    raw = np.memmap(file, dtype=np.uint8, mode="r", offset=offset, shape=(length,))
                    proto = onnx.TensorProto()
                    proto.CopyFrom(t)
                    del proto.external_data[:]
                    proto.data_location = onnx.TensorProto.DEFAULT
                    proto.raw_data = bytes(raw)
                    return numpy_helper.to_array(proto)
                return np.memmap(file, dtype=dtype.np, mode="r", offset=offset, shape=shape)

            return Weight(ttype, load, source=f"{file}@{offset}")
        return Weight(ttype, lambda t=t: _tensor_to_array(t, dtype), source=f"{self.source}:{t.name}")

    # -- main ------------------------------------------------------------------------------------
    def run(self, name: str) -> Graph:
        g = self.graph
        g.name = name
        mg = self.model.graph
        g.meta.update(
            source_format="onnx",
            producer=f"{self.model.producer_name} {self.model.producer_version}".strip(),
            opsets={k or "ai.onnx": v for k, v in self.opsets.items()},
        )
        self.check_supported(mg.node, self.opsets)
        env: dict[str, Value] = {}
        init_names = {t.name for t in mg.initializer}
        for vi in mg.input:
            if vi.name in init_names:
                continue  # IR < 4 style: initializers listed as inputs are weights
            try:
                env[vi.name] = g.add_input(vi.name, _type_from_value_info(vi))
            except Unsupported as e:
                raise ImportError_(f"graph input {vi.name!r}: {e}") from None
        for t in mg.initializer:
            try:
                env[t.name] = g.add_weight(t.name, self._weight(t))
            except Unsupported as e:
                raise ImportError_(str(e)) from None
        for t in mg.sparse_initializer:
            raise ImportError_(f"sparse initializer {t.values.name!r} is not supported")
        self.convert_nodes(mg.node, env, self.opsets)
        for vi in mg.output:
            if vi.name not in env:
                raise ImportError_(f"graph output {vi.name!r} is not produced by any node")
            v = env[vi.name]
            g.add_output(v, vi.name)
        self._sharpen_outputs(mg)
        g.remove_unused()
        return g

    def _sharpen_outputs(self, mg: onnx.GraphProto) -> None:
        """Take the model's declared output dims where inference only knows ``?``."""
        for v, vi in zip(self.graph.outputs, mg.output):
            try:
                declared = _type_from_value_info(vi)
            except Unsupported:
                continue
            if v.type.shape is None or declared.shape is None or len(declared.shape) != len(v.type.shape):
                continue
            dims = tuple(d if d != UNKNOWN else e for d, e in zip(v.type.shape, declared.shape))
            v.type = TensorType(v.type.dtype, dims, v.type.quant)

    def check_supported(self, nodes: Sequence[onnx.NodeProto], opsets: dict[str, int]) -> None:
        problems = []
        for n in nodes:
            why = self._why_unsupported(n, opsets)
            if why:
                problems.append((n.name or n.output[0], n.domain, n.op_type, opsets.get(n.domain, 0), why))
        if problems:
            raise UnsupportedOpsError(problems)

    def _why_unsupported(self, n: onnx.NodeProto, opsets: dict[str, int]) -> str:
        domain = "" if n.domain in STANDARD_DOMAINS else n.domain
        if (domain, n.op_type) in CONVERTERS or (n.domain, n.op_type) in self.functions:
            return ""
        if domain == "" and n.op_type == "If":
            return ""  # a constant condition inlines its branch; a data-dependent one fails at conversion
        if self._schema_function(n, opsets) is not None:
            return ""
        if domain and domain not in opsets:
            return f"domain {domain!r} is not imported by the model"
        return "no converter and no ONNX function body to expand"

    def _schema_function(self, n: onnx.NodeProto, opsets: dict[str, int]) -> onnx.FunctionProto | None:
        domain = "" if n.domain in STANDARD_DOMAINS else n.domain
        try:
            schema = onnx.defs.get_schema(n.op_type, opsets.get(domain, 1), domain)
        except Exception:
            return None
        if not schema.has_function:
            return None
        try:
            fn_bytes = schema.get_function_with_opset_version(opsets.get(domain, 1))
        except Exception:
            fn_bytes = None
        if fn_bytes is None:
            return None
        fn = onnx.FunctionProto()
        if isinstance(fn_bytes, onnx.FunctionProto):
            fn.CopyFrom(fn_bytes)
        else:
            fn.ParseFromString(fn_bytes)
        # the body refers to the op's attributes; unset ones take the schema's defaults
        have = {a.name for a in fn.attribute_proto}
        for name, spec in schema.attributes.items():
            d = spec.default_value
            if name not in have and d is not None and d.type != onnx.AttributeProto.UNDEFINED:
                a = onnx.AttributeProto()
                a.CopyFrom(d)
                a.name = name
                fn.attribute_proto.append(a)
        return fn

    def convert_nodes(
        self, nodes: Sequence[onnx.NodeProto], env: dict[str, Value], opsets: dict[str, int]
    ) -> None:
        for n in nodes:
            self.convert_node(n, env, opsets)

    def convert_node(self, n: onnx.NodeProto, env: dict[str, Value], opsets: dict[str, int]) -> None:
        domain = "" if n.domain in STANDARD_DOMAINS else n.domain
        label = n.name or f"{n.op_type}->{','.join(n.output)}"
        ins: list[Value | None] = []
        for x in n.input:
            if not x:
                ins.append(None)
            elif x in env:
                ins.append(env[x])
            else:
                raise ImportError_(f"node {label!r} ({n.op_type}): input {x!r} is not defined")
        if domain == "" and n.op_type == "If":
            self._convert_if(n, ins, env, opsets, label)
            return
        fn = CONVERTERS.get((domain, n.op_type))
        if fn is None:
            body = self.functions.get((n.domain, n.op_type)) or self._schema_function(n, opsets)
            if body is None:
                raise UnsupportedOpsError(
                    [(label, n.domain, n.op_type, opsets.get(domain, 0), "no converter")]
                )
            self._inline(n, body, ins, env, opsets)
            return
        attrs = {a.name: _attr_value(a) for a in n.attribute}
        ctx = NodeContext(self.graph, n, ins, attrs, opsets.get(domain, 1), self)
        try:
            outs = fn(ctx)
        except Unsupported as e:
            raise UnsupportedOpsError([(label, n.domain, n.op_type, ctx.opset, str(e))]) from None
        except UnsupportedOpsError:
            raise
        except (OpError, ValueError, TypeError, IndexError, KeyError) as e:
            raise ImportError_(f"node {label!r} ({n.op_type}, opset {ctx.opset}): {e}") from e
        if isinstance(outs, Value):
            outs = [outs]
        for name, v in zip(n.output, outs):
            if name and v is not None:
                env[name] = v
        for name in n.output[len(outs) :]:
            if name:
                raise ImportError_(f"node {label!r} ({n.op_type}): output {name!r} is not supported")

    def _convert_if(
        self, n: onnx.NodeProto, ins: list[Value | None], env: dict[str, Value], opsets: dict[str, int], label: str
    ) -> None:
        """``If`` with a compile-time constant condition: the taken branch is inlined."""
        cond = self.const_value(ins[0] if ins else None)
        if cond is None:
            raise UnsupportedOpsError([(label, n.domain, "If", opsets.get("", 0),
                                        "the condition is not a compile-time constant (data-dependent control flow)")])
        attrs = {a.name: a for a in n.attribute}
        branch = attrs["then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"].g
        scope = dict(env)  # the branch sees the enclosing scope's values by name
        for t in branch.initializer:
            scope[t.name] = self.graph.add_weight(t.name, self._weight(t))
        self.check_supported(branch.node, opsets)
        self.convert_nodes(branch.node, scope, opsets)
        for out, vi in zip(n.output, branch.output):
            if out:
                if vi.name not in scope:
                    raise ImportError_(f"node {label!r} (If): branch output {vi.name!r} is not produced")
                env[out] = scope[vi.name]

    def _inline(
        self,
        n: onnx.NodeProto,
        fn: onnx.FunctionProto,
        ins: list[Value | None],
        env: dict[str, Value],
        outer_opsets: dict[str, int],
    ) -> None:
        """Expand a function call: bind formals, substitute attribute references, convert the body."""
        prefix = (n.name or n.op_type) + "/"
        # inner names are prefixed so they cannot clash with the caller's or another call's
        scoped: dict[str, Value] = {
            prefix + formal: actual for formal, actual in zip(fn.input, ins) if actual is not None
        }
        attrs = {a.name: a for a in fn.attribute_proto}
        attrs.update({a.name: a for a in n.attribute})
        opsets = dict(outer_opsets)
        for o in fn.opset_import:
            opsets[o.domain or ""] = o.version
        for inner in fn.node:
            node = onnx.NodeProto()
            node.CopyFrom(inner)
            node.name = prefix + (inner.name or inner.op_type + "_" + "_".join(inner.output))
            del node.attribute[:]
            for a in inner.attribute:
                if not a.ref_attr_name:
                    node.attribute.append(a)
                elif a.ref_attr_name in attrs:
                    b = onnx.AttributeProto()
                    b.CopyFrom(attrs[a.ref_attr_name])
                    b.name = a.name
                    node.attribute.append(b)
            for i, x in enumerate(inner.input):
                node.input[i] = prefix + x if x else ""
            for i, x in enumerate(inner.output):
                node.output[i] = prefix + x if x else ""
            why = self._why_unsupported(node, opsets)
            if why:
                raise UnsupportedOpsError(
                    [(node.name, node.domain, node.op_type, opsets.get(node.domain, 0), why)]
                )
            self.convert_node(node, scoped, opsets)
        for formal, actual in zip(fn.output, n.output):
            if actual:
                if prefix + formal not in scoped:
                    raise ImportError_(f"function {fn.name}: output {formal!r} is not produced")
                env[actual] = scoped[prefix + formal]


def _tensor_to_array(t: onnx.TensorProto, dtype: DType) -> np.ndarray:
    arr = numpy_helper.to_array(t)
    if arr.dtype != dtype.np:
        arr = arr.view(dtype.np) if arr.dtype.itemsize == dtype.np.itemsize else arr.astype(dtype.np)
    return arr
