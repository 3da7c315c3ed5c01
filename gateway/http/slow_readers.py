"""Slow readers, told by how fast they take a response, not only by a full buffer.

The write deadline (``server.client_write_timeout_s``) starts when the gateway's socket
buffer is full. A client that reads a trickle (or nothing, behind a large receive
buffer) of a long stream may never fill it: a stream of 1.5 KB/s fills the 1 MiB send
buffer in twelve minutes, and meanwhile the response holds an upstream connection. So,
as Kestrel's ``MinResponseDataRate`` does, a connection answering a request is looked at
every ``client_write_timeout_s``: when bytes were waiting for the client at the last
look, it must have taken at least ``server.client_min_read_bytes_s`` a second of them
since (or all of them, when fewer were waiting); else it is cut off.

What the client took is the kernel's own count (``TCP_INFO``'s bytes acknowledged: a
client's TCP stops acknowledging once its receive buffer is full, i.e. once it stops
reading), and what waits is the socket's unacknowledged bytes (``SIOCOUTQ``) plus the
transport's buffer. Where either is not available (not Linux, not TCP) nothing is
checked. The rule (``too_slow``) is pure; ``Sample.of`` reads the socket.
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import termios
from dataclasses import dataclass

# struct tcp_info (linux/tcp.h): 8 one-byte fields, 24 four-byte ones, then
# tcpi_pacing_rate and tcpi_max_pacing_rate before tcpi_bytes_acked (Linux 4.1+).
_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_AT = 8 + 24 * 4 + 2 * 8
_TCP_INFO_SIZE = _BYTES_ACKED_AT + _BYTES_ACKED.size
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_OUTQ = getattr(termios, "TIOCOUTQ", None)  # SIOCOUTQ: the same request on Linux


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at a client connection."""

    at: float  # seconds (the loop's clock)
    taken: int  # bytes the client has acknowledged since the connection opened
    waiting: int  # bytes sent to it or buffered for it, not yet acknowledged

    @classmethod
    def of(cls, sock: socket.socket | None, buffered: int, at: float) -> Sample | None:
        """The connection's counts now; None where the platform does not tell them."""
        if sock is None or _TCP_INFO is None or _OUTQ is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_SIZE)
            if len(info) < _TCP_INFO_SIZE:
                return None  # a kernel older than the field
            (taken,) = _BYTES_ACKED.unpack_from(info, _BYTES_ACKED_AT)
            unacknowledged = struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
            return cls(at, taken, unacknowledged + buffered)
        return None


def too_slow(before: Sample, now: Sample, min_bytes_s: float) -> bool:
    """Whether a client that had ``before.waiting`` bytes waiting took too few of them:
    fewer than ``min_bytes_s`` a second since, and not all of them."""
    if before.waiting <= 0:
        return False  # nothing was waiting: an idle stream (a slow model), not a slow reader
    owed = min(before.waiting, min_bytes_s * (now.at - before.at))
    return now.taken - before.taken < owed
