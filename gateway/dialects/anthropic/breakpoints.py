"""Where the gateway marks Anthropic's prompt cache (pure).

Anthropic reuses a prompt prefix only up to a block marked ``cache_control`` (at most
four a request), reading a prefix an earlier request wrote at one of its own marks (it
looks back up to 20 blocks from each mark). A cache read is billed at a tenth of the
input price, a write at 1.25 times: a mark where nothing will be read again costs more.

The context's stable part (``memory/stable_layout.py``) is the client's ``system`` and
``tools``, memory's part of ``system``, and the window. The gateway marks:

1. the end of the window: the message before the last user message (which holds the
   recalled excerpts, changed every turn, and the new message). The next turn's window
   is this one's and two more messages, so its mark reads this one's prefix back;
2. the end of ``system``, memory included: read back when the window moves on but the
   memory did not change.

The client's marks in ``system`` and ``tools`` are kept and counted first; the gateway's
go in that order while the four last. Marks the client put on its messages are not
carried over (``blocks``): its messages are now memory's, and a mark after the recalled
excerpts would be a write never read.
"""

from __future__ import annotations

from typing import Any

MAX_BREAKPOINTS = 4  # Anthropic refuses a request with more
EPHEMERAL = {"type": "ephemeral"}


def count_marks(value: Any) -> int:
    """The ``cache_control`` marks in ``value`` (blocks, a list of them, or tools)."""
    if isinstance(value, dict):
        return int("cache_control" in value) + sum(count_marks(v) for v in value.values())
    if isinstance(value, list):
        return sum(count_marks(v) for v in value)
    return 0


def _mark(block: dict[str, Any]) -> None:
    block["cache_control"] = dict(EPHEMERAL)


def place(system: list[dict[str, Any]], messages: list[dict[str, Any]], room: int) -> int:
    """Mark the stable part's ends, in order, within ``room`` marks; how many were made.
    ``system``: the system blocks as they will be sent (the client's, then memory's)."""
    made = 0
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    if last_user > 0 and made < room and messages[last_user - 1]["content"]:
        _mark(messages[last_user - 1]["content"][-1])
        made += 1
    if system and made < room and "cache_control" not in system[-1]:
        _mark(system[-1])
        made += 1
    return made
