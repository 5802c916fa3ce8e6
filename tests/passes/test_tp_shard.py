"""tp-shard (passes/tp_shard.py) and the all_reduce op (ir/ops/collective.py), in one process.

The ranks' graphs run on the CPU backend in threads that meet at each all_reduce through the
in-process twin of the shared-memory transport (``runtime/tp/comm.thread_group``); their logits must
equal the unsharded graph's within the f32 tolerance of tests/helpers.py (``atol`` relative to the
logits' largest magnitude: the ranks add the same products in another order). Random checkpoints
are fresh draws (tests.helpers.rng).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ingot.frontend.hf import import_hf
from ingot.ir.op import OpError
from ingot.ir.ops.collective import AllReduce
from ingot.ir.types import DType, TensorType
from ingot.ir.verify import verify
from ingot.passes import PassContext, run_passes
from ingot.passes.tp_shard import TpShardError, shard
from ingot.runtime.cpu import CpuExecutor
from ingot.runtime.paged import PagedModel
from ingot.runtime.tp.comm import overrides, thread_group
from tests.frontend.dense_llama import random_weights, write_checkpoint
from tests.helpers import assert_close, assert_text_roundtrip, rng, tol
from tests.runtime.serving_models import TINY

#: 8 attention heads, 4 KV heads: shards 2 and 4 ways
EIGHT_HEADS = {**TINY, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8, "hidden_size": 48,
               "intermediate_size": 64}


def _graph(tmp_path, cfg=TINY, bias: bool = False, row_bias: bool = False):
    weights = random_weights(cfg, rng(), bias=bias)
    if row_bias:  # o_proj / down_proj biases: added once, by rank 0
        r = rng()
        for i in range(cfg["num_hidden_layers"]):
            for name in ("self_attn.o_proj.bias", "mlp.down_proj.bias"):
                weights[f"model.layers.{i}.{name}"] = (0.1 * r.standard_normal(cfg["hidden_size"])).astype(np.float32)
    return import_hf(write_checkpoint(tmp_path / "ckpt", cfg, weights))


class _ThreadRanks:
    """The ranks' graphs as PagedModels stepping together in threads (one step: every rank runs it)."""

    def __init__(self, graphs, num_blocks: int) -> None:
        comms = thread_group(len(graphs), slot_bytes=4096, timeout=60)  # small slots: several chunks per tensor
        self.models = []
        for g, comm in zip(graphs, comms):
            m = PagedModel(g, num_blocks)
            m._executor = CpuExecutor(g, overrides(comm))
            self.models.append(m)

    def add_sequence(self) -> int:
        return [m.add_sequence() for m in self.models][0]

    def step(self, batch):
        out: list = [None] * len(self.models)
        errors: list = []

        def run(i: int) -> None:
            try:
                out[i] = self.models[i].step(batch)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(self.models))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if errors:
            raise errors[0]
        for o in out[1:]:  # every rank computes the same logits (replicated lm_head)
            np.testing.assert_array_equal(o, out[0])
        return out[0]


def _check_logits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    rtol, atol = tol(np.float32)
    assert_close(got, want, rtol=rtol, atol=atol * max(1.0, float(np.abs(want).max())), what=what)


def _compare(graph, graphs, r: np.random.Generator) -> None:
    vocab = int(graph.meta["llm"]["vocab_size"])
    ref, tp = PagedModel(graph, 32), _ThreadRanks(graphs, 32)
    seqs = [(ref.add_sequence(), tp.add_sequence()) for _ in range(3)]
    # prefill chunks of different lengths, then mixed prefill + decode steps, then decode only
    for step, counts in enumerate([(7, 3, 12), (1, 5, 1), (1, 1, 1), (1, 1, 1)]):
        batch = [(s, [int(t) for t in r.integers(0, vocab, n)]) for s, n in zip(seqs, counts)]
        want = ref.step([(a, t) for (a, _), t in batch])
        got = tp.step([(b, t) for (_, b), t in batch])
        _check_logits(got, want, f"step {step}")


@pytest.mark.parametrize("tp", [2, 4])
def test_sharded_graphs_give_the_unsharded_logits(tmp_path, tp):
    graph = _graph(tmp_path, EIGHT_HEADS)
    graphs = shard(graph, tp)
    assert len(graphs) == tp
    for g in graphs:
        verify(g)
    _compare(graph, graphs, rng())


def test_qkv_and_row_parallel_biases(tmp_path):
    graph = _graph(tmp_path, TINY, bias=True, row_bias=True)
    graphs = shard(graph, 2)
    rank0, rank1 = graphs
    o0 = next(n for n in rank0.nodes if n.outputs[0].name == "layers.0.attn_out.partial")
    o1 = next(n for n in rank1.nodes if n.outputs[0].name == "layers.0.attn_out.partial")
    assert len(o0.inputs) == 4 and o0.inputs[2] is not None and o0.inputs[3] is not None  # bias + residual
    assert len(o1.inputs) == 2  # neither: rank 0 adds them once
    _compare(graph, graphs, rng())


def test_shard_structure(tmp_path):
    graph = _graph(tmp_path)
    NH, KV, D, H = TINY["num_attention_heads"], TINY["num_key_value_heads"], TINY["head_dim"], TINY["hidden_size"]
    I, L = TINY["intermediate_size"], TINY["num_hidden_layers"]
    for rank, g in enumerate(shard(graph, 2)):
        hist = g.op_histogram()
        assert hist["all_reduce"] == 2 * L
        assert all(n.op.group_size == 2 for n in g.nodes if n.op.name == "all_reduce")
        for n in g.nodes:
            if n.op.name == "paged_attention":
                assert (n.op.num_heads, n.op.num_kv_heads) == (NH // 2, KV // 2)
        w = g.weights
        assert w["model.layers.0.self_attn.qkv_proj.weight"].type.shape == ((NH + 2 * KV) * D // 2, H)
        assert w["model.layers.0.self_attn.o_proj.weight"].type.shape == (H, NH * D // 2)
        assert w["model.layers.0.mlp.gate_up_proj.weight"].type.shape == (I, H)
        assert w["model.layers.0.mlp.down_proj.weight"].type.shape == (H, I // 2)
        assert w["model.embed_tokens.weight"].type.shape == (TINY["vocab_size"], H)  # replicated
        assert w["lm_head.weight"].type.shape == (TINY["vocab_size"], H)
        cache = next(v for v in g.inputs if v.name == "kv_cache.0")
        assert cache.type.shape[3] == KV // 2
        assert g.meta["kv_cache"]["num_kv_heads"] == KV // 2
        assert g.meta["kv_cache"]["bytes_per_token"] == graph.meta["kv_cache"]["bytes_per_token"] // 2
        assert g.meta["tp"] == {"size": 2, "rank": rank, "num_heads": NH, "num_kv_heads": KV, "head_dim": D,
                                "kv_head_start": rank * KV // 2}
        assert [v.name for v in g.inputs] == [v.name for v in graph.inputs]
        assert g.output_names == ["logits"]
        assert_text_roundtrip(g)
    # the rank's qkv rows: its query heads, then its KV heads' K rows, then V rows
    full = graph.weights["model.layers.1.self_attn.qkv_proj.weight"].load()
    part = shard(graph, 2)[1].weights["model.layers.1.self_attn.qkv_proj.weight"].load()
    q, k = NH * D, KV * D
    np.testing.assert_array_equal(part, np.concatenate([full[q // 2:q], full[q + k // 2:q + k], full[q + k + k // 2:]]))


def test_pass_form_and_tp1(tmp_path):
    graph = _graph(tmp_path)
    assert shard(graph, 1) == [graph]
    ctx = PassContext(options={"tp-shard": {"size": 2, "rank": 1}})
    g = _graph(tmp_path)
    run_passes(g, ["tp-shard"], ctx)
    assert g.meta["tp"]["rank"] == 1 and g.op_histogram()["all_reduce"] == 4


def test_heads_not_divisible_is_a_clear_error(tmp_path):
    graph = _graph(tmp_path)  # 4 heads, 2 KV heads
    with pytest.raises(TpShardError, match="model has 4 attention heads and 2 KV heads"):
        shard(graph, 4)
    with pytest.raises(TpShardError, match="model has 4 attention heads and 2 KV heads"):
        shard(graph, 3)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(TpShardError, match="positive integer"):
            shard(graph, bad)


def test_not_the_serving_form_is_a_clear_error():
    from ingot.ir.graph import Graph

    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (4,)))
    g.add_output(g.add1(AllReduce(), [x]))
    with pytest.raises(TpShardError, match="not in the serving form"):
        shard(g, 2)


def test_all_reduce_op():
    x = rng().standard_normal((3, 5)).astype(np.float32)
    op = AllReduce(group_size=1)
    assert op.infer([TensorType(DType.bf16, ("T", 5))]) == [TensorType(DType.bf16, ("T", 5))]
    np.testing.assert_array_equal(op.run(x)[0], x)  # one rank: identity
    with pytest.raises(OpError, match="floating-point"):
        op.infer([TensorType(DType.i64, (3,))])
    with pytest.raises(OpError, match=">= 1"):
        AllReduce(group_size=0).infer([TensorType(DType.f32, (3,))])
    two = AllReduce(group_size=2)
    with pytest.raises(OpError, match="needs the other ranks"):
        two.run(x)
    y = rng().standard_normal((3, 5)).astype(np.float32)
    assert_close(two.reduce([x, y]), x + y)
    import ml_dtypes

    xb, yb = x.astype(ml_dtypes.bfloat16), y.astype(ml_dtypes.bfloat16)
    want = (xb.astype(np.float32) + yb.astype(np.float32)).astype(ml_dtypes.bfloat16)  # f32 sum, one rounding
    np.testing.assert_array_equal(two.reduce([xb, yb]).view(np.uint16), want.view(np.uint16))
    with pytest.raises(OpError, match="2 ranks got 3"):
        two.reduce([x, x, x])


def test_thread_transport_chunks_and_abort():
    comms = thread_group(3, slot_bytes=64, timeout=30)  # 16 f32 per round: a [7, 9] tensor takes 4 rounds
    parts = [rng().standard_normal((7, 9)).astype(np.float32) for _ in range(3)]
    op = AllReduce(group_size=3)
    out: list = [None] * 3

    def run(r: int) -> None:
        for _ in range(3):  # several all_reduces in a row reuse the alternating halves
            out[r] = comms[r].all_reduce(op, parts[r])

    threads = [threading.Thread(target=run, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for r in range(3):
        np.testing.assert_array_equal(out[r], op.reduce(parts))
    from ingot.runtime.tp.comm import TpCommError

    comms[1].abort()
    with pytest.raises(TpCommError, match="rank 0"):
        comms[0].all_reduce(op, parts[0])
