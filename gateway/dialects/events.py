"""Typed events in a relayed event stream (pure), for the watches of the APIs that send
them (``dialects/responses/watch.py``, ``dialects/anthropic/watch.py``): reading one's
payload (``typed_event``), and finding its bytes, to hold an answer's last event back
until the turn is recorded.

A chunk of a stream the gateway reads holds whole events (``upstream.body.WholeEvents``),
but an event may be larger than a chunk: these find where one starts by its type, named
on its ``event:`` line or first in its ``data:`` JSON, whichever line endings are used.
"""

from __future__ import annotations

from typing import Any

from gateway import codec
from gateway.upstream.sse import SSEDecoder


class EventFed:
    """A watch fed a relayed stream's bytes, reading each event's ``data`` (``_add``)."""

    _decoder: SSEDecoder

    def _add(self, data: str) -> None:
        raise NotImplementedError

    def feed(self, chunk: bytes) -> None:
        for event in self._decoder.feed(chunk):
            self._add(event.data)

    def close(self) -> None:
        """The upstream closed the body cleanly."""
        for event in self._decoder.close():
            self._add(event.data)


def typed_event(data: str) -> dict[str, Any] | None:
    """An event's ``data`` as a typed event (a JSON object with a string ``type``, as the
    Responses and Messages APIs send them); None: not one (malformed)."""
    try:
        event = codec.loads(data)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return None
    return event


def _line_start(chunk: bytes, at: int) -> int:
    return max(chunk.rfind(b"\n", 0, at), chunk.rfind(b"\r", 0, at)) + 1


def _event_start(chunk: bytes, line: int) -> int:
    """Where the event holding the line at ``line`` starts: after the blank line before
    it (or at the chunk's start, when the event began in an earlier chunk)."""
    while line > 0:
        end = line - 1  # the previous line's terminator
        if chunk[end] == 0x0A and end > 0 and chunk[end - 1] == 0x0D:
            end -= 1
        previous = _line_start(chunk, end)
        if previous == end:
            return line  # a blank line: the event starts here
        line = previous
    return 0


def _is_type_line(line: bytes, name: bytes) -> bool:
    if line.startswith(b"event:"):
        return line[6:].strip() == name
    if not line.startswith(b"data:"):
        return False
    head = line[5:].lstrip()
    # The event's own type, first as the stream writes it: its name anywhere else (in an
    # answer's text) is quoted with escaped quotes, never this.
    return head.startswith((b'{"type":"' + name + b'"', b'{"type": "' + name + b'"'))


# How an event ends: a blank line, whichever line endings the stream uses.
_EVENT_ENDS = (b"\n\n", b"\r\r", b"\r\n\r\n", b"\n\r\n", b"\r\n\n")


def split_at_last_event(chunk: bytes) -> tuple[bytes, bytes]:
    """The chunk's whole events, and the event begun after them (held back).

    The completed event repeats the whole answer, so it often spans chunks: were its
    beginning relayed before the record, an error event sent instead of its end would
    be read by the client as part of it. A client acts on an event only once it ends,
    so holding back its beginning delays nothing the client could use.
    """
    end = 0
    for ending in _EVENT_ENDS:
        at = chunk.rfind(ending)
        if at != -1:
            end = max(end, at + len(ending))
    return chunk[:end], chunk[end:]


def event_named(chunk: bytes, name: bytes) -> int:
    """Where the event of type ``name`` starts in the chunk, or -1."""
    at = chunk.find(name)
    while at != -1:
        line = _line_start(chunk, at)
        end = min(
            (i for i in (chunk.find(b"\n", at), chunk.find(b"\r", at)) if i != -1),
            default=len(chunk),
        )
        if _is_type_line(chunk[line:end], name):
            return _event_start(chunk, line)
        at = chunk.find(name, at + 1)
    return -1
