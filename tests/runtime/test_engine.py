"""The engine on the CPU backend with a tiny random Llama: batch invariance, n > 1, stop strings,
logprobs, aborts freeing blocks, the asyncio wrapper and the offline ``ingot.LLM`` API."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import ingot
from ingot.runtime.engine import AsyncEngine, EngineRequestError, LLMEngine, QueueFullError
from ingot.runtime.metrics import EngineMetrics
from ingot.runtime.paged import greedy_generate
from ingot.runtime.sampling import SamplingParams
from tests.runtime.serving_models import VOCAB, compile_tiny

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return compile_tiny(tmp_path_factory.mktemp("engine"))


def _prompts(n: int, seed: int = 0, max_len: int = 120) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB - 1, int(rng.integers(1, max_len))).tolist() for _ in range(n)]


def test_greedy_batch_invariance(artifact):
    """16 requests of mixed lengths batched together (chunked prefill mixed with decodes) give
    exactly the tokens each gives alone."""
    engine = LLMEngine(artifact, num_blocks=256, max_num_batched_tokens=64)
    prompts = _prompts(16)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    batched = engine.generate(prompts, params)
    for p, out in zip(prompts, batched):
        alone = greedy_generate(engine.graph, p, 24, stop_ids=())
        assert out.outputs[0].token_ids == alone
        assert out.outputs[0].finish_reason == "length"
    assert engine.scheduler.kv.num_used_blocks == 0


def test_n_shares_prompt_blocks_and_seeds_reproduce(artifact):
    metrics = EngineMetrics()
    engine = LLMEngine(artifact, num_blocks=128, metrics=metrics)
    prompt = list(range(3, 67))  # 64 tokens: 4 full blocks
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    out = engine.generate([prompt], params)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 8 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # different streams per sample
    # the 3 later samples found the first one's prompt blocks (3 full blocks each; the last token is computed)
    assert engine.scheduler.kv.prefix_stats.hits >= 3 * 48
    again = engine.generate([prompt], params)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
    assert metrics.prefix_hits._value.get() > 0
    assert engine.scheduler.kv.num_used_blocks == 0


def test_stop_strings_logprobs_and_text(artifact):
    engine = LLMEngine(artifact, num_blocks=64)
    free = engine.generate(["hello"], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0].outputs[0]
    assert free.text == engine.tokenizer.decode(free.token_ids)
    stop = free.text[3:5]
    assert stop and stop not in free.text[:3]
    out = engine.generate(["hello"], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop],
                                                    logprobs=2))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == free.text[: free.text.index(stop)]
    assert len(out.logprobs) == len(out.token_ids)
    assert all(lp.rank == 1 and len(lp.top_token_ids) == 2 for lp in out.logprobs)  # greedy: the best token


def test_abort_frees_blocks_and_bad_requests_raise(artifact):
    engine = LLMEngine(artifact, num_blocks=64)
    # greedy and ignoring EOS: the request must still be running after one step (a sampled EOS
    # would finish it and free its blocks before the abort)
    rid = engine.add_request(list(range(3, 100)), SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    engine.step()
    assert engine.scheduler.kv.num_used_blocks > 0
    assert engine.abort(rid) and not engine.abort(rid)
    assert engine.scheduler.kv.num_used_blocks == 0 and not engine.has_unfinished_requests()
    with pytest.raises(EngineRequestError, match="context length"):
        engine.add_request([5] * engine.max_model_len, SamplingParams())
    with pytest.raises(EngineRequestError, match="context length"):
        engine.add_request([5], SamplingParams(max_tokens=engine.max_model_len))
    with pytest.raises(EngineRequestError, match="token ids"):
        engine.add_request([VOCAB + 5], SamplingParams())
    with pytest.raises(EngineRequestError, match="empty"):
        engine.add_request([], SamplingParams())


def test_async_engine_streams_and_aborts(artifact):
    engine = LLMEngine(artifact, num_blocks=128)
    aengine = AsyncEngine(engine, max_queue=0)
    prompts = _prompts(6, seed=3, max_len=40)
    expected = [o.outputs[0].token_ids for o in engine.generate(prompts, SamplingParams(temperature=0.0,
                                                                                          max_tokens=12))]

    async def run_one(p: list[int]) -> list[int]:
        toks: list[int] = []
        async for out in aengine.generate(p, SamplingParams(temperature=0.0, max_tokens=12)):
            toks += out.outputs[0].delta_token_ids
        return toks

    async def leave_early(p: list[int]) -> None:
        async for out in aengine.generate(p, SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)):
            if len(out.outputs[0].token_ids) >= 3:
                break

    async def main() -> list[list[int]]:
        got = await asyncio.wait_for(asyncio.gather(*(run_one(p) for p in prompts), leave_early(prompts[0])), 60)
        return list(got[:-1])

    aengine.start()
    try:
        assert asyncio.run(main()) == expected
        for _ in range(200):  # the abort reaches the engine thread asynchronously
            if not engine.has_unfinished_requests():
                break
            asyncio.run(asyncio.sleep(0.01))
        assert engine.scheduler.kv.num_used_blocks == 0
        aengine.engine.args.max_num_seqs, aengine.num_in_flight = 1, 1
        with pytest.raises(QueueFullError):
            aengine.check_admission()
    finally:
        aengine.num_in_flight = 0
        aengine.stop(10)
    assert not aengine.running


def test_llm_api(artifact):
    llm = ingot.LLM(artifact, num_blocks=64)
    prompts = _prompts(3, seed=5, max_len=30)
    outs = llm.generate(prompt_token_ids=prompts, max_tokens=6)
    assert len(outs) == 3
    for p, o in zip(prompts, outs):
        assert o.token_ids == greedy_generate(llm.engine.graph, p, 6)
        assert o.text == llm.tokenizer.decode(o.token_ids)
    (text_out,) = llm.generate(prompts="hello there", max_tokens=4)
    assert text_out.token_ids == greedy_generate(llm.engine.graph, llm.tokenizer.encode("hello there"), 4)
    with pytest.raises(ValueError):
        llm.generate(max_tokens=4)


def test_streamed_outputs_keep_their_step_totals(artifact):
    """Outputs share the sequence's growing token and logprob lists (no copy per step): an output read after
    later steps still gives its own step's totals, consistent with the deltas streamed up to it."""
    engine = LLMEngine(artifact, num_blocks=64)
    engine.add_request(_prompts(1, seed=5, max_len=20)[0],
                       SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1, stop=["\x00\x01"]))
    outs = []
    while engine.has_unfinished_requests():
        outs += [o.outputs[0] for o in engine.step()]
    toks: list[int] = []
    text, lps = "", []
    for c in outs:  # read only now, after the request finished
        toks += c.delta_token_ids
        text += c.delta_text
        lps += c.delta_logprobs
        assert c.token_ids == toks and c.text == text and c.logprobs == lps
    final = outs[-1]
    assert final.finished and len(final.token_ids) == 8 and final.text == engine.tokenizer.decode(final.token_ids)
    final.token_ids = [1, 2]  # the totals stay assignable, as dataclass fields were
    assert final.token_ids == [1, 2] and final != outs[0] and "token_ids=[1, 2]" in repr(final)


def test_gc_freeze_is_held_until_the_last_holder_releases():
    """``hold_gc_freeze`` / ``release_gc_freeze`` (what a GPU engine's load and close call): the collector stays frozen
    while any holder has not released it, a second release changes nothing, and the last release unfreezes."""
    import gc

    from ingot.runtime import engine as engine_mod

    class Holder:
        pass

    a, b = Holder(), Holder()
    before = set(engine_mod._gc_holders)
    engine_mod._gc_holders.clear()
    try:
        engine_mod.hold_gc_freeze(a)
        engine_mod.hold_gc_freeze(b)
        assert gc.get_freeze_count() > 0
        engine_mod.release_gc_freeze(a)
        engine_mod.release_gc_freeze(a)
        assert gc.get_freeze_count() > 0 and set(engine_mod._gc_holders) == {b}
        engine_mod.release_gc_freeze(b)
        assert gc.get_freeze_count() == 0 and not engine_mod._gc_holders
    finally:
        engine_mod._gc_holders.update(before)
        if before:
            gc.freeze()
