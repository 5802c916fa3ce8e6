"""tp-shard: the serving form of a decoder -> one rank's graph of an ``N``-way tensor-parallel group.

Megatron-style sharding of docs/SERVING_FORM.md's graph (as ``frontend/llama_builder.py`` builds it,
for checkpoints and for lowered ONNX exports alike)::

    embedding                               replicated (every rank holds the whole table)
    per layer:
      rms_norm                              replicated
      linear(qkv, fused)  -> split          column-parallel: rank r holds the rows of its query heads
                                            [r*NH/N, (r+1)*NH/N) and of its KV heads [r*KV/N, (r+1)*KV/N)
                                            (K rows, then V rows; biases alike); split sizes / N
      rope(q), rope(k)                      per token, per head: unchanged
      paged_attention                       num_heads / N, num_kv_heads / N; the rank's KV cache input
                                            holds only its KV heads: [blocks, 2, block_size, KV/N, D]
      linear(o_proj, bias, residual)        row-parallel: the columns of the rank's query heads;
        -> all_reduce                       rank 0 keeps the bias and the residual input, other ranks
                                            drop both, so the sum over ranks adds each exactly once
      rms_norm                              replicated
      linear(gate_up, fused) -> split       column-parallel: rows [r*I/N, (r+1)*I/N) of gate and of up
      swiglu                                elementwise: unchanged
      linear(down, bias, residual)          row-parallel like o_proj, then all_reduce
        -> all_reduce
    gather -> rms_norm -> linear(lm_head)   replicated: every rank computes the logits (the engine
                                            reads rank 0's); no all-gather

Grouped-query attention keeps its grouping: query head ``h`` reads KV head ``h // (NH / KV)``, so the
contiguous query-head block of a rank reads exactly the rank's contiguous KV-head block.

Runs after the LLM lowering (or a checkpoint frontend) and before quantization and the GPU lowering
(it reads the f32 serving form; quantized linears are not sharded). Needs ``N`` to divide the
model's attention heads, KV heads and intermediate size (``TpShardError`` names them otherwise).
Preserves the serving form's signature (the KV cache inputs narrow to the rank's heads) and every
value name: a row-parallel linear's partial result is ``NAME.partial`` and its all_reduce takes the
original name. ``graph.meta["kv_cache"]`` becomes the rank's (``num_kv_heads`` / N, bytes per token /
N) and ``graph.meta["tp"]`` records the group size, the rank and the model's head counts.

The function ``shard(graph, N)`` returns all ranks' graphs; the registered pass ``tp-shard`` replaces
the graph by one rank's (options ``size``, ``rank``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..ir.graph import Graph, Node, Value, Weight
from ..ir.ops.collective import AllReduce
from ..ir.types import TensorType
from .manager import Pass, PassContext, PassError, register_pass


class TpShardError(PassError):
    """The graph cannot be sharded as asked; the message says which part and why."""


@dataclass
class _Plan:
    """What the sharding changes, found once and applied per rank."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    #: weight name -> function(rank) -> the rank's array (column-parallel rows, row-parallel columns)
    weights: dict[str, Callable[[np.ndarray, int], np.ndarray]] = field(default_factory=dict)
    #: weight name -> the rank's shape
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    attention: set[Node] = field(default_factory=set)
    #: split node -> the rank's sizes
    splits: dict[Node, tuple[int, ...]] = field(default_factory=dict)
    row_parallel: set[Node] = field(default_factory=set)
    kv_inputs: set[Value] = field(default_factory=set)


def _where(n: Node) -> str:
    return f"{n.op.name} -> %{n.outputs[0].name}" + (f" ({n.source})" if n.source else "")


def _sole_user(users: dict[Value, list[Node]], v: Value, expect: str, what: str) -> Node:
    found = users.get(v, [])
    if len(found) != 1 or found[0].op.name != expect:
        got = ", ".join(_where(u) for u in found) or "nothing"
        raise TpShardError(f"tp-shard: {what} %{v.name} must be read by one {expect} only; it is read by {got}")
    return found[0]


def _producer(v: Value | None, op: str, what: str) -> Node:
    if v is None or v.producer is None or v.producer.op.name != op:
        got = "nothing" if v is None or v.producer is None else _where(v.producer)
        raise TpShardError(f"tp-shard: {what} must come from a {op}, got {got}")
    return v.producer


def _rows(parts: list[tuple[int, int]]) -> np.ndarray:
    return np.concatenate([np.arange(a, b) for a, b in parts])


def _plan(graph: Graph, tp: int) -> _Plan:
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise TpShardError(f"tp-shard: the tensor-parallel size must be a positive integer, got {tp!r}")
    if not isinstance(graph.meta.get("kv_cache"), dict):
        raise TpShardError("tp-shard: the graph is not in the serving form (graph.meta has no 'kv_cache'); "
                           "tensor parallelism needs an LLM compiled in mode 'llm'")
    users = graph.users()
    atts = [n for n in graph.nodes if n.op.name == "paged_attention"]
    mlps = [n for n in graph.nodes if n.op.name == "swiglu"]
    if not atts:
        raise TpShardError("tp-shard: the graph has no paged_attention: nothing to shard")
    a0 = atts[0].op
    NH, KV, D = a0.num_heads, a0.num_kv_heads, a0.head_dim  # type: ignore[attr-defined]
    if NH % tp or KV % tp:
        raise TpShardError(
            f"tp-shard: tensor-parallel size {tp} must divide the model's attention heads and KV heads, but the "
            f"model has {NH} attention heads and {KV} KV heads; pick a tp that divides both")
    plan = _Plan(NH, KV, D)
    nh, kv = NH // tp, KV // tp

    def weight(v: Value | None, what: str) -> str:
        if v is None or graph.weight_values.get(v.name) is not v:
            raise TpShardError(f"tp-shard: {what} must be a weight, got %{v.name if v is not None else '_'}")
        return v.name

    def column(name: str, parts_of: Callable[[int], list[tuple[int, int]]], what: str) -> None:
        if name in plan.weights:
            raise TpShardError(f"tp-shard: weight {name} is used by more than one sharded linear ({what})")
        shape = graph.weights[name].type.shape or ()
        plan.shapes[name] = (sum(b - a for a, b in parts_of(0)), *shape[1:])  # type: ignore[misc]
        plan.weights[name] = lambda a, r: a[_rows(parts_of(r))]

    def row(name: str, cols: int, what: str) -> None:
        if name in plan.weights:
            raise TpShardError(f"tp-shard: weight {name} is used by more than one sharded linear ({what})")
        shape = graph.weights[name].type.shape or ()
        if len(shape) != 2 or shape[1] != cols * tp:
            raise TpShardError(f"tp-shard: {what} weight {name} is {list(shape)}, expected [*, {cols * tp}]")
        plan.shapes[name] = (shape[0], cols)  # type: ignore[assignment]
        plan.weights[name] = lambda a, r: a[:, r * cols:(r + 1) * cols]

    def row_parallel(lin: Node, x: Value, cols: int, what: str) -> None:
        if lin.op.name != "linear" or lin.inputs[0] is not x:
            raise TpShardError(f"tp-shard: {what} must be a linear reading %{x.name}, got {_where(lin)}")
        row(weight(lin.inputs[1], what), cols, what)
        plan.row_parallel.add(lin)

    for att in atts:
        op = att.op
        if (op.num_heads, op.num_kv_heads, op.head_dim) != (NH, KV, D):  # type: ignore[attr-defined]
            raise TpShardError(f"tp-shard: {_where(att)} has different head counts than the first layer")
        q, k, v, cache = att.inputs[:4]
        rope_q = _producer(q, "rope", f"{_where(att)}: q")
        rope_k = _producer(k, "rope", f"{_where(att)}: k")
        split = _producer(rope_q.inputs[0], "split", f"{_where(att)}: q (before rope)")
        ok = (rope_k.inputs[0] is split.outputs[1] and v is split.outputs[2] and rope_q.inputs[0] is split.outputs[0]
              and split.op.split == (NH * D, KV * D, KV * D))  # type: ignore[attr-defined]
        if not ok:
            raise TpShardError(f"tp-shard: {_where(att)}: q, k, v must be the three parts [{NH * D}, {KV * D}, "
                               f"{KV * D}] of one fused qkv split ({_where(split)})")
        qkv = _producer(split.inputs[0], "linear", f"{_where(split)}: its input")
        if len(qkv.inputs) > 3 and qkv.inputs[3] is not None:
            raise TpShardError(f"tp-shard: the qkv linear {_where(qkv)} has a residual input")
        _sole_user(users, qkv.outputs[0], "split", "the qkv projection")
        _sole_user(users, split.outputs[0], "rope", "q")
        _sole_user(users, split.outputs[1], "rope", "k")
        _sole_user(users, split.outputs[2], "paged_attention", "v")
        _sole_user(users, rope_q.outputs[0], "paged_attention", "rotated q")
        _sole_user(users, rope_k.outputs[0], "paged_attention", "rotated k")

        def qkv_rows(r: int) -> list[tuple[int, int]]:
            q0, k0, v0 = 0, NH * D, (NH + KV) * D
            return [(q0 + r * nh * D, q0 + (r + 1) * nh * D), (k0 + r * kv * D, k0 + (r + 1) * kv * D),
                    (v0 + r * kv * D, v0 + (r + 1) * kv * D)]

        column(weight(qkv.inputs[1], "qkv weight"), qkv_rows, "qkv")
        if len(qkv.inputs) > 2 and qkv.inputs[2] is not None:
            column(weight(qkv.inputs[2], "qkv bias"), qkv_rows, "qkv bias")
        plan.splits[split] = (nh * D, kv * D, kv * D)
        plan.attention.add(att)
        if cache is None or cache not in graph.inputs:
            raise TpShardError(f"tp-shard: {_where(att)}: its KV cache must be a graph input")
        plan.kv_inputs.add(cache)
        o = _sole_user(users, att.outputs[0], "linear", "the attention output")
        row_parallel(o, att.outputs[0], nh * D, "o_proj")

    for act in mlps:
        gate, up = act.inputs[:2]
        split = _producer(gate, "split", f"{_where(act)}: gate")
        inter = split.op.split[0] if split.op.split else None  # type: ignore[attr-defined]
        if up is not split.outputs[1] or len(split.outputs) != 2 or split.op.split != (inter, inter):  # type: ignore
            raise TpShardError(f"tp-shard: {_where(act)}: gate and up must be the two equal parts of one fused "
                               f"gate_up split ({_where(split)})")
        assert isinstance(inter, int)
        if inter % tp:
            raise TpShardError(f"tp-shard: tensor-parallel size {tp} must divide the model's intermediate size "
                               f"{inter}")
        gu = _producer(split.inputs[0], "linear", f"{_where(split)}: its input")
        if len(gu.inputs) > 3 and gu.inputs[3] is not None:
            raise TpShardError(f"tp-shard: the gate_up linear {_where(gu)} has a residual input")
        _sole_user(users, gu.outputs[0], "split", "the gate_up projection")
        _sole_user(users, gate, "swiglu", "gate")
        _sole_user(users, up, "swiglu", "up")
        part = inter // tp

        def gu_rows(r: int, inter: int = inter, part: int = part) -> list[tuple[int, int]]:
            return [(r * part, (r + 1) * part), (inter + r * part, inter + (r + 1) * part)]

        column(weight(gu.inputs[1], "gate_up weight"), gu_rows, "gate_up")
        if len(gu.inputs) > 2 and gu.inputs[2] is not None:
            column(weight(gu.inputs[2], "gate_up bias"), gu_rows, "gate_up bias")
        plan.splits[split] = (part, part)
        down = _sole_user(users, act.outputs[0], "linear", "the swiglu output")
        row_parallel(down, act.outputs[0], part, "down_proj")
    return plan


def _sliced(source: Weight, fn: Callable[[np.ndarray, int], np.ndarray], rank: int,
            shape: tuple[int, ...]) -> Weight:
    def load() -> np.ndarray:
        out = np.ascontiguousarray(fn(np.asarray(source.load()), rank))
        source.release()  # the full tensor is read once per rank, never kept for all of them
        return out

    return Weight(TensorType(source.type.dtype, shape), load, f"{source.source}[tp rank {rank}]")


def _shard_rank(graph: Graph, plan: _Plan, tp: int, rank: int) -> Graph:
    g = Graph(graph.name)
    vmap: dict[Value, Value] = {}
    for v in graph.inputs:
        t = v.type
        if v in plan.kv_inputs:
            shape = list(t.shape or ())
            shape[3] = plan.num_kv_heads // tp
            t = TensorType(t.dtype, tuple(shape))
        vmap[v] = g.add_input(v.name, t)
    for name, v in graph.weight_values.items():
        w = graph.weights[name]
        if name in plan.weights:
            w = _sliced(w, plan.weights[name], rank, plan.shapes[name])
        vmap[v] = g.add_weight(name, w)

    def m(v: Value | None) -> Value | None:
        return None if v is None else vmap[v]

    for node in graph.nodes:
        op = node.op
        inputs = [m(v) for v in node.inputs]
        if node in plan.attention:
            op = dataclasses.replace(op, num_heads=plan.num_heads // tp,  # type: ignore[call-arg]
                                     num_kv_heads=plan.num_kv_heads // tp)
        elif node in plan.splits:
            op = dataclasses.replace(op, split=plan.splits[node])  # type: ignore[call-arg]
        if node in plan.row_parallel:
            if rank != 0:  # the bias and the residual are added once, by rank 0
                inputs = inputs[:2]
            while inputs[-1] is None:
                inputs = inputs[:-1]
            name = node.outputs[0].name
            partial = g.add1(op, inputs, f"{name}.partial", node.source)
            vmap[node.outputs[0]] = g.add1(AllReduce(group_size=tp), [partial], name, node.source)
            continue
        outs = g.add(op, inputs, [o.name for o in node.outputs], node.source)
        for o, n in zip(node.outputs, outs):
            vmap[o] = n
    for v, name in zip(graph.outputs, graph.output_names):
        g.add_output(vmap[v], name)
    g.meta = copy.deepcopy(graph.meta)
    spec = g.meta["kv_cache"]
    assert isinstance(spec, dict)
    spec["num_kv_heads"] = plan.num_kv_heads // tp
    spec["bytes_per_token"] = int(spec["bytes_per_token"]) // tp
    g.meta["tp"] = {"size": tp, "rank": rank, "num_heads": plan.num_heads, "num_kv_heads": plan.num_kv_heads,
                    "head_dim": plan.head_dim, "kv_head_start": rank * (plan.num_kv_heads // tp)}
    return g


def shard(graph: Graph, tp: int) -> list[Graph]:
    """Every rank's graph (rank order) of an ``tp``-way tensor-parallel group; ``graph`` is not changed.
    ``tp == 1`` gives ``[graph]``."""
    plan = _plan(graph, tp)
    if tp == 1:
        return [graph]
    return [_shard_rank(graph, plan, tp, r) for r in range(tp)]


def shard_rank(graph: Graph, tp: int, rank: int) -> Graph:
    """Rank ``rank``'s graph of a ``tp``-way group (see the module docstring)."""
    if not isinstance(rank, int) or not 0 <= rank < max(int(tp), 1):
        raise TpShardError(f"tp-shard: rank must be in [0, {tp}), got {rank!r}")
    plan = _plan(graph, tp)
    return graph if tp == 1 else _shard_rank(graph, plan, tp, rank)


@register_pass
class TpShard(Pass):
    """Replaces a serving-form graph by one rank's shard of a tensor-parallel group (module docstring).

    Runs after the LLM lowering, before quantization and GPU lowering. Options: ``size`` (the group
    size, default 1: no change) and ``rank`` (default 0).
    """

    name = "tp-shard"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        size = ctx.option(self.name, "size", 1)
        rank = ctx.option(self.name, "rank", 0)
        new = shard_rank(graph, size, rank)
        if new is graph:
            return False
        graph.__dict__.update({k: v for k, v in new.__dict__.items() if k != "name"})
        return True
