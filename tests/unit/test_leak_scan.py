"""The end-of-suite scans (tests/support/fixtures.py) find what they look for."""

from __future__ import annotations

import logging

import pytest

from tests.support.fixtures import find_logged_contents, find_secrets

KEY = "sk-test-Ab3_x-Yz09QwErTyUiOpAsDf"


@pytest.mark.parametrize("start", [0, 3, len(KEY) - 8])
def test_any_eight_characters_of_a_key_are_found(start: int) -> None:
    piece = KEY[start : start + 8]
    for blob in [piece, f"before {piece} after", f"x{piece}y".encode(), f'{{"k":"{piece}"}}']:
        assert piece in find_secrets([blob], [KEY]), blob


def test_seven_characters_or_none_are_not_found() -> None:
    blobs: list[bytes | str] = [KEY[:7], f"{KEY[:7]} {KEY[7:14]}", "no key here", b""]
    assert find_secrets(blobs, [KEY]) == []
    assert find_secrets([KEY], []) == []


def test_a_content_is_found_where_it_starts_anywhere_in_a_record() -> None:
    content = "my passport number is X1234567"
    records = [
        (logging.ERROR, content),
        (logging.WARNING, f"x{content}"),
        (logging.INFO, f"my passport number is {content[:-1]}"),  # a prefix only
        (logging.DEBUG, content),
    ]
    assert find_logged_contents(records, {content, "  " + content}) == [content, content]
