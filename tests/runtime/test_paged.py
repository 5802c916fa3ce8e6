"""The paged CPU driver: step-input layout, block allocation, batching invariance, chunked prefill."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.frontend.hf import import_hf
from ingot.runtime.paged import CacheFullError, PagedModel, greedy_generate
from tests.frontend.dense_llama import TINY_CONFIG, assert_logits_close, dense_logits, random_weights, write_checkpoint
from tests.helpers import rng

VOCAB = TINY_CONFIG["vocab_size"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    weights = random_weights(TINY_CONFIG, rng())
    ckpt = write_checkpoint(tmp_path_factory.mktemp("tiny"), TINY_CONFIG, weights)
    return import_hf(ckpt), weights


def _tokens(n: int) -> list[int]:
    return [int(t) for t in rng().integers(0, VOCAB, n)]


def test_step_inputs_layout(tiny):
    """The docstring's example: a 6-token prefill chunk next to a decode token of a 9-token sequence."""
    model = PagedModel(tiny[0], num_blocks=8)
    a, b = model.add_sequence(), model.add_sequence()
    model.step([(b, _tokens(9))])
    feeds = model.step_inputs([(a, _tokens(6)), (b, [5])])
    assert feeds["positions"].tolist() == [0, 1, 2, 3, 4, 5, 9]
    assert feeds["query_start_loc"].tolist() == [0, 6, 7]
    assert feeds["logits_indices"].tolist() == [5, 6]
    assert feeds["seq_lens"].tolist() == [6, 10]
    bs = model.block_size
    ta, tb = model.sequences[a].block_table, model.sequences[b].block_table
    assert feeds["slot_mapping"].tolist() == [ta[0] * bs + i for i in range(6)] + [tb[0] * bs + 9]
    assert feeds["block_tables"][0, 0] == ta[0] and feeds["block_tables"][1, 0] == tb[0]
    assert {k: v.dtype.name for k, v in feeds.items() if not k.startswith("kv_cache")} == {
        "input_ids": "int64", "positions": "int64", "slot_mapping": "int64", "block_tables": "int32",
        "seq_lens": "int32", "query_start_loc": "int32", "logits_indices": "int64"}


def test_block_allocation(tiny):
    model = PagedModel(tiny[0], num_blocks=4)
    bs = model.block_size
    a, b = model.add_sequence(), model.add_sequence()
    model.step([(a, _tokens(bs + 1))])  # two blocks
    model.step([(b, _tokens(bs))])  # one block
    assert len(model.sequences[a].block_table) == 2 and len(model.sequences[b].block_table) == 1
    used = {*model.sequences[a].block_table, *model.sequences[b].block_table}
    assert len(used) == 3 and model.num_free_blocks + len(used) == model.num_blocks
    with pytest.raises(CacheFullError, match="need 2 more blocks, 1 free"):
        model.step_inputs([(b, _tokens(bs + 1))])
    model.free_sequence(a)
    assert model.num_free_blocks == 3
    with pytest.raises(ValueError, match="no new tokens"):
        model.step_inputs([(b, [])])


def test_batching_invariance(tiny):
    """Sequences stepped together (prefills mixed with decodes) get the logits they get alone."""
    graph, _ = tiny
    prompts = [_tokens(11), _tokens(5), _tokens(20)]
    follow = [_tokens(4) for _ in prompts]

    alone = []
    for p, f in zip(prompts, follow):
        model = PagedModel(graph, num_blocks=4)
        s = model.add_sequence()
        rows = [model.step([(s, p)])[0]] + [model.step([(s, [t])])[0] for t in f]
        alone.append(rows)

    model = PagedModel(graph, num_blocks=12)
    seqs = [model.add_sequence() for _ in prompts]
    # step 0: seq 0 and 1 prefill together; seq 2 waits
    out = model.step([(seqs[0], prompts[0]), (seqs[1], prompts[1])])
    together = {0: [out[0]], 1: [out[1]], 2: []}
    # step 1: seq 2 prefills next to decodes of 0 and 1 (in another order)
    out = model.step([(seqs[1], [follow[1][0]]), (seqs[2], prompts[2]), (seqs[0], [follow[0][0]])])
    together[1].append(out[0])
    together[2].append(out[1])
    together[0].append(out[2])
    done = {0: 1, 1: 1, 2: 0}
    while any(done[i] < len(follow[i]) for i in done):
        batch = [i for i in done if done[i] < len(follow[i])]
        out = model.step([(seqs[i], [follow[i][done[i]]]) for i in batch])
        for row, i in enumerate(batch):
            together[i].append(out[row])
            done[i] += 1
    for i in range(len(prompts)):
        assert len(together[i]) == len(alone[i])
        for j, (x, y) in enumerate(zip(together[i], alone[i])):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5 * np.abs(y).max(), err_msg=f"seq {i} step {j}")


@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_chunked_prefill_equals_whole(tiny, chunk):
    graph, weights = tiny
    prompt = _tokens(19)  # crosses a block boundary
    whole = PagedModel(graph, num_blocks=2)
    s = whole.add_sequence()
    expected = whole.step([(s, prompt)])[0]
    chunked = PagedModel(graph, num_blocks=2)
    s = chunked.add_sequence()
    for start in range(0, len(prompt), chunk):
        got = chunked.step([(s, prompt[start : start + chunk])])[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    assert_logits_close(got, dense_logits(TINY_CONFIG, weights, prompt)[-1], 1e-4)


def test_greedy_generate(tiny):
    graph, weights = tiny
    for _ in range(10):  # draw a prompt whose greedy path has no near-tie (f32 vs f64 could split it)
        prompt, ids, margins = _tokens(7), [], []
        for _ in range(6):
            logits = dense_logits(TINY_CONFIG, weights, prompt + ids)[-1]
            top2 = np.sort(logits)[-2:]
            margins.append(top2[1] - top2[0])
            ids.append(int(np.argmax(logits)))
        if min(margins) > 1e-3:
            break
    got = greedy_generate(graph, prompt, 6, stop_ids=())
    assert got == ids
    assert got == greedy_generate(graph, prompt, 6, prefill_chunk=3, stop_ids=())
    stop = got[2]
    assert greedy_generate(graph, prompt, 6, stop_ids=[stop]) == got[: got.index(stop) + 1]
