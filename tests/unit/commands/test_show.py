"""The small formats of inspect and sessions."""

from __future__ import annotations

import pytest

from gateway.commands.show import bar, ranges
from gateway.ui.present import ago, human_bytes, message_text


def test_ranges() -> None:
    assert ranges([9, 5, 6, 7, 11, 12]) == "5-7, 9, 11-12"
    assert ranges([]) == ""
    # A receipt's recalled keys, as stored: strings, some of another session.
    assert ranges(["12", "11", "s-other#5", "14"]) == "11-12, 14, s-other#5"


@pytest.mark.parametrize(
    ("size", "shown"),
    [(None, "—"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 * 2**20, "5.0 MiB")],
)
def test_human_bytes(size: int | None, shown: str) -> None:
    assert human_bytes(size) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(3, "just now"), (42, "42 s ago"), (190, "3 min ago"), (7300, "2 h ago"),
     (86400, "1 day ago"), (3 * 86400 + 5, "3 days ago")],
)  # fmt: skip
def test_ago(seconds: float, shown: str) -> None:
    assert ago(seconds) == shown


def test_bar_and_message_text() -> None:
    assert bar(15, 30, width=10) == "█████·····"
    assert bar(99, 10, width=4) == "████"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert message_text({"role": "assistant", "content": None, "tool_calls": [call]}) == "→ f({})"
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]
    assert message_text({"role": "user", "content": parts}) == "a [image_url]"
    assert message_text({"role": "tool", "tool_call_id": "c1", "content": "ok"}) == "[c1] ok"
