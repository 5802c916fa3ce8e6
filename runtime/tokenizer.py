"""The tokenizer an artifact carries: HF ``tokenizer.json`` + ``tokenizer_config.json``.

Encoding and decoding go through the ``tokenizers`` library; the chat template (Jinja, from
``tokenizer_config.json``) renders in a sandboxed environment, as transformers renders it, so a
template can neither read files nor run code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class TokenizerError(ValueError):
    """The tokenizer files are missing or unusable."""


def _token_text(v: Any) -> str | None:
    # tokenizer_config.json spells a special token as a string or as an AddedToken dict
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


class Tokenizer:
    def __init__(self, directory: str | os.PathLike) -> None:
        from tokenizers import Tokenizer as _HFTokenizer

        d = Path(directory)
        if not (d / "tokenizer.json").is_file():
            raise TokenizerError(f"{d}: no tokenizer.json (the model was compiled without a tokenizer)")
        self._tok = _HFTokenizer.from_file(str(d / "tokenizer.json"))
        cfg_path = d / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.chat_template: str | None = self.config.get("chat_template")
        if isinstance(self.chat_template, list):  # named templates: take the default one
            named = {t.get("name"): t.get("template") for t in self.chat_template}
            self.chat_template = named.get("default")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` ([{"role": ..., "content": ...}])."""
        if not self.chat_template:
            raise TokenizerError("this model's tokenizer has no chat template")
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        specials = {k: _token_text(self.config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        return env.from_string(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **specials
        )

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of the chat-templated prompt (the template writes any BOS itself)."""
        return self.encode(self.apply_chat_template(messages), add_special_tokens=False)


class StreamDecoder:
    """Turns tokens arriving one by one into text pieces, holding back incomplete UTF-8."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._emitted = 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character split across tokens
            return ""
        piece, self._emitted = text[self._emitted :], len(text)
        return piece
