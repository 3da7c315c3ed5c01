"""The private third-party APIs fenced in ``gateway.compat``: each module's version check,
and what the gateway reads of each library, checked on the installed version."""

from __future__ import annotations

import asyncio
import inspect
import re
import socket
import tomllib
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import tiktoken_ext.openai_public
from aiohttp.base_protocol import BaseProtocol
from starlette.responses import StreamingResponse
from starlette.routing import Route

from gateway.compat import aiohttp as compat_aiohttp
from gateway.compat import starlette as compat_starlette
from gateway.compat import tiktoken as compat_tiktoken
from gateway.compat import uvicorn as compat_uvicorn
from gateway.compat import versions
from gateway.compat import wordllama as compat_wordllama

MODULES = [compat_aiohttp, compat_starlette, compat_tiktoken, compat_uvicorn, compat_wordllama]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("3.14.5", (3, 14, 5)), ("0.30.0rc1", (0, 30, 0)), ("1.0", (1, 0)), (" 8 ", (8,))],
)
def test_versions_are_read_by_their_release_numbers(text: str, parsed: tuple[int, ...]) -> None:
    assert versions.parse(text) == parsed


@pytest.mark.parametrize("installed", ["3.11.18", "3.15.0", "4.0.0", "3.15.0a1"])
def test_a_version_outside_the_tested_range_is_refused_naming_the_range(installed: str) -> None:
    with pytest.raises(RuntimeError) as refused:
        versions.check("aiohttp", installed, (3, 12), (3, 15), uses="its internals")
    message = str(refused.value)
    assert "aiohttp >= 3.12, < 3.15" in message and f"aiohttp {installed} is installed" in message


@pytest.mark.parametrize("installed", ["3.12.0", "3.12.0rc1", "3.14.99"])
def test_a_version_inside_the_tested_range_passes(installed: str) -> None:
    versions.check("aiohttp", installed, (3, 12), (3, 15), uses="its internals")


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_the_installed_versions_are_in_the_tested_ranges(module: Any) -> None:
    low, high = module.TESTED
    assert low <= versions.parse(module.VERSION) < high


def test_the_installed_distribution_is_read_from_its_metadata(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(versions.importlib.metadata, "version", lambda name: "0.1.0")
    with pytest.raises(RuntimeError, match=r"uvicorn >= 0\.30, < 0\.55 .* uvicorn 0\.1\.0"):
        versions.require("uvicorn", (0, 30), (0, 55), uses="x")


# aiohttp


def test_aiohttp_writer_drain_limit_is_read_from_aiohttp() -> None:
    assert compat_aiohttp.WRITE_DRAIN_BYTES == 0x10000


async def test_a_session_without_retries() -> None:
    session = compat_aiohttp.without_retries(aiohttp.ClientSession())
    try:
        assert session._retry_connection is False
    finally:
        await session.close()


def test_a_renamed_private_name_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiohttp.ClientSession, "ATTRS", frozenset())
    with pytest.raises(RuntimeError, match="_retry_connection"):
        compat_aiohttp.check_private_names()


async def test_the_bytes_of_a_broken_stream_are_taken_from_the_reader() -> None:
    protocol = BaseProtocol(asyncio.get_running_loop())
    reader = aiohttp.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
    reader.feed_data(b"data: one\n\n")
    reader.feed_data(b"data: tw")
    reader.set_exception(aiohttp.ClientPayloadError("broken"))
    with pytest.raises(aiohttp.ClientPayloadError):
        await reader.readany()
    assert compat_aiohttp.take_buffered(reader) == b"data: one\n\ndata: tw"
    assert compat_aiohttp.take_buffered(reader) == b""


# uvicorn


async def test_the_uvicorn_protocol_state_the_gateway_reads() -> None:
    """A real httptools protocol on a real socket, in the middle of a request."""
    release = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await release.wait()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    config = compat_uvicorn.Config(app, lifespan="off", http="httptools", log_level="error")
    config.load()
    state = compat_uvicorn.ServerState()
    protocol = compat_uvicorn.HttpToolsProtocol(config, state, {})
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    await loop.connect_accepted_socket(lambda: protocol, ours)
    theirs.setblocking(False)
    try:
        await loop.sock_sendall(theirs, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        for _ in range(100):
            if protocol.cycle is not None:
                break
            await asyncio.sleep(0.01)
        assert protocol.transport is not None and protocol.loop is loop
        assert protocol.logger is not None and isinstance(state.default_headers, list)
        assert protocol.flow.read_paused is False and callable(protocol.flow.pause_reading)
        cycle = protocol.cycle
        assert (cycle.response_started, cycle.response_complete) == (False, False)
        assert cycle.keep_alive is True and cycle.disconnected is False
        assert isinstance(cycle.message_event, asyncio.Event)
        release.set()
        answer = await asyncio.wait_for(loop.sock_recv(theirs, 4096), 5)
        assert answer.startswith(compat_uvicorn.STATUS_LINE[204])
    finally:
        release.set()
        theirs.close()
        protocol.transport.close()
        await asyncio.sleep(0)


def test_the_uvicorn_hooks_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(compat_uvicorn.HttpToolsProtocol, "on_message_begin")
    with pytest.raises(RuntimeError, match="on_message_begin"):
        compat_uvicorn.check_hooks()


# starlette


async def test_a_streamed_body_is_sent_whole_and_alone() -> None:
    async def body() -> Any:
        yield b"one"
        yield b"two"

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await compat_starlette.stream_body(StreamingResponse(body(), status_code=201), send)
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 3
    assert sent[0]["status"] == 201
    assert [m.get("body") for m in sent[1:]] == [b"one", b"two", b""]


def test_the_matched_route_names_the_request() -> None:
    route = Route("/v1/chat/completions", lambda request: None)
    assert compat_starlette.matched_path({"route": route}) == "/v1/chat/completions"
    assert compat_starlette.matched_path({}) is None


def test_the_outermost_middleware_wraps_the_error_middleware() -> None:
    wrapped: list[Any] = []

    class App(compat_starlette.OutermostStarlette):
        def outermost(self, app: Any) -> Any:
            wrapped.append(app)
            return app

    stack = App().build_middleware_stack()
    assert wrapped == [stack] and type(stack).__name__ == "ServerErrorMiddleware"


def test_the_starlette_methods_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(StreamingResponse, "stream_response")
    with pytest.raises(RuntimeError, match="stream_response"):
        compat_starlette.check_methods()


# tiktoken


@pytest.mark.parametrize("name", sorted(compat_tiktoken.ENCODING_URLS))
def test_the_encoding_urls_are_tiktokens_own(name: str) -> None:
    """The cache file is named by the URL tiktoken downloads from: a moved file would
    never be found in the cache, and the offline encoding would be used silently."""
    source = inspect.getsource(getattr(tiktoken_ext.openai_public, name))
    assert f'"{compat_tiktoken.ENCODING_URLS[name]}"' in source


# wordllama


def test_wordllama_s_files_are_where_the_gateway_reads_them() -> None:
    from safetensors import safe_open

    directory = compat_wordllama.package_dir()
    assert directory is not None and (directory / "__init__.py").is_file()
    files = compat_wordllama.files(directory)
    with safe_open(str(files.weights), framework="np") as weights:
        assert weights.get_slice(compat_wordllama.TABLE).get_shape()[1] >= 128
    assert files.tokenizer.read_text().lstrip().startswith("{")


def test_wordllama_is_found_without_being_imported() -> None:
    # In a process of its own: another test of this one may have imported wordllama.
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from gateway.compat import wordllama\n"
        "assert wordllama.package_dir() is not None\n"
        "assert 'wordllama' not in sys.modules, 'wordllama was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_moved_wordllama_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "tokenizers").mkdir()
    (tmp_path / compat_wordllama.TOKENIZER).write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"has no weights/l2_supercat_256\.safetensors"):
        compat_wordllama.files(tmp_path)


# the pins


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_the_projects_pins_are_the_tested_ranges(module: Any) -> None:
    """pip must not install a version the gateway then refuses to start with."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = module.__name__.rsplit(".", 1)[1]
    (pin,) = [d for d in project["dependencies"] if re.match(rf"{name}\b(\[.*\])?[<>=]", d)]
    low, high = module.TESTED
    assert pin.endswith(f">={versions.shown(low)},<{versions.shown(high)}"), pin
