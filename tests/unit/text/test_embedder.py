"""The in-process word vectors recall uses: read from the installed wheel, no network."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.compat import wordllama
from gateway.memory import vectors
from gateway.text.embedder import StaticEmbedder, by_pieces


def test_loads_from_the_installed_package_and_places_meanings() -> None:
    embedder = StaticEmbedder.load()
    assert embedder is not None
    dog, puppy, tax = (embedder.query(t) for t in ("my dog", "a puppy", "tax return forms"))
    assert dog is not None and puppy is not None and tax is not None
    assert dog.shape == (vectors.DIM,)
    assert float(dog @ puppy) > float(dog @ tax)
    assert embedder.query("") is None  # no words: no direction
    stored = embedder.encode(["my dog", ""])
    assert len(stored[0]) == vectors.DIM and stored[1] == b""


def test_without_wordllama_s_files_recall_matches_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(wordllama, "package_dir", lambda: tmp_path)
    assert StaticEmbedder.load() is None
    assert "has no tokenizers/l2_supercat_tokenizer_config.json" in caplog.text
    monkeypatch.setattr(wordllama, "package_dir", lambda: None)
    assert StaticEmbedder.load() is None
    assert "wordllama is not installed" in caplog.text


def test_an_untested_wordllama_version_falls_back_to_words(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The vectors are optional: a wordllama outside the tested range must not stop the
    # gateway from starting (its version is checked when its files are read).
    monkeypatch.setattr(wordllama, "VERSION", "0.5.0")
    assert StaticEmbedder.load() is None
    assert "tested with wordllama >= 0.3, < 0.5" in caplog.text


# What meets at a word's edges: spaces (one, several, leading, trailing), "▁" written by
# the user, line breaks and tabs, punctuation, digits, other scripts, and characters the
# vocabulary lacks (byte fallback).
SAID = st.text(alphabet="ab Zq 9 .,!?'-/\t\n\u2581\u00e9\u4e2d\U0001f600", max_size=40)


@functools.cache
def shipped() -> StaticEmbedder:
    embedder = StaticEmbedder.load()
    assert embedder is not None
    return embedder


@settings(max_examples=400, deadline=None)
@given(texts=st.lists(SAID, min_size=1, max_size=5))
def test_a_text_s_tokens_are_its_pieces_tokens_exactly(texts: list[str]) -> None:
    """Issue 33: each word tokenized once and remembered, not each text whole (the
    tokenizer's BPE over a whole text took 40 µs for a short message): the same ids."""
    embedder = shipped()
    assert embedder._by_pieces
    for text in texts:  # (the pieces the earlier texts left remembered, and new ones)
        whole = embedder._tokenizer.encode(text, add_special_tokens=False).ids
        assert embedder.ids(text) == whole


def test_a_tokenizer_whose_tokens_cross_a_space_is_run_on_whole_texts() -> None:
    from tokenizers import Tokenizer, models, normalizers

    vocab = {"▁a": 0, "▁b": 1, "a▁b": 2, "a": 3, "b": 4, "▁": 5, "a▁": 6}
    merges = [("a", "▁"), ("a▁", "b"), ("▁", "a"), ("▁", "b")]
    crossing = Tokenizer(models.BPE(vocab, merges))
    crossing.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    assert not by_pieces(crossing)
    table = np.eye(len(vocab), vectors.DIM, dtype=np.float32)
    embedder = StaticEmbedder(crossing, table)
    assert embedder.ids("a b") == crossing.encode("a b").ids
