"""Device sampling (``runtime/engine.py``, "Device sampling") on the CPU backend, whose ``greedy_tokens`` is
numpy's argmax: the engine gives the same tokens (and logprobs) with it on and off, takes
``executor.greedy_tokens`` exactly on the steps where every sampling row is plain greedy, falls back to the
logits on mixed steps (sampling, logprobs, penalties), and handles ties and NaN like the host sampler. The
GPU kernel itself: tests/codegen/test_sampling_kernel.py; on the CUDA engine: test_device_sampling_gpu.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ingot.runtime.engine import EngineArgs, LLMEngine, device_sampling_default
from ingot.runtime.sampling import SamplingParams
from tests.runtime.serving_models import VOCAB, compile_tiny, run_requests

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return compile_tiny(tmp_path_factory.mktemp("device-sampling"))


class Spy:
    """Wraps an executor: counts the steps that went through ``run`` (logits) and ``greedy_tokens``."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self.calls: list[str] = []

    def run(self, feeds: Any, check: bool = True) -> dict[str, np.ndarray]:
        self.calls.append("run")
        return self.executor.run(feeds, check=check)

    def greedy_tokens(self, feeds: Any) -> np.ndarray:
        self.calls.append("greedy_tokens")
        return self.executor.greedy_tokens(feeds)


def _engine(artifact, device_sampling: bool, **kwargs: Any) -> tuple[LLMEngine, Spy]:
    engine = LLMEngine(artifact, EngineArgs(num_blocks=256, max_num_batched_tokens=48,
                                            device_sampling=device_sampling, **kwargs))
    spy = Spy(engine.executor)
    engine.executor = spy
    return engine, spy


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB - 1, int(rng.integers(2, 70))).tolist() for _ in range(n)]


def test_greedy_steps_take_device_tokens_and_match(artifact):
    """All-greedy requests (chunked prefill mixed with decodes, n > 1, stop strings): every step goes through
    ``greedy_tokens``, none copies logits, and the tokens are the host path's."""
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    requests = [(p, greedy) for p in _prompts(8)]
    requests.append((_prompts(1, 5)[0], SamplingParams(n=3, temperature=0.0, max_tokens=12, ignore_eos=True)))
    off, off_spy = _engine(artifact, False)
    want = run_requests(off, requests)
    on, on_spy = _engine(artifact, True)
    assert run_requests(on, requests) == want
    assert set(off_spy.calls) == {"run"} and off.num_device_sampled_steps == 0
    assert set(on_spy.calls) == {"greedy_tokens"} and on.num_device_sampled_steps == len(on_spy.calls)
    assert on.scheduler.kv.num_used_blocks == 0


@pytest.mark.parametrize("other", [
    SamplingParams(temperature=0.8, seed=3, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.0, logprobs=2, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.0, frequency_penalty=0.5, presence_penalty=0.5, max_tokens=6, ignore_eos=True),
], ids=["sampled", "logprobs", "repetition-penalty", "frequency-presence"])
def test_mixed_steps_fall_back_to_logits(artifact, other):
    """One request needing the distribution (or penalized logits) runs beside greedy ones: while it samples,
    the steps copy logits and go through the host sampler; after it finishes, the greedy requests' steps
    take device tokens again. Tokens and logprobs equal the host path's throughout."""
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    requests = [(p, greedy) for p in _prompts(4, 1)] + [(_prompts(1, 2)[0], other)]
    off, _ = _engine(artifact, False)
    want = run_requests(off, requests)
    on, spy = _engine(artifact, True)
    got = run_requests(on, requests)
    assert got == want
    # exactly the steps that sample the other request's 6 tokens (one after another) copy logits
    first = spy.calls.index("run")
    assert spy.calls[first : first + 6] == ["run"] * 6 and spy.calls.count("run") == 6, spy.calls
    assert on.num_device_sampled_steps == len(spy.calls) - 6 > 0
    if other.logprobs is not None:
        assert all(lp.rank == 1 for lp in got[-1][0][1])


def test_prefill_only_steps_skip_the_logits(artifact):
    """A step where no row samples (a long prompt's first chunks) needs no logits at all: even beside a
    sampled request's prefill chunk it takes ``greedy_tokens`` (the sampled request samples no row yet)."""
    prompt = list(range(3, 3 + 150))  # 150 tokens, 48 per step: 3 chunks before the first token
    params = SamplingParams(temperature=0.7, seed=1, max_tokens=3, ignore_eos=True)
    off, _ = _engine(artifact, False)
    want = run_requests(off, [(prompt, params)])
    on, spy = _engine(artifact, True)
    assert run_requests(on, [(prompt, params)]) == want
    assert spy.calls[:3] == ["greedy_tokens"] * 3 and set(spy.calls[3:]) == {"run"}


class TiedLogits:
    """A stand-in executor whose logits tie (each row's best value at two or three ids), hold NaN, or are all
    -inf; ``greedy_tokens`` is numpy's argmax, the contract of the CUDA kernel."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.step = 0

    def run(self, feeds: Any, check: bool = False) -> dict[str, np.ndarray]:
        s = len(feeds["logits_indices"])
        rng = np.random.default_rng(self.step)
        self.step += 1
        x = rng.standard_normal((s, self.vocab)).astype(np.float32)
        for r in range(s):
            kind = (self.step + r) % 4
            ids = rng.choice(np.arange(3, self.vocab), 3, replace=False)
            if kind == 0:
                x[r, ids] = 9.0
            elif kind == 1:
                x[r, ids[:2]] = np.nan
            elif kind == 2:
                x[r] = -np.inf
            else:
                x[r, ids[:2]] = np.inf
        return {"logits": x}

    def greedy_tokens(self, feeds: Any) -> np.ndarray:
        self.step_logits = self.run(feeds)["logits"]
        return np.argmax(self.step_logits, axis=1)


def test_ties_and_nan_match_the_host_sampler(artifact):
    """On tied, NaN and all -inf rows the device path picks what ``Sampler`` picks (numpy's argmax: the lowest
    id, NaN first), so the streams agree token for token."""
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    requests = [(p, greedy) for p in _prompts(6, 4)]
    outs = []
    for on in (False, True):
        engine = LLMEngine(artifact, EngineArgs(num_blocks=256, device_sampling=on))
        engine.executor = TiedLogits(engine.vocab_size)
        outs.append(run_requests(engine, requests))
        assert engine.num_device_sampled_steps == (engine.executor.step if on else 0)
    assert outs[0] == outs[1]
    tokens = {t for o in outs[1] for c in o for t in c[0]}
    assert 0 in tokens  # the all -inf rows


def test_switch_env_and_executors_without_the_method(artifact, monkeypatch):
    monkeypatch.setenv("INGOT_DEVICE_SAMPLING", "0")
    assert not device_sampling_default() and not LLMEngine(artifact, num_blocks=16).device_sampling
    assert LLMEngine(artifact, num_blocks=16, device_sampling=True).device_sampling  # the argument wins
    monkeypatch.setenv("INGOT_DEVICE_SAMPLING", "1")
    assert device_sampling_default()
    monkeypatch.delenv("INGOT_DEVICE_SAMPLING")
    assert device_sampling_default()

    class LogitsOnly:  # like bench/bench_engine_step.py's ReplayExecutor: no greedy_tokens
        def __init__(self, executor: Any) -> None:
            self.executor = executor

        def run(self, feeds: Any, check: bool = True) -> dict[str, np.ndarray]:
            return self.executor.run(feeds, check=check)

    engine = LLMEngine(artifact, num_blocks=64)
    engine.executor = LogitsOnly(engine.executor)
    out = engine.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 4 and engine.num_device_sampled_steps == 0


def test_cpu_executor_greedy_tokens_is_the_logits_argmax(artifact):
    from ingot.runtime.artifact import load_graph
    from ingot.runtime.paged import PagedModel

    model = PagedModel(load_graph(artifact)[0], num_blocks=8)
    a, b = model.add_sequence(), model.add_sequence()
    feeds = model.step_inputs([(a, [5, 9, 11, 40]), (b, [7, 8])])
    logits = model._executor.run(feeds)["logits"]
    tokens = model._executor.greedy_tokens(feeds)
    assert tokens.dtype == np.int64 and np.array_equal(tokens, np.argmax(logits, axis=1))


# -- the CUDA executor's decode staging (host side, no GPU) -----------------------------------------


class HostStaging:
    """``cuda_driver.PinnedBuffer``'s interface over ordinary memory."""

    def __init__(self, nbytes: int) -> None:
        self.array = np.full(nbytes, 0xAB, np.uint8)  # stale bytes everywhere

    def view(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.array[offset : offset + n].view(dtype).reshape(shape)


def _padded(feeds: dict[str, np.ndarray], bucket: int, cap: int) -> dict[str, np.ndarray]:
    """A decode step padded to ``bucket`` rows (docs/SERVING_FORM.md; the CUDA executor's padding rows)."""
    s = len(feeds["seq_lens"])
    bt = np.zeros((bucket, cap), np.int32)
    bt[:s, : feeds["block_tables"].shape[1]] = feeds["block_tables"]
    pad = bucket - s
    return {"input_ids": np.r_[feeds["input_ids"], np.zeros(pad, np.int64)],
            "positions": np.r_[feeds["positions"], np.zeros(pad, np.int64)],
            "slot_mapping": np.r_[feeds["slot_mapping"], np.full(pad, -1, np.int64)],
            "seq_lens": np.r_[feeds["seq_lens"], np.ones(pad, np.int32)].astype(np.int32),
            "query_start_loc": np.arange(bucket + 1, dtype=np.int32),
            "logits_indices": np.arange(bucket, dtype=np.int64), "block_tables": bt}


def test_cuda_decode_staging_writes_the_padded_step(tmp_path):
    """``CudaExecutor._stage_decode`` writes each decode step, padded to its bucket, straight into the pinned
    staging copy: byte for byte the padded inputs at the memory plan's offsets, whatever was staged before
    (a wider step, another bucket, an eager step)."""
    import ingot
    from ingot.runtime.artifact import load_graph
    from ingot.runtime.cuda_backend import CudaExecutor
    from tests.runtime.test_cuda_backend import FIXTURES

    path = ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target="h200", out=tmp_path / "t.ingot", mode="llm")
    graph, manifest = load_graph(path)
    plan = manifest["cuda"]["memory_plan"]
    ex = CudaExecutor.__new__(CudaExecutor)  # the host-side state _stage_decode reads, no device
    ex.buffers, ex.num_blocks = plan["buffers"], 64
    ex.bounds = {k: int(v) for k, v in plan["bindings"].items()}
    ex.inputs = [v for v in graph.inputs if v.name not in plan["kv_cache"]["inputs"]]
    ex.staging = HostStaging(int(plan["regions"]["io"]))
    ex._staged, ex._staged_bucket, ex._step_staging = {}, [None], [ex.staging]
    cap = ex.bounds["max_blocks"]
    rng = np.random.default_rng(0)
    for s, width, bucket in ((3, 5, 4), (2, 2, 4), (7, 9, 8), (1, 1, 1), (4, 3, 4), (4, 4, 4)):
        if (s, width) == (4, 4):
            ex._staged_bucket[0] = None  # what an eager step's staging does
            ex.staging.array[:] = 0xCD
        feeds = {"input_ids": rng.integers(0, 256, s), "positions": rng.integers(0, 100, s),
                 "slot_mapping": rng.integers(0, 1000, s), "seq_lens": rng.integers(1, 100, s).astype(np.int32),
                 "block_tables": rng.integers(0, 64, (s, width)).astype(np.int32),
                 "query_start_loc": np.arange(s + 1, dtype=np.int32), "logits_indices": np.arange(s)}
        end = ex._stage_decode(feeds, bucket)
        want = _padded(feeds, bucket, cap)
        ends = []
        for v in ex.inputs:
            off = int(ex.buffers[v.name]["offset"])
            a = want[v.name].astype(v.type.dtype.np)
            got = ex.staging.array[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
            assert np.array_equal(got, a), f"{v.name}, {s} rows in bucket {bucket}"
            ends.append(off + a.nbytes)
        assert end == max(ends)
