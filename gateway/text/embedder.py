"""Static word embeddings for recall, computed in-process with no network and no model
server: wordllama's ``l2_supercat`` token vectors, shipped inside the ``wordllama`` wheel.

A text's vector is the mean of its tokens' vectors (what wordllama itself computes), cut
to its first ``vectors.DIM`` components (the model is trained so that a prefix is itself
a usable embedding). About 20 µs for a short message on one core: cheap enough to embed a
turn's messages when they are recorded and a question when it is asked.

Only the package's data files are read (its tokenizer and weights, found where
``compat/wordllama.py`` says they lie): importing ``wordllama`` itself would configure the
root logger and, if its files were missing, try to download them. Without the package or
its files the gateway still recalls, by words alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gateway.compat import wordllama
from gateway.memory import vectors

log = logging.getLogger(__name__)

# Longer texts are embedded from their first part: a pasted document's vector is its
# topic, and the tokenizer's time stays bounded.
MAX_CHARS = 8000


class StaticEmbedder:
    """Text -> vector with wordllama's shipped token embeddings (thread-safe)."""

    name = "wordllama-l2_supercat-128"

    def __init__(self, tokenizer: object, table: npt.NDArray[np.float32]) -> None:
        self._tokenizer = tokenizer
        self._table = table

    @classmethod
    def load(cls) -> StaticEmbedder | None:
        """The embedder, or None (logged) when the package or its files are missing."""
        directory = wordllama.package_dir()
        if directory is None:
            log.warning("wordllama is not installed: recall matches words only")
            return None
        try:
            from safetensors import safe_open
            from tokenizers import Tokenizer

            files = wordllama.files(directory)
            tokenizer = Tokenizer.from_file(str(files.tokenizer))
            with safe_open(str(files.weights), framework="np") as weights:
                table = weights.get_tensor(wordllama.TABLE)
        except (OSError, ImportError, ValueError, KeyError, RuntimeError) as error:
            # RuntimeError: a wordllama outside the tested versions (compat/wordllama.py).
            log.warning("wordllama's files unreadable (%s): recall matches words only", error)
            return None
        return cls(tokenizer, np.ascontiguousarray(table[:, : vectors.DIM], dtype=np.float32))

    def vector(self, text: str) -> npt.NDArray[np.float32]:
        """The mean of the text's token vectors (zeros for a text with no tokens)."""
        ids = self._tokenizer.encode(  # type: ignore[attr-defined]
            text[:MAX_CHARS], add_special_tokens=False
        ).ids
        if not ids:
            return np.zeros(vectors.DIM, dtype=np.float32)
        found: npt.NDArray[np.float32] = self._table[ids].mean(axis=0)
        return found

    def encode(self, texts: Sequence[str]) -> list[bytes]:
        """The stored form of each text's vector (see ``vectors.encode``)."""
        return [vectors.encode(self.vector(text)) for text in texts]

    def query(self, text: str) -> npt.NDArray[np.float32] | None:
        """A question's unit vector (None when it has no words the model knows)."""
        return vectors.unit(self.vector(text))
