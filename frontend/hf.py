"""Hugging Face frontend: a checkpoint directory (Llama family) -> the serving-form graph.

The directory holds ``config.json``, the weights as ``model.safetensors`` or shards listed by
``model.safetensors.index.json``, and usually the tokenizer (``tokenizer.json``,
``tokenizer_config.json``, maybe ``chat_template.jinja``). Weights stay memory-mapped; each
tensor is read (and widened to f32) only when the graph's lazy weight is loaded.

Supported ``model_type``: ``llama``, ``mistral`` (sliding window), ``qwen2`` (q/k/v biases).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ..ir.graph import Graph
from ..runtime.safetensors_io import SafetensorsError, SafetensorsFile
from .llama_builder import CheckpointError, LlamaConfig, Tensor, build_llama

MODEL_TYPES = ("llama", "mistral", "qwen2")


def is_checkpoint_dir(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _ids(v: Any) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in v] if isinstance(v, list) else [int(v)]


def hf_config(directory: Path) -> LlamaConfig:
    """The builder's config from ``config.json`` (and ``generation_config.json`` for EOS ids)."""
    c = _read_json(directory / "config.json")
    if "text_config" in c and "hidden_size" not in c:
        c = {**c["text_config"], **{k: v for k, v in c.items() if k.endswith("token_id")}}
    model_type = c.get("model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(
            f"{directory}: model_type {model_type!r} is not supported (supported: {', '.join(MODEL_TYPES)})"
        )
    try:
        hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
        layers, ffn, vocab = int(c["num_hidden_layers"]), int(c["intermediate_size"]), int(c["vocab_size"])
    except KeyError as e:
        raise CheckpointError(f"{directory / 'config.json'}: missing {e.args[0]!r}") from None
    # transformers >= 5 writes rope_parameters; older configs rope_theta + rope_scaling
    rope = dict(c.get("rope_parameters") or {})
    theta = float(rope.get("rope_theta", c.get("rope_theta", 10000.0)))
    scaling = dict(c.get("rope_scaling") or {}) or {k: v for k, v in rope.items() if k != "rope_theta"} or None
    if scaling and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    window = c.get("sliding_window") if model_type == "mistral" or c.get("use_sliding_window") else None
    eos = _ids(c.get("eos_token_id"))
    gen = directory / "generation_config.json"
    if gen.is_file():
        eos = list(dict.fromkeys(eos + _ids(_read_json(gen).get("eos_token_id"))))
    return LlamaConfig(
        architecture=model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or hidden // heads),
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        max_position_embeddings=int(c.get("max_position_embeddings", 4096)),
        rope_scaling=scaling,
        partial_rotary_factor=float(c.get("partial_rotary_factor", 1.0)),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        sliding_window=int(window or 0),
        bos_token_id=None if c.get("bos_token_id") is None else int(c["bos_token_id"]),
        eos_token_ids=tuple(eos),
    )


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointError(f"{directory}: shards listed in {index.name} are missing: {missing}")
        return [directory / s for s in shards]
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(directory.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    return found


def _loader(f: SafetensorsFile, name: str):
    return lambda: np.asarray(f.get(name), dtype=np.float32)


def import_hf(directory: str | os.PathLike, name: str | None = None) -> Graph:
    """Build the serving-form graph of a Llama-family HF checkpoint directory; weights stay lazy."""
    directory = Path(directory)
    if not is_checkpoint_dir(directory):
        raise CheckpointError(f"{directory}: not a Hugging Face checkpoint directory (no config.json)")
    cfg = hf_config(directory)
    tensors: dict[str, Tensor] = {}
    for path in _weight_files(directory):
        try:
            f = SafetensorsFile(path)
            for key in f.keys():
                _, shape = f.info(key)
                tensors[key] = Tensor(tuple(shape), _loader(f, key), f"{path.name}:{key}")
        except SafetensorsError as e:
            raise CheckpointError(str(e)) from None
    graph = build_llama(cfg, tensors, name or re.sub(r"\W", "_", directory.name) or "main")
    graph.meta["source_format"] = "hf"
    return graph


def write_tokenizer(directory: str | os.PathLike, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Copy the checkpoint's ``tokenizer.json`` and write its ``tokenizer_config.json`` (with the
    chat template folded in from ``chat_template.jinja`` where transformers >= 4.43 keeps it).

    Returns ``{file name: path}``; empty when the checkpoint has no ``tokenizer.json``.
    """
    src, out = Path(directory), Path(out_dir)
    if not (src / "tokenizer.json").is_file():
        return {}
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "tokenizer.json", out / "tokenizer.json")
    cfg = _read_json(src / "tokenizer_config.json") if (src / "tokenizer_config.json").is_file() else {}
    if "chat_template" not in cfg and (src / "chat_template.jinja").is_file():
        cfg["chat_template"] = (src / "chat_template.jinja").read_text()
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1, ensure_ascii=False) + "\n")
    return {"tokenizer.json": out / "tokenizer.json", "tokenizer_config.json": out / "tokenizer_config.json"}
