"""Decode steps on the CUDA executor (``-m gpu``; skipped without a GPU): ``greedy_tokens_steps`` runs ``K`` decode
steps as one CUDA graph with the argmax ids fed on the device; its ids equal ``greedy_tokens`` run step by step on
the same inputs and those of a graph per step (``INGOT_STEPS_GRAPH=0``), and the CUDA engine's token streams with
``K = 8`` equal ``K = 1``'s. The host-side logic: the CPU tests in test_decode_steps.py (a fake driver) and
tests/codegen/test_step_inputs.py (the step kernel on the host).

    python -m pytest tests/runtime/test_decode_steps_gpu.py -m gpu -v -s
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ingot
from ingot.runtime.engine import EngineArgs, LLMEngine
from ingot.runtime.sampling import SamplingParams
from tests.frontend.dense_llama import write_checkpoint
from tests.runtime.serving_models import TINY, VOCAB, run_requests, write_byte_tokenizer

pytestmark = pytest.mark.gpu
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def artifact(gpu_target, tmp_path_factory) -> Path:
    """The serving tests' tiny random Llama with the byte tokenizer (stop strings), compiled for this GPU."""
    from tests.frontend.dense_llama import random_weights

    directory = tmp_path_factory.mktemp("decode-steps-gpu")
    ckpt = write_checkpoint(directory / "ckpt", TINY, random_weights(TINY, np.random.default_rng(0)))
    write_byte_tokenizer(ckpt)
    return ingot.compile(ckpt, target=gpu_target, out=directory / "model.ingot")


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB - 1, int(rng.integers(3, 60))).tolist() for _ in range(n)]


@pytest.mark.parametrize("rows", [1, 3, 6])
def test_steps_equal_greedy_tokens_step_by_step(artifact, rows):
    """``K = 6`` decode steps of ``rows`` sequences in one call, then the same steps one at a time with the ids the
    call returned as inputs (their K/V writes repeat the same values): the same ids, step for step."""
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    ex = CudaExecutor.from_artifact(artifact, num_blocks=64, device_argmax=True)
    assert ex.argmax is not None, "the argmax kernel did not load (no NVRTC/nvcc on this machine?)"
    try:
        model = CudaPagedModel(ex)
        seqs = [model.add_sequence() for _ in range(rows)]
        prefill = list(zip(seqs, _prompts(rows, rows)))
        first = ex.greedy_tokens(model.step_inputs(prefill))
        for s, toks in prefill:
            model.sequences[s].num_tokens += len(toks)
        k = 6
        steps = []
        for j in range(k):
            steps.append(model.step_inputs([(s, [int(first[i]) if j == 0 else 0]) for i, s in enumerate(seqs)]))
            for s in seqs:
                model.sequences[s].num_tokens += 1
        graphs_before = ex.stats["graph_steps"]
        ids = ex.greedy_tokens_steps(steps)
        assert ids.shape == (k, rows) and ids.dtype == np.int64
        assert ex.stats["multi_steps"] == 1 and ex.stats["graph_steps"] == graphs_before + k, ex.stats
        prev = first
        for j in range(k):
            again = ex.greedy_tokens({**steps[j], "input_ids": np.asarray(prev, np.int64)})
            assert again.tolist() == ids[j].tolist(), f"step {j}: one call {ids[j]}, step by step {again}"
            prev = ids[j]
    finally:
        ex.close()


def _next_steps(model, seqs: list[int], first: np.ndarray, k: int) -> list[dict[str, np.ndarray]]:
    """The next ``k`` decode steps' inputs of ``seqs`` (step 0's ids ``first``, the others placeholders); the
    sequences' token counts advance by ``k``."""
    steps = []
    for j in range(k):
        steps.append(model.step_inputs([(s, [int(first[i]) if j == 0 else 0]) for i, s in enumerate(seqs)]))
        for s in seqs:
            model.sequences[s].num_tokens += 1
    return steps


@pytest.mark.parametrize("rows", [1, 3])
def test_one_graph_equals_a_graph_per_step_and_single_steps(artifact, rows, monkeypatch):
    """``K`` = 1, 3 and 8 decode steps of ``rows`` sequences (3: bucket 4, one padding row) as one CUDA graph, the
    same steps with ``INGOT_STEPS_GRAPH=0`` (the bucket's graph per step), and ``K`` single ``greedy_tokens`` steps
    fed the ids: the same ids (their K/V writes repeat the same values). Each ``K`` is called twice, the second time
    with the next ``K`` steps' inputs, which the cached (bucket, ``K``) graph replays: one capture per (bucket, ``K``),
    none of the per-step path's bucket graph beyond its one."""
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    ex = CudaExecutor.from_artifact(artifact, num_blocks=64, device_argmax=True)
    assert ex.argmax is not None, "the argmax kernel did not load (no NVRTC/nvcc on this machine?)"
    assert ex.step_kernel is not None, "the step kernel did not load"
    try:
        model = CudaPagedModel(ex)
        seqs = [model.add_sequence() for _ in range(rows)]
        prefill = list(zip(seqs, _prompts(rows, 10 + rows)))
        first = ex.greedy_tokens(model.step_inputs(prefill))
        for s, toks in prefill:
            model.sequences[s].num_tokens += len(toks)
        bucket = next(b for b in ex.buckets if b >= rows)
        for n, k in enumerate((1, 3, 8)):
            for call in range(2):
                steps = _next_steps(model, seqs, first, k)
                monkeypatch.setenv("INGOT_STEPS_GRAPH", "1")
                ids = ex.greedy_tokens_steps(steps)
                assert ids.shape == (k, rows) and ids.dtype == np.int64
                monkeypatch.setenv("INGOT_STEPS_GRAPH", "0")
                each = ex.greedy_tokens_steps(steps)
                assert each.tolist() == ids.tolist(), f"K={k} call {call}: one graph {ids}, a graph per step {each}"
                prev = first
                for j in range(k):
                    again = ex.greedy_tokens({**steps[j], "input_ids": np.asarray(prev, np.int64)})
                    assert again.tolist() == ids[j].tolist(), f"K={k} call {call} step {j}: {ids[j]} vs {again}"
                    prev = ids[j]
                first = ids[-1]
            assert sorted(ex.steps_graphs) == [(bucket, kk, 0) for kk in (1, 3, 8)[: n + 1]], ex.stats
            assert ex.stats["steps_graphs"] == n + 1 and ex.stats["captures"] == 1, ex.stats
        assert ex.stats["multi_steps"] == 2 * 2 * 3, ex.stats
    finally:
        ex.close()


def _run(artifact: Path, k: int, requests: list, eos: tuple[int, ...] | None = None,
         overlap: bool = False) -> tuple[list, dict, bool]:
    engine = LLMEngine(artifact, EngineArgs(num_blocks=256, decode_steps=k, device_sampling=True,
                                            decode_overlap=overlap), device="cuda")
    if eos is not None:
        engine.eos_token_ids = eos
    try:
        out = run_requests(engine, requests)
        kv = engine.scheduler.kv
        return out, dict(engine.executor.stats), kv.num_free_blocks == kv.num_blocks
    finally:
        engine.close()


def _early_stops(prompts: list[list[int]], free: list, max_tokens: int, stop_token_at: int,
                 eos_at: int) -> tuple[list, tuple[int, ...]]:
    """Eight requests of ``max_tokens`` greedy tokens, three of them stopping early, the stops picked from ``free``
    (``run_requests``' result for the same prompts without stops) so that they fire: request 5 at an eos id (its
    token ``eos_at``), 6 at a stop token id (its token ``stop_token_at``), 7 at a stop string from its text. The
    five others keep the batch in bucket 8 to the end. Returns the requests and the eos ids for the engine."""
    toks = [c[0][0] for c in free]
    text = free[7][0][2]
    stop = next(text[i : i + 2] for i in range(5, len(text) - 2) if text[i : i + 2] not in text[: i + 1])

    def g(**kw) -> SamplingParams:
        return SamplingParams(temperature=0.0, **{"max_tokens": max_tokens, "ignore_eos": True, **kw})

    requests = [(p, g()) for p in prompts[:5]]
    requests += [(prompts[5], g(ignore_eos=False)), (prompts[6], g(stop_token_ids=[toks[6][stop_token_at]])),
                 (prompts[7], g(stop=[stop]))]
    return requests, (toks[5][eos_at],)


def test_engine_streams_equal_single_steps(artifact):
    """Eight greedy requests (one prefill step, then decode steps in bucket 8) with ``K = 1`` and ``K = 8``. Same
    lengths: every model step has the same rows (``K`` is cut where they end), so the streams are equal bit for
    bit. Then three of them stop early (eos, a stop token id, a stop string, picked from the first run's tokens):
    they end inside the ``K`` steps, while five rows keep the batch in bucket 8 (rows are computed independently
    within a bucket, so the rows that go on computing after their stop in the ``K = 8`` run change nothing)."""
    prompts = _prompts(8, 0)
    same = SamplingParams(temperature=0.0, max_tokens=37, ignore_eos=True)
    one, one_stats, free1 = _run(artifact, 1, [(p, same) for p in prompts])
    eight, stats, free8 = _run(artifact, 8, [(p, same) for p in prompts])
    print("K=1", one_stats, "\nK=8", stats)
    assert eight == one and free1 and free8
    assert stats["multi_steps"] > 0 and one_stats["multi_steps"] == 0
    assert stats["argmax_steps"] == one_stats["argmax_steps"]
    requests, eos = _early_stops(prompts, one, 37, stop_token_at=9, eos_at=13)
    one, _, free1 = _run(artifact, 1, requests, eos)
    eight, stats, free8 = _run(artifact, 8, requests, eos)
    assert [c[0][3] for c in one[5:]] == ["stop"] * 3
    assert stats["multi_steps"] > 0 and free1 and free8
    for i, (a, b) in enumerate(zip(one, eight)):
        assert a == b, f"request {i}: K=1 {a[0][0]} ({a[0][3]}), K=8 {b[0][0]} ({b[0][3]})"


@pytest.mark.parametrize("path", ["graph_each", "one_graph"])
@pytest.mark.parametrize("k", [1, 8])
def test_engine_overlap_streams_equal(artifact, k, path, monkeypatch):
    """The engine's overlap (runtime/engine.py, "Overlap": the next plan queued on the GPU before the last one's ids
    are read, its step 0 fed the last ids on the device, two submissions' staging in flight): with three requests
    stopping early (eos, a stop token id, a stop string), the streams equal the engine's without overlap, and every
    block comes back. ``one_graph``: ``INGOT_STEPS_GRAPH=1``, a graph of the ``K`` steps per parity."""
    monkeypatch.setenv("INGOT_STEPS_GRAPH", "1" if path == "one_graph" else "0")
    prompts = _prompts(8, 3)
    plain = SamplingParams(temperature=0.0, max_tokens=41, ignore_eos=True)
    first, _, _ = _run(artifact, 1, [(p, plain) for p in prompts])
    # the five rows going on to the end keep every step in bucket 8 (rows are computed independently within a
    # bucket): the rows stopping early compute one more plan with overlap, which changes no other row
    requests, eos = _early_stops(prompts, first, 41, stop_token_at=11, eos_at=19)
    want, _, free0 = _run(artifact, k, requests, eos)
    got, stats, free1 = _run(artifact, k, requests, eos, overlap=True)
    print(f"K={k} {path} overlap", stats)
    assert [c[0][3] for c in want[5:]] == ["stop"] * 3
    for i, (a, b) in enumerate(zip(want, got)):
        assert a == b, f"request {i}: no overlap {a[0][0]} ({a[0][3]}), overlap {b[0][0]} ({b[0][3]})"
    assert stats["chained_submits"] >= 2 and free0 and free1
    assert (stats["steps_graphs"] > 0) == (path == "one_graph"), stats
