"""fuse-rope: exported rotary position embedding -> ``rotary_embedding(x, cos_half, sin_half)``.

Runs after canonicalize, before fuse-attention (which then sees the rotated q and k). Needs nothing.
Preserves values (the fused op computes in f32).

Rotate-half (Llama, Mistral, Qwen, ...), x ``[B, H, S, D]``::

    x * cos + concat(-x[..., h:2h], x[..., :h], axis=-1) * sin      -> rotary_embedding(x, c, s)
    concat(rotary_embedding(x[..., :R]), x[..., R:], axis=-1)        -> rotary_embedding(x) {rotary_dim=R}

Interleaved (GPT-J style), with ``rot = reshape(concat(unsqueeze(-x[..., 1::2]), unsqueeze(x[..., ::2])))``
pairing ``(2i, 2i+1)`` -> ``{interleaved=true}``.

HF's ``cos``/``sin`` are ``[B, S, R]`` with duplicated halves (``cat(freqs, freqs)``), unsqueezed to
``[B, 1, S, R]``; the fused op wants per-token ``[B, S, R/2]``: the replacement takes the first half
(every other element for the interleaved form). It fuses only when the duplication is visible: the
table is ``cos(concat(f, f))`` (through casts, unsqueezes, gathers, scalar scaling) or a constant whose
halves are equal.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.ops.attention import RotaryEmbedding
from ..ir.ops.shape import Slice, Squeeze, Unsqueeze
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Match, P, Rule, Var, const_value, rewrite

_BIG = (1 << 63) - 1  # "to the end", as exporters write it


def _last_dim(v: Value) -> int | None:
    s = v.type.shape
    return s[-1] if s and isinstance(s[-1], int) else None


def _window(v: Value, step: int = 1) -> tuple[Value, int, int, int]:
    """``(base, start, stop, step)`` such that ``v = base[..., start:stop:step]`` (slices of the last
    axis composed; step 1 chains only, then one final stepped slice)."""
    p = v.producer
    if p is not None and p.op.name == "slice" and len(p.inputs) == 1 and p.inputs[0] is not None:
        x = p.inputs[0]
        rank, d = x.type.rank, _last_dim(x)
        op = p.op
        if rank and d is not None and op.starts is not None and len(op.starts) == 1:  # type: ignore[attr-defined]
            axes = op.axes if op.axes is not None else (0,)  # type: ignore[attr-defined]
            st = op.steps[0] if op.steps else 1  # type: ignore[attr-defined]
            if axes[0] % rank == rank - 1 and st >= 1:
                s, e = op.starts[0], op.ends[0]  # type: ignore[attr-defined]
                s = min(max(s + d if s < 0 else s, 0), d)
                e = min(max(e + d if e < 0 else e, 0), d)
                if st == 1:
                    b, s0, _, st0 = _window(x)
                    if st0 == 1:
                        return b, s0 + s, s0 + max(e, s), 1
                return x, s, max(e, s), st
    d = _last_dim(v)
    return v, 0, d if d is not None else -1, 1


def _duplicated(v: Value, graph: Graph, interleaved: bool, depth: int = 0) -> bool:
    """Is ``v``'s last axis two copies of one half (``cat(f, f)``; interleaved: ``f`` repeated twice)?"""
    if depth > 12:
        return False
    arr = const_value(v, graph, limit=1 << 22)
    if arr is not None:
        if arr.ndim == 0 or arr.shape[-1] % 2:
            return False
        if interleaved:
            return bool(np.array_equal(arr[..., 0::2], arr[..., 1::2]))
        h = arr.shape[-1] // 2
        return bool(np.array_equal(arr[..., :h], arr[..., h:]))
    p = v.producer
    if p is None:
        return False
    ins = [i for i in p.inputs if i is not None]
    name, rank = p.op.name, v.type.rank
    if name == "concat" and not interleaved and len(ins) == 2 and ins[0] is ins[1] and rank:
        return p.op.axis % rank == rank - 1  # type: ignore[attr-defined]
    if interleaved and name in ("reshape", "flatten") and ins:
        # repeat_interleave: reshape(concat|expand(unsqueeze(f, -1), ...)) [..., S, R/2, 2] -> [..., S, R]
        src = ins[0]
        q = src.producer
        if q is not None and src.type.shape and src.type.shape[-1] == 2:
            qi = [i for i in q.inputs if i is not None]
            if q.op.name == "concat" and len(qi) == 2 and qi[0] is qi[1]:
                return True
            if q.op.name == "expand" and qi and qi[0].type.shape and qi[0].type.shape[-1] == 1:
                return True
        return False
    if name in ("cos", "sin", "cast", "neg", "unsqueeze", "identity"):
        if name == "unsqueeze" and rank and any(a % rank == rank - 1 for a in p.op.axes or ()):  # type: ignore
            return False
        return _duplicated(ins[0], graph, interleaved, depth + 1)
    if name in ("mul", "div") and len(ins) == 2:
        # scaled by something constant along the last axis (attention_factor, a per-token scale)
        for a, other in ((ins[0], ins[1]), (ins[1], ins[0])):
            if other.type.shape is not None and (not other.type.shape or other.type.shape[-1] == 1):
                if a.type.rank == rank and _duplicated(a, graph, interleaved, depth + 1):
                    return True
        return False
    if name == "gather" and ins and rank:
        x = ins[0]
        axis = p.op.axis % x.type.rank if x.type.rank else -1  # type: ignore[attr-defined]
        return axis != (x.type.rank or 0) - 1 and _duplicated(x, graph, interleaved, depth + 1)
    if name in ("expand", "slice") and ins:
        # must not touch the last axis
        if name == "slice":
            b, s, e, st = _window(v)
            if b is not v:
                return False
        elif v.type.shape is None or ins[0].type.shape is None or ins[0].type.shape[-1:] != v.type.shape[-1:]:
            return False
        return _duplicated(ins[0], graph, interleaved, depth + 1)
    return False


def _half_table(b: Builder, t: Value, half: int, interleaved: bool) -> Value | None:
    """``[B|1, S, half]`` from a table broadcast against ``x [B, H, S, D]``."""
    shape = t.type.shape
    if shape is None:
        return None
    p = t.producer
    if len(shape) == 4:
        if shape[1] != 1:
            return None
        if p is not None and p.op.name == "unsqueeze" and tuple(a % 4 for a in p.op.axes or ()) == (1,):  # type: ignore
            t3 = p.inputs[0]
            assert t3 is not None
        else:
            t3 = b.add(Squeeze(axes=(1,)), [t])
    elif len(shape) == 2:
        t3 = b.add(Unsqueeze(axes=(0,)), [t])
    else:
        return None
    if interleaved:
        return b.add(Slice(starts=(0,), ends=(_BIG,), axes=(-1,), steps=(2,)), [t3])
    return b.add(Slice(starts=(0,), ends=(half,), axes=(-1,)), [t3])


def _tables_ok(x: Value, cos: Value, sin: Value, graph: Graph, interleaved: bool) -> bool:
    r = _last_dim(x)
    for t in (cos, sin):
        if t.type.dtype != x.type.dtype or _last_dim(t) != r or not _duplicated(t, graph, interleaved):
            return False
    return True


def _rules(graph: Graph) -> list[Rule]:
    def rotate_half(m: Match, b: Builder) -> Value | None:
        cat = m.node("cat")
        neg_in, lo = cat.inputs
        if neg_in is None or lo is None or neg_in.producer is None or neg_in.producer.op.name != "neg":
            return None
        hi = neg_in.producer.inputs[0]
        assert hi is not None
        out = m.root.outputs[0]
        if out.type.rank != 4 or cat.op.axis % 4 != 3:  # type: ignore[attr-defined]
            return None
        bh, sh, eh, sth = _window(hi)
        bl, sl, el, stl = _window(lo)
        a, c = m.node("mc").inputs
        for x, cos in ((a, c), (c, a)):
            assert x is not None and cos is not None
            bx, sx, ex, stx = _window(x)
            if not (bx is bh is bl and sth == stl == stx == 1 and sl == sx and el == sh and eh == ex
                    and el - sl == eh - sh > 0):
                continue
            if x.type.shape != out.type.shape or not _tables_ok(x, cos, m["sin"], graph, False):
                continue
            half = el - sl
            c_half = _half_table(b, cos, half, False)
            s_half = _half_table(b, m["sin"], half, False)
            if c_half is None or s_half is None:
                return None
            return b.add(RotaryEmbedding(), [x, c_half, s_half])
        return None

    def interleaved(m: Match, b: Builder) -> Value | None:
        cat, out = m.node("cat"), m.root.outputs[0]
        if out.type.rank != 4 or cat.op.axis % 5 != 4:  # type: ignore[attr-defined]
            return None
        u_neg, u_even = cat.inputs
        ups = []
        for u in (u_neg, u_even):
            if u is None or u.producer is None or u.producer.op.name != "unsqueeze" or u.type.shape is None:
                return None
            if tuple(a % 5 for a in u.producer.op.axes or ()) != (4,):  # type: ignore[attr-defined]
                return None
            ups.append(u.producer.inputs[0])
        n, even = ups
        if n is None or n.producer is None or n.producer.op.name != "neg" or even is None:
            return None
        odd = n.producer.inputs[0]
        assert odd is not None
        bo, so, eo, sto = _window(odd)
        be, se, ee, ste = _window(even)
        a, c = m.node("mc").inputs
        for x, cos in ((a, c), (c, a)):
            assert x is not None and cos is not None
            bx, sx, ex, stx = _window(x)
            if not (bx is bo is be and bx is x and sto == ste == 2 and se == 0 and so == 1 and ex % 2 == 0):
                continue
            if x.type.shape != out.type.shape or not _tables_ok(x, cos, m["sin"], graph, True):
                continue
            c_half = _half_table(b, cos, ex // 2, True)
            s_half = _half_table(b, m["sin"], ex // 2, True)
            if c_half is None or s_half is None:
                return None
            return b.add(RotaryEmbedding(interleaved=True), [x, c_half, s_half])
        return None

    def partial(m: Match, b: Builder) -> Value | None:
        rope, xp = m.node("rope"), m["pass"]
        out = m.root.outputs[0]
        xr = rope.inputs[0]
        assert xr is not None
        if rope.op.rotary_dim or out.type.rank != 4 or m.root.op.axis % 4 != 3:  # type: ignore[attr-defined]
            return None
        br, sr, er, _ = _window(xr)
        bp, sp, ep, stp = _window(xp)
        if not (br is bp and sr == 0 and sp == er and stp == 1 and ep == _last_dim(br)
                and br.type.shape == out.type.shape):
            return None
        return b.add(RotaryEmbedding(interleaved=rope.op.interleaved, rotary_dim=er),  # type: ignore[attr-defined]
                     [br, *rope.inputs[1:]])

    mc = P("mul", Var("m0"), Var("m1"), name="mc", one_use=True)
    return [
        Rule("rotate-half", P("add", mc, P("mul", P("concat", Var("n"), Var("l"), name="cat", one_use=True),
                                           Var("sin"), commutative=True, one_use=True), commutative=True),
             rotate_half),
        Rule("interleaved", P("add", mc, P("mul", P(("reshape", "flatten"), P("concat", Var("n"), Var("e"), name="cat",
                                                                               one_use=True), one_use=True),
                                           Var("sin"), commutative=True, one_use=True), commutative=True),
             interleaved),
        Rule("partial-rotary", P("concat", P("rotary_embedding", Var("xr"), Var("c"), Var("s"), name="rope",
                                             one_use=True), Var("pass")), partial),
    ]


@register_pass
class FuseRope(Pass):
    """Rotate-half / interleaved / partial RoPE -> ``rotary_embedding``. Runs after canonicalize and
    before fuse-attention; needs nothing; preserves values."""

    name = "fuse-rope"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        self.stats = rewrite(graph, _rules(graph))
        return bool(self.stats)
