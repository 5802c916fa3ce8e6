"""A Llama-3.2-1B-shaped checkpoint with random weights, in Hugging Face form (nothing is downloaded).

    python bench/make_llama1b.py OUT_DIR [--layers 16] [--seed 0]

Writes ``OUT_DIR/config.json`` and ``OUT_DIR/model.safetensors`` (bf16, ~2.5 GB): hidden 2048, 16 layers,
32 attention heads, 8 KV heads, head_dim 64, intermediate 8192, vocab 128256, tied embeddings, llama3
rope scaling, as ``frontend/hf.py`` imports them. Weights are N(0, 1/fan_in) (embeddings N(0, 1), norms
around 1) so activations stay O(1); there is no tokenizer (the benchmarks feed token ids).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LLAMA_1B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
}


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    NH, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, H)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (NH * D, H), p + "self_attn.k_proj.weight": (KV * D, H),
            p + "self_attn.v_proj.weight": (KV * D, H), p + "self_attn.o_proj.weight": (H, NH * D),
            p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I),
        })
    return shapes


def make_checkpoint(out: Path, layers: int | None = None, seed: int = 0) -> Path:
    """Write the checkpoint (``layers`` overrides the depth, for quick runs); returns ``out``."""
    from ingot.ir.types import DType
    from ingot.runtime import safetensors_io

    cfg = dict(LLAMA_1B)
    if layers is not None:
        cfg["num_hidden_layers"] = int(layers)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shapes = tensor_shapes(cfg)

    def loader(name: str, shape: tuple[int, ...]):
        def load() -> np.ndarray:
            if len(shape) == 1:  # norm weights
                a = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
            elif name == "model.embed_tokens.weight":
                a = rng.standard_normal(shape, dtype=np.float32)
            else:
                a = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(shape[1]))
            return a.astype(ml_dtypes.bfloat16)

        return load

    entries = [(name, (DType.bf16, shape), loader(name, shape)) for name, shape in shapes.items()]
    safetensors_io.write(out / "model.safetensors", entries, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=None, help="override the 16 layers (quick runs)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.perf_counter()
    make_checkpoint(a.out, a.layers, a.seed)
    n = sum(int(np.prod(s)) for s in tensor_shapes({**LLAMA_1B, **({"num_hidden_layers": a.layers}
                                                                   if a.layers else {})}).values())
    print(json.dumps({"checkpoint": str(a.out), "parameters": n, "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
