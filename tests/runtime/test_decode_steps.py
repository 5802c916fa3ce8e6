"""Decode steps (``runtime/engine.py``, "Decode steps"; ``INGOT_DECODE_STEPS=K``) on the CPU backend, whose
``greedy_tokens_steps`` runs the steps one after another: the token streams, texts and finish reasons with
``K = 4`` and ``8`` are those of ``K = 1`` across requests finishing at different steps (eos, stop token ids,
``max_tokens``, stop strings), ``n > 1``, requests joining mid-run, preemption, prefix caching
(blocks published by decode steps are hit), the streamed outputs (bursts of up to ``K`` tokens) and the metrics;
every block goes back to the pool. The fallbacks (a request waiting, sampling, logprobs, no device sampling,
executors without the method) run single steps. The scheduler's plan (positions, slots, blocks) is checked
directly, and the CUDA executor's queue of copies and graph launches runs against a fake driver (no GPU). The
CUDA engine itself: test_decode_steps_gpu.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ingot.runtime.engine import AsyncEngine, EngineArgs, LLMEngine, decode_steps_default
from ingot.runtime.metrics import EngineMetrics
from ingot.runtime.request import Request
from ingot.runtime.sampling import SamplingParams
from ingot.runtime.scheduler import CacheConfig, Scheduler, SchedulerConfig, build_step_inputs
from tests.runtime.serving_models import VOCAB, compile_tiny, run_requests

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return compile_tiny(tmp_path_factory.mktemp("decode-steps"))


class Spy:
    """Wraps an executor: logs each call, and checks that decode steps never run while a request waits."""

    def __init__(self, engine: LLMEngine, multi: bool = True) -> None:
        self.executor = engine.executor
        self.engine = engine
        self.calls: list[tuple[str, int]] = []  # (method, steps)
        self.num_prompt_rows_tokens = 0  # tokens computed beyond one per row (prefill chunks), all steps
        if multi:
            self.greedy_tokens_steps = self._steps

    def run(self, feeds: Any, check: bool = True) -> dict[str, np.ndarray]:
        self.calls.append(("run", 1))
        self.num_prompt_rows_tokens += len(feeds["input_ids"]) - len(feeds["seq_lens"])
        return self.executor.run(feeds, check=check)

    def greedy_tokens(self, feeds: Any) -> np.ndarray:
        self.calls.append(("greedy_tokens", 1))
        self.num_prompt_rows_tokens += len(feeds["input_ids"]) - len(feeds["seq_lens"])
        return self.executor.greedy_tokens(feeds)

    def _steps(self, steps: list[Any]) -> np.ndarray:
        assert not self.engine.scheduler.waiting_can_join(), "decode steps while a waiting request could join"
        assert all(len(f["input_ids"]) == len(f["seq_lens"]) for f in steps), "a prefill row in decode steps"
        self.calls.append(("greedy_tokens_steps", len(steps)))
        ids = self.executor.greedy_tokens_steps(steps)
        assert ids.shape == (len(steps), len(steps[0]["seq_lens"])) and ids.dtype == np.int64
        return ids

    @property
    def multi(self) -> list[int]:
        return [k for name, k in self.calls if name == "greedy_tokens_steps"]


def _engine(artifact, k: int, num_blocks: int = 256, eos: tuple[int, ...] | None = None, multi: bool = True,
            **kwargs: Any) -> tuple[LLMEngine, Spy]:
    engine = LLMEngine(artifact, EngineArgs(num_blocks=num_blocks, max_num_batched_tokens=kwargs.pop("budget", 48),
                                            decode_steps=k, **kwargs))
    if eos is not None:
        engine.eos_token_ids = eos
    spy = Spy(engine, multi)
    engine.executor = spy
    return engine, spy


def _prompts(n: int, seed: int = 0, lo: int = 2, hi: int = 60) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB - 1, int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def _all_free(engine: LLMEngine) -> bool:
    kv = engine.scheduler.kv
    return kv.num_used_blocks == 0 and kv.num_free_blocks == kv.num_blocks and not kv.req_blocks


def _stopping_requests(artifact, seed: int) -> tuple[list[tuple[list[int], SamplingParams]], tuple[int, ...]]:
    """Requests that end at different steps: length, eos, stop token ids, stop strings,
    ``n = 3``; the stops are picked from a free run's tokens and text so that they do fire. Returns the requests
    and the eos id for the engines."""
    prompts = _prompts(8, seed)
    free_params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    engine = LLMEngine(artifact, EngineArgs(num_blocks=256, decode_steps=1))
    free = [c[0] for c in run_requests(engine, [(p, free_params) for p in prompts])]
    eos = free[1][0][11]
    text = free[3][2]
    stop = next(text[i : i + 2] for i in range(6, len(text) - 2) if text[i : i + 2] not in text[: i + 1])

    def g(**kw: Any) -> SamplingParams:
        return SamplingParams(temperature=0.0, **{"max_tokens": 30, "ignore_eos": True, **kw})

    requests = [
        (prompts[0], g()),  # length, 30
        (prompts[1], g(ignore_eos=False)),  # eos at token 12 (or where that id first comes)
        (prompts[2], g(stop_token_ids=[free[2][0][6]])),
        (prompts[3], g(stop=[stop])),
        (prompts[4], g(max_tokens=5)),  # fewer tokens than K: K is cut
        (prompts[5], g(stop_token_ids=[free[5][0][17], free[5][0][23]])),
        (prompts[6], g(n=3, max_tokens=13)),
        (prompts[7], g(max_tokens=1)),
    ]
    return requests, (eos,)


@pytest.mark.parametrize("k", [4, 8])
def test_streams_equal_single_steps_when_requests_stop_at_different_steps(artifact, k):
    requests, eos = _stopping_requests(artifact, 1)
    one, one_spy = _engine(artifact, 1, eos=eos)
    want = run_requests(one, requests)
    reasons = [c[3] for r in want for c in r]
    assert reasons.count("stop") >= 3 and reasons.count("length") >= 4, reasons
    many, spy = _engine(artifact, k, eos=eos)
    assert run_requests(many, requests) == want
    assert many.num_multi_steps == len(spy.multi) > 0 and max(spy.multi) == k and min(spy.multi) >= 2
    assert one.num_multi_steps == 0 and _all_free(one) and _all_free(many)
    # the same model steps ran, only grouped, and the same prefill chunks: nothing is recomputed after decode steps
    assert many.num_device_sampled_steps == one.num_device_sampled_steps
    assert spy.num_prompt_rows_tokens == one_spy.num_prompt_rows_tokens


def test_requests_joining_mid_run_stream_in_bursts(artifact):
    """Requests added while others decode (their prefill chunks run as single steps in between); the deltas of
    the streamed outputs add up to each step's totals, come in bursts of up to K, and the final streams are the
    single-step engine's."""
    prompts = _prompts(7, 2, hi=90)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, stop=["\x00\x01"])
              for m in (40, 25, 33, 12, 40, 7, 19)]
    joins = {0: [0, 1], 2: [2], 5: [3, 4], 9: [5], 10: [6]}  # engine step -> requests added before it
    results = {}
    for k in (1, 4):
        engine, spy = _engine(artifact, k)
        streams: dict[str, list[int]] = {}
        texts: dict[str, str] = {}
        bursts: list[int] = []
        ids: list[str] = []
        step = 0
        while step <= max(joins) or engine.has_unfinished_requests():
            for i in joins.get(step, ()):
                ids.append(engine.add_request(prompts[i], params[i]))
            for o in engine.step():
                c = o.outputs[0]
                streams[o.request_id] = streams.get(o.request_id, []) + c.delta_token_ids
                texts[o.request_id] = texts.get(o.request_id, "") + c.delta_text
                assert c.token_ids == streams[o.request_id] and c.text == texts[o.request_id]
                bursts.append(len(c.delta_token_ids))
            step += 1
        assert [len(streams[i]) for i in ids] == [p.max_tokens for p in params]
        assert max(bursts) == k and _all_free(engine)
        results[k] = ([streams[i] for i in ids], [texts[i] for i in ids])
        if k > 1:
            assert engine.num_multi_steps > 0 and ("greedy_tokens", 1) in spy.calls
    assert results[4] == results[1]


def test_preemption_and_few_free_blocks(artifact):
    """A cache too small for every request: preemptions (recomputed prompts) and steps where the free blocks do not
    hold K more tokens (single steps); the streams are the single-step engine's and every block comes back."""
    requests = [(p, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)) for p in _prompts(8, 3, 10, 40)]
    one, _ = _engine(artifact, 1, num_blocks=14)
    want = run_requests(one, requests)
    many, spy = _engine(artifact, 8, num_blocks=14)
    assert run_requests(many, requests) == want
    assert one.scheduler.num_preemptions > 0 and many.scheduler.num_preemptions > 0
    assert many.num_multi_steps > 0 and _all_free(one) and _all_free(many)


def test_prefix_cache_hits_blocks_published_by_decode_steps(artifact):
    """A request whose prompt is an earlier request's prompt and generated tokens finds the blocks those tokens
    filled during decode steps (their hashes are over the right tokens), and computes the same tokens."""
    first = _prompts(1, 4, 20, 21)[0]
    results = []
    for k in (1, 8):
        engine, spy = _engine(artifact, k)
        a = engine.generate([first], SamplingParams(temperature=0.0, max_tokens=45, ignore_eos=True))[0]
        gen = a.outputs[0].token_ids
        hits_before = engine.scheduler.kv.prefix_stats.hits
        prompt = first + gen[:40] + [7]  # 61 tokens: blocks 0-2 cached (16..48 filled by decode steps)
        b = engine.generate([prompt, prompt[:50] + [9, 9]],
                            SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
        hits = engine.scheduler.kv.prefix_stats.hits - hits_before
        assert hits >= 2 * 48, hits
        results.append((gen, [o.outputs[0].token_ids for o in b], hits))
        assert _all_free(engine)
        assert k == 1 or engine.num_multi_steps > 0
    assert results[0] == results[1]


def test_fallbacks_run_single_steps(artifact):
    """Decode steps while requests wait for a seat (max_num_seqs 1: they cannot join before a running one ends),
    none while a waiting request could join (the Spy checks), while a request samples or wants logprobs, with
    device sampling off, or for an executor without ``greedy_tokens_steps``; the tokens stay the same."""
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    prompts = _prompts(3, 5)
    want = run_requests(_engine(artifact, 1)[0], [(p, greedy) for p in prompts])
    # requests waiting for the one seat: decode steps run (the Spy asserts none could join meanwhile)
    engine, spy = _engine(artifact, 4, max_num_seqs=1)
    assert run_requests(engine, [(p, greedy) for p in prompts]) == want and engine.num_multi_steps > 0
    # device sampling off, or an executor without the method: single steps only
    for kwargs in ({"device_sampling": False}, {"multi": False}):
        engine, spy = _engine(artifact, 4, **kwargs)
        assert run_requests(engine, [(p, greedy) for p in prompts]) == want
        assert engine.num_multi_steps == 0 and not spy.multi and _all_free(engine)
    # a sampled / logprobs request beside greedy ones: single steps while it runs
    for other in (SamplingParams(temperature=0.8, seed=1, max_tokens=30, ignore_eos=True),
                  SamplingParams(temperature=0.0, logprobs=1, max_tokens=30, ignore_eos=True)):
        requests = [(p, greedy) for p in prompts] + [(prompts[0], other)]
        want = run_requests(_engine(artifact, 1)[0], requests)
        engine, spy = _engine(artifact, 4)
        assert run_requests(engine, requests) == want
        assert engine.num_multi_steps == 0 and not spy.multi and _all_free(engine)


def test_decode_steps_setting(artifact, monkeypatch):
    monkeypatch.delenv("INGOT_DECODE_STEPS", raising=False)
    assert decode_steps_default() == 1 and LLMEngine(artifact, num_blocks=16).decode_steps == 1
    monkeypatch.setenv("INGOT_DECODE_STEPS", "8")
    assert decode_steps_default() == 8 and LLMEngine(artifact, num_blocks=16).decode_steps == 8
    assert LLMEngine(artifact, num_blocks=16, decode_steps=2).decode_steps == 2  # the argument wins
    for bad in ("0", "-2", "four"):
        monkeypatch.setenv("INGOT_DECODE_STEPS", bad)
        with pytest.raises(ValueError, match="INGOT_DECODE_STEPS"):
            decode_steps_default()
    with pytest.raises(ValueError, match="decode_steps"):
        LLMEngine(artifact, num_blocks=16, decode_steps=0)


def test_async_streams_and_metrics(artifact):
    """Through ``AsyncEngine`` (the server's path): each stream's deltas add up to the single-step tokens, some
    outputs carry several tokens, and the metrics count every generated token."""
    prompts = _prompts(5, 6, hi=30)
    params = SamplingParams(temperature=0.0, max_tokens=23, ignore_eos=True)
    want = [c[0][0] for c in run_requests(_engine(artifact, 1)[0], [(p, params) for p in prompts])]
    llm = LLMEngine(artifact, num_blocks=128, decode_steps=4)
    llm.metrics = EngineMetrics()
    engine = AsyncEngine(llm)

    async def one(p: list[int]) -> tuple[list[int], int]:
        toks: list[int] = []
        longest = 0
        async for out in engine.generate(p, params):
            toks += out.outputs[0].delta_token_ids
            longest = max(longest, len(out.outputs[0].delta_token_ids))
        return toks, longest

    async def main() -> list[tuple[list[int], int]]:
        return list(await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), 60))

    engine.start()
    try:
        got = asyncio.run(main())
    finally:
        engine.stop(10)
    assert [g[0] for g in got] == want and max(g[1] for g in got) == 4
    assert llm.metrics.generation_tokens._value.get() == 23 * len(prompts)
    assert llm.num_multi_steps > 0 and _all_free(llm)


# -- the scheduler's plan ---------------------------------------------------------------------------


def _scheduler(num_blocks: int, bs: int = 4, **kw: Any) -> Scheduler:
    return Scheduler(SchedulerConfig(max_model_len=kw.pop("max_model_len", 128), **kw),
                     CacheConfig(num_blocks, bs))


def test_plan_positions_slots_and_blocks():
    s = _scheduler(64)
    reqs = [Request(f"r{i}", list(range(3, 3 + n)), max_tokens=m) for i, (n, m) in enumerate([(5, 20), (9, 6)])]
    for r in reqs:
        s.add_request(r)
    out = s.schedule()
    s.update_from_output(out, [50, 60])
    out = s.schedule()  # both decode
    free = s.kv.num_free_blocks
    plan = s.plan_decode_steps(out, 8)
    assert plan is not None and plan.num_steps == 5  # r1 may generate 5 more tokens (max_tokens 6)
    assert plan.step_inputs[0] is out.step_inputs
    for j, si in enumerate(plan.step_inputs):
        assert si.positions.tolist() == [5 + j, 9 + j] and si.seq_lens.tolist() == [6 + j, 10 + j]
        for r, pos, slot in zip(reqs, si.positions, si.slot_mapping):
            blocks = s.kv.get_block_ids(r.request_id)
            assert slot == blocks[pos // 4] * 4 + pos % 4
        assert si.query_start_loc.tolist() == [0, 1, 2] and si.logits_indices.tolist() == [0, 1]
        if j:
            assert si.input_ids.tolist() == [0, 0]  # placeholders
    # blocks for 5 + 4 and 9 + 4 tokens' K/V: 3 + 4 blocks, 2 + 3 held before
    assert [len(s.kv.get_block_ids(r.request_id)) for r in reqs] == [3, 4] and s.kv.num_free_blocks == free - 2
    toks = [[70 + j, 80 + j] for j in range(5)]
    toks[2][0] = 99
    reqs[0].stop_token_ids = frozenset({99})  # r0 stops at step 2: its later tokens are discarded
    for j in range(5):
        updated = s.update_from_decode_step(plan, j, toks[j])
        assert [r.request_id for r in updated] == (["r0", "r1"] if j <= 2 else ["r1"])
        # the usual decode state after each step: every token computed but the last
        assert all(r.num_computed_tokens == r.num_tokens - 1 for r in updated if not r.is_finished)
        assert j == 4 or reqs[1].num_computed_tokens == 10 + j
    assert reqs[0].output_token_ids == [50, 70, 71, 99] and reqs[0].finish_reason == "stop"
    assert reqs[1].output_token_ids == [60, 80, 81, 82, 83, 84] and reqs[1].finish_reason == "length"
    assert s.kv.num_used_blocks == 0 and not s.has_unfinished_requests()


def test_plan_refuses_and_changes_nothing():
    s = _scheduler(6)
    a, b = Request("a", [3] * 7, max_tokens=10), Request("b", [4] * 6, max_tokens=10)
    s.add_request(a)
    s.add_request(b)
    s.update_from_output(s.schedule(), [5, 5])
    out = s.schedule()  # a holds 2 blocks (8 tokens), b 2 (7 tokens); 2 free
    state = (s.kv.num_free_blocks, [s.kv.get_block_ids(r) for r in ("a", "b")])
    assert s.plan_decode_steps(out, 8) is None  # a needs 2 more blocks for 7 more tokens, b 2: 4 > 2 free
    assert s.plan_decode_steps(out, 1) is None
    assert (s.kv.num_free_blocks, [s.kv.get_block_ids(r) for r in ("a", "b")]) == state
    plan = s.plan_decode_steps(out, 4)  # 3 more tokens: a 11 -> 3 blocks, b 10 -> 3 blocks
    assert plan is not None and plan.num_steps == 4 and s.kv.num_free_blocks == 0
    s.add_request(Request("c", [6] * 3, max_tokens=4))  # a request waiting: no plan
    for j in range(4):
        s.update_from_decode_step(plan, j, [9, 9])
    out = s.schedule()
    assert "c" not in out.req_ids and s.plan_decode_steps(out, 4) is None
    s.update_from_output(out, [9, 9])
    assert a.num_computed_tokens == a.num_tokens - 1 == 12


# -- the CUDA executor's queue, against a fake driver -----------------------------------------------


class FakeMemory:
    """One byte array standing for host and device memory: ``cuda_driver``'s buffers, copies and graphs over it.
    Copies run when queued (a stream runs its work in order; so does this)."""

    def __init__(self, nbytes: int = 1 << 20) -> None:
        self.mem = np.zeros(nbytes, np.uint8)
        self.top = 4096

    def alloc(self, nbytes: int) -> SimpleNamespace:
        ptr, self.top = self.top, self.top + -(-max(int(nbytes), 1) // 256) * 256
        assert self.top <= len(self.mem)
        buf = SimpleNamespace(ptr=ptr, nbytes=max(int(nbytes), 1), free=lambda: None,
                              array=self.mem[ptr : ptr + max(int(nbytes), 1)])
        buf.view = lambda off, dt, shape, buf=buf: buf.array[off : off + int(np.prod(shape, dtype=np.int64)) * np.dtype(
            dt).itemsize].view(dt).reshape(shape)
        return buf

    def copy(self, dst: int, src: int, n: int, stream: Any = None) -> None:
        self.run(lambda: self.mem.__setitem__(slice(dst, dst + n), self.mem[src : src + n].copy()))

    def run(self, op: Any) -> None:
        """Run a stream's work (a copy, a graph launch); ``DeferredMemory`` queues it instead."""
        op()

    def read(self, ptr: int, dtype: Any, n: int) -> np.ndarray:
        return self.mem[ptr : ptr + n * np.dtype(dtype).itemsize].view(dtype).copy()


class FakeEvent:
    """``cuda_driver.Event`` where copies run when queued: nothing to wait for."""

    def record(self, stream: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def destroy(self) -> None:
        pass


class FakeCapture:
    """``cuda_driver.CudaGraph`` over the fake memory: what ``record`` queues (``FakeCapture.queue``) runs at each
    ``launch``, with the kernel arguments it had when captured."""

    recording: list[Any] | None = None

    def __init__(self, stream: Any, record: Any) -> None:
        self.ops: list[Any] = []
        FakeCapture.recording = self.ops
        try:
            record()
        finally:
            FakeCapture.recording = None

    @staticmethod
    def queue(op: Any) -> None:
        assert FakeCapture.recording is not None, "a graph's work queued outside a capture"
        FakeCapture.recording.append(op)

    def launch(self, stream: Any) -> None:
        ops = self.ops
        FakeCapture.runner(lambda: [op() for op in ops])

    @staticmethod
    def runner(work: Any) -> None:
        """How a stream runs a launched graph's work (``DeferredMemory.run`` queues it): now."""
        work()

    def destroy(self) -> None:
        self.ops = []


def fake_host_launch(fake: FakeMemory) -> Any:
    """``cuda_driver.launch`` for a ``HostKernel`` (``tests/codegen/host_emulation.py``) over the fake memory: its
    arguments read from the packed block when captured (pointers: offsets into ``fake.mem``), run at replay."""
    import ctypes

    def launch(fn: Any, grid: Any, block: Any, smem: int, stream: Any, params_addr: int, what: str = "kernel",
               pdl: bool = False) -> None:
        spec = fn.spec
        slots = (ctypes.c_void_p * len(spec.params)).from_address(params_addr)
        args = {}
        for p, addr in zip(spec.params, slots):
            v = (ctypes.c_uint64 if p.ctype == "ptr" else ctypes.c_int64).from_address(addr).value
            args[p.name] = fake.mem[v:] if p.ctype == "ptr" else v
        assert tuple(grid) == spec.grid_dims(args) and tuple(block) == spec.block
        FakeCapture.queue(lambda: fn.launch(**args))

    return launch


def fake_executor(tmp_path: Any, monkeypatch: Any, one: bool = False, fake: FakeMemory | None = None,
                  event: Any = None) -> tuple[Any, FakeMemory, list[dict[str, np.ndarray]], Any]:
    """A ``CudaExecutor`` of the tiny Llama (h200) holding only the state the decode-steps queue reads, over
    ``cuda_driver`` faked by ``fake`` (default: a ``FakeMemory``; ``event``: the fake ``Event`` class). Its decode
    graph "samples" a token from each row's staged input id, position and context (``sample``) into the argmax
    ids, and logs the inputs it saw in ``seen``. ``one``: the step kernel built for the host
    (``INGOT_STEPS_GRAPH=1``). Returns (executor, fake memory, seen, sample)."""
    import ingot
    from ingot.codegen.kernels.copy.step_rule import step_inputs_spec
    from ingot.codegen.memory_plan import eval_dim
    from ingot.codegen.target import get_target
    from ingot.runtime import cuda_driver as cd
    from ingot.runtime.artifact import load_graph
    from ingot.runtime.cuda_backend import CudaExecutor
    from tests.codegen.host_emulation import CXX, HostKernel
    from tests.runtime.test_cuda_backend import FIXTURES

    if one and CXX is None:
        pytest.skip("no host C++ compiler for the step kernel")
    monkeypatch.setenv("INGOT_STEPS_GRAPH", "1" if one else "0")
    path = ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target="h200", out=tmp_path / "t.ingot", mode="llm")
    graph, manifest = load_graph(path)
    plan = manifest["cuda"]["memory_plan"]
    fake = fake or FakeMemory(64 * int(plan["regions"]["io"]) + (4 << 20))
    for name, fn in (("memcpy_htod", fake.copy), ("memcpy_dtod", fake.copy), ("memcpy_dtoh", fake.copy),
                     ("PinnedBuffer", fake.alloc), ("DeviceMemory", fake.alloc), ("CudaGraph", FakeCapture),
                     ("launch", fake_host_launch(fake)), ("Event", event or FakeEvent)):
        monkeypatch.setattr(cd, name, fn)
    monkeypatch.setattr(FakeCapture, "runner", staticmethod(fake.run))
    ex = CudaExecutor.__new__(CudaExecutor)  # the state greedy_tokens_steps reads, over the fake memory
    ex.buffers, ex.num_blocks, ex.kv_inputs, ex.kv_layer_bytes = plan["buffers"], 64, [], 0
    ex.bounds = {k: int(v) for k, v in plan["bindings"].items()}
    ex.inputs = [v for v in graph.inputs if v.name not in plan["kv_cache"]["inputs"]]
    ex.staging = fake.alloc(int(plan["regions"]["io"]))
    ex.arena = fake.alloc(int(plan["regions"]["io"]))
    ex.base = {"io": 0}
    ex._staged, ex._staged_bucket = {}, [None]
    ex._init_submissions()
    ex.cuda_graphs, ex.buckets = True, [b for b in (1, 2, 4, 8) if b <= ex.bounds["S"]]
    ex.stats = {"graph_steps": 0, "argmax_steps": 0, "multi_steps": 0, "captures": 0, "steps_graphs": 0,
                "chained_submits": 0}
    ex.ctx = ex.stream = SimpleNamespace(make_current=lambda: None, synchronize=lambda: None)
    ex.argmax = SimpleNamespace(tokens=fake.alloc(8 * ex.bounds["S"]))
    ex.steps_graphs = {}
    ex.step_kernel = None
    if one:
        spec = step_inputs_spec(get_target("h200"))
        ex.step_kernel = (HostKernel(spec, tmp_path), spec)
    seen: list[dict[str, np.ndarray]] = []

    def sample(inputs: dict[str, np.ndarray]) -> np.ndarray:
        bt = inputs["block_tables"]
        return (inputs["input_ids"] * 7 + inputs["positions"] * 3 + inputs["seq_lens"] * 5 + inputs["slot_mapping"]
                + bt.sum(axis=1)) % 1000

    def decode_graph(bucket: int) -> None:
        """The bucket's decode step: read the inputs from the io region, write every row's "argmax"."""
        dims = ex._graph_dims(bucket)
        got = {}
        for v in ex.inputs:
            shape = tuple(eval_dim(d, dims) for d in v.type.shape)
            got[v.name] = fake.read(ex.address(v.name), v.type.dtype.np, int(np.prod(shape))).reshape(shape)
        seen.append(got)
        fake.mem[ex.argmax.tokens.ptr : ex.argmax.tokens.ptr + 8 * bucket] = sample(got).astype(
            np.int64).view(np.uint8)

    ex.graphs = {b: SimpleNamespace(launch=lambda stream, b=b: fake.run(lambda: decode_graph(b)))
                 for b in ex.buckets}
    ex._record_graph = lambda dims: FakeCapture.queue(lambda: decode_graph(dims["S"]))
    return ex, fake, seen, sample


@pytest.mark.parametrize("path", ["one_graph", "graph_each"])
def test_cuda_decode_steps_queue(tmp_path, monkeypatch, path):
    """``CudaExecutor.greedy_tokens_steps`` against a fake driver whose decode graph "samples" a token from each
    row's staged input id, position and context: every step sees its own step's positions, slots, lengths and
    block tables (and padding rows), step ``j > 0`` the previous step's ids, and the ids come back ``[K, S]``.
    ``one_graph``: the K steps captured as one graph per (bucket, K) (the step kernel built for the host, its
    arguments as captured), every step's inputs staged in one buffer, a (bucket, K) seen again replaying its graph
    with the new inputs; padding rows feed on their own samples. ``graph_each`` (``INGOT_STEPS_GRAPH=0``): the
    bucket's graph per step, padding rows' ids 0."""
    from ingot.runtime.cuda_steps import STEP_STRIDE_ALIGN

    one = path == "one_graph"
    ex, fake, seen, sample = fake_executor(tmp_path, monkeypatch, one)
    rng = np.random.default_rng(0)
    # (sequences, K): (4, 4) replays (3, 4)'s graph (bucket 4) with other inputs and one row more
    calls = ((3, 4), (1, 5), (3, 2), (2, 3), (4, 4))
    for s, k in calls:
        bucket = next(b for b in ex.buckets if b >= s)
        table = rng.permutation(64)[: s * 12].reshape(s, 12).astype(np.int32)
        first = rng.integers(4, 30, s)
        steps = [build_step_inputs(rng.integers(3, 90, s) if j == 0 else np.zeros(s, np.int64), first + j, [1] * s,
                                   list(range(s)), table, 4).as_feeds() for j in range(k)]
        seen.clear()
        ids = ex.greedy_tokens_steps(steps)
        assert ids.shape == (k, s) and ids.dtype == np.int64 and len(seen) == k
        prev = steps[0]["input_ids"]
        for j in range(k):
            g = seen[j]
            assert len(g["input_ids"]) == bucket
            assert g["input_ids"][:s].tolist() == list(prev)
            pad = sample(seen[j - 1])[s:] if one and j else 0  # padding rows: their own last sample, or token 0
            assert (g["input_ids"][s:] == pad).all(), (j, g["input_ids"])
            for name in ("positions", "slot_mapping", "seq_lens"):
                assert g[name][:s].tolist() == steps[j][name].tolist(), (j, name)
            assert (g["positions"][s:] == 0).all()
            assert (g["slot_mapping"][s:] == -1).all() and (g["seq_lens"][s:] == 1).all()
            assert g["query_start_loc"].tolist() == list(range(bucket + 1))
            assert g["logits_indices"].tolist() == list(range(bucket))
            w = steps[j]["block_tables"].shape[1]
            assert (g["block_tables"][:s, :w] == steps[j]["block_tables"]).all() and not g["block_tables"][:s, w:].any()
            assert not g["block_tables"][s:].any()
            want = sample({n: g[n] for n in g})[:s]
            assert ids[j].tolist() == want.tolist()
            prev = ids[j]
    assert ex.stats["multi_steps"] == 5 and ex.stats["graph_steps"] == ex.stats["argmax_steps"] == 18
    if one:
        assert sorted(ex.steps_graphs) == [(1, 5, 0), (2, 3, 0), (4, 2, 0), (4, 4, 0)] and ex.stats["steps_graphs"] == 4
        assert all(sg.stride % STEP_STRIDE_ALIGN == 0 and sg.stride >= sg.end for sg in ex.steps_graphs.values())
    else:
        assert not ex.steps_graphs and ex.stats["steps_graphs"] == 0


def test_runtime_kernels_build_for_the_artifacts_arch(monkeypatch, caplog):
    """``CudaExecutor._runtime_kernel`` (the argmax and step kernels the runtime adds): built for the target of the
    artifact's architecture and kept in ``modules``; None for an architecture no target has; None with the given
    warning where the kernel does not compile."""
    from ingot.codegen import compile as cc
    from ingot.codegen.kernels.copy.step_rule import step_inputs_spec
    from ingot.runtime import cuda_driver as cd
    from ingot.runtime.cuda_backend import CudaExecutor

    class FakeModule:
        def __init__(self, cubin: bytes, entry: str) -> None:
            assert cubin[:4] == b"\x7fELF"
            self.entry = entry

        def function(self, name: str) -> str:
            return f"fn:{name}"

    monkeypatch.setattr(cd, "Module", FakeModule)
    ex = CudaExecutor.__new__(CudaExecutor)
    ex.modules = {}
    ex.cuda = {"arch": "sm_90a"}
    try:
        built = ex._runtime_kernel(step_inputs_spec, "off")
    except cc.CompilerUnavailable:
        pytest.skip("no CUDA compiler")
    assert built is not None
    fn, spec = built
    assert spec.arch == "sm_90a" and fn == f"fn:{spec.entry}" and spec.entry in ex.modules
    ex.cuda = {"arch": "sm_42"}
    assert ex._runtime_kernel(step_inputs_spec, "off") is None

    def broken(spec, *a, **k):
        raise cc.CompileError("nope")

    ex.cuda = {"arch": "sm_90a"}
    monkeypatch.setattr(cc, "compile_spec", broken)
    with caplog.at_level("WARNING", logger="ingot.cuda"):
        assert ex._runtime_kernel(step_inputs_spec, "the step kernel off") is None
    assert "the step kernel off: nope" in caplog.text
