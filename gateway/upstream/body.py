"""An upstream answer's body on its way to the client, and how it can break.

Pure byte handling, no HTTP client: a compressed body is inflated in bounded pieces and
counted against the answer's limit (a gzip bomb stops there), and an event stream is
passed on in whole events so that an error event added after a break reads as one.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

from gateway import offload

# Decoded bytes made at most per step: a compressed chunk of a few KB may inflate a
# thousandfold (a gzip bomb), so it is inflated in pieces, each counted before the next.
_DECODED_PIECE = 1 << 16


class UpstreamStreamBroken(Exception):
    """The upstream body stopped after it had begun (stall past the idle limit, or reset).

    ``code`` is what the client is told (in-band for a stream, else in the error body).
    """

    def __init__(self, message: str, *, timeout: bool) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.code = "upstream_timeout" if timeout else "upstream_stream_broken"


class UpstreamResponseTooLarge(UpstreamStreamBroken):
    """The answer went past ``upstream.max_response_bytes`` (decoded, when read decoded)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the upstream's answer is larger than the {limit}-byte limit"
            " (upstream.max_response_bytes)",
            timeout=False,
        )
        self.code = "upstream_response_too_large"


async def inflated(pieces: Iterator[bytes]) -> tuple[list[bytes], Exception | None]:
    """A compressed chunk's decoded pieces, and the error that ended them if one did: the
    first ``HEAVY_CHARS`` of them made on the loop, the rest (a chunk that decodes to
    megabytes: a gzip "bomb" inflates up to the answer limit) in the heavy-work pool, so
    that other requests are not held while it inflates."""
    out: list[bytes] = []
    size = 0
    try:
        for piece in pieces:
            out.append(piece)
            size += len(piece)
            if size >= offload.HEAVY_CHARS:
                return await offload.off_loop(_drained, pieces, out)
    except (UpstreamResponseTooLarge, zlib.error) as error:
        return out, error.with_traceback(None)
    return out, None


def _drained(pieces: Iterator[bytes], out: list[bytes]) -> tuple[list[bytes], Exception | None]:
    try:
        out.extend(pieces)
    except (UpstreamResponseTooLarge, zlib.error) as error:
        # Without its traceback: the frames in it hold ``out``, tens of MB, which would
        # then live as long as the error (and, in a cycle, until a full collection).
        return out, error.with_traceback(None)
    return out, None


class Decoder:
    """Undoes a Content-Encoding of gzip or deflate (anything else passes as it is), and
    counts what it gives out against ``limit``: past it, ``UpstreamResponseTooLarge``.

    Compressed input is inflated at most ``_DECODED_PIECE`` bytes at a time (zlib's
    ``max_length``; the rest of the input waits in ``unconsumed_tail``), so going past
    the limit is found having made at most one piece more, whatever the input holds.
    """

    def __init__(self, encoding: str, limit: int) -> None:
        self._zlib: Any = None
        self._deflate = False
        self._limit = limit
        self._left = limit
        if encoding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._zlib = zlib.decompressobj()
            self._deflate = True

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """``chunk`` decoded, in pieces; raises ``zlib.error`` on a body that does not decode."""
        if self._zlib is None:
            if chunk:
                yield self._counted(chunk)
            return
        data = chunk
        while True:
            piece = self._inflate(data)
            if piece:
                yield self._counted(piece)
            data = self._zlib.unconsumed_tail
            # A full piece may leave output pending inside zlib even with no input left.
            if not data and len(piece) < _DECODED_PIECE:
                return

    def flush(self) -> Iterator[bytes]:
        """What is left once the body has ended (all input was fed, in pieces: little)."""
        if self._zlib is not None:
            rest = bytes(self._zlib.flush())
            if rest:
                yield self._counted(rest)

    def _inflate(self, data: bytes) -> bytes:
        try:
            return bytes(self._zlib.decompress(data, _DECODED_PIECE))
        except zlib.error:
            if not self._deflate:
                raise
            # "deflate" is often sent without its zlib header: retry as raw deflate.
            self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
            self._deflate = False
            return bytes(self._zlib.decompress(data, _DECODED_PIECE))

    @property
    def compressed(self) -> bool:
        return self._zlib is not None

    def _counted(self, piece: bytes) -> bytes:
        self._left -= len(piece)
        if self._left < 0:
            raise UpstreamResponseTooLarge(self._limit)
        return piece


# What ends an event of an event stream: a blank line (after "\n", "\r" or "\r\n").
_EVENT_ENDS = (b"\n\n", b"\r\r", b"\r\n\r\n")


def _event_end(data: bytes) -> int:
    """Just past the last event end in ``data``; 0 if it holds none."""
    end = 0
    for mark in _EVENT_ENDS:
        at = data.rfind(mark)
        if at != -1:
            end = max(end, at + len(mark))
    return end


class WholeEvents:
    """Passes an event stream on in whole events, holding back the start of one that is
    still arriving. When the stream breaks (or outgrows its limit) what the client has
    then ends with an event, so the in-band error the gateway adds is read as one; a half
    event before it would merge with it into a line no client can parse.

    The held pieces are kept apart and joined once their event ends: a long event that
    arrives in many pieces is copied once, not once a piece.
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[bytes] = []

    def feed(self, piece: bytes) -> bytes:
        """The bytes of ``piece`` (and of what was held) up to the last event end."""
        if not self._held:
            if piece.endswith(b"\n\n"):
                return piece  # the usual piece: whole events
            end = _event_end(piece)
            if end < len(piece):
                self._held.append(piece[end:])
            return piece[:end]
        tail = self._held[-1][-3:]  # an event end may straddle the two
        end = _event_end(tail + piece) - len(tail)
        if end <= 0:
            self._held.append(piece)
            return b""
        out = b"".join(self._held) + piece[:end]
        self._held = [piece[end:]] if end < len(piece) else []
        return out

    def rest(self) -> bytes:
        """What is held once the stream has ended cleanly: relayed as it came."""
        rest, self._held = b"".join(self._held), []
        return rest
