"""The request id, the access line's fields, the log formats, and the middleware's line."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.app import _Gateway
from gateway.observability import metrics, request_log
from gateway.observability.request_log import (
    JsonFormatter,
    RequestIdFilter,
    TextFormatter,
    current_request_id,
    note,
    request_id_from,
)

GENERATED = re.compile(r"req_[0-9a-f]{24}")


def headers(value: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"host", b"x"), (b"x-request-id", value), (b"accept", b"*/*")]


@pytest.mark.parametrize(
    "value", [b"abc", b"A-Z.a_z:0-9", b"x" * 128, b"0", b"01HZX8J1T9:trace.span-1"]
)
def test_a_plain_client_request_id_is_honoured(value: bytes) -> None:
    assert request_id_from(headers(value)) == value.decode()


@pytest.mark.parametrize(
    "value",
    [b"", b"x" * 129, b"has space", b'quote"d', b"new\nline", b"caf\xc3\xa9", b"a/b", b"{}"],
)
def test_an_unusable_client_request_id_is_replaced(value: bytes) -> None:
    assert GENERATED.fullmatch(request_id_from(headers(value)))


def test_without_a_client_id_each_request_gets_a_new_one() -> None:
    ids = {request_id_from([(b"host", b"x")]) for _ in range(1000)}
    assert len(ids) == 1000
    assert all(GENERATED.fullmatch(i) for i in ids)


def test_fields_are_noted_only_inside_a_logged_request() -> None:
    note(status_text="nobody listens")  # outside a request: nothing, no error
    request_log.after_response(lambda: pytest.fail("never run"))
    assert current_request_id() is None and not request_log.collecting()
    entry, token = request_log.begin(headers(b"r-1"), logged=True)
    try:
        assert current_request_id() == "r-1" and request_log.collecting()
        note(session_id="s", tokens_in=3)
        note(tokens_in=4)
        assert entry.fields == {"session_id": "s", "tokens_in": 4}
    finally:
        request_log.end(token)
    assert current_request_id() is None
    entry, token = request_log.begin(headers(b"r-2"), logged=False)
    try:
        note(session_id="s")  # no access line: nothing kept, the id still known
        assert entry.fields is None and current_request_id() == "r-2"
        assert not request_log.collecting()
    finally:
        request_log.end(token)


async def test_the_request_reaches_the_tasks_it_starts_and_their_notes_reach_it() -> None:
    entry, token = request_log.begin([], logged=True)
    try:

        async def child() -> str | None:
            note(tokens_out=7)
            return current_request_id()

        assert await asyncio.create_task(child()) == entry.request_id
        assert entry.fields == {"tokens_out": 7}
    finally:
        request_log.end(token)


def record(msg: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord(
        "gateway.routes.memory_proxy", logging.WARNING, __file__, 1, msg, args, None
    )
    made.__dict__.update(extra)
    return made


def test_the_filter_puts_the_request_id_on_records_made_while_serving() -> None:
    filter_ = RequestIdFilter()
    outside = record("x")
    assert filter_.filter(outside) and "request_id" not in outside.__dict__
    _, token = request_log.begin(headers(b"req-9"), logged=True)
    try:
        inside = record("y")
        assert filter_.filter(inside) and inside.__dict__["request_id"] == "req-9"
        own = record("z", request_id="other")  # the access line names its own
        assert filter_.filter(own) and own.__dict__["request_id"] == "other"
    finally:
        request_log.end(token)


def test_a_json_line_is_one_object_with_the_records_fields() -> None:
    line = JsonFormatter().format(
        record("answered %s", "x", request_id="r-1", tiers={"window": 3}, color_message="\x1b[1m")
    )
    assert "\n" not in line
    data = json.loads(line)
    assert list(data)[:4] == ["time", "level", "logger", "message"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", data["time"])
    assert data["level"] == "WARNING" and data["logger"] == "gateway.routes.memory_proxy"
    assert data["message"] == "answered x"
    assert data["request_id"] == "r-1" and data["tiers"] == {"window": 3}
    assert "color_message" not in data  # uvicorn's coloured copy of the message
    for attribute in ("args", "msg", "pathname", "lineno", "levelno", "created", "thread"):
        assert attribute not in data


def test_an_exception_is_one_field_of_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        made = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), _exc_info())
    line = JsonFormatter().format(made)
    assert "\n" not in line
    data = json.loads(line)
    assert "ValueError: boom" in data["exc_info"] and "Traceback" in data["exc_info"]


def _exc_info() -> tuple[type[BaseException], BaseException, object]:
    import sys

    kind, error, trace = sys.exc_info()
    assert kind is not None and error is not None
    return kind, error, trace


def test_text_keeps_the_plain_format_and_appends_the_fields() -> None:
    formatter = TextFormatter()
    plain = formatter.format(record("memory degraded: %s", "timeout"))
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING gateway\.routes\.memory_proxy "
        r"memory degraded: timeout",
        plain,
    )
    line = formatter.format(record("POST %s", "/v1", request_id="r-1", tiers={"window": 3}))
    assert line.endswith(' POST /v1 request_id=r-1 tiers={"window":3}')


def test_the_logging_config_routes_uvicorn_through_the_gateways_handler() -> None:
    config = request_log.logging_config("debug", "text")
    assert config["root"] == {"level": "DEBUG", "handlers": ["stderr"]}
    assert config["handlers"]["stderr"]["formatter"] == "text"
    assert config["handlers"]["stderr"]["filters"] == ["request_id"]
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        assert config["loggers"][name] == {"handlers": [], "propagate": True}
    assert request_log.logging_config("info", "json")["handlers"]["stderr"]["formatter"] == "json"


# --- the middleware ---


def _app(*, access_log: bool = True, metrics_on: bool = True) -> Starlette:
    async def item(request: Request) -> Response:
        timer = metrics.timer(request.scope)
        timer.upstream_sent()
        timer.upstream_answered()
        note(session_id="s-1", tokens_in=12)
        return PlainTextResponse(
            "ok",
            headers={"x-request-id": "upstream-7", "x-memory-status": "ok",
                     "x-gateway-request-id": "an-upstream-gateways-id"},
        )  # fmt: skip

    async def stream(request: Request) -> Response:
        sent: list[bytes] = []

        async def body() -> AsyncIterator[bytes]:
            for part in (b"one ", b"two"):
                yield part
                sent.append(part)
                await asyncio.sleep(0.05)
            note(tokens_out=2)  # known only after the last byte

        # Work only the line needs: done once the response is out, before the line.
        request_log.after_response(lambda: note(deferred=b"".join(sent).decode()))
        return StreamingResponse(body())

    async def broken(request: Request) -> Response:
        raise RuntimeError("boom")

    # The gateway's app: the middleware outside Starlette's error middleware.
    return _Gateway(
        metrics=metrics_on,
        access_log=access_log,
        routes=[Route("/items/{item_id}", item), Route("/stream", stream),
                Route("/broken", broken)],
    )  # fmt: skip


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="gateway.access")
    yield caplog


def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [
        json.loads(JsonFormatter().format(r)) for r in caplog.records if r.name == "gateway.access"
    ]


def test_every_response_carries_the_id_of_its_one_access_line(
    access: pytest.LogCaptureFixture,
) -> None:
    with TestClient(_app(), raise_server_exceptions=False) as client:
        ok = client.get("/items/secret-item", headers={"X-Request-Id": "client-1"})
        failed = client.get("/broken")
        missing = client.get("/nowhere", headers={"X-Request-Id": "bad id"})
    assert ok.headers["x-gateway-request-id"] == "client-1"
    # The upstream's own id passes unchanged; another gateway's id is not ours.
    assert ok.headers["x-request-id"] == "upstream-7"
    assert ok.headers.get_list("x-gateway-request-id") == ["client-1"]
    assert GENERATED.fullmatch(failed.headers["x-gateway-request-id"])
    assert GENERATED.fullmatch(missing.headers["x-gateway-request-id"])
    found = lines(access)
    assert [(line["request_id"], line["route"], line["status"]) for line in found] == [
        ("client-1", "/items/{item_id}", 200),
        (failed.headers["x-gateway-request-id"], "/broken", 500),
        (missing.headers["x-gateway-request-id"], "unmatched", 404),
    ]
    first = found[0]
    assert first["method"] == "GET" and first["message"] == "GET /items/{item_id} 200"
    assert first["session_id"] == "s-1" and first["tokens_in"] == 12
    assert first["upstream_request_id"] == "upstream-7" and first["memory_status"] == "ok"
    assert isinstance(first["duration_ms"], float) and isinstance(first["added_ms"], float)
    assert 0 <= first["added_ms"] <= first["duration_ms"]  # type: ignore[operator]
    assert "added_ms" not in found[2] and "upstream_ms" not in found[2]
    assert "secret-item" not in json.dumps(found)  # the route template, never the path


def test_a_streams_line_is_written_after_its_last_byte(access: pytest.LogCaptureFixture) -> None:
    with TestClient(_app()) as client:
        response = client.get("/stream")
    assert response.text == "one two"
    (line,) = lines(access)
    assert line["tokens_out"] == 2 and line["duration_ms"] >= 100  # type: ignore[operator]
    assert line["deferred"] == "one two"


@pytest.mark.parametrize("metrics_on", [True, False])
def test_without_the_access_log_the_id_is_still_returned(
    access: pytest.LogCaptureFixture, metrics_on: bool
) -> None:
    with TestClient(_app(access_log=False, metrics_on=metrics_on)) as client:
        response = client.get("/items/1", headers={"X-Request-Id": "quiet-1"})
    assert response.headers["x-gateway-request-id"] == "quiet-1"
    assert lines(access) == []
