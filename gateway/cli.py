"""``memory-gateway serve | check-config``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Sequence

import uvicorn

from gateway.config import ConfigError, Settings, load_settings

log = logging.getLogger("gateway")


async def _serve(settings: Settings, host: str, port: int) -> None:
    # Imported here: `check-config` must not need the server's dependencies loaded.
    from gateway.app import create_app
    from gateway.proxy.upstream import Upstream
    from gateway.store.embedded import EmbeddedRedis
    from gateway.store.redis_store import RedisStore, create_client
    from gateway.tokens import TokenCounter

    embedded = EmbeddedRedis(settings.redis.data_dir) if settings.redis.url == "embedded" else None
    url = embedded.url if embedded is not None else settings.redis.url
    timeout_s = settings.redis.timeout_ms / 1000
    # Clients connect lazily: creating them before the embedded server is up is fine.
    store = RedisStore(
        create_client(url, timeout_s=timeout_s, max_connections=settings.redis.max_connections),
        timeout_s=timeout_s,
        retention_s=int(settings.redis.retention_days * 86400),
    )
    upstream = Upstream(settings.upstream)

    @contextlib.asynccontextmanager
    async def resources() -> AsyncIterator[None]:
        if embedded is not None:
            await embedded.start()
        try:
            yield
        finally:
            await upstream.aclose()
            await store.close()
            if embedded is not None:
                await embedded.stop()

    app = create_app(
        settings, upstream=upstream, store=store, tokenizer=TokenCounter(), resources=resources()
    )
    # Access logs carry method, path and status only: never bodies or headers.
    config = uvicorn.Config(app, host=host, port=port, log_level=settings.server.log_level)
    await uvicorn.Server(config).serve()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memory-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", default="config/gateway.yaml", help="YAML configuration file")
    serve.add_argument("--host", help="listen address (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default: server.port, 8080)")
    check = commands.add_parser("check-config", help="validate a configuration file and exit")
    check.add_argument("file")
    args = parser.parse_args(argv)

    path = args.config if args.command == "serve" else args.file
    try:
        settings = load_settings(path)
    except ConfigError as error:
        print(f"memory-gateway: invalid configuration: {error}", file=sys.stderr)
        return 2
    if args.command == "check-config":
        print(f"{path}: OK (preset {settings.memory.preset}, redis {settings.redis.url})")
        return 0

    logging.basicConfig(
        level=settings.server.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # httpx logs every request line at INFO: one line per chat message is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the normal way to stop
        asyncio.run(
            _serve(settings, args.host or settings.server.host, args.port or settings.server.port)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
