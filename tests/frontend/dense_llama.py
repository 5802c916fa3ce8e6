"""An independent reference for the checkpoint frontends: tiny random Llama checkpoints and a plain
dense numpy forward (float64, full causal attention over the whole sequence, no cache)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TINY_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
}


def random_weights(cfg: dict, rng: np.random.Generator, bias: bool = False) -> dict[str, np.ndarray]:
    """HF-named f32 weights for ``cfg`` (scaled so activations stay O(1)); q/k/v biases if ``bias``."""
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    NH, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or H // NH

    def mat(n: int, k: int) -> np.ndarray:
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((V, H)).astype(np.float32),
         "model.norm.weight": (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)}
    if not cfg.get("tie_word_embeddings"):
        w["lm_head.weight"] = mat(V, H)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
        w[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
        w[p + "self_attn.q_proj.weight"] = mat(NH * D, H)
        w[p + "self_attn.k_proj.weight"] = mat(KV * D, H)
        w[p + "self_attn.v_proj.weight"] = mat(KV * D, H)
        w[p + "self_attn.o_proj.weight"] = mat(H, NH * D)
        if bias:
            for n, rows in (("q", NH * D), ("k", KV * D), ("v", KV * D)):
                w[p + f"self_attn.{n}_proj.bias"] = (0.1 * rng.standard_normal(rows)).astype(np.float32)
        w[p + "mlp.gate_proj.weight"] = mat(I, H)
        w[p + "mlp.up_proj.weight"] = mat(I, H)
        w[p + "mlp.down_proj.weight"] = mat(H, I)
    return w


def write_checkpoint(directory: Path, cfg: dict, weights: dict[str, np.ndarray], shards: int = 1) -> Path:
    """``config.json`` + ``model.safetensors`` (or ``shards`` files and the index json)."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    names = sorted(weights)
    if shards == 1:
        save_file({n: weights[n] for n in names}, str(directory / "model.safetensors"))
        return directory
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        save_file({n: weights[n] for n in part}, str(directory / file))
        weight_map.update({n: file for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, theta: float, D: int) -> np.ndarray:
    """Rotate-half RoPE on [L, heads, D] at positions 0..L-1 (complex-free float64 form)."""
    L = x.shape[0]
    inv = 1.0 / theta ** (np.arange(0, D, 2) / D)
    ang = np.arange(L)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : D // 2], x[..., D // 2 :]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def dense_logits(cfg: dict, weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Logits [len(ids), vocab] of a plain causal Llama forward over the whole sequence."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    H, NH, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or H // NH
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    L = len(ids)
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    mask = np.tril(np.ones((L, L), bool))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)

        def proj(n: str, h: np.ndarray = h, p: str = p) -> np.ndarray:
            y = h @ w[p + f"self_attn.{n}_proj.weight"].T
            return y + w[p + f"self_attn.{n}_proj.bias"] if p + f"self_attn.{n}_proj.bias" in w else y

        q = _rope(proj("q").reshape(L, NH, D), theta, D)
        k = _rope(proj("k").reshape(L, KV, D), theta, D)
        v = proj("v").reshape(L, KV, D)
        k, v = np.repeat(k, NH // KV, axis=1), np.repeat(v, NH // KV, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(D)
        scores = np.where(mask, scores, -np.inf)
        p_att = np.exp(scores - scores.max(-1, keepdims=True))
        p_att /= p_att.sum(-1, keepdims=True)
        att = np.einsum("hqk,khd->qhd", p_att, v).reshape(L, NH * D)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = _rms(x, w["model.norm.weight"], eps)
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return x @ head.T


def assert_logits_close(got: np.ndarray, expected: np.ndarray, rel: float, what: str = "") -> None:
    """Every element within ``rel`` of the expected logits' largest magnitude (logits near zero
    make an element-wise relative test meaningless)."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    err = np.max(np.abs(got - expected)) / np.max(np.abs(expected))
    assert err <= rel, f"{what}: max |diff| / max |expected| = {err:.3g} > {rel}"
