"""HF checkpoint frontend: the serving form, driven through prefill and decode by the paged CPU
driver, against a dense numpy Llama forward (and transformers where torch is installed)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

import ingot
from ingot.frontend.hf import import_hf
from ingot.frontend.llama_builder import CheckpointError
from ingot.ir.verify import verify
from ingot.runtime.artifact import load_graph
from ingot.runtime.paged import PagedModel
from tests.frontend.dense_llama import TINY_CONFIG, assert_logits_close, dense_logits, random_weights, write_checkpoint
from tests.helpers import assert_text_roundtrip, rng

PROMPT_LEN, DECODE_STEPS = 11, 8

VARIANTS = {
    "llama": ({}, False, 1),
    "tied-sharded": ({"tie_word_embeddings": True}, False, 3),
    "qwen2-bias": ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}, True, 1),
}
#: checked against transformers only (the dense reference has plain RoPE and full attention)
HF_ONLY_VARIANTS = {
    "llama3-rope": ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}, False, 1),
    "linear-rope": ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, False, 1),
    "yarn-rope": ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}},
                  False, 1),
    "mistral-window": ({"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 6},
                       False, 1),
}


def _checkpoint(tmp_path, variant: str):
    overrides, bias, shards = {**VARIANTS, **HF_ONLY_VARIANTS}[variant]
    cfg = {**TINY_CONFIG, **overrides}
    weights = random_weights(cfg, rng(), bias=bias)
    return cfg, weights, write_checkpoint(tmp_path / variant, cfg, weights, shards)


def _drive(graph, ids: list[int], chunk: int | None) -> list[np.ndarray]:
    """Prefill ids[:PROMPT_LEN] (in chunks), then decode the rest one token per step; returns the
    logits after the prefill and after each decode step."""
    model = PagedModel(graph, num_blocks=4)
    seq = model.add_sequence()
    prompt = ids[:PROMPT_LEN]
    chunk = chunk or PROMPT_LEN
    for start in range(0, PROMPT_LEN, chunk):
        logits = model.step([(seq, prompt[start : start + chunk])])
    out = [logits[0]]
    for t in ids[PROMPT_LEN:]:
        out.append(model.step([(seq, [t])])[0])
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("chunk", [None, 4])
def test_prefill_and_decode_match_dense_forward(tmp_path, variant, chunk):
    cfg, weights, ckpt = _checkpoint(tmp_path, variant)
    graph = import_hf(ckpt)
    verify(graph)
    ids = [int(i) for i in rng().integers(0, cfg["vocab_size"], PROMPT_LEN + DECODE_STEPS)]
    steps = _drive(graph, ids, chunk)
    dense = dense_logits(cfg, weights, ids)
    assert len(steps) == DECODE_STEPS + 1
    for i, logits in enumerate(steps):
        pos = PROMPT_LEN - 1 + i
        assert_logits_close(logits, dense[pos], 1e-4, f"{variant} step {i} (position {pos})")


def test_graph_is_the_serving_form(tmp_path):
    cfg, _, ckpt = _checkpoint(tmp_path, "tied-sharded")
    graph = import_hf(ckpt)
    assert [v.name for v in graph.inputs[:7]] == [
        "input_ids", "positions", "slot_mapping", "block_tables", "seq_lens", "query_start_loc", "logits_indices"
    ]
    assert [v.name for v in graph.inputs[7:]] == [f"kv_cache.{i}" for i in range(cfg["num_hidden_layers"])]
    assert graph.output_names == ["logits"]
    L = cfg["num_hidden_layers"]
    assert graph.op_histogram() == {"linear": 4 * L + 1, "rms_norm": 2 * L + 1, "rope": 2 * L, "split": 2 * L,
                                    "paged_attention": L, "swiglu": L, "embedding": 1, "gather": 1}
    linear_weights = [n.inputs[1] for n in graph.nodes if n.op.name == "linear"]
    embed = graph.nodes[0].inputs[0]
    assert linear_weights[-1] is embed, "tied embeddings share one weight"
    spec = graph.meta["kv_cache"]
    assert spec["num_kv_heads"] == 2 and spec["head_dim"] == 8 and spec["block_size"] == 16
    assert spec["bytes_per_token"] == L * 2 * 2 * 8 * 4
    assert graph.meta["llm"]["vocab_size"] == cfg["vocab_size"] and graph.meta["llm"]["eos_token_ids"] == [2]
    assert_text_roundtrip(graph)


def test_weights_are_lazy(tmp_path):
    _, _, ckpt = _checkpoint(tmp_path, "llama")
    graph = import_hf(ckpt)
    assert all(w._array is None for n, w in graph.weights.items() if not n.startswith("rope."))


def test_compile_to_llm_artifact(tmp_path):
    cfg, weights, ckpt = _checkpoint(tmp_path, "llama")
    path = ingot.compile(ckpt, out=tmp_path / "tiny.ingot")
    graph, manifest = load_graph(path)
    assert manifest["mode"] == "llm"
    assert manifest["kv_cache"]["inputs"] == [f"kv_cache.{i}" for i in range(cfg["num_hidden_layers"])]
    assert manifest["llm"]["architecture"] == "llama"
    assert "tokenizer.json" not in manifest["files"]
    ids = [int(i) for i in rng().integers(0, cfg["vocab_size"], 5)]
    model = PagedModel(graph, num_blocks=1)
    logits = model.step([(model.add_sequence(), ids)])[0]
    assert_logits_close(logits, dense_logits(cfg, weights, ids)[-1], 1e-4)
    with pytest.raises(ingot.api.CompileError, match="serving form"):
        ingot.compile(ckpt, out=tmp_path / "g.ingot", mode="graph")


def test_tokenizer_files_are_copied(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    _, _, ckpt = _checkpoint(tmp_path, "llama")
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(ckpt / "tokenizer.json"))
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"eos_token": "world"}))
    (ckpt / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    path = ingot.compile(ckpt, out=tmp_path / "tiny.ingot")
    from ingot.runtime.tokenizer import Tokenizer as IngotTokenizer

    t = IngotTokenizer(path)
    assert t.encode("hello world") == [1, 2]
    assert t.encode_chat([{"role": "user", "content": "world hello"}]) == [2, 1]


def test_unsupported_model_type(tmp_path):
    cfg = {**TINY_CONFIG, "model_type": "gpt2"}
    write_checkpoint(tmp_path / "c", cfg, random_weights(TINY_CONFIG, rng()))
    with pytest.raises(CheckpointError, match="model_type 'gpt2' is not supported"):
        import_hf(tmp_path / "c")


def test_missing_tensor_is_named(tmp_path):
    weights = random_weights(TINY_CONFIG, rng())
    del weights["model.layers.1.mlp.up_proj.weight"]
    write_checkpoint(tmp_path / "c", TINY_CONFIG, weights)
    with pytest.raises(CheckpointError, match="model.layers.1.mlp.up_proj.weight"):
        import_hf(tmp_path / "c")


_HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))


@pytest.mark.skipif(not _HAS_TORCH, reason="needs torch and transformers (the 'fixtures' extra)")
@pytest.mark.parametrize("variant", list(VARIANTS) + list(HF_ONLY_VARIANTS))
def test_matches_transformers(tmp_path, variant):
    import torch
    from transformers import AutoModelForCausalLM

    cfg, _, ckpt = _checkpoint(tmp_path, variant)
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager").eval()
    ids = [int(i) for i in rng().integers(0, cfg["vocab_size"], PROMPT_LEN + DECODE_STEPS)]
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0].numpy()
    steps = _drive(import_hf(ckpt), ids, chunk=None)
    for i, logits in enumerate(steps):
        pos = PROMPT_LEN - 1 + i
        assert_logits_close(logits, expected[pos], 1e-4, f"{variant} step {i}")
