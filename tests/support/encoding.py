"""Watching tiktoken: which texts a test made it encode."""

from __future__ import annotations

from typing import Any

import pytest
import tiktoken


def encoded_texts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text tiktoken encodes from now on in this test, in order (the list grows)."""
    encoded: list[str] = []
    original = tiktoken.Encoding.encode

    def counting(self: tiktoken.Encoding, text: str, **kwargs: Any) -> list[int]:
        encoded.append(text)
        return original(self, text, **kwargs)

    monkeypatch.setattr(tiktoken.Encoding, "encode", counting)
    return encoded
