"""A pure, incremental Server-Sent Events decoder (no IO).

Bytes arrive in arbitrary chunks: a UTF-8 character, a line ending or a whole event may be
split across them. Lines end with ``\\r\\n``, ``\\n`` or ``\\r`` (the spec allows all
three), so a chunk ending in ``\\r`` is held back until we know whether ``\\n`` follows.
Only ``data`` and ``event`` matter to the gateway; the bytes themselves are forwarded to
the client untouched, this decoder only watches them.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str = "message"


class SSEDecoder:
    """Feed it chunks; it returns the events completed by each chunk."""

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._data: list[str] = []
        self._event = ""
        self._has_data = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        self._buffer += self._text.decode(chunk)
        return self._drain(final=False)

    def close(self) -> list[SSEEvent]:
        """End of stream: an event not closed by a blank line is discarded, per the spec."""
        self._buffer += self._text.decode(b"", final=True)
        # A "\r" held back at the end of the last chunk is a line ending after all: the
        # blank line it may complete dispatches its event. A partial line is dropped.
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        buffer = self._buffer
        start = 0
        length = len(buffer)
        while start < length:
            cr = buffer.find("\r", start)
            lf = buffer.find("\n", start)
            if cr == -1 and lf == -1:
                break
            if cr != -1 and (lf == -1 or cr < lf):
                if cr == length - 1 and not final:
                    break  # "\r" at the end: a "\n" may be in the next chunk
                end, next_start = cr, cr + 2 if lf == cr + 1 else cr + 1
            else:
                end, next_start = lf, lf + 1
            event = self._line(buffer[start:end])
            if event is not None:
                events.append(event)
            start = next_start
        self._buffer = buffer[start:]
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            if not self._has_data:
                self._event = ""
                return None
            event = SSEEvent("\n".join(self._data), self._event or "message")
            self._data, self._event, self._has_data = [], "", False
            return event
        if line.startswith(":"):
            return None  # comment / keep-alive
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._has_data = True
        elif field == "event":
            self._event = value
        return None
