"""``memory-gateway serve | worker | check-config``, and the operator commands of ``commands/``
(``import | export | inspect | sessions``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.metadata
import logging
import logging.config
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette

from gateway import commands as operator_commands
from gateway.config import ConfigError, Settings, load_settings
from gateway.http import gc_tuning as collector
from gateway.http import open_files
from gateway.http.server import BoundedHeadProtocol, ClientLimits, with_mapped_forms
from gateway.observability.metrics import MULTIPROC_ENV
from gateway.observability.request_log import logging_config
from gateway.service.worker import Worker
from gateway.store.embedded import EmbeddedRedis
from gateway.wiring import build_clients

log = logging.getLogger("gateway")

# What --help opens with: for the person running the command (the module's docstring is
# for the person reading the code).
DESCRIPTION = (
    "An OpenAI-compatible proxy that gives chat applications long-conversation memory. "
    "Run it with `serve`; the other commands manage it and the memory it keeps."
)


def _redis(settings: Settings) -> tuple[EmbeddedRedis | None, str]:
    if settings.redis.url != "embedded":
        return None, settings.redis.url
    embedded = EmbeddedRedis(settings.redis.data_dir)
    return embedded, embedded.url


def _run(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop (uvicorn's own choice with ``--workers``): its event loop and sockets
    are C, and the gateway is bound by them. Plain asyncio where uvloop is not installed."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main)


async def _serve(settings: Settings, host: str, port: int) -> None:
    embedded, url = _redis(settings)
    # Clients connect lazily: creating them before the embedded server is up is fine.
    clients = build_clients(settings, url)

    @contextlib.asynccontextmanager
    async def resources() -> AsyncIterator[None]:
        if embedded is not None:
            await embedded.start()
        collector.tune_for_serving()
        open_files.raise_to_hard_limit()
        try:
            yield
        finally:
            await clients.aclose()
            if embedded is not None:
                await embedded.stop()

    app = clients.create_app(settings, resources=resources())
    await uvicorn.Server(uvicorn.Config(app, **_server_options(settings, host, port))).serve()


def _server_options(settings: Settings, host: str, port: int) -> dict[str, Any]:
    # httptools, with the head bounded by server.max_header_bytes and a client's time
    # and connections bounded (see http/server.py).
    # Logging as main() sets it up, in every worker process too; uvicorn's access line is
    # off: the gateway's own (gateway.access, server.access_log) replaces it.
    return {
        "host": host,
        "port": port,
        "log_level": settings.server.log_level,
        "log_config": logging_config(settings.server.log_level, settings.server.log_format),
        "access_log": False,
        # A client's address is the socket's, unless it comes through a proxy named in
        # server.trusted_proxies: an X-Forwarded-For from anyone else is not believed.
        "proxy_headers": bool(settings.server.trusted_proxies),
        "forwarded_allow_ips": ",".join(with_mapped_forms(settings.server.trusted_proxies)) or None,
        **protocol_options(settings),
    }


def protocol_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the gateway's HTTP protocol (``serve``'s, and the test
    suite's in-process gateways')."""
    return {
        # The protocol's own bounds on a client (see http/server.py). A partial, not a
        # subclass made here: ``--workers`` pickles the options to each process.
        "http": functools.partial(BoundedHeadProtocol, limits=_client_limits(settings)),
        "h11_max_incomplete_event_size": settings.server.max_header_bytes,
        "timeout_keep_alive": settings.server.keepalive_s,
    }


def _client_limits(settings: Settings) -> ClientLimits:
    server = settings.server
    return ClientLimits(
        header_timeout_s=server.header_timeout_s,
        body_timeout_s=server.body_timeout_s,
        write_timeout_s=server.client_write_timeout_s,
        min_read_bytes_s=server.client_min_read_bytes_s,
        max_connections_per_client=server.max_connections_per_client,
        trusted_proxies=tuple(server.trusted_proxies),
    )


# How ``serve --workers N`` tells its worker processes which configuration to load.
_CONFIG_ENV = "MEMORY_GATEWAY_CONFIG_FILE"


def worker_app() -> Starlette:
    """The app of one ``serve --workers N`` process (a uvicorn factory)."""
    settings = load_settings(os.environ[_CONFIG_ENV])
    clients = build_clients(settings, settings.redis.url)

    @contextlib.asynccontextmanager
    async def resources() -> AsyncIterator[None]:
        collector.tune_for_serving()
        open_files.raise_to_hard_limit()
        try:
            yield
        finally:
            await clients.aclose()

    return clients.create_app(settings, resources=resources())


@contextlib.contextmanager
def _shared_metrics_dir() -> Iterator[None]:
    """The directory where the workers' metrics meet, empty when they start.

    Values left by an earlier run would be summed into this one's (counters would jump).
    Without ``PROMETHEUS_MULTIPROC_DIR`` a private directory is made and removed after.
    """
    given = os.environ.get(MULTIPROC_ENV)
    path = Path(given) if given else Path(tempfile.mkdtemp(prefix="memory-gateway-metrics-"))
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    try:
        yield
    finally:
        if not given:
            shutil.rmtree(path, ignore_errors=True)
            del os.environ[MULTIPROC_ENV]


WORKER_HEALTHCHECK_S = 30


def _serve_workers(
    settings: Settings, config_file: str, host: str, port: int, workers: int
) -> None:
    if settings.redis.url == "embedded":
        raise ConfigError(
            "redis.url: several workers need an external Redis (redis://…), "
            "the embedded one is private to one process"
        )
    os.environ[_CONFIG_ENV] = os.path.abspath(config_file)
    with _shared_metrics_dir():
        uvicorn.run(
            "gateway.cli:worker_app",
            factory=True,
            workers=workers,
            # uvicorn kills and restarts a worker that does not answer its ping within
            # this: at its default (5 s), workers still importing on a loaded machine were
            # killed and restarted, again and again.
            timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
            **_server_options(settings, host, port),
        )


async def _work(settings: Settings) -> None:
    if settings.redis.url == "embedded":
        raise ConfigError(
            "redis.url: a separate worker needs an external Redis (redis://…), "
            "the embedded one is private to its gateway"
        )
    clients = build_clients(settings, settings.redis.url)
    runner = clients.runner(settings)
    worker = Worker.from_config(clients.job_store, runner, settings.worker)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("worker %s consuming jobs", worker.consumer)
    try:
        await worker.run(stop)
    finally:
        await clients.aclose()


def _version() -> str:
    try:
        return importlib.metadata.version("memory-gateway")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree not installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memory-gateway", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", default="config/gateway.yaml", help="YAML configuration file")
    serve.add_argument("--host", help="listen address (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default: server.port, 8080)")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes sharing the port (more than 1 needs an external Redis)",
    )
    work = commands.add_parser("worker", help="run summarization jobs (scale out)")
    work.add_argument("--config", default="config/gateway.yaml", help="YAML configuration file")
    check = commands.add_parser("check-config", help="validate a configuration file and exit")
    check.add_argument("file")
    check.add_argument(
        "--connect",
        action="store_true",
        help="also reach Redis (PING) and the upstream (GET /models); exit 1 if one fails",
    )
    operator_commands.add_commands(commands)  # import, export, inspect, sessions, facts, search
    args = parser.parse_args(argv)
    if args.command in operator_commands.COMMANDS:
        return operator_commands.run(args)

    path = args.file if args.command == "check-config" else args.config
    try:
        settings = load_settings(path)
    except ConfigError as error:
        print(f"memory-gateway: invalid configuration: {error}", file=sys.stderr)
        return 2
    if args.command == "check-config":
        redis = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", settings.redis.url)  # no password
        print(f"{path}: OK (preset {settings.memory.preset}, redis {redis})")
        if not args.connect:
            return 0
        from gateway.commands.connect import connection_checks  # httpx: only when asked

        checks = connection_checks(settings)
        for result in checks:
            print(result.line())
        return 0 if all(result.ok for result in checks) else 1

    # server.log_format: JSON lines (or text) on stderr, each with the request's id.
    logging.config.dictConfig(logging_config(settings.server.log_level, settings.server.log_format))
    logging.captureWarnings(True)  # a warning is a log line too, not free text on stderr
    if args.command == "worker":
        try:
            _run(_work(settings))
        except ConfigError as error:
            print(f"memory-gateway: invalid configuration: {error}", file=sys.stderr)
            return 2
        return 0
    host, port = args.host or settings.server.host, args.port or settings.server.port
    if args.workers > 1:
        try:
            _serve_workers(settings, args.config, host, port, args.workers)
        except ConfigError as error:
            print(f"memory-gateway: invalid configuration: {error}", file=sys.stderr)
            return 2
        return 0
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the normal way to stop
        _run(_serve(settings, host, port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
