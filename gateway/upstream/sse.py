"""A pure, incremental Server-Sent Events decoder (no IO).

Bytes arrive in arbitrary chunks: a UTF-8 character, a line ending or a whole event may be
split across them. Lines end with ``\\r\\n``, ``\\n`` or ``\\r`` (the spec allows all
three), so a chunk ending in ``\\r`` is held back until we know whether ``\\n`` follows.
Only ``data`` and ``event`` matter to the gateway; the bytes themselves are forwarded to
the client untouched, this decoder only watches them.

A watcher must not be the weak point of the stream it watches: bytes that are not UTF-8
are replaced, and a line or an event longer than ``max_event_chars`` is dropped rather
than buffered without bound. Either way ``damaged`` is set, so a caller knows that what it
decoded is not the whole stream (the gateway then records nothing).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

# An OpenAI chunk is a few hundred bytes; a whole answer sent as one event is far below this.
MAX_EVENT_CHARS = 1 << 20


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str = "message"


class SSEDecoder:
    """Feed it chunks; it returns the events completed by each chunk."""

    def __init__(self, *, max_event_chars: int = MAX_EVENT_CHARS) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._buffer = ""
        self._data: list[str] = []
        self._data_chars = 0
        self._event = ""
        self._has_data = False
        self._max = max_event_chars
        self._skip_line = False  # the rest of an over-long line is still to come
        self._skip_event = False  # the event lost a line; drop it when it ends
        self.damaged = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        self._buffer += self._decode(chunk, final=False)
        return self._drain(final=False)

    def close(self) -> list[SSEEvent]:
        """End of stream: an event not closed by a blank line is discarded, per the spec."""
        self._buffer += self._decode(b"", final=True)
        # A "\r" held back at the end of the last chunk is a line ending after all: the
        # blank line it may complete dispatches its event. A partial line is dropped.
        return self._drain(final=True)

    def _decode(self, chunk: bytes, *, final: bool) -> str:
        try:
            return self._text.decode(chunk, final)
        except UnicodeDecodeError:
            # Not UTF-8: note it, and go on replacing (the strict decoder's pending bytes
            # carried over, so a character split across chunks still decodes).
            self.damaged = True
            lenient = codecs.getincrementaldecoder("utf-8")(errors="replace")
            lenient.setstate(self._text.getstate())
            self._text = lenient
            return lenient.decode(chunk, final)

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
            if self._skip_line:
                self._skip_line = False  # the end of an over-long line: drop it
            else:
                event = self._line(buffer[start:end])
                if event is not None:
                    events.append(event)
            start = next_start
        self._buffer = buffer[start:]
        if len(self._buffer) > self._max:
            self._drop_line()
        return events

    def _drop_line(self) -> None:
        """A line too long to hold: forget it, its end, and the event it belongs to."""
        self.damaged = True
        self._buffer = ""
        self._skip_line = True
        self._skip_event = True

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            skip, self._skip_event = self._skip_event, False
            if not self._has_data or skip:
                self._data, self._data_chars, self._event, self._has_data = [], 0, "", False
                return None
            event = SSEEvent("\n".join(self._data), self._event or "message")
            self._data, self._data_chars, self._event, self._has_data = [], 0, "", False
            return event
        if line.startswith(":"):
            return None  # comment / keep-alive
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data_chars += len(value) + 1
            if self._data_chars > self._max:
                # Many lines that each fit but add up to too much: the same as one.
                self.damaged, self._skip_event, self._data = True, True, []
                return None
            if not self._skip_event:
                self._data.append(value)
            self._has_data = True
        elif field == "event":
            self._event = value
        return None
