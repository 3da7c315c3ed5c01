"""A real TCP proxy in front of a server, for network faults a stopped process cannot make.

``delay_s`` holds every chunk the server sends for that long before the client gets it (a
slow or far-away Redis); ``black_hole`` holds everything in both directions on every
connection, old and new, while it is set (a partition: connections accept and then
silence). Both can change while clients are connected. Chunks keep their order.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

from devsupport.servers import free_port

_CHUNK = 64 * 1024


class TcpProxy:
    """Listens on a free 127.0.0.1 port and forwards to ``target_port``, in its own thread."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.delay_s = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._flowing: asyncio.Event | None = None  # cleared while black-holed
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def black_hole(self) -> bool:
        return self._flowing is not None and not self._flowing.is_set()

    @black_hole.setter
    def black_hole(self, on: bool) -> None:
        assert self._loop is not None and self._flowing is not None, "start the proxy first"
        self._loop.call_soon_threadsafe(self._flowing.clear if on else self._flowing.set)
        # Returns once the proxy loop has applied it: the caller's next request sees it.
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._loop).result(5)

    def start(self) -> TcpProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("tcp proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(10)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._flowing = asyncio.Event()
        self._flowing.set()
        connections: set[asyncio.Task[None]] = set()

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.ensure_future(self._connection(reader, writer))
            connections.add(task)
            task.add_done_callback(connections.discard)

        server = await asyncio.start_server(accept, "127.0.0.1", self.port)
        self._ready.set()
        async with server:
            await self._stopped.wait()
        for task in list(connections):
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)

    async def _connection(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:
            client_writer.close()  # the server is down: refuse, as it would
            return
        pumps = [
            asyncio.ensure_future(self._pump(client_reader, server_writer, delayed=False)),
            asyncio.ensure_future(self._pump(server_reader, client_writer, delayed=True)),
        ]
        try:
            # Either side closing ends the connection, as a plain TCP path would.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for writer in (client_writer, server_writer):
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, delayed: bool
    ) -> None:
        """Read as fast as data comes; forward each chunk when its delay is over."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        forwarder = asyncio.ensure_future(self._forward(queue, writer))
        try:
            while chunk := await reader.read(_CHUNK):
                release = time.monotonic() + (self.delay_s if delayed else 0.0)
                queue.put_nowait((release, chunk))
            queue.put_nowait((0.0, b""))  # end of stream, after what is queued
            await forwarder
        finally:
            forwarder.cancel()

    async def _forward(
        self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
    ) -> None:
        while True:
            release, chunk = await queue.get()
            if not chunk:
                return
            await asyncio.sleep(max(release - time.monotonic(), 0.0))
            assert self._flowing is not None
            await self._flowing.wait()
            writer.write(chunk)
            await writer.drain()


@contextlib.contextmanager
def proxy_to(target_port: int) -> Iterator[TcpProxy]:
    proxy = TcpProxy(target_port).start()
    try:
        yield proxy
    finally:
        proxy.stop()
