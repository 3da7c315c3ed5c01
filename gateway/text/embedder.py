"""Static word embeddings for recall, computed in-process with no network and no model
server: wordllama's ``l2_supercat`` token vectors, shipped inside the ``wordllama`` wheel.

A text's vector is the mean of its tokens' vectors (what wordllama itself computes), cut
to its first ``vectors.DIM`` components (the model is trained so that a prefix is itself
a usable embedding). About 10 µs for a short message on one core, its words tokenized
once (``by_pieces``): cheap enough to embed a turn's messages when they are recorded and a
question when it is asked.

Only the package's data files are read (its tokenizer and weights, found where
``compat/wordllama.py`` says they lie): importing ``wordllama`` itself would configure the
root logger and, if its files were missing, try to download them. Without the package or
its files the gateway still recalls, by words alone.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.compat import wordllama
from gateway.memory import vectors

log = logging.getLogger(__name__)

# Longer texts are embedded from their first part: a pasted document's vector is its
# topic, and the tokenizer's time stays bounded.
MAX_CHARS = 8000

# The tokenizer's word boundary: it writes a space as "▁" (and puts one before the text),
# then runs BPE over the whole text (~0.15 µs a character: 40 µs for a short message). No
# token of its vocabulary holds "▁" after another character, so no merge ever joins a
# piece "▁…" to what precedes it: a text's tokens are its pieces' (a run of "▁" and the
# characters up to the next), exactly, and each piece is tokenized once and remembered.
SPACE = "\u2581"
_PIECES = re.compile(SPACE + "+[^" + SPACE + "]*")
PIECES_KEPT = 1 << 16  # distinct pieces remembered (a word each: a few MB)
_LONGEST_KEPT = 64  # a longer piece (a URL, a run of symbols) is tokenized each time


def by_pieces(tokenizer: Any) -> bool:
    """Whether the tokenizer's tokens of a text are its pieces' (see ``_PIECES``): only
    "▁" put before the text and in place of each space, no pre-tokenizer, and no token
    with "▁" after another character. (Checked, not assumed: another wordllama may ship
    another tokenizer, which is then run on whole texts.)"""
    shape = json.loads(tokenizer.to_str())
    normalizer = shape.get("normalizer") or {}
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else []
    expected = [
        {"type": "Prepend", "prepend": SPACE},
        {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
    ]
    if steps != expected or shape.get("pre_tokenizer") is not None:
        return False
    joined = re.compile("[^" + SPACE + "]" + SPACE)
    return not any(joined.search(token) for token in tokenizer.get_vocab())


class StaticEmbedder:
    """Text -> vector with wordllama's shipped token embeddings (thread-safe)."""

    name = "wordllama-l2_supercat-128"

    def __init__(self, tokenizer: Any, table: npt.NDArray[np.float32]) -> None:
        self._tokenizer = tokenizer
        self._table = table
        self._by_pieces = by_pieces(tokenizer)
        # Each piece's ids (thread-safe: one dict operation at a time under the GIL).
        self._pieces: dict[str, tuple[int, ...]] = {}

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

    def ids(self, text: str) -> list[int]:
        """The text's token ids, as the tokenizer gives them."""
        if not self._by_pieces:
            return list(self._tokenizer.encode(text, add_special_tokens=False).ids)
        found: list[int] = []
        if not text:
            return found
        known = self._pieces.get
        for piece in _PIECES.findall(SPACE + text.replace(" ", SPACE)):
            ids = known(piece)
            found += ids if ids is not None else self._tokenized(piece)
        return found

    def _tokenized(self, piece: str) -> tuple[int, ...]:
        ids = tuple(token.id for token in self._tokenizer.model.tokenize(piece))
        if len(piece) <= _LONGEST_KEPT:
            if len(self._pieces) >= PIECES_KEPT:
                self._pieces.clear()  # (rare: the words of a conversation repeat)
            self._pieces[piece] = ids
        return ids

    def vector(self, text: str) -> npt.NDArray[np.float32]:
        """The mean of the text's token vectors (zeros for a text with no tokens)."""
        ids = self.ids(text[:MAX_CHARS])
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
