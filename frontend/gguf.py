"""GGUF frontend: a llama.cpp checkpoint (Llama family) -> the serving-form graph.

Reads the file with the ``gguf`` package (memory-mapped). Each tensor becomes a lazy f32 ``Tensor``
that ``gguf.quants.dequantize`` expands on first use (F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1, the
K-quants, ...). GGUF names map to Hugging Face names, and llama.cpp's Q/K row permutation is undone
so the graph is the one ``hf.py`` builds for the same model: llama.cpp's converter reorders each
head's q_proj/k_proj rows from rotate-half order ``(2, D/2)`` to interleaved order ``(D/2, 2)``
for ggml's pairwise RoPE; reading them back as ``(D/2, 2)`` and swapping restores HF's order.

The tokenizer lives in the metadata (``tokenizer.ggml.*``); ``write_tokenizer`` turns a byte-level
BPE vocabulary (``tokenizer.ggml.model == "gpt2"``) into HF ``tokenizer.json`` and
``tokenizer_config.json`` (with the chat template) for the ``tokenizers`` library.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..ir.graph import Graph
from .llama_builder import CheckpointError, LlamaConfig, Tensor, build_llama

ARCHITECTURES = ("llama",)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _reader(path: Path):
    """The file's ``gguf.GGUFReader`` (memory-mapped). A compile reads a file twice (``import_gguf``, then
    ``write_tokenizer``) and opening one parses all its metadata (1.8 s for the bundled SmolLM2 on the CI machine):
    the last two readers are kept, keyed by the file's resolved path, size and modification time, so a changed file
    is read again."""
    try:
        st = path.stat()
    except OSError as e:
        raise CheckpointError(f"{path}: not a readable GGUF file: {e}") from None
    return _open_reader(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _open_reader(path: str, size: int, mtime_ns: int):
    try:
        import gguf
    except ModuleNotFoundError:  # pragma: no cover - a base dependency
        raise CheckpointError("reading GGUF needs the 'gguf' package: pip install gguf") from None
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable GGUF file: {e}") from None


def _metadata(reader) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        try:
            out[key] = field.contents()
        except Exception:  # noqa: BLE001 - a field the package cannot decode is not one we need
            continue
    return out


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn
    .q_proj.weight``); None for tensors the builder does not use."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m:
        layer = _LAYER_NAMES.get(m.group(2))
        return None if layer is None else f"model.layers.{m.group(1)}.{layer}.{m.group(3)}"
    m = re.fullmatch(r"(\w+)\.(weight|bias)", gguf_name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    return None


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute``: per head, rows (D/2, 2) -> (2, D/2)."""
    rows = w.shape[0]
    return np.ascontiguousarray(
        w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _dequantizer(t, unpermute_heads: int = 0):
    import gguf

    def load() -> np.ndarray:
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise CheckpointError(f"GGUF tensor {t.name}: quantization {t.tensor_type.name} is not supported") from None
        w = np.asarray(w, np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
        return _unpermute(w, unpermute_heads) if unpermute_heads else w

    return load


def _get(md: dict[str, Any], key: str, default: Any = None) -> Any:
    return md.get(key, default)


def gguf_config(md: dict[str, Any], path: Path | str = "") -> LlamaConfig:
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    p = f"{arch}."
    try:
        hidden = int(md[p + "embedding_length"])
        heads = int(md[p + "attention.head_count"])
        layers = int(md[p + "block_count"])
        ffn = int(md[p + "feed_forward_length"])
    except KeyError as e:
        raise CheckpointError(f"{path}: GGUF metadata lacks {e.args[0]!r}") from None
    kv_heads = int(_get(md, p + "attention.head_count_kv", heads))
    head_dim = int(_get(md, p + "attention.key_length", hidden // heads))
    rot = int(_get(md, p + "rope.dimension_count", head_dim))
    if rot != head_dim:
        raise CheckpointError(f"{path}: partial RoPE ({rot} of {head_dim} dims) is not supported for llama GGUFs")
    scaling = None
    kind = _get(md, p + "rope.scaling.type")
    if kind in ("linear", "yarn"):
        scaling = {"rope_type": kind, "factor": float(md[p + "rope.scaling.factor"])}
        if p + "rope.scaling.original_context_length" in md:
            scaling["original_max_position_embeddings"] = int(md[p + "rope.scaling.original_context_length"])
    elif kind not in (None, "none"):
        raise CheckpointError(f"{path}: GGUF rope scaling {kind!r} is not supported")
    tokens = md.get("tokenizer.ggml.tokens")
    vocab = int(_get(md, p + "vocab_size", len(tokens) if tokens is not None else 0))
    eos = [md[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in md]
    bos = md.get("tokenizer.ggml.bos_token_id")
    return LlamaConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(_get(md, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_get(md, p + "rope.freq_base", 10000.0)),
        max_position_embeddings=int(_get(md, p + "context_length", 4096)),
        rope_scaling=scaling,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=tuple(dict.fromkeys(int(e) for e in eos)),
    )


def import_gguf(path: str | os.PathLike, name: str | None = None) -> Graph:
    """Build the serving-form graph of a Llama-family GGUF file; weights dequantize lazily."""
    path = Path(path)
    reader = _reader(path)
    md = _metadata(reader)
    cfg = gguf_config(md, path)
    tensors: dict[str, Tensor] = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            raise CheckpointError(f"{path}: per-frequency RoPE factors (rope_freqs) are not supported yet")
        hf = hf_name(t.name)
        if hf is None:
            continue
        heads = 0
        if hf.endswith("self_attn.q_proj.weight") or hf.endswith("self_attn.q_proj.bias"):
            heads = cfg.num_heads
        elif hf.endswith("self_attn.k_proj.weight") or hf.endswith("self_attn.k_proj.bias"):
            heads = cfg.num_kv_heads
        shape = tuple(int(d) for d in reversed(t.shape))
        tensors[hf] = Tensor(shape, _dequantizer(t, heads), f"{path.name}:{t.name}")
    graph = build_llama(cfg, tensors, name or _graph_name(path))
    graph.meta["source_format"] = "gguf"
    graph.meta["gguf"] = {"file_type": md.get("general.file_type"), "name": md.get("general.name")}
    return graph


def _graph_name(path: Path) -> str:
    return re.sub(r"\W", "_", path.stem) or "main"


# -- tokenizer -----------------------------------------------------------------------------------

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: llama.cpp's ``tokenizer.ggml.pre`` names -> the split regex its vocabulary was trained with
#: (None: GPT-2's, which the ByteLevel pre-tokenizer applies itself).
_PRE_SPLITS: dict[str, str | None] = {
    "default": None, "gpt2": None, "smollm": None, "gpt-2": None,
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
#: pre-tokenizers that also split every digit on its own (llama.cpp's ``\p{N}`` pass first)
_DIGITS_FIRST = {"smollm"}


def build_tokenizer(md: dict[str, Any]):
    """A ``tokenizers.Tokenizer`` from GGUF metadata (byte-level BPE vocabularies only)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = md.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise CheckpointError(f"GGUF tokenizer model {kind!r} is not supported (supported: gpt2 byte-level BPE)")
    tokens: list[str] = list(md["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])]
    types = list(md.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    pre = md.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_SPLITS:
        raise CheckpointError(f"GGUF pre-tokenizer {pre!r} is not supported (known: {', '.join(_PRE_SPLITS)})")
    split = _PRE_SPLITS[pre]
    steps = []
    if pre in _DIGITS_FIRST:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if split is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    # CONTROL (3) tokens are special; USER_DEFINED (4) ones are matched whole but decoded as text
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4])
    bos = md.get("tokenizer.ggml.bos_token_id")
    if md.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        b = tokens[int(bos)]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{b}:0 $A:0", pair=f"{b}:0 $A:0 {b}:1 $B:1", special_tokens=[(b, int(bos))]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def tokenizer_config(md: dict[str, Any]) -> dict[str, Any]:
    """HF ``tokenizer_config.json`` contents: special tokens, BOS/EOS flags, chat template."""
    tokens = md["tokenizer.ggml.tokens"]

    def tok(key: str) -> str | None:
        i = md.get(f"tokenizer.ggml.{key}")
        return None if i is None else tokens[int(i)]

    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(md.get("tokenizer.ggml.add_eos_token", False)),
        "bos_token": tok("bos_token_id"),
        "eos_token": tok("eos_token_id"),
        "unk_token": tok("unknown_token_id"),
        "pad_token": tok("padding_token_id"),
        "clean_up_tokenization_spaces": False,
    }
    arch = md.get("general.architecture")
    if arch and f"{arch}.context_length" in md:
        cfg["model_max_length"] = int(md[f"{arch}.context_length"])
    if "tokenizer.chat_template" in md:
        cfg["chat_template"] = md["tokenizer.chat_template"]
    return cfg


def write_tokenizer(path: str | os.PathLike, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for a GGUF file into ``out_dir``.

    Returns ``{file name: path}``; raises ``CheckpointError`` for vocabularies it cannot convert.
    """
    md = _metadata(_reader(Path(path)))
    if "tokenizer.ggml.tokens" not in md:
        raise CheckpointError(f"{path}: the GGUF file has no tokenizer")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"tokenizer.json": out_dir / "tokenizer.json", "tokenizer_config.json": out_dir / "tokenizer_config.json"}
    build_tokenizer(md).save(str(files["tokenizer.json"]))
    files["tokenizer_config.json"].write_text(json.dumps(tokenizer_config(md), indent=1, ensure_ascii=False) + "\n")
    return files
