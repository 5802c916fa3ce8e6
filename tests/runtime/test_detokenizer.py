"""Incremental detokenization against tokenizer.decode on whole sequences, multi-byte characters
split across tokens, leading spaces after a prompt, special tokens, stop strings."""

import json

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
from ingot.runtime.detokenizer import IncrementalDetokenizer  # noqa: E402
from ingot.runtime.sampling import SamplingParams  # noqa: E402

SENTENCES = [
    "The café serves crème brûlée and naïve résumés.",
    "日本語のテキストも少しあります。日本は島国です。",
    "Emoji time: 🎉🚀 and 👍🏽 plus a family 👨‍👩‍👧.",
    "Plain ASCII: the quick brown fox jumps over the lazy dog 12345.",
    "Ελληνικά και русский текст, ünïcödé everywhere ½ → ∞.",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>"]


@pytest.fixture(scope="module")
def byte_level():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 3, trainer)
    return tok


@pytest.fixture(scope="module")
def byte_fallback():
    """Llama-style: Metaspace pieces, <0xNN> byte tokens for characters outside the vocabulary."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    ascii_only = [s for s in SENTENCES if s.isascii()] + ["the cat sat on the mat", "résumé"]
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=SPECIALS, limit_alphabet=60)
    tok.train_from_iterator(ascii_only * 3, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(spec))


def stream(tok, ids, **kw):
    d = IncrementalDetokenizer(tok, **kw)
    deltas = [d.push(t) for t in ids]
    deltas.append(d.finish())
    return d, deltas


@pytest.mark.parametrize("fixture", ["byte_level", "byte_fallback"])
def test_encoded_text_streams_to_decode(fixture, request):
    tok = request.getfixturevalue(fixture)
    for text in SENTENCES:
        ids = tok.encode(text).ids
        d, deltas = stream(tok, ids)
        assert "".join(deltas) == tok.decode(ids) == d.output_text
        assert all("\ufffd" not in x for x in deltas)
    # something must actually be split across tokens for this test to mean anything
    assert any(tok.decode([i]).endswith("\ufffd") for i in tok.encode(SENTENCES[1]).ids)


def test_random_sequences_byte_level(byte_level):
    g = np.random.default_rng(0)
    vocab = byte_level.get_vocab_size()
    clean = 0
    for _ in range(300):
        ids = g.integers(0, vocab, g.integers(1, 16)).tolist()
        for skip in (True, False):
            d, deltas = stream(byte_level, ids, skip_special_tokens=skip)
            full = byte_level.decode(ids, skip_special_tokens=skip)
            assert "".join(deltas) == full
            if "\ufffd" not in full:
                clean += 1
                assert all("\ufffd" not in x for x in deltas)
    assert clean > 20


def test_random_sequences_byte_fallback(byte_fallback):
    # ByteFallback turns a whole run of byte tokens into U+FFFDs when the run is invalid, even the
    # valid bytes already streamed, so concatenation equality holds only for sequences that decode
    # cleanly; those are built here from random characters
    g = np.random.default_rng(1)
    alphabet = list("abc ét日本🎉👍 ") + ["the", " cat"]
    for _ in range(200):
        text = "".join(g.choice(alphabet, g.integers(1, 12)))
        ids = byte_fallback.encode(text).ids
        _, deltas = stream(byte_fallback, ids)
        assert "".join(deltas) == byte_fallback.decode(ids)
        assert all("\ufffd" not in x for x in deltas)
    # and random ids never put U+FFFD in a delta when the whole decodes without one
    vocab = byte_fallback.get_vocab_size()
    for _ in range(300):
        ids = g.integers(0, vocab, g.integers(1, 20)).tolist()
        if "\ufffd" not in byte_fallback.decode(ids):
            _, deltas = stream(byte_fallback, ids)
            assert all("\ufffd" not in x for x in deltas)


def test_multibyte_character_held_back(byte_fallback):
    ids = byte_fallback.encode("a🎉").ids
    d = IncrementalDetokenizer(byte_fallback)
    pieces = [d.push(t) for t in ids]
    assert pieces[-1].endswith("🎉") and all(p == "" for p in pieces[-4:-1])  # 4 byte tokens


def test_leading_space_after_prompt(byte_fallback):
    prompt = byte_fallback.encode("the cat").ids
    out = byte_fallback.encode("sat on the mat").ids
    _, deltas = stream(byte_fallback, out, prompt_token_ids=prompt)
    full = byte_fallback.decode(prompt + out)
    assert "".join(deltas) == full[len(byte_fallback.decode(prompt)):] == " sat on the mat"
    _, alone = stream(byte_fallback, out)
    assert "".join(alone) == "sat on the mat"  # no prompt: decode's leading-space rule applies


def test_special_tokens(byte_level):
    eot = byte_level.token_to_id("<|endoftext|>")
    ids = byte_level.encode("the café").ids + [eot]
    assert "".join(stream(byte_level, ids)[1]) == "the café"
    assert "".join(stream(byte_level, ids, skip_special_tokens=False)[1]) == "the café<|endoftext|>"


@pytest.mark.parametrize("fixture", ["byte_level", "byte_fallback"])
def test_stop_string_across_tokens(fixture, request):
    tok = request.getfixturevalue(fixture)
    text = "The café serves crème brûlée and more"
    ids = tok.encode(text).ids
    for stop in ("brûlée", "e c", "é", "serves crème", "more"):
        d = IncrementalDetokenizer.from_params(tok, SamplingParams(stop=[stop, "never"]))
        deltas = []
        for t in ids:
            deltas.append(d.push(t))
            if d.finished:
                break
        deltas.append(d.finish())
        full = tok.decode(ids)
        assert d.finish_reason == "stop" and d.stop_reason == stop
        assert "".join(deltas) == d.output_text == full[: full.index(stop)]
        assert d.push(ids[0]) == ""


def test_stop_string_never_streams_then_withdraws(byte_level):
    ids = byte_level.encode("the quick brown fox jumps").ids
    d = IncrementalDetokenizer(byte_level, stop=["brown fox", "xyz"])
    seen = ""
    for t in ids:
        seen += d.push(t)
        assert "brown fox".startswith(seen[len("the quick "):]) or not seen.startswith("the quick b")
        assert "brown" not in seen
    assert d.finished and seen + d.finish() == "the quick "


def test_earliest_stop_wins_and_no_stop(byte_level):
    ids = byte_level.encode("one two three").ids
    d, deltas = stream(byte_level, ids, stop=["three", "two"])
    assert "".join(deltas) == "one " and d.stop_reason == "two"
    d, deltas = stream(byte_level, ids, stop=["four"])
    assert "".join(deltas) == "one two three" and d.finish_reason is None and d.token_ids == ids


def test_ingot_tokenizer_wrapper_decodes_too(byte_level, tmp_path):
    from ingot.runtime.tokenizer import Tokenizer

    byte_level.save(str(tmp_path / "tokenizer.json"))
    wrapped = Tokenizer(tmp_path)
    ids = byte_level.encode(SENTENCES[2]).ids
    assert "".join(stream(wrapped, ids)[1]) == byte_level.decode(ids)


class _PythonOnly:
    """A decoder that is not a HF tokenizer: the detokenizer takes its Python path."""

    def __init__(self, tok):
        self.decode = tok.decode


@pytest.mark.parametrize("fixture", ["byte_level", "byte_fallback"])
def test_decode_stream_path_matches_python_path(fixture, request):
    # random ids (invalid UTF-8 runs, special tokens, DecodeStream's InvalidPrefix), prompt contexts that end
    # inside a character, chunked pushes and stop strings: both paths stream exactly the same deltas
    tok = request.getfixturevalue(fixture)
    g = np.random.default_rng(2)
    vocab = tok.get_vocab_size()
    for trial in range(400):
        ids = g.integers(0, vocab, g.integers(1, 24)).tolist()
        context = g.integers(0, vocab, g.integers(0, 8)).tolist()
        kw = {"prompt_token_ids": context, "skip_special_tokens": trial % 3 != 0}
        if trial % 4 == 0:
            full = tok.decode(ids)
            kw["stop"] = [full[len(full) // 2:][:2] or "x", "zz"]
        fast, slow = IncrementalDetokenizer(tok, **kw), IncrementalDetokenizer(_PythonOnly(tok), **kw)
        assert fast._hf is not None and slow._hf is None
        i = 0
        while i < len(ids):
            k = 1 if trial % 2 else int(g.integers(1, 4))
            chunk = ids[i] if k == 1 else ids[i:i + k]
            assert fast.push(chunk) == slow.push(chunk), (ids, context, kw)
            i += k
        assert fast.finish() == slow.finish()
        assert (fast.output_text, fast.finish_reason, fast.stop_reason, fast.token_ids) == \
            (slow.output_text, slow.finish_reason, slow.stop_reason, slow.token_ids)
