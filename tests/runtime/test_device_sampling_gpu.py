"""Device sampling on the CUDA executor (``-m gpu``; skipped without a GPU): tiny random Llamas whose LM head
rows come in identical pairs (token ``i`` and ``i + vocab/2``), so every argmax is a tie the kernel must break
like numpy (the lower id). For the same steps (eager prefill, decode graphs of several buckets) the device ids
equal the host argmax of the CUDA logits; the engine's tokens are the same with device sampling on and off
(``INGOT_DEVICE_SAMPLING=0``), greedy alone and beside sampled / logprobs requests.

    python -m pytest tests/runtime/test_device_sampling_gpu.py -m gpu -v -s
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ingot
from ingot.runtime.engine import EngineArgs, LLMEngine
from ingot.runtime.sampling import SamplingParams
from tests.frontend.dense_llama import TINY_CONFIG, random_weights, write_checkpoint
from tests.runtime.serving_models import run_requests

pytestmark = pytest.mark.gpu

#: the tiny models' vocabularies: the byte tokenizer's and Llama 3's (the kernel's 16-byte loads, 1024 threads)
VOCABS = (260, 128256)


def compile_tied(directory: Path, vocab: int, target: str) -> Path:
    """A random 2-layer Llama whose LM head rows ``vocab/2 ..`` repeat rows ``0 ..``, compiled for ``target``."""
    cfg = {**TINY_CONFIG, "vocab_size": vocab, "max_position_embeddings": 1024}
    w = random_weights(cfg, np.random.default_rng(vocab))
    half = vocab // 2
    w["lm_head.weight"][half : 2 * half] = w["lm_head.weight"][:half]
    ckpt = write_checkpoint(directory / "ckpt", cfg, w)
    return ingot.compile(ckpt, target=target, out=directory / "tied.ingot")


@pytest.fixture(scope="module", params=VOCABS, ids=[f"vocab{v}" for v in VOCABS])
def tied(request, gpu_target, tmp_path_factory) -> tuple[Path, int]:
    return compile_tied(tmp_path_factory.mktemp(f"tied-{request.param}"), request.param, gpu_target), request.param


def _prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, int(rng.integers(3, 40))).tolist() for _ in range(n)]


def test_device_argmax_equals_host_argmax_of_the_cuda_logits(tied):
    """Each step runs twice with the same inputs (the KV writes are the same values): once for the logits,
    once for the device ids; the ids are numpy's argmax of those logits, ties included."""
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    path, vocab = tied
    ex = CudaExecutor.from_artifact(path, num_blocks=64, device_argmax=True)
    assert ex.argmax is not None, "the argmax kernel did not load (no NVRTC/nvcc on this machine?)"
    model = CudaPagedModel(ex)
    prompts = _prompts(5, vocab)
    seqs = [model.add_sequence() for _ in prompts]
    batch = list(zip(seqs, prompts))
    ties = steps = 0
    try:
        for step in range(12):
            # prefill (eager), then decodes of 5, 3 and 1 sequences (graph buckets 8, 4 and 1)
            live = batch if step < 5 else batch[:3] if step < 9 else batch[:1]
            feeds = model.step_inputs(live)
            logits = ex.logits(feeds)
            ids = ex.greedy_tokens(feeds)
            assert ids.dtype == np.int64 and ids.shape == (len(live),)
            want = np.argmax(logits, axis=1)
            assert np.array_equal(ids, want), f"step {step}: device {ids}, host argmax {want}"
            ties += int(sum((row == row.max()).sum() > 1 for row in logits))
            steps += len(live)
            for s, tokens in live:
                model.sequences[s].num_tokens += len(tokens)
            batch = [(s, [int(t)]) for (s, _), t in zip(live, ids)] + batch[len(live) :]
        print(f"vocab {vocab}: {ties} of {steps} rows were exact ties; stats {ex.stats}")
        assert ties > 0, "the twin LM head rows gave no exact tie: the test did not exercise the tie rule"
        assert ex.stats["graph_steps"] > 0 and ex.stats["eager_steps"] > 0 and ex.stats["argmax_steps"] == 12
    finally:
        ex.close()


def _generate(path: Path, requests: list[tuple[list[int], SamplingParams]], device_sampling: bool,
              ) -> tuple[list, LLMEngine]:
    engine = LLMEngine(path, EngineArgs(num_blocks=128, device_sampling=device_sampling), device="cuda")
    return run_requests(engine, requests), engine


@pytest.mark.parametrize("mix", ["greedy", "mixed"])
def test_engine_tokens_unchanged_by_device_sampling(tied, mix, monkeypatch):
    path, vocab = tied
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    requests = [(p, greedy) for p in _prompts(6, vocab, 1)]
    if mix == "mixed":
        requests += [(_prompts(1, vocab, 2)[0], SamplingParams(temperature=0.9, seed=5, max_tokens=5, ignore_eos=True)),
                     (_prompts(1, vocab, 3)[0], SamplingParams(temperature=0.0, logprobs=3, max_tokens=4,
                                                               ignore_eos=True))]
    monkeypatch.setenv("INGOT_DEVICE_SAMPLING", "0")
    host, off = _generate(path, requests, None)  # type: ignore[arg-type]  # None: the environment says off
    assert not off.device_sampling and off.executor.argmax is None and off.num_device_sampled_steps == 0
    off.close()
    monkeypatch.delenv("INGOT_DEVICE_SAMPLING")
    device, on = _generate(path, requests, True)
    stats = dict(on.executor.stats)
    steps = on.num_device_sampled_steps
    on.close()
    assert device == host
    assert steps > 0 and stats["argmax_steps"] == steps and stats["graph_steps"] > 0, stats
