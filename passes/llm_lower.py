"""llm-lower: a fused decoder export -> the serving form of docs/SERVING_FORM.md.

Runs after ``O2`` (canonicalize, fuse, canonicalize). Needs the fused ops: ``rms_norm``, ``linear``
(fused QKV / gate-up ``linear`` + ``split`` or separate ones), ``rotary_embedding``, ``attention``,
``swiglu``, and an embedding (``embedding`` or ``gather`` on a weight). Replaces the whole graph; the
new signature is the serving form's, ``graph.meta`` gets ``kv_cache`` and ``llm``.

How: the pass walks the residual stream from the token embedding and recognizes each role::

    embedding -> per layer:
        rms_norm -> q/k/v linears -> [layout] -> rotary_embedding(q), rotary_embedding(k)
        -> [layout, concat with past K/V, GQA expansion] -> attention(q, k, v, mask)
        -> [layout] -> linear(o_proj, residual) | linear(o_proj) + residual
        -> rms_norm -> gate/up linears -> swiglu -> linear(down, residual) | ... + residual
    -> rms_norm -> linear(lm_head) -> [layout] -> logits

maps them to a ``LlamaConfig`` and Hugging Face-named tensors, and emits the serving form with
``frontend.llama_builder.build_llama``. Layout ops (reshape, transpose, (un)squeeze, flatten, expand,
no-op casts and slices) between the roles are accounted for; so is every node that does not depend
on the token ids' or past K/V's *values* (position, mask and shape computations): those are
replaced by what the serving form computes itself, and checked:

- the RoPE cos/sin tables are the graph's own cos/sin, evaluated on the CPU backend at positions
  ``0 .. max_positions - 1`` (so any rope scaling is captured exactly);
- every attention's mask (with an all-ones ``attention_mask``) must be exactly causal, bottom-right
  aligned for a non-empty past;
- finally (option ``check``, default on) the lowered graph, driven through a paged cache with two
  sequences of different lengths (a prefill, then a second step), must give the original graph's
  logits within ``check_rtol`` (1e-3) of the logits' max magnitude.

Any node on the hidden path that plays no recognized role fails the pass with an ``LlmLowerError``
naming those nodes; nothing is silently dropped.

Options (``ctx.option("llm-lower", key)``): ``max_positions`` (RoPE table length and context length;
default the ``config``'s ``max_position_embeddings``, else 4096), ``config`` (a Hugging Face
``config.json`` dict, if one came with the export: ``max_position_embeddings``, ``bos_token_id``,
``eos_token_id``, ``model_type``), ``check`` (bool), ``check_rtol`` (float).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from .manager import Pass, PassContext, PassError, register_pass

#: Ops that only move data (their first input is the data, the rest shapes/axes).
LAYOUT_OPS = frozenset({"reshape", "transpose", "unsqueeze", "squeeze", "flatten", "expand", "identity"})
#: Ops whose output does not depend on their input's values.
SHAPE_ONLY_OPS = frozenset({"shape", "size"})

DEFAULT_MAX_POSITIONS = 4096

_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)$")
_PRESENT = re.compile(r"present\.(\d+)\.(key|value)$")
_OPTIONAL_INPUTS = ("attention_mask", "position_ids")


class LlmLowerError(PassError):
    """The graph is not a decoder this pass can lower; the message says which part and why."""


def decoder_signature_problem(graph: Graph) -> str | None:
    """None when ``graph``'s inputs/outputs look like a decoder LLM export, else why not.

    A decoder has an ``input_ids`` input (plus optionally ``attention_mask``, ``position_ids`` and
    ``past_key_values.{i}.key/value``) and a ``logits`` output (plus optionally ``present.{i}.*``).
    """
    ins = [v.name for v in graph.inputs]
    if "input_ids" not in ins:
        return f"it has no input named input_ids (inputs: {ins})"
    odd = [n for n in ins if n != "input_ids" and n not in _OPTIONAL_INPUTS and not _PAST.match(n)]
    if odd:
        return f"inputs {odd} are not input_ids, attention_mask, position_ids or past_key_values.*"
    if "logits" not in graph.output_names:
        return f"it has no output named logits (outputs: {graph.output_names})"
    odd = [n for n in graph.output_names if n != "logits" and not _PRESENT.match(n)]
    if odd:
        return f"outputs {odd} are not logits or present.*"
    return None


def looks_like_decoder(graph: Graph) -> bool:
    return decoder_signature_problem(graph) is None


def _describe(n: Node) -> str:
    outs = ", ".join(f"%{o.name}" for o in n.outputs)
    return f"{n.op.name} -> {outs}" + (f" ({n.source})" if n.source else "")


def _static(t: TensorType, what: str) -> tuple[int, ...]:
    if t.shape is None or not all(isinstance(d, int) for d in t.shape):
        raise LlmLowerError(f"{what} must have a static shape, got {t}")
    return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]


@dataclass
class _Proj:
    """Rows ``start:stop`` of a ``linear``'s weight (and bias): one projection of a fused linear."""

    node: Node
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass
class _Layer:
    attn_norm: Node
    q: _Proj
    k: _Proj
    v: _Proj
    rope_q: Node
    rope_k: Node
    attention: Node
    scale: float
    o: Node
    mlp_norm: Node
    gate: _Proj
    up: _Proj
    swiglu: Node
    down: Node


class _Recognizer:
    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.users = graph.users()
        self.claimed: dict[Node, str] = {}
        self.inputs = {v.name: v for v in graph.inputs}
        self.outputs = dict(zip(graph.output_names, graph.outputs))
        self.pasts = {v for v in graph.inputs if _PAST.match(v.name)}
        self.hidden = self._hidden_values()
        self._const_cache: dict[int, Callable[[], np.ndarray]] = {}

    # -- helpers -------------------------------------------------------------------------------
    def _hidden_values(self) -> set[Value]:
        """Values that depend on the token ids' or the past K/V's values (not only their shapes)."""
        hidden: set[Value] = {self.inputs["input_ids"], *self.pasts}
        for n in self.g.nodes:
            if n.op.name not in SHAPE_ONLY_OPS and any(v is not None and v in hidden for v in n.inputs):
                hidden.update(n.outputs)
        return hidden

    def claim(self, nodes: Iterable[Node], role: str) -> None:
        for n in nodes:
            self.claimed.setdefault(n, role)

    def fail(self, what: str, at: Node | Value | None = None) -> LlmLowerError:
        where = ""
        if isinstance(at, Node):
            where = f" at {_describe(at)}"
        elif isinstance(at, Value):
            where = f" at %{at.name}" + (f" = {_describe(at.producer)}" if at.producer else "")
        return LlmLowerError(f"llm-lower: {what}{where}")

    def real_users(self, v: Value) -> list[Node]:
        return [u for u in self.users.get(v, []) if u.op.name not in SHAPE_ONLY_OPS]

    def const(self, v: Value | None, what: str) -> Callable[[], np.ndarray]:
        """A loader for a compile-time constant value (a weight, a constant, or ops on those)."""
        if v is None:
            raise self.fail(f"{what} is missing")
        key = id(v)
        if key in self._const_cache:
            return self._const_cache[key]
        g = self.g
        if v.producer is None:
            if g.weight_values.get(v.name) is not v:
                raise self.fail(f"{what} is not a constant (it is the graph input %{v.name})")
            w = g.weights[v.name]
            loader: Callable[[], np.ndarray] = w.load
        elif v.producer.op.name == "constant":
            arr = v.producer.op.value  # type: ignore[attr-defined]
            loader = lambda: arr  # noqa: E731
        else:
            n = v.producer
            if n.op.has_side_effects or v in self.hidden:
                raise self.fail(f"{what} is not a constant", v)
            args = [None if i is None else self.const(i, what) for i in n.inputs]
            index = v.index

            def loader() -> np.ndarray:
                return n.op.run(*[None if a is None else a() for a in args])[index]

        self._const_cache[key] = loader
        return loader

    def back(self, v: Value, *, past: list[Value] | None = None, scale: list[float] | None = None,
             ) -> tuple[Value, list[Node]]:
        """Follow ``v`` back through layout ops (and, when asked, a concat with a past K/V input and
        multiplications by a scalar constant); returns the first other value and the nodes passed."""
        nodes: list[Node] = []
        while v.producer is not None:
            n = v.producer
            op = n.op.name
            x = n.inputs[0] if n.inputs else None
            if x is not None and (
                op in LAYOUT_OPS
                or (op == "cast" and x.type.dtype == v.type.dtype)
                or (op == "slice" and x.type.shape is not None and x.type.shape == v.type.shape)
            ):
                nodes.append(n)
                v = x
                continue
            if past is not None and op == "concat" and len(n.inputs) == 2 and n.inputs[0] is not None:
                p, pnodes = self.back(n.inputs[0])
                if p in self.pasts and n.inputs[1] is not None:
                    past.append(p)
                    nodes += [n, *pnodes]
                    v = n.inputs[1]
                    continue
            if scale is not None and op in ("mul", "div") and len(n.inputs) == 2:
                data = [i for i in n.inputs if i is not None and i in self.hidden]
                other = [i for i in n.inputs if i is not None and i not in self.hidden]
                if len(data) == 1 and len(other) == 1 and (other[0].type.numel() == 1):
                    if op == "div" and n.inputs[1] is not other[0]:
                        break
                    c = float(np.asarray(self.const(other[0], "a scale factor")()).reshape(()))
                    scale.append(c if op == "mul" else 1.0 / c)
                    nodes.append(n)
                    v = data[0]
                    continue
            break
        return v, nodes

    def proj(self, v: Value, source: Value, role: str) -> _Proj:
        """``v`` as rows of a ``linear`` of ``source`` (whole, or one part of a split/slice)."""
        v, nodes = self.back(v)
        self.claim(nodes, role)
        n = v.producer
        if n is None:
            raise self.fail(f"{role}: expected a linear projection", v)
        whole = n.op.name not in ("split", "slice")
        start = stop = 0
        if n.op.name in ("split", "slice"):
            x = n.inputs[0]
            rank = x.type.rank if x is not None else None
            if x is None or rank is None:
                raise self.fail(f"{role}: cannot read the split", n)
            if n.op.name == "split":
                axis = n.op.axis % rank  # type: ignore[attr-defined]
                sizes = [o.type.shape[-1] if o.type.shape else None for o in n.outputs]
                if axis != rank - 1 or not all(isinstance(s, int) for s in sizes):
                    raise self.fail(f"{role}: expected a split of the last axis with static sizes", n)
                start = sum(sizes[: v.index])  # type: ignore[arg-type]
                stop = start + sizes[v.index]  # type: ignore[operator]
            else:
                op = n.op
                if len(n.inputs) > 1 or op.axes is None or len(op.axes) != 1 or op.axes[0] % rank != rank - 1 \
                        or (op.steps is not None and tuple(op.steps) != (1,)):  # type: ignore[attr-defined]
                    raise self.fail(f"{role}: expected a slice of the last axis with step 1", n)
                dim = _static(x.type, f"{role} input")[-1]
                start, stop, _ = slice(op.starts[0], op.ends[0]).indices(dim)  # type: ignore[attr-defined]
            self.claim([n], role)
            v = x
            n = x.producer
        if n is None or n.op.name != "linear":
            raise self.fail(f"{role}: expected a linear projection", v)
        if n.inputs[0] is not source:
            raise self.fail(f"{role}: the projection does not read the normalized hidden state", n)
        if len(n.inputs) > 3 and n.inputs[3] is not None:
            raise self.fail(f"{role}: unexpected residual input", n)
        rows = _static(n.inputs[1].type, f"{role} weight")[0]  # type: ignore[union-attr]
        self.claim([n], role)
        if whole:
            start, stop = 0, rows
        return _Proj(n, start, stop)

    def stream_users(self, x: Value) -> tuple[Node, Node | None]:
        """The rms_norm that reads the residual stream ``x`` and the node that adds to it (if any)."""
        users = self.real_users(x)
        norms = [u for u in users if u.op.name == "rms_norm" and u.inputs[0] is x]
        rest = [u for u in users if u not in norms]
        if len(norms) != 1 or len(rest) > 1:
            found = ", ".join(_describe(u) for u in users) or "nothing"
            raise self.fail(f"expected one rms_norm and one residual add to read the residual stream; found {found}",
                            x)
        return norms[0], rest[0] if rest else None

    def residual(self, x: Value, r: Node, role: str) -> tuple[Node, Value]:
        """The linear whose result ``r`` adds to the residual ``x``; and the new residual."""
        if r.op.name == "linear" and len(r.inputs) > 3 and r.inputs[3] is x and r.inputs[0] is not x:
            self.claim([r], role)
            return r, r.outputs[0]
        if r.op.name == "add" and len(r.inputs) == 2 and x in r.inputs:
            other = r.inputs[1] if r.inputs[0] is x else r.inputs[0]
            lin = other.producer if other is not None else None
            if lin is not None and lin.op.name == "linear" and not (len(lin.inputs) > 3 and lin.inputs[3] is not None):
                self.claim([r], f"{role} residual add")
                self.claim([lin], role)
                return lin, r.outputs[0]
        raise self.fail(f"{role}: expected a linear adding to the residual stream", r)

    # -- roles ---------------------------------------------------------------------------------
    def embedding(self) -> Node:
        ids = self.inputs["input_ids"]
        found = []
        for n in self.g.nodes:
            if n.op.name == "embedding" or (n.op.name == "gather" and getattr(n.op, "axis", 0) == 0):
                if len(n.inputs) == 2 and n.inputs[1] is not None and n.inputs[0] is not None:
                    src, nodes = self.back(n.inputs[1])
                    if src is ids and n.inputs[0] not in self.hidden:
                        found.append((n, nodes))
        if len(found) != 1:
            raise self.fail(f"expected one token embedding (gather/embedding of a weight by input_ids), "
                            f"found {len(found)}")
        n, nodes = found[0]
        self.claim([n, *nodes], "embedding")
        return n

    def attention_block(self, x: Value, norm: Node, r: Node, i: int) -> tuple[dict[str, Any], Value]:
        h = norm.outputs[0]
        role = f"layer {i} attention"
        self.claim([norm], f"layer {i} input norm")
        o, x2 = self.residual(x, r, f"layer {i} o_proj")
        a, nodes = self.back(o.inputs[0])  # type: ignore[arg-type]
        self.claim(nodes, role)
        att = a.producer
        if att is None or att.op.name != "attention":
            raise self.fail(f"layer {i}: expected attention before o_proj", a)
        self.claim([att], role)
        if len(att.inputs) > 4 and att.inputs[4] is not None:
            raise self.fail(f"{role}: kv_lengths are not supported", att)
        scales: list[float] = []
        ropes = []
        projs = []
        for name, val in zip("qkv", att.inputs[:3]):
            past: list[Value] = []
            src, nodes = self.back(val, past=past if name != "q" else None, scale=scales if name != "v" else None)
            self.claim(nodes, role)
            if name != "q" and len(past) != (1 if self.pasts else 0):
                raise self.fail(f"{role}: {name} must be this step's {name} after the past {name}", val)
            if name != "v":
                rope = src.producer
                if rope is None or rope.op.name != "rotary_embedding":
                    raise self.fail(f"{role}: expected rotary_embedding on {name}", src)
                self.claim([rope], f"layer {i} rope")
                ropes.append(rope)
                src, nodes = self.back(rope.inputs[0], scale=scales)  # type: ignore[arg-type]
                self.claim(nodes, role)
            projs.append(self.proj(src, h, f"layer {i} {name}_proj"))
        scale = math.prod(scales)
        return dict(attn_norm=norm, q=projs[0], k=projs[1], v=projs[2], rope_q=ropes[0], rope_k=ropes[1],
                    attention=att, scale=scale, o=o), x2

    def mlp_block(self, x: Value, norm: Node, r: Node, i: int) -> tuple[dict[str, Any], Value]:
        h = norm.outputs[0]
        role = f"layer {i} mlp"
        self.claim([norm], f"layer {i} post-attention norm")
        down, x2 = self.residual(x, r, f"layer {i} down_proj")
        s, nodes = self.back(down.inputs[0])  # type: ignore[arg-type]
        self.claim(nodes, role)
        act = s.producer
        if act is None or act.op.name != "swiglu":
            raise self.fail(f"layer {i}: expected swiglu before down_proj", s)
        if getattr(act.op, "alpha", 1.0) != 1.0:
            raise self.fail(f"{role}: swiglu alpha {act.op.alpha} is not 1 (SiLU)", act)  # type: ignore[attr-defined]
        self.claim([act], role)
        gate = self.proj(act.inputs[0], h, f"layer {i} gate_proj")  # type: ignore[arg-type]
        up = self.proj(act.inputs[1], h, f"layer {i} up_proj")  # type: ignore[arg-type]
        return dict(mlp_norm=norm, gate=gate, up=up, swiglu=act, down=down), x2

    def recognize(self) -> tuple[Node, list[_Layer], Node, Node]:
        problem = decoder_signature_problem(self.g)
        if problem:
            raise LlmLowerError(f"llm-lower: graph @{self.g.name} is not a decoder export: {problem}")
        emb = self.embedding()
        x = emb.outputs[0]
        layers: list[_Layer] = []
        while True:
            norm, r = self.stream_users(x)
            if r is None:
                break
            attn, x = self.attention_block(x, norm, r, len(layers))
            norm, r = self.stream_users(x)
            if r is None:
                raise self.fail(f"layer {len(layers)}: expected an MLP block after attention", x)
            mlp, x = self.mlp_block(x, norm, r, len(layers))
            layers.append(_Layer(**attn, **mlp))
        if not layers:
            raise self.fail("found no decoder layer")
        final = norm
        self.claim([final], "final norm")
        h = final.outputs[0]
        users = self.real_users(h)
        if len(users) != 1 or users[0].op.name != "linear" or users[0].inputs[0] is not h or len(users[0].inputs) > 2:
            raise self.fail("expected the final norm to feed one lm_head linear (no bias)", h)
        head = users[0]
        self.claim([head], "lm_head")
        out, nodes = self.back(self.outputs["logits"])
        if out is not head.outputs[0]:
            raise self.fail("the logits output is not the lm_head's result", self.outputs["logits"])
        self.claim(nodes, "lm_head")
        for name, v in self.outputs.items():
            if _PRESENT.match(name):
                src, nodes = self.back(v)
                if src.producer is not None and src.producer not in self.claimed:
                    raise self.fail(f"output {name} is not a past K/V concat of a recognized layer", v)
                self.claim(nodes, "kv cache output")
        # every node whose values depend on the tokens or the past must have a role
        for n in self.g.nodes:
            if n not in self.claimed and not any(o in self.hidden for o in n.outputs):
                self.claimed[n] = "position/mask/shape computation"
        unknown = [n for n in self.g.nodes if n not in self.claimed]
        if unknown:
            listed = "; ".join(_describe(n) for n in unknown[:12])
            more = f" (and {len(unknown) - 12} more)" if len(unknown) > 12 else ""
            ops: dict[str, int] = {}
            for n in unknown:
                ops[n.op.name] = ops.get(n.op.name, 0) + 1
            raise LlmLowerError(
                f"llm-lower: {len(unknown)} node(s) of graph @{self.g.name} play no recognized decoder role "
                f"(ops {ops}): {listed}{more}"
            )
        return emb, layers, final, head


# -- evaluation helpers ------------------------------------------------------------------------------


def _evaluate(graph: Graph, targets: Sequence[Value], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Values of ``targets`` computing only their ancestors (numpy references)."""
    need: set[Node] = set()
    stack = [t.producer for t in targets if t.producer is not None]
    while stack:
        n = stack.pop()
        if n in need:
            continue
        need.add(n)
        stack.extend(v.producer for v in n.inputs if v is not None and v.producer is not None)
    env: dict[Value, np.ndarray] = {}
    for v in graph.inputs:
        if v.name in feeds:
            env[v] = np.asarray(feeds[v.name])
    for name, v in graph.weight_values.items():
        env[v] = graph.weights[name].load()  # lazy: only what is read costs anything
    for n in graph.nodes:
        if n in need:
            missing = [v.name for v in n.inputs if v is not None and v not in env]
            if missing:
                raise LlmLowerError(f"llm-lower: cannot evaluate {_describe(n)}: no value for {missing}")
            for v, a in zip(n.outputs, n.op.run(*[None if v is None else env[v] for v in n.inputs])):
                env[v] = a
    return [env[t] for t in targets]


def _feeds(graph: Graph, ids: np.ndarray, past_len: int, past: Mapping[str, np.ndarray] | None = None,
           ) -> dict[str, np.ndarray]:
    """Feeds for the original export: batch 1, all-ones mask, positions ``past_len ..``; the past K/V
    are ``past``'s presents, or zeros of length ``past_len``."""
    n = ids.shape[-1]
    feeds: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        dt = v.type.dtype.np
        if v.name == "input_ids":
            feeds[v.name] = ids.reshape(1, n).astype(dt)
        elif v.name == "attention_mask":
            feeds[v.name] = np.ones((1, past_len + n), dt)
        elif v.name == "position_ids":
            feeds[v.name] = np.arange(past_len, past_len + n, dtype=dt).reshape(1, n)
        else:
            m = _PAST.match(v.name)
            assert m is not None
            if past is not None:
                feeds[v.name] = past[f"present.{m.group(1)}.{m.group(2)}"]
            else:
                shape = v.type.shape or ()
                dims = [1 if j == 0 else past_len if j == 2 else d for j, d in enumerate(shape)]
                if not all(isinstance(d, int) for d in dims) or len(dims) != 4:
                    raise LlmLowerError(f"llm-lower: past input {v.name} has shape {v.type}, expected [batch, "
                                        "kv_heads, past_seq, head_dim] with static heads and head_dim")
                feeds[v.name] = np.zeros(dims, dt)
    return feeds


def _table(arr: np.ndarray, positions: int, half: int, what: str) -> np.ndarray:
    a = np.asarray(arr, np.float32)
    while a.ndim > 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim == 3 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 2 or a.shape[0] < positions or a.shape[1] < half:
        raise LlmLowerError(f"llm-lower: rope {what} evaluates to shape {list(arr.shape)}, expected "
                            f"[{positions}, >= {half}] (one row per position)")
    return np.ascontiguousarray(a[:positions, :half])


# -- the pass ----------------------------------------------------------------------------------------


def lower_llm(graph: Graph, options: Mapping[str, Any] | None = None) -> Graph:
    """The serving form of the fused decoder ``graph`` (a new graph; ``graph`` is not changed)."""
    from ..frontend.llama_builder import LlamaConfig, Tensor, build_llama

    opts = dict(options or {})
    hf = dict(opts.get("config") or {})
    rec = _Recognizer(graph)
    emb, layers, final, head = rec.recognize()

    def arr_loader(v: Value | None, what: str) -> Callable[[], np.ndarray]:
        return rec.const(v, what)

    # -- dimensions --
    table_t = emb.inputs[0]
    vocab, hidden = _static(table_t.type, "the embedding table")  # type: ignore[union-attr]
    first = layers[0]
    att = first.attention
    qt = att.inputs[0].type  # type: ignore[union-attr]
    if qt.rank == 4:
        num_heads, head_dim = qt.shape[1], qt.shape[3]  # type: ignore[index]
        if not (isinstance(num_heads, int) and isinstance(head_dim, int)):
            raise rec.fail(f"attention q {qt} needs static heads and head_dim", att)
    else:
        num_heads = att.op.num_heads  # type: ignore[attr-defined]
        if not num_heads:
            raise rec.fail("attention on 3-D q without num_heads", att)
        head_dim = first.q.rows // num_heads
    num_kv_heads = first.k.rows // head_dim
    inter = first.gate.rows
    eps = float(first.attn_norm.op.eps)  # type: ignore[attr-defined]
    rot = first.rope_q.op.rotary_dim or head_dim  # type: ignore[attr-defined]
    for i, ly in enumerate(layers):
        a = ly.attention.op
        if (ly.q.rows, ly.k.rows, ly.v.rows) != (num_heads * head_dim, num_kv_heads * head_dim,
                                                 num_kv_heads * head_dim):
            raise rec.fail(f"layer {i}: q/k/v projections have {ly.q.rows}/{ly.k.rows}/{ly.v.rows} rows, "
                           f"expected {num_heads}x{head_dim} / {num_kv_heads}x{head_dim}", ly.q.node)
        if ly.gate.rows != inter or ly.up.rows != inter:
            raise rec.fail(f"layer {i}: gate/up have {ly.gate.rows}/{ly.up.rows} rows, expected {inter}", ly.swiglu)
        for norm in (ly.attn_norm, ly.mlp_norm):
            if not math.isclose(float(norm.op.eps), eps, rel_tol=1e-6) or norm.op.axis not in (-1, 1):  # type: ignore
                raise rec.fail(f"layer {i}: rms_norm eps/axis differ from the first layer's ({eps}, -1)", norm)
        for rope in (ly.rope_q, ly.rope_k):
            if rope.op.interleaved:  # type: ignore[attr-defined]
                raise rec.fail("interleaved rotary embedding is not supported by the serving form builder", rope)
            if (rope.op.rotary_dim or head_dim) != rot:  # type: ignore[attr-defined]
                raise rec.fail(f"layer {i}: rotary_dim differs from the first layer's {rot}", rope)
        if a.softcap or a.window_left >= 0 or a.window_right >= 0 or a.diagonal:  # type: ignore[attr-defined]
            raise rec.fail(f"layer {i}: attention softcap/window/diagonal are not supported", ly.attention)
        scale = (a.scale if a.scale is not None else 1.0 / math.sqrt(head_dim)) * ly.scale  # type: ignore
        if not math.isclose(scale, 1.0 / math.sqrt(head_dim), rel_tol=1e-5):
            raise rec.fail(f"layer {i}: attention scale {scale} is not 1/sqrt(head_dim)", ly.attention)
    if not math.isclose(float(final.op.eps), eps, rel_tol=1e-6):  # type: ignore[attr-defined]
        raise rec.fail(f"final rms_norm eps {final.op.eps} differs from the layers' {eps}", final)  # type: ignore

    # -- rope tables: the graph's own cos/sin at positions 0 .. P-1 --
    max_pos = int(opts.get("max_positions") or hf.get("max_position_embeddings") or DEFAULT_MAX_POSITIONS)
    pairs: dict[tuple[int, int], Node] = {}
    for ly in layers:
        for rope in (ly.rope_q, ly.rope_k):
            pairs.setdefault((id(rope.inputs[1]), id(rope.inputs[2])), rope)
    tables: tuple[np.ndarray, np.ndarray] | None = None
    for rope in pairs.values():
        cos_v, sin_v = rope.inputs[1], rope.inputs[2]
        if cos_v in rec.hidden or sin_v in rec.hidden:
            raise rec.fail("rope cos/sin depend on the hidden states", rope)
        if len(rope.inputs) > 3 and rope.inputs[3] is not None:
            raise rec.fail("rotary_embedding with position_ids and cos/sin tables is not supported yet", rope)
        feeds = _feeds(graph, np.zeros(max_pos, np.int64), 0)
        cos, sin = _evaluate(graph, [cos_v, sin_v], feeds)  # type: ignore[list-item]
        got = (_table(cos, max_pos, rot // 2, "cos"), _table(sin, max_pos, rot // 2, "sin"))
        if tables is None:
            tables = got
        elif not (np.array_equal(tables[0], got[0]) and np.array_equal(tables[1], got[1])):
            raise rec.fail("layers use different rope tables", rope)
    assert tables is not None

    # -- masks: exactly causal (bottom-right for a past) --
    _check_masks(graph, rec, layers)

    # -- tensors under Hugging Face names --
    tensors: dict[str, Tensor] = {}

    def put(name: str, v: Value | None, rows: slice | None = None) -> None:
        load = arr_loader(v, name)
        shape = _static(v.type, name)  # type: ignore[union-attr]
        if rows is not None:
            shape = (rows.stop - rows.start, *shape[1:])
            tensors[name] = Tensor(shape, lambda: np.asarray(load())[rows], f"{graph.name}:%{v.name}[rows]")  # type: ignore
        else:
            tensors[name] = Tensor(shape, load, f"{graph.name}:%{v.name}")  # type: ignore[union-attr]

    def put_linear(prefix: str, p: _Proj | Node) -> bool:
        node, rows = (p.node, slice(p.start, p.stop)) if isinstance(p, _Proj) else (p, None)
        put(prefix + ".weight", node.inputs[1], rows)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if bias is not None:
            put(prefix + ".bias", bias, rows)
        return bias is not None

    put("model.embed_tokens.weight", table_t)
    for i, ly in enumerate(layers):
        pre = f"model.layers.{i}."
        put(pre + "input_layernorm.weight", ly.attn_norm.inputs[1])
        put(pre + "post_attention_layernorm.weight", ly.mlp_norm.inputs[1])
        for name in ("q", "k", "v"):
            put_linear(pre + f"self_attn.{name}_proj", getattr(ly, name))
        put_linear(pre + "self_attn.o_proj", ly.o)
        for name in ("gate", "up"):
            put_linear(pre + f"mlp.{name}_proj", getattr(ly, name))
        put_linear(pre + "mlp.down_proj", ly.down)
    put("model.norm.weight", final.inputs[1])
    tied = head.inputs[1] is table_t
    if not tied:
        put("lm_head.weight", head.inputs[1])
    if _static(head.inputs[1].type, "lm_head") != (vocab, hidden):  # type: ignore[union-attr]
        raise rec.fail(f"lm_head weight is {head.inputs[1].type}, expected [{vocab}, {hidden}]", head)  # type: ignore

    eos = hf.get("eos_token_id")
    cfg = LlamaConfig(
        architecture=str(opts.get("architecture") or hf.get("model_type") or "llama"),
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=len(layers),
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, rms_norm_eps=eps,
        rope_theta=float(hf.get("rope_theta") or 10000.0), max_position_embeddings=max_pos,
        partial_rotary_factor=rot / head_dim, tie_word_embeddings=tied,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
    )
    new = build_llama(cfg, tensors, name=graph.name, rope_tables=tables)
    new.meta = {**{k: v for k, v in graph.meta.items() if k not in ("kv_cache", "llm")}, **new.meta}
    if opts.get("check", True):
        check_lowering(graph, new, rtol=float(opts.get("check_rtol", 1e-3)))
    return new


def _check_masks(graph: Graph, rec: _Recognizer, layers: Sequence[_Layer]) -> None:
    cases = [(0, 5), (3, 2)] if rec.pasts else [(0, 5)]
    for past_len, n in cases:
        feeds = _feeds(graph, np.zeros(n, np.int64), past_len)
        masks = [ly.attention.inputs[3] if len(ly.attention.inputs) > 3 else None for ly in layers]
        todo = [m for m in masks if m is not None]
        for m in todo:
            if m in rec.hidden:
                raise rec.fail("the attention mask depends on the hidden states", m)
        values = dict(zip(map(id, todo), _evaluate(graph, todo, feeds))) if todo else {}
        kv = past_len + n
        causal = np.arange(kv)[None, :] <= past_len + np.arange(n)[:, None]
        for i, (ly, m) in enumerate(zip(layers, masks)):
            bias = ly.attention.op.bias(None if m is None else values[id(m)], None, 1, n, kv,  # type: ignore
                                        np.dtype(np.float32))
            bias = np.broadcast_to(bias, (*bias.shape[:2], n, kv))
            allowed = bias > -1e4
            if not (np.array_equal(allowed, np.broadcast_to(causal, allowed.shape)) and np.all(bias[allowed] == 0)):
                raise rec.fail(f"layer {i}: the attention mask (all-ones attention_mask, past {past_len}, "
                               f"{n} new tokens) is not exactly causal", ly.attention)


def check_lowering(original: Graph, lowered: Graph, rtol: float = 1e-3, seed: int = 0,
                   steps: Sequence[tuple[int, int]] = ((5, 3), (2, 1))) -> float:
    """Drive ``lowered`` through a paged cache (two sequences batched together; ``steps`` gives each
    step's new-token counts per sequence) and compare each sequence's logits with ``original`` run on
    that sequence alone (with its past, or on the whole sequence); returns the worst relative error."""
    from ..runtime.cpu import CpuExecutor
    from ..runtime.paged import PagedModel

    vocab = int(lowered.meta["llm"]["vocab_size"])  # type: ignore[index]
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, vocab, sum(s[j] for s in steps)) for j in range(2)]
    has_past = any(_PAST.match(v.name) for v in original.inputs)
    ref = CpuExecutor(original)
    bs = int(lowered.meta["kv_cache"]["block_size"])  # type: ignore[index]
    model = PagedModel(lowered, num_blocks=2 * (-(-max(len(s) for s in seqs) // bs)))
    ids = [model.add_sequence() for _ in seqs]
    done = [0, 0]
    presents: list[dict[str, np.ndarray] | None] = [None, None]
    worst = 0.0
    for step in steps:
        batch = [(ids[j], seqs[j][done[j]: done[j] + step[j]].tolist()) for j in range(2)]
        got = model.step(batch)
        for j in range(2):
            if has_past:
                feeds = _feeds(original, seqs[j][done[j]: done[j] + step[j]], done[j], presents[j])
            else:
                feeds = _feeds(original, seqs[j][: done[j] + step[j]], 0)
            out = ref.run(feeds)
            presents[j] = out
            want = np.asarray(out["logits"], np.float64).reshape(-1, vocab)[-1]
            scale = float(np.abs(want).max()) or 1.0
            err = float(np.abs(got[j] - want).max()) / scale
            worst = max(worst, err)
            if not err <= rtol:
                raise LlmLowerError(
                    f"llm-lower: the lowered graph disagrees with @{original.name}: max |logit error| / max |logit| "
                    f"= {err:.3g} > {rtol} (sequence {j}, after {done[j] + step[j]} tokens)"
                )
        for j in range(2):
            done[j] += step[j]
    return worst


@register_pass
class LlmLower(Pass):
    """Lowers a fused decoder export to the serving form (docs/SERVING_FORM.md); see the module doc.

    Runs after ``canonicalize, fuse, canonicalize`` (``O2``). Replaces the graph (signature, nodes,
    weights); sets ``graph.meta["kv_cache"]`` and ``graph.meta["llm"]``. Fails with ``LlmLowerError``
    (leaving the graph as it was) when any part of the graph plays no recognized role.
    """

    name = "llm-lower"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        opts = dict(ctx.options.get(self.name, {}))
        new = lower_llm(graph, opts)
        graph.__dict__.update({k: v for k, v in new.__dict__.items() if k != "name"})
        self.stats = {"layers": int(new.meta["llm"]["num_layers"])}  # type: ignore[index]
        return True
