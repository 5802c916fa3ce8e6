"""The text form of the IR: a printer and a parser that round-trip.

::

    graph @main(%x: f32[B,4], %k: i64[1]) weights(%w: f32[4,8]) {
      %y = matmul(%x, %w) : f32[B,8]
      %v, %i = topk(%y, %k) {axis=-1, largest=true, sorted=true} : f32[B,?], i64[B,?]
      return %v as "values", %i
    }

Names that are not plain identifiers are quoted (``%"/model/Add_output_0"``); an omitted optional
input prints as ``_``; attributes print in field order; constants print as
``dense<f32[2]>[1.0, 2.0]``. Weights print as declarations only: their bytes live elsewhere, so
parsing gives weights without data unless ``weights=`` supplies them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from typing import Any

import numpy as np

from .graph import Graph, Value, Weight
from .op import Op, OpError, get_op
from .types import UNKNOWN, DType, TensorType

_IDENT = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_.]*|\d+)\Z")


def _name(name: str) -> str:
    return "%" + (name if _IDENT.match(name) else json.dumps(name))


def _dim(d: int | str) -> str:
    return str(d) if isinstance(d, int) or _IDENT.match(d) or d == UNKNOWN else json.dumps(d)


def print_type(t: TensorType) -> str:
    if t.shape is None:
        return f"{t.dtype.value}[*]"
    return f"{t.dtype.value}[{','.join(_dim(d) for d in t.shape)}]"


def _scalar(v: Any) -> str:
    if isinstance(v, bool | np.bool_):
        return "true" if v else "false"
    if isinstance(v, int | np.integer):
        return str(int(v))
    if isinstance(v, float | np.floating):
        f = float(v)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        r = repr(f)
        return r if any(c in r for c in ".e") else r + ".0"
    raise TypeError(f"cannot print {v!r}")


def print_attr(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, DType):
        return v.value
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, tuple | list):
        return "[" + ", ".join(print_attr(x) for x in v) + "]"
    if isinstance(v, np.ndarray):
        t = TensorType.of(v)
        flat = v.reshape(-1)
        if t.dtype.is_float and t.dtype not in (DType.f64, DType.f32):
            flat = flat.astype(np.float32)
        return f"dense<{print_type(t)}>[" + ", ".join(_scalar(x.item()) for x in flat) + "]"
    return _scalar(v)


def _is_default(f: dataclasses.Field, v: Any) -> bool:
    if f.default is dataclasses.MISSING or isinstance(v, np.ndarray):
        return False
    d = f.default
    return type(d) is type(v) and d == v and not (isinstance(v, float) and math.isnan(v))


def print_node_attrs(op: Op) -> str:
    """Attributes in field order; those equal to their default are left out (parsing restores them)."""
    attrs = [(f.name, getattr(op, f.name)) for f in dataclasses.fields(op)
             if not _is_default(f, getattr(op, f.name))]
    if not attrs:
        return ""
    return " {" + ", ".join(f"{k}={print_attr(v)}" for k, v in attrs) + "}"


def print_graph(g: Graph) -> str:
    ins = ", ".join(f"{_name(v.name)}: {print_type(v.type)}" for v in g.inputs)
    head = f"graph @{g.name}({ins})"
    if g.weight_values:
        ws = ", ".join(f"{_name(v.name)}: {print_type(v.type)}" for v in g.weight_values.values())
        head += f" weights({ws})"
    lines = [head + " {"]
    for n in g.nodes:
        outs = ", ".join(_name(v.name) for v in n.outputs)
        args = ", ".join("_" if v is None else _name(v.name) for v in n.inputs)
        tys = ", ".join(print_type(v.type) for v in n.outputs)
        lines.append(f"  {outs} = {n.op.name}({args}){print_node_attrs(n.op)} : {tys}")
    rets = []
    for v, name in zip(g.outputs, g.output_names):
        rets.append(_name(v.name) + ("" if name == v.name else f" as {json.dumps(name)}"))
    lines.append("  return " + ", ".join(rets))
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- parser ----------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<num>-?(?:inf|nan|\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)(?![A-Za-z_]))
    | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
    | (?P<punct>->|[%@(){}\[\],:=<>*_?])
    )""",
    re.X,
)


class ParseError(ValueError):
    pass


class _Lexer:
    def __init__(self, text: str) -> None:
        self.toks: list[tuple[str, str, int]] = []
        pos = 0
        text = re.sub(r"#[^\n]*", "", text)
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                break
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise ParseError(f"unexpected character {text[pos]!r} at offset {pos}")
            kind = m.lastgroup or ""
            self.toks.append((kind, m.group(kind), pos))
            pos = m.end()
        self.i = 0

    def peek(self, k: int = 0) -> tuple[str, str, int]:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ("eof", "", -1)

    def next(self) -> tuple[str, str, int]:
        t = self.peek()
        self.i += 1
        return t

    def accept(self, s: str) -> bool:
        if self.peek()[1] == s and self.peek()[0] != "str":
            self.i += 1
            return True
        return False

    def expect(self, s: str) -> None:
        kind, val, pos = self.next()
        if val != s or kind == "str":
            raise ParseError(f"expected {s!r}, got {val!r} at offset {pos}")


def _parse_name(lx: _Lexer) -> str:
    lx.expect("%")
    kind, val, pos = lx.next()
    if kind == "str":
        return json.loads(val)
    if kind in ("ident", "num"):
        return val
    raise ParseError(f"expected a value name at offset {pos}")


def _parse_dim(lx: _Lexer) -> int | str:
    kind, val, pos = lx.next()
    if kind == "num":
        return int(val)
    if kind == "str":
        return json.loads(val)
    if kind == "ident" or val == "?":
        return val
    raise ParseError(f"expected a dimension at offset {pos}")


def parse_type(lx: _Lexer) -> TensorType:
    kind, val, pos = lx.next()
    try:
        dtype = DType(val)
    except ValueError:
        raise ParseError(f"unknown dtype {val!r} at offset {pos}") from None
    lx.expect("[")
    if lx.accept("*"):
        lx.expect("]")
        return TensorType(dtype, None)
    dims: list[int | str] = []
    while not lx.accept("]"):
        dims.append(_parse_dim(lx))
        lx.accept(",")
    return TensorType(dtype, tuple(dims))


def _parse_literal(lx: _Lexer) -> Any:
    kind, val, pos = lx.next()
    if kind == "str":
        return json.loads(val)
    if kind == "num":
        if re.fullmatch(r"-?\d+", val):
            return int(val)
        return float(val)
    if val == "[":
        items = []
        while not lx.accept("]"):
            items.append(_parse_literal(lx))
            lx.accept(",")
        return tuple(items)
    if kind == "ident":
        if val == "true":
            return True
        if val == "false":
            return False
        if val == "none":
            return None
        if val == "dense":
            lx.expect("<")
            t = parse_type(lx)
            lx.expect(">")
            vals = _parse_literal(lx)
            assert t.shape is not None
            arr = np.array(vals, dtype=np.float64 if t.dtype.is_float else object)
            return arr.astype(t.dtype.np).reshape(tuple(int(d) for d in t.shape))
        return _Ident(val)
    raise ParseError(f"unexpected {val!r} at offset {pos}")


class _Ident(str):
    pass


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except (TypeError, ValueError) as e:
                errors.append(str(e))
        raise TypeError(f"{where}: {value!r} fits none of {hint}")
    if origin is tuple:
        if not isinstance(value, tuple):
            raise TypeError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], where) for v in value)
        return tuple(_coerce(v, a, where) for v, a in zip(value, args))
    if hint is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{where}: expected true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{where}: expected an int, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{where}: expected a float, got {value!r}")
        return float(value)
    if hint is str:
        if isinstance(value, _Ident) or not isinstance(value, str):
            raise TypeError(f"{where}: expected a string, got {value!r}")
        return str(value)
    if hint is DType:
        if not isinstance(value, _Ident):
            raise TypeError(f"{where}: expected a dtype, got {value!r}")
        return DType(str(value))
    if hint is np.ndarray:
        if not isinstance(value, np.ndarray):
            raise TypeError(f"{where}: expected dense<...>, got {value!r}")
        return value
    if hint is Any or hint is object:
        return value
    raise TypeError(f"{where}: unsupported attribute type {hint}")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type[Op]) -> dict[str, Any]:
    if cls not in _HINTS:
        import sys

        mod = sys.modules[cls.__module__]
        ns = {**vars(mod), "np": np, "DType": DType}
        _HINTS[cls] = typing.get_type_hints(cls, globalns=ns)
    return _HINTS[cls]


def make_op(name: str, attrs: dict[str, Any]) -> Op:
    cls = get_op(name)
    hints = _hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(attrs) - fields
    if unknown:
        raise ParseError(f"op {name} has no attribute(s) {sorted(unknown)}")
    kwargs = {k: _coerce(v, hints[k], f"{name}.{k}") for k, v in attrs.items()}
    return cls(**kwargs)


def parse_graph(text: str, weights: dict[str, np.ndarray] | None = None) -> Graph:
    """Parse the text form. Types written in the text are checked against inference."""
    lx = _Lexer(text)
    lx.expect("graph")
    lx.expect("@")
    g = Graph(lx.next()[1])
    env: dict[str, Value] = {}
    lx.expect("(")
    while not lx.accept(")"):
        name = _parse_name(lx)
        lx.expect(":")
        env[name] = g.add_input(name, parse_type(lx))
        lx.accept(",")
    if lx.accept("weights"):
        lx.expect("(")
        while not lx.accept(")"):
            name = _parse_name(lx)
            lx.expect(":")
            t = parse_type(lx)
            if weights is not None and name in weights:
                w = Weight.from_array(weights[name], source=f"text:{name}")
            else:

                def missing(name: str = name) -> np.ndarray:
                    raise ValueError(f"weight {name!r} has no data (parsed from text)")

                w = Weight(t, missing, source=f"text:{name}")
            env[name] = g.add_weight(name, w)
            lx.accept(",")
    lx.expect("{")
    while not lx.accept("return"):
        outs = [_parse_name(lx)]
        while lx.accept(","):
            outs.append(_parse_name(lx))
        lx.expect("=")
        kind, opname, pos = lx.next()
        lx.expect("(")
        args: list[Value | None] = []
        while not lx.accept(")"):
            if lx.accept("_"):
                args.append(None)
            else:
                n = _parse_name(lx)
                if n not in env:
                    raise ParseError(f"{opname} at offset {pos}: %{n} is not defined")
                args.append(env[n])
            lx.accept(",")
        attrs: dict[str, Any] = {}
        if lx.accept("{"):
            while not lx.accept("}"):
                key = lx.next()[1]
                lx.expect("=")
                attrs[key] = _parse_literal(lx)
                lx.accept(",")
        lx.expect(":")
        tys = [parse_type(lx)]
        while lx.accept(","):
            tys.append(parse_type(lx))
        op = make_op(opname, attrs)
        values = g.add(op, args, outs, source=f"text@{pos}")
        if len(values) != len(outs):
            raise OpError(f"{opname} at offset {pos}: produces {len(values)} values, {len(outs)} named")
        for v, t, n in zip(values, tys, outs):
            # the written type is authoritative (it may be sharper than inference, e.g. after
            # shape folding); the verifier checks it is compatible
            v.type = t
            env[n] = v
    while True:
        n = _parse_name(lx)
        if n not in env:
            raise ParseError(f"return: %{n} is not defined")
        out_name = json.loads(lx.next()[1]) if lx.accept("as") else n
        g.outputs.append(env[n])
        g.output_names.append(out_name)
        if not lx.accept(","):
            break
    lx.expect("}")
    return g
