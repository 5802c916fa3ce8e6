"""fuse-attention: decomposed scaled dot-product attention -> ``attention(q, k, v, mask)``.

Runs after fuse-rope (q and k are then ``rotary_embedding`` results) and canonicalize. Needs
nothing. Preserves values; rows whose keys are all masked give zeros (as the exporters' ``isnan``
guard does; without it the decomposed form gives NaN there).

::

    s = matmul(q * a, kT * b) [* c | / c]          kT: any view chain realizing k^T (transposes,
    l = s + mask | where(cond, s, -inf) | s             reshapes) of repeat_kv(k): unsqueeze/expand/
    p = softmax(l, axis=-1) [-> where(isnan(p), 0, p)]  reshape, checked by simulating the chain
    y = matmul(p, v')                               v': repeat_kv(v) or v

    -> attention(q, k, v, mask) {scale=a*b*c, num_heads=Hq, num_kv_heads=Hkv}

``q``, ``k``, ``v`` are 4-D ``[B, H, S, D]``; ``k``/``v`` keep their KV heads (GQA) and any past-KV
``concat`` in front of them (the LLM lowering replaces the whole op by paged attention). The mask
stays an input: additive (float) or boolean (True attends). A causal ``trilu`` mask built from
ones (SDPA ``is_causal``) becomes ``causal=true`` with no mask.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.ops.attention import Attention
from ..ir.types import DType
from .fuse_util import realizes, scalar_value, view_chain
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Match, P, Rule, Var, rewrite


def _unrepeat(v: Value, graph: Graph, heads: int | None, transpose: bool) -> tuple[Value, float] | None:
    """``(k, scale)`` with ``v`` = (scale *) [transposed] repeat_kv(k) for a 4-D ``k`` [B, Hkv, S, D]."""
    for cand, scale in reversed(view_chain(v, graph)):
        s = cand.type.shape
        if s is None or len(s) != 4 or not isinstance(s[1], int) or s[1] == 0:
            continue
        if heads is None or heads % s[1]:
            continue
        rep = heads // s[1]

        def expected(a: np.ndarray, rep: int = rep) -> np.ndarray:
            r = np.repeat(a, rep, axis=1)
            return np.swapaxes(r, -1, -2) if transpose else r

        if realizes(v, cand, graph, expected):
            return cand, scale
    return None


def _scaled(v: Value, graph: Graph) -> tuple[Value, float]:
    """``(x, s)`` with ``v = s * x`` through scalar muls/divs only."""
    from .fuse_util import _scale_operand

    scale = 1.0
    while v.producer is not None:
        sc = _scale_operand(v.producer, graph)
        if sc is None:
            break
        v, f = sc
        scale *= f
    return v, scale


def _mask(logits: Value, graph: Graph) -> tuple[Value, Value | None] | None:
    """``(scores, mask)``: the scores before an additive mask (or a -inf ``where``), and the mask."""
    p = logits.producer
    if p is not None and p.op.name == "add":
        a, b = p.inputs
        assert a is not None and b is not None
        for s, m in ((a, b), (b, a)):
            if s.producer is not None and s.type.shape == logits.type.shape and _is_scores(s, graph):
                return s, m
    if p is not None and p.op.name == "where":
        c, s, f = p.inputs
        assert c is not None and s is not None and f is not None
        if scalar_value(f, graph) == -np.inf and s.type.shape == logits.type.shape:
            return s, c
    return logits, None


def _is_scores(v: Value, graph: Graph) -> bool:
    x, _ = _scaled(v, graph)
    return x.producer is not None and x.producer.op.name == "matmul"


def _rules(graph: Graph) -> list[Rule]:
    def fuse(m: Match, b: Builder) -> Value | None:
        sm, v_exp, out = m.node("softmax"), m["v"], m.root.outputs[0]
        logits = sm.inputs[0]
        assert logits is not None
        if sm.op.axis not in (-1, 3) or out.type.rank != 4:  # type: ignore[attr-defined]
            return None
        found = _mask(logits, graph)
        if found is None:
            return None
        scores, mask = found
        raw, s_scale = _scaled(scores, graph)
        mm = raw.producer
        if mm is None or mm.op.name != "matmul":
            return None
        qs, kts = mm.inputs
        assert qs is not None and kts is not None
        q, q_scale = _scaled(qs, graph)
        qshape = q.type.shape
        if qshape is None or len(qshape) != 4 or not isinstance(qshape[1], int):
            return None
        hq = qshape[1]
        kk = _unrepeat(kts, graph, hq, transpose=True)
        vv = _unrepeat(v_exp, graph, hq, transpose=False)
        if kk is None or vv is None or vv[1] != 1.0:
            return None
        k, k_scale = kk
        v = vv[0]
        if k.type.dtype != q.type.dtype or v.type.dtype != q.type.dtype or k.type.shape[1] != v.type.shape[1]:  # type: ignore
            return None
        scale = q_scale * k_scale * s_scale
        if q.type.dtype != DType.f64:  # the factors were f32 (or narrower) constants: no false digits
            scale = float(str(np.float32(scale)))
        hk = k.type.shape[1]  # type: ignore[index]
        op = Attention(scale=scale, num_heads=hq, num_kv_heads=hk)  # type: ignore[arg-type]
        if mask is not None and (mask.type.rank is None or mask.type.rank > 4):
            return None
        return b.add(op, [q, k, v] + ([mask] if mask is not None else []))

    sm = P("softmax", Var("l"), name="softmax", one_use=True)
    sm2 = P("softmax", Var("l"), name="softmax")
    guarded = P("where", P("isnan", sm2, one_use=True), Var("zero", where=lambda v: scalar_value(v, graph) == 0.0),
                sm2, one_use=True)
    return [
        Rule("sdpa", P("matmul", sm, Var("v")), fuse),
        Rule("sdpa-nan-guard", P("matmul", guarded, Var("v")), fuse),
    ]


@register_pass
class FuseAttention(Pass):
    """Decomposed attention (GQA, masks, past KV) -> ``attention``. Runs after fuse-rope; needs
    nothing; preserves values."""

    name = "fuse-attention"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        self.stats = rewrite(graph, _rules(graph))
        return bool(self.stats)
