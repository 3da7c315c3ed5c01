"""The clients of ``bench/abuse.py``: victims and attackers, each a process of its own.

    python bench/abuse_clients.py --role victims|attack     # the job: stdin's first line

Lines on stdin and stdout drive it: the process reads its job (JSON) from the first
line, gets ready (imports, payloads) and says ``prepared``; it starts on ``go``. Victims
run for their period; an attacker says ``ready`` once its attack is on and keeps it on
until ``stop``. Each then prints its result as one JSON line. Imports are kept light:
the bench starts two of these per scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import math
import os
import random
import re
import resource
import select
import socket
import statistics
import struct
import sys
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

VICTIM_MODEL = "bench-t0-c5-s0"  # five chunks at once: the gateway's own cost dominates
VICTIM_ADDRESS = "127.0.0.1"
ATTACKER_ADDRESS = "127.0.0.2"  # another client address (all of 127/8 is loopback)
BENCH_NOFILE = 65536  # where the hard limit allows: 1,100 sockets and more
MIB = 1024 * 1024


def raise_nofile(wanted: int = BENCH_NOFILE) -> int:
    """The soft descriptor limit raised toward ``wanted`` (never above the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def next_line() -> str:
    """The next line the bench sends ('' once it is gone)."""
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def say(line: str) -> None:
    print(line, flush=True)


# Given to an attack: ``start()`` once its payloads are made (returns on "go"), ``on()``
# once the attack is on.
Start = Callable[[], Awaitable[None]]
On = Callable[[], None]


# --- Victims ------------------------------------------------------------------------------


async def victims(job: dict[str, Any]) -> dict[str, Any]:
    """``clients`` clients, each sending one streamed request every 1 / ``rate`` s, the
    user messages ``texts`` in turn."""
    texts: list[str] = job["texts"]
    interval = 1.0 / float(job["rate"])
    clients = int(job["clients"])
    headers = {"Authorization": f"Bearer {job['key']}"}
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    sent = itertools.count()

    async def one(http: aiohttp.ClientSession, due: float) -> None:
        n = next(sent)
        body = {
            "model": VICTIM_MODEL,
            "messages": [{"role": "user", "content": texts[n % len(texts)]}],
            "stream": True,
        }
        session = {"X-Session-Id": f"{job['sessions']}-{n % 16}"}
        error = ""
        try:
            async with http.post(job["url"], json=body, headers={**headers, **session}) as response:
                data = await response.read()
                if response.status != 200:
                    found = re.search(rb'"code":\s*"([^"]+)"', data)
                    error = f"http {response.status}" + (f" {found[1].decode()}" if found else "")
                elif b'data: {"error"' in data:
                    error = "in-band error"
                elif b"data: [DONE]" not in data:
                    error = "no [DONE]"
                elif response.headers.get("x-memory-status") != "ok":
                    error = f"memory {response.headers.get('x-memory-status')}"
        except TimeoutError:
            error = "timeout"
        except (aiohttp.ClientError, OSError) as exc:
            error = type(exc).__name__
        if error:
            errors[error] += 1
        else:
            latencies.append(time.perf_counter() - due)

    async def client(http: aiohttp.ClientSession, first: float, until: float) -> None:
        # Requests a stall made late go out at once (their latency counts from when they
        # were due), but none after the period plus one timeout: a gateway that stalls
        # for good must not hold the bench; those are counted as errors.
        hard_end = until + float(job["timeout_s"])
        due = first
        while due < until:
            now = time.perf_counter()
            if now >= hard_end:
                errors["not sent: the period was over"] += math.ceil((until - due) / interval)
                return
            if due > now:
                await asyncio.sleep(due - now)
            await one(http, due)
            due += interval

    connector = aiohttp.TCPConnector(limit=clients, local_addr=(VICTIM_ADDRESS, 0))
    timeout = aiohttp.ClientTimeout(total=float(job["timeout_s"]))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        say("prepared")
        await next_line()
        start = time.perf_counter()
        until = start + float(job["duration_s"])
        await asyncio.gather(
            *(client(http, start + k * interval / clients, until) for k in range(clients))
        )
    return {
        "requests": len(latencies) + sum(errors.values()),
        "latencies_s": latencies,
        "errors": dict(errors),
    }


# --- Attacks ------------------------------------------------------------------------------


@dataclass
class Attack:
    """What an attacker needs, and what it counts (label -> answers)."""

    host: str
    port: int
    key: str
    params: dict[str, Any]
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    outcomes: Counter[str] = field(default_factory=Counter)
    notes: dict[str, Any] = field(default_factory=dict)
    durations: list[float] = field(default_factory=list)
    received: list[int] = field(default_factory=list)  # answer bytes, of dropped answers

    def head(self, length: int, *, session: str | None, extra: str = "") -> bytes:
        lines = [
            "POST /v1/chat/completions HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            f"Authorization: Bearer {self.key}",
            "Content-Type: application/json",
            f"Content-Length: {length}",
            "Connection: close",
        ]
        if session is not None:
            lines.append(f"X-Session-Id: {session}")
        return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def _label(status: int, stream: bool, head: bytes, tail: bytes) -> str:
    if status != 200:
        found = re.search(rb'"code":\s*"([^"]+)"', tail)
        return f"{status}" + (f" {found[1].decode()}" if found else "")
    if stream:
        if b'data: {"error"' in tail:
            found = re.search(rb'"code":\s*"([^"]+)"', tail)
            return "200 + in-band error" + (f" {found[1].decode()}" if found else "")
        return "200 [DONE]" if b"data: [DONE]" in tail else "200 ended without [DONE]"
    memory = re.search(rb"(?i)\r\nx-memory-status:\s*(\w+)", head)
    return "200" + (f" memory {memory[1].decode()}" if memory else "")


@dataclass(frozen=True)
class Answer:
    label: str  # how the gateway answered, for the table
    retry_after_s: float | None = None  # a 429's Retry-After


async def exchange(
    attack: Attack,
    body: bytes,
    *,
    stream: bool,
    session: str | None,
    read_for_s: float | None = None,
) -> Answer:
    """One request on a new connection, its whole answer read (and dropped).

    ``read_for_s``: the answer is read for that long at most, then the connection is
    dropped (a client that leaves).
    """
    try:
        reader, writer = await asyncio.open_connection(
            attack.host, attack.port, local_addr=(ATTACKER_ADDRESS, 0), limit=1 << 20
        )
    except OSError as error:
        return Answer(f"connect: {error.strerror or type(error).__name__}")
    try:
        writer.write(attack.head(len(body), session=session))
        writer.write(body)
        # Answered (413?) and closed before the whole body went: the answer may be there.
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return Answer("closed without an answer")
        status = int(head.split(b" ", 2)[1])
        if status == 429:
            found = re.search(rb"(?i)\r\nretry-after:\s*(\d+(?:\.\d+)?)", head)
            if found is None:
                return Answer("429 without Retry-After", 1.0)
            return Answer(_label(status, stream, head, await reader.read(8192)), float(found[1]))
        tail = b""
        received = 0
        started = time.monotonic()
        while True:
            if read_for_s is not None and time.monotonic() - started > read_for_s:
                attack.received.append(received)
                return Answer(f"{status}, dropped by the client after {read_for_s:g} s")
            chunk = await reader.read(1 << 16)
            if not chunk:
                break
            received += len(chunk)
            tail = (tail + chunk)[-8192:]
        return Answer(_label(status, stream, head, tail))
    except ConnectionResetError:
        return Answer("connection reset")
    except OSError as error:  # the gateway closed the connection while we sent or read
        return Answer(f"connection error: {error.strerror or type(error).__name__}")
    except (ValueError, IndexError, asyncio.LimitOverrunError):
        return Answer("unreadable answer")
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def request_loop(
    attack: Attack, clients: int, request: Callable[[int], Awaitable[Answer]]
) -> None:
    """``clients`` attackers, each sending its next request once its last one ended.

    A 429 is followed by its Retry-After, as an SDK's retries do: the payload is what
    these attacks are about (``attack_flood`` is the one that does not wait).
    """
    numbers = itertools.count()
    waiting = [False] * clients  # a request on its way: cut short at the end

    async def client(k: int) -> None:
        while not attack.stopping.is_set():
            started = time.monotonic()
            waiting[k] = True
            answer = await request(next(numbers))
            waiting[k] = False
            attack.outcomes[answer.label] += 1
            attack.durations.append(time.monotonic() - started)
            pause = 0.1 if answer.label.startswith("connect") else answer.retry_after_s
            if pause:  # refused, or told when to come back: no spinning
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(attack.stopping.wait(), min(pause, 60.0))

    tasks = [asyncio.create_task(client(k)) for k in range(clients)]
    await attack.stopping.wait()
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if any(waiting):
        attack.outcomes["still waiting for an answer at the end"] += sum(waiting)


def chat_body(model: str, content_json: bytes, stream: bool) -> tuple[bytes, bytes]:
    """A chat body around one message whose JSON-encoded content is given: (before, after)."""
    before = b'{"model": "%s", "stream": %s, "messages": [{"role": "user", "content": ' % (
        model.encode(),
        b"true" if stream else b"false",
    )
    return before, content_json + b"}]}"


async def attack_big(attack: Attack, start: Start, on: On) -> None:
    """One message of ``size`` random lowercase letters, a new session each time."""
    size = int(attack.params["size"])
    letters = bytes(ord("a") + i % 26 for i in range(256))
    blob = os.urandom(size).translate(letters)
    before, after = chat_body(VICTIM_MODEL, b"", True)

    async def request(n: int) -> Answer:
        content = b'"' + str(n).encode() + blob[len(str(n)) :] + b'"'
        return await exchange(
            attack, before + content + after, stream=True, session=f"big-{n}-{uuid.uuid4().hex[:6]}"
        )

    await start()
    on()
    await request_loop(attack, int(attack.params.get("clients", 1)), request)


def text_bomb_png(chunks: int = 24, inflated: int = 1 << 20) -> bytes:
    """A 1x1 PNG with ``chunks`` zTXt chunks before its pixels, each ~1 KB that inflates
    to ``inflated`` bytes: ~24 KB whose header a text-inflating reader turns into 24 MiB."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    text = zlib.compress(b"\x00" * inflated, 9)
    bomb = b"".join(chunk(b"zTXt", b"Comment%d\x00\x00" % n + text) for n in range(chunks))
    pixels = chunk(b"IDAT", zlib.compress(b"\x00\x00"))
    return b"\x89PNG\r\n\x1a\n" + ihdr + bomb + pixels + chunk(b"IEND", b"")


async def attack_png(attack: Attack, start: Start, on: On) -> None:
    """``images`` text-bomb PNGs as data URLs in one user message, a new session each
    time: one (~32 KB of body, read on the event loop) or many (a body for the pool)."""
    png = text_bomb_png(int(attack.params.get("chunks", 24)))
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    parts = [{"type": "text", "text": "what is in these?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}}] * int(attack.params["images"])
    before, after = chat_body(VICTIM_MODEL, json.dumps(parts).encode(), True)
    attack.notes["body KB"] = round(len(before + after) / 1024, 1)

    async def request(n: int) -> Answer:
        session = f"png-{n}-{uuid.uuid4().hex[:6]}"
        return await exchange(attack, before + after, stream=True, session=session)

    await start()
    on()
    await request_loop(attack, int(attack.params.get("clients", 1)), request)


async def attack_many(attack: Attack, start: Start, on: On) -> None:
    """100,000 two-letter messages, user and assistant in turn, the last a user's."""
    count = 100_000
    messages = [
        {"role": "assistant" if i % 2 else "user", "content": "hi"} for i in range(count - 1)
    ]
    messages.append({"role": "user", "content": "hi"})
    body = json.dumps({"model": VICTIM_MODEL, "stream": True, "messages": messages}).encode()
    attack.notes["body MB"] = round(len(body) / 1e6, 1)

    async def request(n: int) -> Answer:
        return await exchange(attack, body, stream=True, session=f"many-{uuid.uuid4().hex}")

    await start()
    on()
    await request_loop(attack, 1, request)


def _four_letter_words(count: int) -> list[str]:
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(w) for w in itertools.islice(itertools.product(alphabet, repeat=4), count)]
    random.Random(22).shuffle(words)
    return words


async def attack_words(attack: Attack, start: Start, on: On) -> None:
    """``words`` distinct four-letter words (of 26^4 = 456,976) in one message, a new
    session each time."""
    text = " ".join(_four_letter_words(int(attack.params["words"])))
    before, after = chat_body(VICTIM_MODEL, json.dumps(text).encode(), True)
    body = before + after
    attack.notes["body MB"] = round(len(body) / 1e6, 1)

    async def request(n: int) -> Answer:
        return await exchange(attack, body, stream=True, session=f"words-{uuid.uuid4().hex}")

    await start()
    on()
    await request_loop(attack, 1, request)


async def attack_upstream(attack: Attack, start: Start, on: On) -> None:
    """A request whose answer is abusive (fast_upstream's ``abuse-*`` models), in a loop."""
    stream = bool(attack.params["stream"])
    read_for = attack.params.get("abandon_s")
    body = json.dumps(
        {
            "model": attack.params["model"],
            "stream": stream,
            "messages": [{"role": "user", "content": "tell me everything"}],
        }
    ).encode()

    async def request(n: int) -> Answer:
        return await exchange(
            attack, body, stream=stream, session=f"upstream-{n % 8}", read_for_s=read_for
        )

    await start()
    on()
    await request_loop(attack, 1, request)


async def attack_flood(attack: Attack, start: Start, on: On) -> None:
    """Small streamed requests at ``rate`` per second, at most ``in_flight`` at once,
    on keep-alive connections (a client library's pool)."""
    import aiohttp

    rate = float(attack.params["rate"])
    in_flight = asyncio.Semaphore(int(attack.params["in_flight"]))
    url = f"http://{attack.host}:{attack.port}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {attack.key}"}
    skipped = 0

    async def one(http: aiohttp.ClientSession, n: int) -> None:
        body = {
            "model": VICTIM_MODEL,
            "stream": True,
            "messages": [{"role": "user", "content": f"flood message number {n}"}],
        }
        started = time.monotonic()
        try:
            async with http.post(
                url, json=body, headers={**headers, "X-Session-Id": f"flood-{n % 64}"}
            ) as response:
                data = await response.read()
                label = _label(response.status, True, b"", data[-8192:])
                if response.status == 429:
                    label += " (Retry-After)" if "retry-after" in response.headers else ""
        except TimeoutError:
            label = "timeout"
        except (aiohttp.ClientError, OSError) as error:
            label = type(error).__name__
        finally:
            in_flight.release()
        attack.outcomes[label] += 1
        attack.durations.append(time.monotonic() - started)

    connector = aiohttp.TCPConnector(
        limit=int(attack.params["in_flight"]), local_addr=(ATTACKER_ADDRESS, 0)
    )
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await start()
        on()
        tasks: set[asyncio.Task[None]] = set()
        started = time.monotonic()
        for n in itertools.count():
            due = started + n / rate
            if attack.stopping.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(attack.stopping.wait(), max(0.0, due - time.monotonic()))
                break
            if in_flight.locked():
                skipped += 1  # the gateway is slower than the flood: it is not queued
                continue
            await in_flight.acquire()
            task = asyncio.create_task(one(http, n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        elapsed = time.monotonic() - started
        sent = sum(attack.outcomes.values()) + len(tasks)
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    attack.notes["sent req/s"] = round(sent / elapsed, 1) if elapsed else 0
    attack.notes["not sent (64 in flight)"] = skipped


# Connections held open: a socket, what it sends, when it was opened.
@dataclass
class Held:
    sock: socket.socket
    kind: str
    opened: float
    drip: bool  # sends one more byte every second


class Holder:
    """Keeps ``counts[kind]`` connections open, reopening those the gateway closes."""

    SWEEP_S = 0.25  # how often closed sockets are looked for (the resolution of "after")

    def __init__(
        self,
        attack: Attack,
        counts: dict[str, int],
        *,
        rcvbuf: int | None,
        addresses: Sequence[str] = (ATTACKER_ADDRESS,),
    ) -> None:
        self.attack = attack
        self.counts = counts
        self.rcvbuf = rcvbuf
        # Connections are opened from each address in turn (a per-address cap then holds
        # each address to its share, not the attack).
        self.addresses = itertools.cycle(addresses)
        self.held: list[Held] = []
        self.closed_after: dict[str, list[float]] = {kind: [] for kind in counts}
        # The answer's status seen on each socket the gateway closed, by kind.
        self.closed_with: dict[str, Counter[str]] = {kind: Counter() for kind in counts}
        self.failures: Counter[str] = Counter()

    async def connect(self, kind: str, first: bytes, drip: bool) -> None:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if self.rcvbuf is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            sock.setblocking(False)
            sock.bind((next(self.addresses), 0))
            await asyncio.wait_for(loop.sock_connect(sock, (self.attack.host, self.attack.port)), 5)
            if first:
                await asyncio.wait_for(loop.sock_sendall(sock, first), 5)
        except (OSError, TimeoutError) as error:
            sock.close()
            self.failures[getattr(error, "strerror", None) or type(error).__name__] += 1
            return
        self.held.append(Held(sock, kind, time.monotonic(), drip))

    def sweep(self) -> Counter[str]:
        """Close our side of sockets the gateway closed; how many of each kind are gone."""
        poller = select.poll()
        by_fd = {h.sock.fileno(): h for h in self.held}
        for fd in by_fd:
            poller.register(fd, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        gone: Counter[str] = Counter()
        for fd, _ in poller.poll(0):
            held = by_fd[fd]
            self.closed_with[held.kind][self.answer(held.sock) or "no answer"] += 1
            self.closed_after[held.kind].append(time.monotonic() - held.opened)
            gone[held.kind] += 1
            held.sock.close()
        self.held = [h for h in self.held if h.sock.fileno() != -1]
        return gone

    @staticmethod
    def answer(sock: socket.socket) -> str:
        """The status of whatever answer waits unread on the socket ('' if none)."""
        try:
            start = sock.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except OSError:
            return ""
        parts = start.split(b" ", 2)
        return parts[1].decode("latin-1") if start.startswith(b"HTTP/") and len(parts) > 1 else ""

    def drip(self) -> None:
        for held in self.held:
            if held.drip:
                with contextlib.suppress(OSError):  # full or closed: the sweep sees it
                    held.sock.send(b"a")

    def report(self) -> None:
        """Outcomes for the table; then every socket is closed."""
        still: dict[str, Counter[str]] = {kind: Counter() for kind in self.counts}
        for held in self.held:
            still[held.kind][self.answer(held.sock) or "no answer"] += 1
        for kind in self.counts:
            closed = self.closed_after[kind]
            if closed:
                how = _counts(self.closed_with[kind])
                after = statistics.median(closed)
                label = f"{kind}: closed by the gateway ({how}; median {after:.2f} s after opening)"
                self.attack.outcomes[label] += len(closed)
            if still[kind]:
                label = f"{kind}: open at the end ({_counts(still[kind])})"
                self.attack.outcomes[label] += sum(still[kind].values())
        if self.failures:
            self.attack.notes["connect failures"] = dict(self.failures)
        for held in self.held:
            held.sock.close()
        self.held = []

    async def hold(
        self, openers: Mapping[str, Callable[[], Awaitable[None]]], start: Start, on: On
    ) -> None:
        await start()
        for kind, count in self.counts.items():
            await asyncio.gather(*(openers[kind]() for _ in range(count)))
        self.attack.notes["opened"] = len(self.held)
        on()
        gone: Counter[str] = Counter()
        reopened = 0
        for tick in itertools.count(1):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.attack.stopping.wait(), self.SWEEP_S)
                break
            gone += self.sweep()
            if tick % round(1 / self.SWEEP_S):
                continue
            # Once a second: a byte more on the slow ones, and the closed ones replaced
            # (the pressure stays, at most one new connection a second for each).
            self.drip()
            for kind, count in gone.items():
                reopened += count
                await asyncio.gather(*(openers[kind]() for _ in range(count)))
            gone.clear()
        self.sweep()
        self.attack.notes["reopened"] = reopened
        self.report()


def _counts(counter: Counter[str]) -> str:
    """ "429 x300, no answer x2" """
    return ", ".join(f"{label} x{count}" for label, count in counter.most_common())


async def attack_unread(attack: Attack, start: Start, on: On) -> None:
    """Streams whose client never reads a byte (a 4 KiB receive buffer): the gateway's
    writes stall, and with them its upstream connections. From ``addresses`` client
    addresses (127.0.0.2 onwards), of ``model`` (a paced one trickles: it never fills
    the gateway's send buffer)."""
    count = int(attack.params["connections"])
    addresses = [f"127.0.0.{2 + n}" for n in range(int(attack.params.get("addresses", 1)))]
    model = str(attack.params.get("model", "abuse-endless"))
    holder = Holder(attack, {"unread": count}, rcvbuf=4096, addresses=addresses)
    numbers = itertools.count()

    async def opener() -> None:
        body = json.dumps(
            {
                "model": model,
                "stream": True,
                "messages": [{"role": "user", "content": "tell me everything"}],
            }
        ).encode()
        head = attack.head(len(body), session=f"unread-{next(numbers)}")
        await holder.connect("unread", head + body, drip=False)

    await holder.hold({"unread": opener}, start, on)


async def attack_slow(attack: Attack, start: Start, on: On) -> None:
    """A third each: a head that never ends (a byte a second), a body that never ends (a
    byte a second of 1 MB announced), a connection that sends nothing."""
    count = int(attack.params["connections"])
    counts = {"slow header": count // 3, "slow body": count // 3}
    counts["idle"] = count - sum(counts.values())
    holder = Holder(attack, counts, rcvbuf=None)
    numbers = itertools.count()
    header_start = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {attack.host}\r\nX-Slow: "
    ).encode()

    async def slow_header() -> None:
        await holder.connect("slow header", header_start, drip=True)

    async def slow_body() -> None:
        head = attack.head(1_000_000, session=f"slow-{next(numbers)}")
        await holder.connect("slow body", head + b'{"model": "', drip=True)

    async def idle() -> None:
        await holder.connect("idle", b"", drip=False)

    openers = {"slow header": slow_header, "slow body": slow_body, "idle": idle}
    await holder.hold(openers, start, on)


ATTACKS: dict[str, Callable[[Attack, Start, On], Awaitable[None]]] = {
    "big": attack_big,
    "png": attack_png,
    "many": attack_many,
    "words": attack_words,
    "upstream": attack_upstream,
    "flood": attack_flood,
    "unread": attack_unread,
    "slow": attack_slow,
}


async def attacker(job: dict[str, Any]) -> dict[str, Any]:
    """One attack, from ``go`` until ``stop``; how the gateway answered it."""
    attack = Attack(job["host"], int(job["port"]), job["key"], job["params"])
    attack.notes["nofile soft limit"] = raise_nofile()
    go = asyncio.Event()

    async def lines() -> None:
        await next_line()
        go.set()
        await next_line()  # "stop", or '' if the bench is gone
        attack.stopping.set()

    async def start() -> None:
        say("prepared")
        await go.wait()

    watcher = asyncio.create_task(lines())
    started = time.monotonic()
    await ATTACKS[job["attack"]](attack, start, lambda: say("ready"))
    watcher.cancel()
    return {
        "outcomes": dict(attack.outcomes),
        "notes": attack.notes,
        "elapsed_s": time.monotonic() - started,
        "median_request_s": statistics.median(attack.durations) if attack.durations else None,
        "mean_dropped_mb": statistics.mean(attack.received) / 1e6 if attack.received else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("victims", "attack"), required=True)
    args = parser.parse_args(argv)
    job = json.loads(sys.stdin.readline())
    runner = victims if args.role == "victims" else attacker
    raise_nofile()
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(runner(job))
    else:
        result = uvloop.run(runner(job))
    say(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
