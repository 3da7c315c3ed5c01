"""Token counting works offline, whatever the model name."""

from __future__ import annotations

import hashlib
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest
import tiktoken.registry
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.compat.tiktoken import cached_locally
from gateway.memory.model import LINE_ENCODING, Message
from gateway.text import tokens
from gateway.text.tokens import (
    LINE_MODEL,
    SHIPPED_ENCODING,
    TOKENS_PER_MESSAGE,
    TOKENS_PER_REPLY,
    TokenCounter,
    encoding_for_model,
)
from tests.support.encoding import encoded_texts

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No network, an empty tiktoken cache, and nothing already loaded in memory."""
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)

    def no_network(self: socket.socket, *args: Any, **kwargs: Any) -> None:
        raise OSError("network access in a unit test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    return cache


def test_network_is_really_off() -> None:
    with pytest.raises(OSError, match="network access"), socket.socket() as sock:
        sock.connect(("127.0.0.1", 9))


@pytest.mark.parametrize(
    "model", ["gpt-4o", "gpt-4o-mini", "gpt-4", "gpt-3.5-turbo", "llama-3.1-70b", "", "my/model:q4"]
)
def test_any_model_counts_offline(model: str) -> None:
    encoding = encoding_for_model(model)
    assert encoding.name == SHIPPED_ENCODING
    counter = TokenCounter()
    assert counter.count_text("Hello, world!", model) == 4
    assert counter.count_text("", model) == 0


def test_known_counts() -> None:
    counter = TokenCounter("unknown-model")
    assert counter.count_text("hello") == 1
    assert counter.count_text("The quick brown fox jumps over the lazy dog.") == 10
    # Special-token text is counted as text, not refused.
    assert counter.count_text("<|endoftext|>") > 1


def test_empty_cache_dir_variable_means_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tiktoken reads TIKTOKEN_CACHE_DIR="" as "do not cache" and would download, even when
    # the default cache directory holds the file: the gateway must not count on it.
    default = tmp_path / "tmp"
    (default / "data-gym-cache").mkdir(parents=True)
    (default / "data-gym-cache" / hashlib.sha1(O200K_URL.encode()).hexdigest()).write_bytes(b"x")
    monkeypatch.setattr(tempfile, "tempdir", str(default))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert not cached_locally("o200k_base")
    assert encoding_for_model("gpt-4o").name == SHIPPED_ENCODING
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    assert cached_locally("o200k_base")  # the default directory, now really used


def test_cached_locally(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not cached_locally("o200k_base")
    (offline / hashlib.sha1(O200K_URL.encode()).hexdigest()).write_bytes(b"x")
    assert cached_locally("o200k_base")
    assert not cached_locally("cl100k_base")
    assert not cached_locally("r50k_base")  # not one we know how to look for
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(offline))
    assert cached_locally("o200k_base")
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", "")
    assert not cached_locally("o200k_base")


def test_count_message() -> None:
    counter = TokenCounter()
    hello = counter.count_text("Hello, world!")
    assert counter.count_message(Message(role="user", content="Hello, world!")) == (
        TOKENS_PER_MESSAGE + hello
    )
    named = Message(role="user", content="Hello, world!", name="bob")
    assert counter.count_message(named) == TOKENS_PER_MESSAGE + hello + 1
    parts = Message(role="user", content=[{"type": "text", "text": "Hello, world!"}])
    assert counter.count_message(parts) == TOKENS_PER_MESSAGE + hello


def test_count_tool_calls() -> None:
    counter = TokenCounter()
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    message = Message(role="assistant", content=None, tool_calls=(call,))
    expected = (
        TOKENS_PER_MESSAGE
        + counter.count_text("get_weather")
        + counter.count_text('{"city":"Paris"}')
    )
    assert counter.count_message(message) == expected
    assert expected > TOKENS_PER_MESSAGE + 5


def test_count_prompt_uses_stored_tokens() -> None:
    counter = TokenCounter()
    stored = Message(role="user", content="Hello, world!", tokens=1000)
    fresh = Message(role="user", content="Hello, world!")
    fresh_count = counter.count_message(fresh)
    assert counter.count_prompt([stored]) == TOKENS_PER_REPLY + 1000
    assert counter.count_prompt([fresh]) == TOKENS_PER_REPLY + fresh_count
    assert counter.count_prompt([stored, fresh]) == TOKENS_PER_REPLY + 1000 + fresh_count
    assert counter.count_prompt([]) == TOKENS_PER_REPLY


def test_default_model_is_used_when_none_given() -> None:
    counter = TokenCounter(default_model="some-local-model")
    assert counter.count_text("Hello, world!") == counter.count_text("Hello, world!", "gpt-4o")


# Characters that meet at line joints in tiktoken's pieces: letters, digits, punctuation
# (which may absorb the line breaks after it), spaces, "/", other scripts and line breaks.
JOINT_ALPHABET = "ab Z9 .,;:!?'\"-_/()[]\t\r\n\n\u00e9\u4e2d\U0001f600\u2028\x0b"


@settings(max_examples=600, deadline=None)
@given(st.lists(st.text(alphabet=JOINT_ALPHABET, max_size=40), max_size=12).map("\n".join))
def test_a_text_counted_line_by_line_has_its_exact_count(text: str) -> None:
    counter = TokenCounter()
    exact = len(encoding_for_model("gpt-4o").encode(text, disallowed_special=()))
    assert counter.count_text(text, "gpt-4o") == exact


def test_a_memory_block_counted_line_by_line_has_its_exact_count() -> None:
    block = (
        "Memory of this conversation (excerpts may be out of date):\n\n"
        "Summaries of earlier messages:\n"
        "- Messages 1-15: The user planned a trip to Lisbon.\n"
        "  Message 7 (User): my seat is 14C.\n\n"
        "Pinned:\n- Allergic to penicillin.\n/etc/hosts was mentioned.\r\n\r\nEnd."
    )
    counter = TokenCounter()
    exact = len(encoding_for_model("gpt-4o").encode(block, disallowed_special=()))
    assert counter.count_text(block, "gpt-4o") == exact


def test_a_model_s_count_is_one_object_that_counts_as_count_text() -> None:
    """What assemble remembers its tier items by: one object per model."""
    counter = TokenCounter()
    count = counter.for_model("gpt-4o")
    assert counter.for_model("gpt-4o") is count
    assert counter.for_model("gpt-4o-mini") is not count
    text = "The trip to Lisbon\nis on 12 May."
    assert count(text) == counter.count_text(text, "gpt-4o") > 0


def test_long_texts_count_as_they_did(  # (counted from a buffer past _BUFFER_CHARS)
) -> None:
    encoding = encoding_for_model("gpt-4o")
    long = "The quick brown fox; 42 jumps\nover it. " * 3000
    assert len(long) > tokens._BUFFER_CHARS
    assert TokenCounter().count_text(long) == len(encoding.encode(long, disallowed_special=()))
    lone = "a\ud800b" * 30_000  # not UTF-8: counted the way tiktoken's encode counts it
    assert tokens.count_with(encoding, lone) == len(encoding.encode(lone, disallowed_special=()))


def test_each_counter_remembers_its_own_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text is encoded once per counter (one per app): a new counter starts empty."""
    encoded = encoded_texts(monkeypatch)
    counter = TokenCounter()
    assert counter.count_text("a summary\nof two lines") == counter.count_text(
        "a summary\nof two lines"
    )
    assert encoded == ["a summary\n", "of two lines"]
    TokenCounter().count_text("a summary\nof two lines")
    assert encoded == ["a summary\n", "of two lines"] * 2


def test_uncounted_chars_are_those_counting_would_read() -> None:
    from gateway.text.tokens import text_chars, uncounted_chars

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "abcd"}}
    parts = [{"type": "text", "text": "xyz"}, {"type": "image_url", "image_url": {"url": "u"}}]
    assert text_chars(Message("user", "hello")) == 5
    assert text_chars(Message("user", parts)) == 3
    assert text_chars(Message("assistant", None, tool_calls=(call,))) == 4
    counted = Message("user", "x" * 1000, tokens=300)
    assert uncounted_chars([Message("user", "hello"), counted]) == 5


def test_stored_line_counts_are_made_in_the_encoding_they_are_read_as() -> None:
    """``Message.line_tokens`` is read as ``LINE_ENCODING``'s count (``block.recalled_line``):
    the counter that makes it counts in that encoding, the one the gateway ships."""
    count = TokenCounter().for_model(LINE_MODEL)
    assert count.encoding == LINE_ENCODING == SHIPPED_ENCODING
    assert count("user: hello there\n") == len(
        encoding_for_model("gpt-4").encode("user: hello there\n")
    )
