"""The HTTP/1.1 server protocol: uvicorn's httptools one, with a bound on a request's head.

httptools (llhttp) is the faster of uvicorn's two parsers: ~0.1 ms less a request than
h11 on a trivial app, a tenth of the passthrough path's cost. But it buffers a request's
line and headers without any limit: an 8 MiB ``X-Session-Id`` was read whole and
answered. This protocol counts the bytes of a head as they arrive and answers 400 (and
closes) once ``server.max_header_bytes`` pass without the head's end, before more is
parsed. Every 400 of this layer (that one, and the parser's own for a malformed request)
is OpenAI's error envelope, as the app's errors are.

Notes:
    The limit comes through uvicorn's own ``h11_max_incomplete_event_size`` option (the
    same bound for h11: a head is its one large incomplete event), so the class needs no
    configuration of its own and ``serve --workers N`` passes it to every process.

    Bytes are counted per ``data_received``; when a read holds the end of one request's
    body and the start of the next request's head, that read's head bytes are not
    counted. One read is at most the event loop's read size (256 KiB with uvloop), so a
    head is still bounded.

The protocol also bounds how long a client may hold a connection without doing its part
(``ClientLimits``, from ``server.*``): a head must arrive within ``header_timeout_s`` of
the connection (or of its first byte, on a kept-alive connection), a body within
``body_timeout_s`` of its head, and a client that stops reading a response for
``client_write_timeout_s`` is cut off (its response's task sees a disconnect, so an
upstream stream is closed at once). Each is one timer a connection, re-armed only when the
connection changes state: a request read in one piece costs none. And one client address
may hold at most ``max_connections_per_client`` connections at once: past that, a new one
is answered 429 and closed, before anything is read or parsed; so is a new one from an
address whose new connections the app refused again and again (``refused_addresses``). Those
answers are paced, ``REFUSALS_PER_TURN`` a turn of the event loop: a client that reopens
hundreds of refused connections at once (each costs ~0.1 ms) would otherwise hold the
loop for tens of ms while every other client's request waited behind them. For the same
reason the requests an address sends at once start a few a turn (``fair_starts``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import ipaddress
import json
import random
import socket
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.compat.uvicorn import (
    STATUS_LINE,
    Config,
    FlowControl,
    HttpToolsProtocol,
    ServerState,
)
from gateway.errors import REFUSAL_SPREAD_S, error_body
from gateway.http.fair_starts import FairStarts
from gateway.http.refused_addresses import HOLD_AFTER, NEW_CONNECTION, REFUSED
from gateway.http.slow_readers import Sample, too_slow

TOO_LARGE = "Request line and headers too large."


class TrustedProxies:
    """``server.trusted_proxies`` (addresses, networks, or "*"), parsed once."""

    def __init__(self, entries: tuple[str, ...]) -> None:
        self.everyone = "*" in entries
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self.literals: set[str] = set()  # entries that are no address
        for entry in entries:
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self.literals.add(entry)

    def __contains__(self, host: str) -> bool:
        if self.everyone or host in self.literals:
            return True
        if not self.networks:
            return False
        try:
            address = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            # An IPv4 peer of a dual-stack socket ("::"): named by its IPv4 address.
            address = address.ipv4_mapped
        return any(address in network for network in self.networks)


def with_mapped_forms(entries: Sequence[str]) -> tuple[str, ...]:
    """``entries`` (``server.trusted_proxies``) and, for each IPv4 one, its IPv4-mapped
    IPv6 form: how an IPv4 peer of a dual-stack socket ("::") is named. uvicorn's proxy
    headers are believed only from a peer these name, and it compares as it is given."""
    mapped = []
    for entry in entries:
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            continue
        if isinstance(network, ipaddress.IPv4Network):
            mapped.append(f"::ffff:{network.network_address}/{96 + network.prefixlen}")
    return (*entries, *mapped)


@dataclass(frozen=True)
class ClientLimits:
    """What one client connection may hold (``server.*``). None or 0: no bound.

    ``trusted_proxies`` are not capped: each of their connections carries many clients
    (the proxy in front bounds those itself).
    """

    header_timeout_s: float | None = None
    body_timeout_s: float | None = None
    write_timeout_s: float | None = None
    min_read_bytes_s: int = 0  # looked at every write_timeout_s (``slow_readers``)
    max_connections_per_client: int = 0
    trusted_proxies: tuple[str, ...] = ()
    # Parsed with the limits (one per server), not at every connection.
    trusted: TrustedProxies = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "trusted", TrustedProxies(self.trusted_proxies))


class _Reading(enum.Enum):
    HEAD = "request head"
    BODY = "request body"


# Open connections per client address, per server (every protocol of one uvicorn server
# shares its ServerState): the cap is per process, as the server's own bounds are.
_OPEN: weakref.WeakKeyDictionary[ServerState, dict[str, int]] = weakref.WeakKeyDictionary()
# Connections past the cap, waiting for their 429 (see ``_refuse_paced``).
_REFUSING: weakref.WeakKeyDictionary[ServerState, collections.deque[BoundedHeadProtocol]] = (
    weakref.WeakKeyDictionary()
)
REFUSALS_PER_TURN = 16
# A refusal is answered after a random part of ``REFUSAL_SPREAD_S`` (errors.py), while few
# enough wait so (below).
# How many refused connections may wait out their spread at once, per server: each holds
# a descriptor meanwhile; past this they are answered at once (paced).
SPREAD_REFUSALS = 128
_SPREADING: weakref.WeakKeyDictionary[ServerState, list[int]] = weakref.WeakKeyDictionary()
# Request starts, paced per client address (``fair_starts``), per server.
_STARTS: weakref.WeakKeyDictionary[ServerState, FairStarts] = weakref.WeakKeyDictionary()
# A refused connection or a deadline is logged at most this often: an attack of a
# thousand sockets must not become a thousand log lines.
_WARN_EVERY_S = 10.0
_last_warned: dict[str, float] = {}


def client_address(host: str) -> str:
    """The address one client is counted by: IPv6 by its /64 (one host is given a whole
    /64 and may use any address in it), an IPv4-mapped IPv6 address as the IPv4 one."""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(address) >> 64 << 64, 64)))


def _warn_rarely(logger: Any, kind: str, message: str, *args: object) -> None:
    now = time.monotonic()
    if now - _last_warned.get(kind, -_WARN_EVERY_S) >= _WARN_EVERY_S:
        _last_warned[kind] = now
        logger.warning(message + " (logged at most every %.0f s)", *args, _WARN_EVERY_S)


# The kernel's send buffer of a client connection. Left to autotuning it grows to several
# MB, all of which a client that stops reading makes the gateway produce (a stream
# relayed, event by event) before the write deadline can even start; 1 MiB still carries
# 20 MB/s at a 50 ms round trip.
SEND_BUFFER_BYTES = 1 << 20


def _bound_send_buffer(transport: asyncio.Transport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)


def _answer_refused(waiting: collections.deque[BoundedHeadProtocol]) -> None:
    """Answer up to ``REFUSALS_PER_TURN`` queued refusals; the rest on the next turn."""
    for _ in range(min(REFUSALS_PER_TURN, len(waiting))):
        waiting.popleft()._refuse()
    if waiting:
        waiting[0].loop.call_soon(_answer_refused, waiting)


class BoundedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol that refuses a request head past a size, bounds the
    time a client takes to send a request or to read a response, and caps one client
    address's connections (``limits``; see the module's notes)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ClientLimits | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.max_head_bytes: int = config.h11_max_incomplete_event_size or 64 * 1024
        self.head_bytes = 0
        self.reading_head = True
        self.heads = 0  # request heads read whole on this connection
        self.limits = limits or ClientLimits()
        # The client address this connection is held to (``client_address``), once known;
        # None: a trusted proxy's (it carries many clients) or no address.
        self.peer: str | None = None
        self.counted_as: str | None = None  # the client address this connection counts for
        self.refused = False  # turned away: waits for its 429 (``_refuse_paced``)
        self.refusal = ("", "")  # what that 429 says, and its code
        # What the client is expected to send now, and the deadline for it (one timer,
        # re-armed only when ``expecting`` changes: trickling bytes does not extend it).
        self.expecting: _Reading | None = _Reading.HEAD
        self.deadline_for: _Reading | None = None
        self.read_deadline: asyncio.TimerHandle | None = None
        self.head_started = False  # bytes of the current head have arrived
        self.write_deadline: asyncio.TimerHandle | None = None
        # The look at how fast the client takes its answer, and the last one's counts.
        self.reader_check: asyncio.TimerHandle | None = None
        self.reader_seen: Sample | None = None
        # The read deadline passed while the gateway, not the client, held reading paused:
        # a full deadline starts again when reading resumes.
        self.deadline_deferred = False

    # Connection: the per-address cap.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = self.reporting = _ReportingFlow(transport, self._reading_resumed)
        if self.client is not None and self.client[0] not in self.limits.trusted:
            self.peer = client_address(self.client[0])
        if self._turned_away():
            return
        _bound_send_buffer(transport)
        self._rearm_read_deadline()

    def _turned_away(self) -> bool:
        cap, address = self.limits.max_connections_per_client, self.peer
        if not cap or address is None:
            return False
        counts = _OPEN.setdefault(self.server_state, {})
        if counts.get(address, 0) >= cap:
            _warn_rarely(
                self.logger, "cap", "refused a connection: %d already open from one address", cap
            )
            message = f"too many open connections from one address (at most {cap})"
            self._turn_away(message, "too_many_connections")
            return True
        if REFUSED.held((self.server, address)):
            REFUSED.note((self.server, address))  # still hammering: still held
            _warn_rarely(
                self.logger,
                "held",
                "refused a connection: its address had %d new connections refused in two seconds",
                HOLD_AFTER,
            )
            message = "too many requests refused from one address in the last seconds"
            self._turn_away(message, "too_many_refused_requests")
            return True
        counts[address] = counts.get(address, 0) + 1
        self.counted_as = address
        return False

    def _turn_away(self, message: str, code: str) -> None:
        """Answer this connection 429 with ``message`` (spread, then paced), reading none
        of what it sends."""
        self.expecting = None
        self.refused = True  # what it sends until its answer is dropped unread
        self.refusal = (message, code)
        self._refuse_spread()

    def _refuse_spread(self) -> None:
        """This connection's 429 after a random part of ``REFUSAL_SPREAD_S`` (while at most
        ``SPREAD_REFUSALS`` wait so), then paced."""
        spreading = _SPREADING.setdefault(self.server_state, [0])
        if spreading[0] >= SPREAD_REFUSALS:
            self._refuse_paced()
            return
        spreading[0] += 1

        def due() -> None:
            spreading[0] -= 1
            self._refuse_paced()

        self.loop.call_later(random.uniform(0, REFUSAL_SPREAD_S), due)

    def _refuse_paced(self) -> None:
        """Queue this connection's 429; the queue is answered a few a loop turn, each
        turn after the loop has polled for other clients' I/O."""
        waiting = _REFUSING.get(self.server_state)
        if waiting is None:
            waiting = _REFUSING[self.server_state] = collections.deque()
        waiting.append(self)
        if len(waiting) == 1:
            self.loop.call_soon(_answer_refused, waiting)

    def _refuse(self) -> None:
        if self.transport.is_closing():  # the client left while it waited
            return
        message, code = self.refusal
        self._answer_and_close(429, message, "rate_limit_error", code, b"retry-after: 1\r\n")

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self.read_deadline, self.write_deadline, self.reader_check):
            if timer is not None:
                timer.cancel()
        self.read_deadline = self.write_deadline = self.reader_check = None
        if self.counted_as is not None:
            counts = _OPEN.get(self.server_state, {})
            left = counts.get(self.counted_as, 1) - 1
            if left > 0:
                counts[self.counted_as] = left
            else:
                counts.pop(self.counted_as, None)
            self.counted_as = None
        super().connection_lost(exc)
        # The flow calls back into this protocol: a reference cycle that only the garbage
        # collector could free, for every connection. At 600 refused connections a second
        # that made a 100 ms young collection every few seconds, stalling every client
        # (bench/abuse.py's unread-streams-3-addresses). Broken here: freed at once.
        self.reporting.on_resume = _nothing

    # Reading: the head bound and the read deadlines.

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        self._feed(data)
        expecting = self.expecting
        if expecting is None and (self.cycle is None or self.cycle.response_complete):
            # Bytes that began no request (blank lines) while none is being answered:
            # whatever comes next is a head, due within the head's deadline.
            expecting = self.expecting = _Reading.HEAD
        if expecting is not self.deadline_for:
            self._rearm_read_deadline()

    def _feed(self, data: bytes) -> None:
        if not self.reading_head:
            super().data_received(data)
            return
        room = self.max_head_bytes - self.head_bytes
        if len(data) <= room:
            self.head_bytes += len(data)
            super().data_received(data)
            return
        self.head_bytes = self.max_head_bytes
        heads = self.heads
        super().data_received(data[:room])
        if self.transport.is_closing():  # the parser refused the head already
            return
        if self.heads == heads:  # no end of the head within the limit
            self.logger.warning(TOO_LARGE)
            message = f"the request line and headers are over {self.max_head_bytes} bytes"
            self._answer_and_close(400, message, "invalid_request_error", "headers_too_large")
            return
        self._feed(data[room:])  # the body, and maybe the next request's head

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_started = True
        self.expecting = _Reading.HEAD

    def on_headers_complete(self) -> None:
        self.reading_head = False
        self.head_started = False
        self.heads += 1
        self.expecting = _Reading.BODY
        if self.heads == 1 and self.peer is not None:  # (its refusal counts: refused_addresses)
            self.scope.setdefault("extensions", {})[NEW_CONNECTION] = {
                "key": (self.server, self.peer)  # (what ``_turned_away`` looks up)
            }
        super().on_headers_complete()
        if self.reader_check is None and self.limits.min_read_bytes_s:
            self._watch_reader()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """The request's task, started in its client address's turn (``fair_starts``)."""
        if self.peer is None:  # (a trusted proxy's connections carry many clients: at once)
            super()._start_asgi_task(cycle, app)
            return
        starts = _STARTS.get(self.server_state)
        if starts is None:
            starts = _STARTS[self.server_state] = FairStarts(self.loop)

        def begin() -> None:
            if not self.transport.is_closing():  # (the client left while it waited)
                super(BoundedHeadProtocol, self)._start_asgi_task(cycle, app)

        starts.start(self.peer, begin)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.reading_head = True
        self.head_bytes = 0
        self.expecting = None

    def _rearm_read_deadline(self) -> None:
        self.deadline_deferred = False
        if self.read_deadline is not None:
            self.read_deadline.cancel()
            self.read_deadline = None
        self.deadline_for = self.expecting
        if self.expecting is _Reading.HEAD:
            seconds = self.limits.header_timeout_s
        elif self.expecting is _Reading.BODY:
            seconds = self.limits.body_timeout_s
        else:
            return
        if seconds:
            self.read_deadline = self.loop.call_later(seconds, self._read_deadline_passed)

    def _read_deadline_passed(self) -> None:
        self.read_deadline = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:
            # The wait is the gateway's, not the client's: the app has not taken the body
            # read so far, or a pipelined request waits its turn. Not counted: the client
            # gets a whole deadline again once reading resumes (``_reading_resumed``).
            self.deadline_deferred = True
            return
        waited_for = self.deadline_for
        _warn_rarely(
            self.logger, "read", "closed a connection: the client took too long to send a %s",
            waited_for.value if waited_for else "request",
        )  # fmt: skip
        cycle = self.cycle
        answering = cycle is not None and not cycle.response_complete
        if waited_for is _Reading.HEAD and answering:
            # A pipelined head, behind a response still being sent: that one ends first.
            assert cycle is not None
            cycle.keep_alive = False
            self.flow.pause_reading()
            return
        if waited_for is _Reading.BODY and answering:
            assert cycle is not None
            if cycle.response_started:  # too late to answer: cut it
                self.transport.close()
                return
            # The app waits for the rest of the body: it is told the client left, and its
            # answer goes nowhere; the client gets the 408.
            cycle.disconnected = True
            cycle.message_event.set()
        if waited_for is _Reading.HEAD and not self.head_started:
            self.transport.close()  # an idle connection: nothing to answer
            return
        message = f"the {waited_for.value if waited_for else 'request'} took too long to arrive"
        self._answer_and_close(408, message, "invalid_request_error", "request_timeout")

    def _reading_resumed(self) -> None:
        if self.deadline_deferred and not self.transport.is_closing():
            self._rearm_read_deadline()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 for a request its parser refused (a control byte in a header, a
        malformed request line): in OpenAI's envelope, not uvicorn's plain text, so that a
        client's SDK can read every error alike."""
        message = "the request is not valid HTTP/1.1 (its request line or a header is malformed)"
        self._answer_and_close(400, message, "invalid_request_error", "invalid_request")

    def _answer_and_close(
        self, status: int, message: str, type_: str, code: str, extra: bytes = b""
    ) -> None:
        """An error of the gateway's (OpenAI's envelope), written before or instead of the
        app's answer; the connection is closed after it."""
        body = json.dumps(error_body(message, type_, code=code)).encode()
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body),
                extra,
                b"connection: close\r\n\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()

    # Writing: the write deadline.

    def pause_writing(self) -> None:
        """The client's socket is full: it has that long to take some of it."""
        super().pause_writing()
        seconds = self.limits.write_timeout_s
        if seconds and self.write_deadline is None:
            self.write_deadline = self.loop.call_later(seconds, self._write_deadline_passed)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.write_deadline is not None:
            self.write_deadline.cancel()
            self.write_deadline = None

    def _watch_reader(self) -> None:
        if self.limits.write_timeout_s:
            self.reader_check = self.loop.call_later(
                self.limits.write_timeout_s, self._look_at_reader
            )

    def _look_at_reader(self) -> None:
        """Every ``write_timeout_s`` while a request is answered: cut off a client that
        takes its answer too slowly (``slow_readers.too_slow``)."""
        self.reader_check = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or cycle.response_complete:
            self.reader_seen = None  # looked at again from the next request's head
            return
        seen = Sample.of(
            self.transport.get_extra_info("socket"),
            self.transport.get_write_buffer_size(),
            self.loop.time(),
        )
        if seen is None:
            return  # the platform does not tell: not looked at again
        before, self.reader_seen = self.reader_seen, seen
        if before is not None and too_slow(before, seen, self.limits.min_read_bytes_s):
            _warn_rarely(
                self.logger, "slow", "closed a connection: the client took its answer at "
                "under %d bytes a second", self.limits.min_read_bytes_s,
            )  # fmt: skip
            self.transport.abort()  # as the write deadline does (see below)
            return
        self._watch_reader()

    def _write_deadline_passed(self) -> None:
        # abort, not close: close would wait for the buffer to drain, which it never does.
        # The response's task sees the disconnect (uvicorn's connection_lost), which
        # closes an upstream stream (routes.relay).
        self.write_deadline = None
        _warn_rarely(
            self.logger, "write", "closed a connection: the client read nothing for %s s",
            self.limits.write_timeout_s,
        )  # fmt: skip
        self.transport.abort()


def _nothing() -> None:
    pass


class _ReportingFlow(FlowControl):
    """uvicorn's flow control, which also tells the protocol when reading resumes."""

    def __init__(self, transport: asyncio.Transport, on_resume: Any) -> None:
        super().__init__(transport)
        self.on_resume = on_resume

    def resume_reading(self) -> None:
        was_paused = self.read_paused
        super().resume_reading()
        if was_paused:
            self.on_resume()
