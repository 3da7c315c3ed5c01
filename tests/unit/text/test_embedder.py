"""The in-process word vectors recall uses: read from the installed wheel, no network."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.compat import wordllama
from gateway.memory import vectors
from gateway.text.embedder import StaticEmbedder


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
