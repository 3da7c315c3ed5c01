"""The request being served: its id, the fields of its access line, and the log format.

A context variable holds the request's ``RequestLog``, so that code deep in the request
path can name the request without it being passed down (the turn's record stores its
receipt under this id) and add fields to the request's one access line (``note``). The
object is shared, not copied, by the tasks the request starts: a field noted in any of
them (the streamed body's task, the recording task) reaches the line.

Log output (``logging_config``): one JSON object a line (python-json-logger, with orjson)
or today's plain text; every record emitted while a request is served carries its
``request_id`` (``RequestIdFilter``). Message content is logged only by the
``gateway.content`` logger, at DEBUG; keys never are.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar, Token
from typing import Any

import orjson
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.orjson import OrjsonFormatter

# The response header that names the request. Not ``X-Request-Id``: an upstream's own
# (OpenAI's) is relayed to the client unchanged, and its SDK reads that one.
RESPONSE_HEADER = b"x-gateway-request-id"
# A client's id for its request, honoured when it is plain enough to log and echo.
CLIENT_HEADER = b"x-request-id"
_VALID_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")

ACCESS = logging.getLogger("gateway.access")
CONTENT = logging.getLogger("gateway.content")


class RequestLog:
    """One request: its id and, when it will have an access line, that line's fields."""

    __slots__ = ("after", "fields", "header", "pending", "request_id")

    def __init__(self, request_id: str, *, logged: bool = True) -> None:
        self.request_id = request_id
        self.header = request_id.encode("ascii", "replace")
        self.fields: dict[str, Any] | None = {} if logged else None
        self.after: list[Callable[[], None]] | None = None
        self.pending: list[asyncio.Future[Any]] | None = None


_CURRENT: ContextVar[RequestLog | None] = ContextVar("memory_gateway_request", default=None)


def current_request_id() -> str | None:
    """The id of the request being served (None outside a request)."""
    entry = _CURRENT.get()
    return None if entry is None else entry.request_id


def begin(
    headers: Iterable[tuple[bytes, bytes]], *, logged: bool
) -> tuple[RequestLog, Token[RequestLog | None]]:
    """Start serving a request: under the client's ``X-Request-Id`` if valid, else a new
    id; ``logged``: it will have an access line. The token ends it (``end``)."""
    entry = RequestLog(request_id_from(headers), logged=logged)
    return entry, _CURRENT.set(entry)


def end(token: Token[RequestLog | None]) -> None:
    _CURRENT.reset(token)


def new_request_id() -> str:
    """``req_`` and 24 hex digits (96 random bits)."""
    return "req_" + os.urandom(12).hex()


def request_id_from(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The id a request is logged and answered under (ASGI raw headers, lower-case names)."""
    for name, value in headers:
        if name == CLIENT_HEADER:
            if _VALID_ID.fullmatch(value) is not None:
                return value.decode("ascii")
            break
    return new_request_id()


# A client's string on a log line: its first characters, non-printable ones escaped.
CLIENT_STRING_CHARS = 64


def client_string(value: str) -> str:
    """A client-controlled string as logs show it: at most ``CLIENT_STRING_CHARS``
    characters, control and other non-printable characters escaped (``\\x1b``), so a
    "model" of a kilobyte of escape codes is neither a wall of text nor a forged line."""
    shown = value[: CLIENT_STRING_CHARS + 1]
    if not shown.isprintable():
        shown = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in shown)
    return shown if len(shown) <= CLIENT_STRING_CHARS else shown[:CLIENT_STRING_CHARS] + "…"


# What a model's name is made of (OpenAI's, Hugging Face repos, Ollama tags, Vertex
# versions): anything else in the field is not logged, whatever it holds.
_MODEL_NAME = re.compile(r"[A-Za-z0-9._:/@+-]{1,64}")


def model_field(model: str) -> str:
    """A request's ``model`` as logs show it: a model's name, or ``(not a model name)``
    (a client may put anything there, and the access line is written at INFO)."""
    return model if _MODEL_NAME.fullmatch(model) else "(not a model name)"


def user_field(user_id: str, mode: str, keyed: Callable[[str], str]) -> str:
    """A user id as logs show it (``server.log_user_ids``): a short keyed hash by default,
    so that lines about one user can be told apart without naming them."""
    if mode == "plain":
        return client_string(user_id)
    return "u-" + keyed(user_id)


def note(**fields: Any) -> None:
    """Add fields to the access line of the request being served (none: no-op)."""
    entry = _CURRENT.get()
    if entry is not None and entry.fields is not None:
        entry.fields.update(fields)


def after_response(work: Callable[[], None]) -> None:
    """Run ``work`` (which may ``note``) once the response is complete, just before the
    access line is written: what only the line needs is done off the client's time."""
    entry = _CURRENT.get()
    if entry is not None and entry.fields is not None:
        if entry.after is None:
            entry.after = [work]
        else:
            entry.after.append(work)


def wait_for(work: asyncio.Future[Any]) -> None:
    """Have the access line wait for ``work`` (running off the loop, noting its fields
    when done): the client does not wait, only the line is written later."""
    entry = _CURRENT.get()
    if entry is not None and entry.fields is not None:
        if entry.pending is None:
            entry.pending = [work]
        else:
            entry.pending.append(work)


async def settle(entry: RequestLog) -> None:
    """Wait for the work the access line waits for (``wait_for``); its failures are its own."""
    pending, entry.pending = entry.pending, None
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


def collecting() -> bool:
    """Whether the request being served will have an access line (worth the counting)."""
    entry = _CURRENT.get()
    return entry is not None and entry.fields is not None


def access_line(entry: RequestLog, line: dict[str, Any], response: dict[str, str]) -> None:
    """Emit the request's one line on ``gateway.access`` (INFO): ``line`` (request id,
    method, route, status, timings), the fields noted while serving it, and ``response``
    (fields read from the response headers; a noted field of the same name wins).

    The record is made and handled directly: ``Logger.info`` would also walk the stack to
    find its caller, which this line does not need (~3 µs of its ~12).
    """
    if entry.after:
        for work in entry.after:
            work()
    if entry.fields:
        line.update(entry.fields)
    for name, value in response.items():
        line.setdefault(name, value)
    record = ACCESS.makeRecord(
        ACCESS.name,
        logging.INFO,
        "",
        0,
        "%s %s %s",
        (line["method"], line["route"], line["status"]),
        None,
        extra=line,
    )
    ACCESS.handle(record)


def content_enabled() -> bool:
    """Whether chat content is logged (``gateway.content`` at DEBUG): check it first."""
    return CONTENT.isEnabledFor(logging.DEBUG)


def log_content(session_id: str, messages: list[dict[str, Any]], answer: Any) -> None:
    """The forwarded messages and the answer of one chat turn, at DEBUG only."""
    CONTENT.debug(
        "chat turn content",
        extra={
            "request_id": current_request_id(),
            "session_id": session_id,
            "messages": messages,
            "answer": answer,
        },
    )


# --- formatting ---


class RequestIdFilter(logging.Filter):
    """Puts the id of the request being served on every record emitted while serving it.

    On the handlers: a logger's own filters would miss the records its children pass up.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if "request_id" not in record.__dict__:
            entry = _CURRENT.get()
            if entry is not None:
                record.request_id = entry.request_id
        return True


# Record attributes that are not fields of their own; uvicorn's ``color_message`` is the
# message again with terminal colour codes.
_NOT_FIELDS = frozenset([*RESERVED_ATTRS, "color_message"])


_second: tuple[int, str] = (-1, "")


def _utc_time(record: logging.LogRecord) -> str:
    """ISO 8601 UTC to the millisecond; the second's text is made once a second."""
    global _second
    second = int(record.created)
    if _second[0] != second:
        _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{_second[1]}.{int(record.msecs):03d}Z"


class JsonFormatter(OrjsonFormatter):
    """``{"time", "level", "logger", "message", ...fields}``: one JSON object a line.

    ``time`` is UTC, ISO 8601, to the millisecond; the fields are the record's extras
    (``request_id`` and the access line's); an exception is one ``exc_info`` string.
    python-json-logger does the rest (exceptions, stacks, encoding with orjson).
    """

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s %(message)s")

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        # The library's own loop (renames, reserved names, defaults) took half of a line's
        # formatting time; the fields it would find are these.
        log_data["time"] = _utc_time(record)
        log_data["level"] = record.levelname
        log_data["logger"] = record.name
        log_data["message"] = record.message
        for key, value in record.__dict__.items():
            if key not in _NOT_FIELDS and key[0] != "_":
                log_data[key] = value
        log_data.update(message_dict)  # exc_info, stack_info


class TextFormatter(logging.Formatter):
    """Today's plain format, then the record's fields as ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        extra = [
            f"{key}={_text_value(value)}"
            for key, value in record.__dict__.items()
            if key not in _NOT_FIELDS and not key.startswith("_")
        ]
        return f"{line} {' '.join(extra)}" if extra else line


def _text_value(value: Any) -> str:
    if isinstance(value, str | int | float | bool) or value is None:
        return str(value)
    return orjson.dumps(value, default=str).decode()


def logging_config(level: str, log_format: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for the gateway and uvicorn (every process of
    ``serve --workers N`` applies it): one handler on stderr, in ``log_format`` ("json" or
    "text"); uvicorn's loggers pass their records to it."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": "gateway.observability.request_log.RequestIdFilter"}},
        "formatters": {
            "json": {"()": "gateway.observability.request_log.JsonFormatter"},
            "text": {"()": "gateway.observability.request_log.TextFormatter"},
        },
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": log_format,
                "filters": ["request_id"],
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {
            # uvicorn's own configuration gives these handlers of their own: undone.
            "uvicorn": {"handlers": [], "propagate": True},
            "uvicorn.error": {"handlers": [], "propagate": True},
            "uvicorn.access": {"handlers": [], "propagate": True},
            # httpx logs every request line at INFO: one line per chat message is noise.
            "httpx": {"level": "WARNING"},
            # The MCP SDK logs each request's transport at INFO (/mcp has its access line).
            "mcp": {"level": "WARNING"},
        },
    }
