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

Speed: with a HF ``tokenizers.Tokenizer`` (or ``ingot.runtime.tokenizer.Tokenizer``, which wraps
one) the window lives on the Rust side in a ``tokenizers.decoders.DecodeStream``, which runs this
same algorithm: one Python->Rust call per token instead of two ``decode`` calls that each convert
the window. The Python offsets mirror it. Where the Python path's state is not one
``DecodeStream`` can start from (a prefix text ending in U+FFFD, e.g. a prompt context that ends
inside a character) or where it refuses a step (``InvalidPrefix``: the window's new text does not
start with its old text, e.g. an invalid byte-fallback run), the Python path runs the step and
hands the window back to a new ``DecodeStream`` after its next emission.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

try:
    from tokenizers import Tokenizer as _HFTokenizer
    from tokenizers.decoders import DecodeStream
except ImportError:  # without it only the Python path (any object with ``decode``)
    _HFTokenizer = DecodeStream = None

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
        self._prefix_text: str | None = self._decode(context)  # None while a DecodeStream holds the window
        self._n_context = len(context)
        hf = getattr(tokenizer, "_tok", tokenizer)  # ingot's Tokenizer wraps a HF one
        self._hf = hf if DecodeStream is not None and isinstance(hf, _HFTokenizer) else None
        self._stream: Any = None
        self._text = ""  # decoded output text so far (cut at a stop string once found)
        self._emitted = 0  # characters of _text handed out
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None  # the stop string that matched
        self._resume_stream()

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
        if self.finish_reason is not None:
            return ""
        ids = self._ids
        if isinstance(token_ids, int):
            new: int | list[int] = int(token_ids)
            ids.append(new)
        else:
            new = [int(t) for t in token_ids]
            ids.extend(new)
        if self._stream is not None:
            try:
                delta = self._stream.step(self._hf, new)
            except Exception:  # InvalidPrefix: this step on the Python path
                self._stream = None
                self._prefix_text = self._decode(ids[self._prefix_offset:self._read_offset])
            else:
                if delta is None:  # nothing new (held back)
                    return ""
                self._prefix_offset, self._read_offset = self._read_offset, len(ids)
                if not self.stop:  # nothing held back: the delta streams as it is
                    self._text += delta
                    self._emitted = len(self._text)
                    return delta
                self._append(delta)
                return self._release(final=self.finish_reason is not None)
        new_text = self._decode(ids[self._prefix_offset:])
        if len(new_text) > len(self._prefix_text) and not new_text.endswith(_REPLACEMENT):
            self._append(new_text[len(self._prefix_text):])
            self._prefix_offset, self._read_offset = self._read_offset, len(ids)
            self._prefix_text = self._decode(ids[self._prefix_offset:self._read_offset])
            self._resume_stream()
        return self._release(final=self.finish_reason is not None)

    def finish(self) -> str:
        """The sequence has ended (EOS, length, abort): returns the text still held back."""
        if not self.finished:
            if self._stream is not None:
                self._stream = None
                self._prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
            new_text = self._decode(self._ids[self._prefix_offset:])
            if len(new_text) > len(self._prefix_text):
                self._append(new_text[len(self._prefix_text):])
            self._prefix_offset = self._read_offset = len(self._ids)
            self._prefix_text = ""
        return self._release(final=True)

    def _resume_stream(self) -> None:
        """Hand the window to a ``DecodeStream`` (HF tokenizer, the Python path's state after an emission)."""
        if self._hf is not None and not self._prefix_text.endswith(_REPLACEMENT):
            self._stream = DecodeStream(ids=self._ids[self._prefix_offset:],
                                        skip_special_tokens=self.skip_special_tokens)
            self._prefix_text = None

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

