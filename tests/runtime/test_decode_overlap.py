"""The engine's overlap (``runtime/engine.py``, "Overlap"): the next plan of decode steps is queued before the
previous plan's tokens are taken. On the CPU backend (``CpuExecutor.submit_greedy_steps`` runs at once, so only the
engine's and the scheduler's bookkeeping is under test): the token streams, texts and finish reasons are those of
the engine without overlap across requests stopping inside a plan (eos, stop token ids, ``max_tokens``, stop
strings), ``n > 1``, requests joining and aborted mid-run, preemption and prefix caching, with ``K = 1`` and ``K > 1``;
every block goes back to the pool. The scheduler's next plan (positions, slots, blocks, refusals) is checked
directly, and the CUDA executor's two submissions in flight run against a fake driver whose stream work runs only
when waited for (a staging copy overwritten before its copy ran would show). On the GPU:
test_decode_steps_gpu.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ingot.runtime.engine import EngineArgs, LLMEngine, decode_overlap_default
from ingot.runtime.request import Request, RequestStatus
from ingot.runtime.sampling import SamplingParams
from ingot.runtime.scheduler import build_step_inputs
from tests.runtime.serving_models import compile_tiny, run_requests
from tests.runtime.test_decode_steps import (
    FakeMemory,
    _all_free,
    _prompts,
    _scheduler,
    _stopping_requests,
    fake_executor,
)

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return compile_tiny(tmp_path_factory.mktemp("decode-overlap"))


class OverlapSpy:
    """Wraps the CPU executor: logs submissions (steps, chained) and checks that a chained one follows an uncollected
    submission of the same rows and that nothing is scheduled while a plan is in flight."""

    def __init__(self, engine: LLMEngine) -> None:
        self.executor = engine.executor
        self.engine = engine
        self.submits: list[tuple[int, bool]] = []
        self.in_flight: list[Any] = []  # tickets submitted, not yet collected

    def run(self, feeds: Any, check: bool = True) -> dict[str, np.ndarray]:
        assert not self.in_flight, "a step while decode steps are in flight"
        return self.executor.run(feeds, check=check)

    def greedy_tokens(self, feeds: Any) -> np.ndarray:
        assert not self.in_flight, "a step while decode steps are in flight"
        return self.executor.greedy_tokens(feeds)

    def submit_greedy_steps(self, steps: list[Any], chained: bool = False) -> Any:
        assert all(len(f["input_ids"]) == len(f["seq_lens"]) for f in steps), "a prefill row in decode steps"
        if chained:
            assert self.in_flight, "a chained submission with nothing before it in flight"
            assert not self.engine.scheduler.waiting_can_join(), "chained steps while a waiting request could join"
        else:
            assert not self.in_flight
        self.submits.append((len(steps), chained))
        ticket = self.executor.submit_greedy_steps(steps, chained=chained)
        self.in_flight.append(ticket)
        return ticket

    def collect_greedy_steps(self, ticket: Any) -> np.ndarray:
        assert any(t is ticket for t in self.in_flight)
        self.in_flight = [t for t in self.in_flight if t is not ticket]
        return self.executor.collect_greedy_steps(ticket)


def _engine(artifact, k: int, overlap: bool, eos: tuple[int, ...] | None = None, num_blocks: int = 256,
            **kwargs: Any) -> tuple[LLMEngine, OverlapSpy]:
    engine = LLMEngine(artifact, EngineArgs(num_blocks=num_blocks, max_num_batched_tokens=kwargs.pop("budget", 48),
                                            decode_steps=k, decode_overlap=overlap, **kwargs))
    if eos is not None:
        engine.eos_token_ids = eos
    spy = OverlapSpy(engine)
    engine.executor = spy
    return engine, spy


@pytest.mark.parametrize("k", [1, 4])
def test_streams_equal_the_engine_without_overlap(artifact, k):
    requests, eos = _stopping_requests(artifact, 1)
    want = run_requests(_engine(artifact, 1, False, eos)[0], requests)
    plain, plain_spy = _engine(artifact, k, False, eos)
    assert run_requests(plain, requests) == want and not plain_spy.submits and plain.num_overlapped_plans == 0
    engine, spy = _engine(artifact, k, True, eos)
    assert run_requests(engine, requests) == want
    chained = [n for n, c in spy.submits if c]
    assert engine.num_overlapped_plans == len(chained) >= 3 and max(chained) == k
    assert not spy.in_flight and engine._inflight is None and _all_free(engine)


def test_joining_and_aborted_requests(artifact):
    """Requests added while others decode stop the chain (the plan in flight is taken, then they are scheduled);
    a request aborted while a plan holds it gets no more tokens and gives its blocks back; the others' streams are
    the engine's without overlap."""
    prompts = _prompts(6, 2, hi=70)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (40, 25, 33, 12, 30, 19)]
    joins = {0: [0, 1], 3: [2], 6: [3, 4], 9: [5]}
    abort_at = 12  # request 4, from this step on, once a plan in flight holds it
    results = {}
    for overlap in (False, True):
        engine, spy = _engine(artifact, 4, overlap)
        streams: dict[str, list[int]] = {}
        ids: list[str] = []
        step = aborted = 0
        while step <= max(joins) or engine.has_unfinished_requests():
            for i in joins.get(step, ()):
                ids.append(engine.add_request(prompts[i], params[i]))
            held = engine._inflight is not None and len(ids) > 4 and ids[4] in engine._inflight[0].output.req_ids
            if step >= abort_at and not aborted and (held or not overlap):
                assert engine.abort(ids[4])
                aborted = step
            for o in engine.step():
                streams[o.request_id] = streams.get(o.request_id, []) + o.outputs[0].delta_token_ids
                assert o.outputs[0].token_ids == streams[o.request_id]
            step += 1
        engine.step()  # takes a plan still in flight for the aborted request, if any
        assert _all_free(engine) and engine._inflight is None
        assert aborted and len(streams[ids[4]]) < params[4].max_tokens
        results[overlap] = [streams[i] for j, i in enumerate(ids) if j != 4]
        assert [len(s) for s in results[overlap]] == [p.max_tokens for j, p in enumerate(params) if j != 4]
        assert (engine.num_overlapped_plans > 0) == overlap
    assert results[True] == results[False]


def test_preemption_and_prefix_cache(artifact):
    """A small cache (preemptions; next plans refused for want of blocks) and a second request hitting blocks the
    overlapped plans published: the streams are the engine's without overlap."""
    requests = [(p, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)) for p in _prompts(8, 3, 10, 40)]
    want = run_requests(_engine(artifact, 4, False, num_blocks=14)[0], requests)
    engine, _ = _engine(artifact, 4, True, num_blocks=14)
    assert run_requests(engine, requests) == want
    assert engine.scheduler.num_preemptions > 0 and engine.num_overlapped_plans > 0 and _all_free(engine)
    first = _prompts(1, 4, 20, 21)[0]
    got = []
    for overlap in (False, True):
        engine, _ = _engine(artifact, 8, overlap)
        a = engine.generate([first], SamplingParams(temperature=0.0, max_tokens=45, ignore_eos=True))[0]
        gen = a.outputs[0].token_ids
        before = engine.scheduler.kv.prefix_stats.hits
        b = engine.generate([first + gen[:40] + [7]], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
        assert engine.scheduler.kv.prefix_stats.hits - before >= 48  # blocks filled during (overlapped) decode
        got.append((gen, b[0].outputs[0].token_ids))
        assert _all_free(engine)
    assert got[0] == got[1]


def test_overlap_setting(artifact, monkeypatch):
    monkeypatch.delenv("INGOT_DECODE_OVERLAP", raising=False)
    assert decode_overlap_default("cuda") and not decode_overlap_default("cpu")
    assert not LLMEngine(artifact, num_blocks=16).decode_overlap
    assert LLMEngine(artifact, num_blocks=16, decode_overlap=True).decode_overlap
    for raw, want in (("0", False), ("off", False), ("1", True), (" yes ", True)):
        monkeypatch.setenv("INGOT_DECODE_OVERLAP", raw)
        assert decode_overlap_default("cuda") == want == decode_overlap_default("cpu")
    monkeypatch.setenv("INGOT_DECODE_OVERLAP", "sometimes")
    with pytest.raises(ValueError, match="INGOT_DECODE_OVERLAP"):
        LLMEngine(artifact, num_blocks=16)


# -- the scheduler's next plan ----------------------------------------------------------------------


def test_next_plan_positions_slots_blocks_and_updates():
    s = _scheduler(64)
    reqs = [Request(f"r{i}", list(range(3, 3 + n)), max_tokens=m) for i, (n, m) in enumerate([(5, 20), (9, 9)])]
    for r in reqs:
        s.add_request(r)
    s.update_from_output(s.schedule(), [50, 60])
    plan = s.plan_decode_steps(s.schedule(), 3)  # positions 5.. and 9..
    assert plan is not None and plan.num_steps == 3 and not plan.chained
    free = s.kv.num_free_blocks
    nxt = s.plan_next_decode_steps(plan, 8)
    # r1 may generate 9 - 1 - 3 = 5 more tokens after the plan: cut to 5
    assert nxt is not None and nxt.chained and nxt.num_steps == 5 and nxt.output is plan.output
    for j, si in enumerate(nxt.step_inputs):
        assert si.positions.tolist() == [8 + j, 12 + j] and si.seq_lens.tolist() == [9 + j, 13 + j]
        assert si.input_ids.tolist() == [0, 0]  # placeholders: step 0's are the plan's last ids, on the device
        for r, pos, slot in zip(reqs, si.positions, si.slot_mapping):
            assert slot == s.kv.get_block_ids(r.request_id)[pos // 4] * 4 + pos % 4
        assert si.block_tables.shape[1] == -(-(13 + j) // 4)
    # K/V to position 12 (13 tokens, 4 blocks) and 16 (17 tokens, 5 blocks); 2 and 3 held before
    assert [len(s.kv.get_block_ids(r.request_id)) for r in reqs] == [4, 5] and s.kv.num_free_blocks == free - 4
    toks = [[70 + j, 80 + j] for j in range(8)]
    toks[4][0] = 99
    reqs[0].stop_token_ids = frozenset({99})  # r0 stops at the next plan's step 1
    for j in range(3):
        s.update_from_decode_step(plan, j, toks[j])
    assert [r.num_computed_tokens for r in reqs] == [8, 12]  # the usual decode state: all but the last token
    for j in range(5):
        updated = s.update_from_decode_step(nxt, j, toks[3 + j])
        assert [r.request_id for r in updated] == (["r0", "r1"] if j <= 1 else ["r1"])
        assert all(r.num_computed_tokens == r.num_tokens - 1 for r in updated if not r.is_finished)
    assert reqs[0].output_token_ids == [50, 70, 71, 72, 73, 99] and reqs[0].finish_reason == "stop"
    assert reqs[1].output_token_ids == [60, *range(80, 88)] and reqs[1].finish_reason == "length"
    assert s.kv.num_used_blocks == 0 and not s.has_unfinished_requests()


def test_next_plan_refuses_and_changes_nothing():
    s = _scheduler(9)
    a, b = Request("a", [3] * 7, max_tokens=30), Request("b", [4] * 6, max_tokens=30)
    for r in (a, b):
        s.add_request(r)
    s.update_from_output(s.schedule(), [5, 5])
    plan = s.plan_decode_steps(s.schedule(), 4)  # a: 11 tokens (3 blocks), b: 10 (3 blocks); 3 free
    assert plan is not None

    def state() -> tuple[int, list[list[int]]]:
        return s.kv.num_free_blocks, [s.kv.get_block_ids(r) for r in ("a", "b")]

    before = state()
    assert s.plan_next_decode_steps(plan, 8) is None  # a to 19 tokens (5 blocks), b to 18 (5): 4 > 3 free
    assert s.plan_next_decode_steps(plan, 0) is None
    b.status = RequestStatus.FINISHED_ABORTED  # a row no longer running
    assert s.plan_next_decode_steps(plan, 2) is None
    b.status = RequestStatus.RUNNING
    s.add_request(Request("c", [6] * 3, max_tokens=4))  # a request waiting
    assert s.plan_next_decode_steps(plan, 2) is None
    assert state() == before
    s.waiting.remove(s.requests["c"])
    del s.requests["c"]
    nxt = s.plan_next_decode_steps(plan, 4)  # a to 15 (4 blocks), b to 14 (4 blocks): 2 of 3 free
    assert nxt is not None and nxt.num_steps == 4 and s.kv.num_free_blocks == 1
    for j in range(4):
        s.update_from_decode_step(plan, j, [9, 9])
    a.max_tokens = len(a.output_token_ids) + 4  # no token left after the next plan
    assert s.plan_next_decode_steps(nxt, 4) is None


def test_plans_while_requests_wait_for_a_seat():
    """A request that waits while every seat is taken (``max_num_seqs``) cannot join before a running one ends, so
    decode steps and the plan after them go ahead; once a seat is free, a waiting request stops both."""
    s = _scheduler(64, max_num_seqs=2)
    a, b, c = (Request(x, [3 + i] * 6, max_tokens=30) for i, x in enumerate("abc"))
    for r in (a, b, c):
        s.add_request(r)
    s.update_from_output(s.schedule(), [5, 5])
    out = s.schedule()
    assert out.req_ids == ["a", "b"] and s.num_waiting == 1 and not s.waiting_can_join()
    plan = s.plan_decode_steps(out, 4)
    assert plan is not None and s.plan_next_decode_steps(plan, 4) is not None
    # a free seat (max_num_seqs 3): a request added while a plan runs could join, so nothing is queued ahead
    s = _scheduler(64, max_num_seqs=3)
    for r in (Request("a", [3] * 6, max_tokens=30), Request("b", [4] * 6, max_tokens=30)):
        s.add_request(r)
    s.update_from_output(s.schedule(), [5, 5])
    plan = s.plan_decode_steps(s.schedule(), 4)
    assert plan is not None and s.plan_next_decode_steps(plan, 4) is not None
    s.add_request(Request("c", [6] * 6, max_tokens=30))
    assert s.waiting_can_join() and s.plan_next_decode_steps(plan, 4) is None


# -- the CUDA executor's submissions, against a fake driver whose stream runs only when waited for --------------


class DeferredMemory(FakeMemory):
    """``FakeMemory`` whose stream work (copies, graph launches) is queued and runs when an event recorded after it
    is waited for, or the stream synchronized: as on a GPU, the host may write a staging copy before an earlier
    copy from it ran."""

    def __init__(self, nbytes: int) -> None:
        super().__init__(nbytes)
        self.queue: list[Any] = []
        self.ran = 0  # ops run, from the first queued

    def run(self, op: Any) -> None:
        self.queue.append(op)

    def drain(self, upto: int | None = None) -> None:
        upto = len(self.queue) if upto is None else upto
        while self.ran < upto:
            self.queue[self.ran]()
            self.ran += 1


@pytest.mark.parametrize("path", ["graph_each", "one_graph"])
def test_cuda_submissions_in_flight(tmp_path, monkeypatch, path):
    """Plans submitted back to back, each chained to the one before, collected one behind: each step sees its own
    inputs (not a later submission's, written to the staging while it waited), a chained plan's step 0 the previous
    plan's last ids, and the ids come back right. A third submission waits for the older; a chained one after other
    work, or with other rows, is refused. ``one_graph`` (``INGOT_STEPS_GRAPH=1``): a graph of the K steps per
    (bucket, K, parity), step 0's ids copied into its staged inputs on the device."""
    from ingot.runtime import cuda_driver as cd

    fake = DeferredMemory(1 << 24)

    class Event:
        def record(self, stream: Any) -> None:
            self.at = len(fake.queue)

        def synchronize(self) -> None:
            fake.drain(self.at)

        def destroy(self) -> None:
            pass

    one = path == "one_graph"
    ex, _, seen, sample = fake_executor(tmp_path, monkeypatch, one, fake=fake, event=Event)
    ex.stream = type("Stream", (), {"synchronize": staticmethod(fake.drain)})()
    assert cd.Event is Event
    rng = np.random.default_rng(0)
    s, table = 3, rng.permutation(64)[:36].reshape(3, 12).astype(np.int32)
    pos = rng.integers(4, 20, s)
    plans = []
    for k in (3, 2, 4, 1, 3):  # each plan's step 0 at the position after the last plan's
        plans.append([build_step_inputs(rng.integers(3, 90, s) if not plans and j == 0 else np.zeros(s, np.int64),
                                        pos + j, [1] * s, list(range(s)), table, 4).as_feeds() for j in range(k)])
        pos = pos + k
    if one:  # captured up front: a capture waits for the stream, which would hide what this test looks for
        for k in range(1, 5):
            for parity in (0, 1):
                ex._steps_graph(4, k, parity)
    tickets = [ex.submit_greedy_steps(plans[0])]
    tickets.append(ex.submit_greedy_steps(plans[1], chained=True))
    assert not seen  # nothing ran yet
    got = [ex.collect_greedy_steps(tickets[0])]
    for i in range(2, len(plans)):
        tickets.append(ex.submit_greedy_steps(plans[i], chained=True))  # written while plan i - 1 waits
        got.append(ex.collect_greedy_steps(tickets[i - 1]))
    # a third in flight: submitting it waits for the first (their staging is the same)
    extra = [ex.submit_greedy_steps(plans[0])]
    assert tickets[-1].ids is None
    extra.append(ex.submit_greedy_steps(plans[0]))
    assert tickets[-1].ids is not None and extra[0].ids is None
    got.append(ex.collect_greedy_steps(tickets[-1]))
    for t in extra:
        ex.collect_greedy_steps(t)
    steps = [f for p in plans for f in p]
    assert len(seen) == len(steps) + 2 * len(plans[0])
    prev = plans[0][0]["input_ids"]
    for g, feeds, want in zip(seen, steps, np.concatenate(got)):
        assert g["input_ids"][:s].tolist() == list(prev)
        for name in ("positions", "slot_mapping", "seq_lens"):
            assert g[name][:s].tolist() == feeds[name].tolist(), name
        w = feeds["block_tables"].shape[1]
        assert (g["block_tables"][:s, :w] == feeds["block_tables"]).all()
        assert want.tolist() == sample(g)[:s].tolist()
        prev = want
    assert ex.stats["chained_submits"] == len(plans) - 1 and ex.stats["multi_steps"] == len(plans) + 2
    assert ex.stats["steps_graphs"] == (8 if one else 0)  # none captured while submissions were in flight
    with pytest.raises(ValueError, match="same rows"):
        ex.submit_greedy_steps([{**f, "seq_lens": f["seq_lens"][:2]} for f in plans[1]], chained=True)
    ex._launch_step(plans[0][0], False, argmax=True)  # other work: the ids on the device are not a submission's
    fake.drain()
    with pytest.raises(ValueError, match="last work"):
        ex.submit_greedy_steps(plans[1], chained=True)


def test_async_engine_streams_and_abort(artifact):
    """Through ``AsyncEngine`` (the server's path) with overlap: each stream's deltas add up to the tokens of the
    engine without overlap; a client that stops reading (abort while plans are in flight) leaves the others' streams
    whole, and every block comes back."""
    import asyncio

    from ingot.runtime.engine import AsyncEngine

    prompts = _prompts(5, 6, hi=30)
    params = SamplingParams(temperature=0.0, max_tokens=29, ignore_eos=True)
    want = [c[0][0] for c in run_requests(_engine(artifact, 1, False)[0], [(p, params) for p in prompts])]
    llm = LLMEngine(artifact, num_blocks=128, decode_steps=4, decode_overlap=True)
    engine = AsyncEngine(llm)

    async def one(p: list[int], stop_after: int | None = None) -> list[int]:
        toks: list[int] = []
        gen = engine.generate(p, params)
        async for out in gen:
            toks += out.outputs[0].delta_token_ids
            if stop_after is not None and len(toks) >= stop_after:
                await gen.aclose()  # the client goes away: the engine aborts the request
                break
        return toks

    async def main() -> list[list[int]]:
        jobs = [one(p) for p in prompts] + [one(prompts[0], stop_after=6)]
        return list(await asyncio.wait_for(asyncio.gather(*jobs), 60))

    engine.start()
    try:
        got = asyncio.run(main())
    finally:
        engine.stop(10)
    assert got[:-1] == want
    assert 6 <= len(got[-1]) < 29 and got[-1] == want[0][: len(got[-1])]
    assert llm.num_overlapped_plans > 0
    llm.step()  # a plan still in flight for the aborted request, if any
    assert _all_free(llm)
