"""Incremental detokenization and stop strings: token ids in, text deltas out.

Decoding token by token is wrong for most tokenizers: a character may span several byte-level
or byte-fallback tokens, and SentencePiece-style decoders drop the leading space of the first
token they see. So each step decodes a small window of ids twice::

    ids:   ... | prefix_offset ........ read_offset ........ len(ids)
                 [ tokens already emitted ][ tokens not emitted yet ]
    prefix_text = decode(ids[prefix_offset:read_offset])
    new_text    = decode(ids[prefix_offset:])          -> delta = new_text[len(prefix_text):]

and emits the delta only when ``new_text`` does not end in U+FFFD (an incomplete UTF-8
character: its bytes are held back until the character completes). After an emission the
window slides: ``prefix_offset = read_offset, read_offset = len(ids)``. A window therefore
always starts at a character boundary, and for byte-level tokenizers the deltas concatenate to
``decode(all_ids)``. ``finish()`` flushes text still held back (a sequence that ends inside a
character decodes to U+FFFD, as ``decode`` would give it).

With ``prompt_token_ids`` the window starts in the prompt's last tokens, so the first output
token gets its leading space as it would after the prompt (OpenAI semantics: the completion is
``decode(prompt + output)`` minus the prompt's text).

Stop strings: the text is searched after each delta, from ``max_stop_len - 1`` characters before
it, so a stop string split across tokens is found. The output is cut before the stop string (it
is not included) and the detokenizer reports ``finish_reason == "stop"``. While stop strings are
set, the last ``max_stop_len - 1`` characters are held back, so no streamed text is ever
withdrawn; ``finish()`` releases them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

# prompt tokens decoded as context before the first output token (vLLM uses the same number)
PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    """A ``tokenizers.Tokenizer`` or ``ingot.runtime.tokenizer.Tokenizer``: both decode this way."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """One sequence's text: push token ids as they arrive, read back the safe-to-stream deltas.

    Invariant: ``output_text`` is exactly the concatenation of the strings returned by
    :meth:`push` and :meth:`finish`.
    """

    def __init__(self, tokenizer: Decoder, *, prompt_token_ids: Sequence[int] = (), skip_special_tokens: bool = True,
                 stop: Iterable[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        context = [int(t) for t in prompt_token_ids][-PROMPT_CONTEXT_TOKENS:]
        self._ids: list[int] = context  # window context + every output token
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._prefix_text = self._decode(context)
        self._n_context = len(context)
        self._text = ""  # decoded output text so far (cut at a stop string once found)
        self._emitted = 0  # characters of _text handed out
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None  # the stop string that matched

    @classmethod
    def from_params(cls, tokenizer: Decoder, params: object, prompt_token_ids: Sequence[int] = ()
                    ) -> IncrementalDetokenizer:
        """From a :class:`~ingot.runtime.sampling.SamplingParams` (its ``stop``, ``skip_special_tokens``)."""
        return cls(tokenizer, prompt_token_ids=prompt_token_ids, stop=getattr(params, "stop", ()),
                   skip_special_tokens=getattr(params, "skip_special_tokens", True))

    @property
    def token_ids(self) -> list[int]:
        """The output token ids pushed so far."""
        return self._ids[self._n_context:]

    @property
    def output_text(self) -> str:
        """The text streamed so far (what :meth:`push` and :meth:`finish` have returned)."""
        return self._text[: self._emitted]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""

    def push(self, token_ids: int | Iterable[int]) -> str:
        """Add output token(s); returns the new text that is safe to stream (maybe "").

        After a stop string is found, the rest is ignored and "" returned: check :attr:`finished`.
        """
        if self.finished:
            return ""
        self._ids.extend([int(token_ids)] if isinstance(token_ids, int) else (int(t) for t in token_ids))
        new_text = self._decode(self._ids[self._prefix_offset:])
        if len(new_text) > len(self._prefix_text) and not new_text.endswith(_REPLACEMENT):
            self._append(new_text[len(self._prefix_text):])
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            self._prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        return self._release(final=self.finished)

    def finish(self) -> str:
        """The sequence has ended (EOS, length, abort): returns the text still held back."""
        if not self.finished:
            new_text = self._decode(self._ids[self._prefix_offset:])
            if len(new_text) > len(self._prefix_text):
                self._append(new_text[len(self._prefix_text):])
            self._prefix_offset = self._read_offset = len(self._ids)
            self._prefix_text = ""
        return self._release(final=True)

    def _append(self, delta: str) -> None:
        start = max(0, len(self._text) - self._hold)
        self._text += delta
        if not self.stop:
            return
        hits = [(i, s) for s in self.stop if (i := self._text.find(s, start)) >= 0]
        if hits:
            i, s = min(hits)
            self._text = self._text[:i]
            self.finish_reason, self.stop_reason = "stop", s

    def _release(self, *, final: bool) -> str:
        end = len(self._text) if final else max(self._emitted, len(self._text) - self._hold)
        delta, self._emitted = self._text[self._emitted:end], end
        return delta
