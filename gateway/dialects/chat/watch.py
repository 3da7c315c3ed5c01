"""Watching a relayed chat stream (pure): did it end, and may its answer be remembered?

The client gets the upstream's bytes untouched; the watch only decides what the gateway
does beside them. A streamed answer is recorded only if the gateway read all of it:

* it ended cleanly — ``[DONE]``, or a ``finish_reason`` before the upstream closed — and
  carried no in-band error;
* every ``data:`` payload was JSON of the expected shape, every byte was UTF-8 and no
  event was too long to hold. The OpenAI SDK itself raises on the first two, so the user
  most likely never saw that answer whole; remembering it would put words in memory that
  nobody read. A client that resends its history brings such a turn back (reconcile).

Lines that are not SSE fields and comments are ignored, as the SSE spec (and the SDK) do.

What the watch holds is bounded by what it is fed: the answer's text (never more than
its bytes) and at most one event still arriving (``sse.MAX_EVENT_CHARS``). It is fed the
decoded stream, which the upstream client ends at ``upstream.max_response_bytes``.
"""

from __future__ import annotations

from typing import Any

from gateway.dialects.chat.accumulate import StreamAccumulator
from gateway.memory.model import Message
from gateway.upstream.sse import SSEDecoder


class StreamWatch:
    def __init__(self) -> None:
        self._decoder = SSEDecoder()
        self._answer = StreamAccumulator()

    def feed(self, chunk: bytes) -> None:
        for event in self._decoder.feed(chunk):
            self._answer.add(event.data)

    def close(self) -> None:
        """The upstream closed the body cleanly."""
        for event in self._decoder.close():
            self._answer.add(event.data)

    @property
    def done(self) -> bool:
        """``[DONE]`` arrived: the moment to record, before it reaches the client."""
        return self._answer.done

    @property
    def ended(self) -> bool:
        """The upstream said the answer is over (or failed): nothing for the gateway to add."""
        answer = self._answer
        return answer.done or answer.finish_reason is not None or answer.error is not None

    @property
    def unreadable(self) -> bool:
        return self._decoder.damaged or self._answer.malformed > 0

    @property
    def recordable(self) -> bool:
        return self._answer.complete and not self.unreadable

    def message(self) -> Message:
        return self._answer.message()

    @property
    def usage(self) -> Any:
        """The ``usage`` of the stream's usage chunk (``stream_options.include_usage``)."""
        return self._answer.usage


def split_at_done(chunk: bytes) -> tuple[bytes, bytes]:
    """The bytes before the ``[DONE]`` event's line, and the rest from it on.

    When ``[DONE]`` straddles two chunks its line does not start in this one: the whole
    chunk is then the rest (held back with ``[DONE]``), which is only later, never wrong.
    (``bytes.find`` rather than a regular expression: this runs on every streamed answer.)
    """
    at = chunk.find(b"[DONE]")
    while at != -1:
        line = max(chunk.rfind(b"\n", 0, at), chunk.rfind(b"\r", 0, at)) + 1
        if chunk[line:at] in (b"data: ", b"data:"):
            return chunk[:line], chunk[line:]
        at = chunk.find(b"[DONE]", at + 6)
    return b"", chunk
