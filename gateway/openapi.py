"""The OpenAPI 3 document of the gateway's own HTTP surface, served at ``GET /openapi.json``.

Hand-written data, kept next to the routes it describes: the memory API in full, and
chat-completions as far as the gateway reads it (everything else is the upstream's).
A test holds it to the routes the app registers, and schemathesis fuzzes the gateway
with it, so a route or field added without its description fails the suite.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway import __version__
from gateway.identity import MAX_ID_LENGTH

JSON = "application/json"

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def _object(required: list[str], properties: dict[str, Schema], extra: bool = False) -> Schema:
    return {
        "type": "object",
        "required": required,
        "properties": properties,
        "additionalProperties": extra,
    }


def _json_body(schema: Schema, required: bool = True) -> Schema:
    return {"required": required, "content": {JSON: {"schema": schema}}}


def _ok(schema: Schema, status: str = "200", description: str = "OK") -> dict[str, Schema]:
    return {status: {"description": description, "content": {JSON: {"schema": schema}}}}


def _errors(*statuses: str) -> dict[str, Schema]:
    """Every gateway error answers with the OpenAI envelope."""
    return {
        status: {"description": _ERROR_TEXT[status], "content": {JSON: {"schema": _ref("Error")}}}
        for status in statuses
    }


_ERROR_TEXT = {
    "400": "invalid request (the envelope's param names the field)",
    "404": "no such session, user or pin for this tenant",
    "413": "request body larger than server.max_body_bytes",
    "502": "upstream unreachable",
    "503": "memory store unavailable",
    "504": "upstream timed out",
}

# Errors any memory API call may answer with: a bad id or body, Redis down.
_API_ERRORS = ("400", "503")

_ID = {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH,
       "description": "1 to 128 printable characters, no control characters"}  # fmt: skip

_SESSION = {"name": "sid", "in": "path", "required": True, "schema": _ID}
_USER = {"name": "uid", "in": "path", "required": True, "schema": _ID}
_PIN = {"name": "pin_id", "in": "path", "required": True, "schema": {"type": "string"}}
_NO_CONTENT = {"204": {"description": "done"}}

_RANGE = _object(["start", "end"], {"start": {"type": "integer"}, "end": {"type": "integer"}})

_CONTENT = {
    "description": "a string, an array of content parts, or null",
    "nullable": True,
    "oneOf": [
        {"type": "string"},
        {"type": "array", "items": _object([], {
            "type": {"type": "string"},
            "text": {"type": "string"},
            "refusal": {"type": "string"},
            "image_url": _object([], {"url": {"type": "string"}}, extra=True),
        }, extra=True)},
    ],
}  # fmt: skip

_TOOL_CALL = _object(
    ["id", "type"],
    {
        "id": {"type": "string", "minLength": 1},
        "type": {"type": "string"},
        "function": _object(
            ["name", "arguments"],
            {"name": {"type": "string"}, "arguments": {"type": "string"}},
            extra=True,
        ),
    },
    extra=True,
)


def _message(roles: list[str], **more: Schema) -> Schema:
    return _object(
        ["role"],
        {
            "role": {"type": "string", "enum": roles},
            "content": _CONTENT,
            "tool_calls": _nullable({"type": "array", "items": _TOOL_CALL}),
            "tool_call_id": _nullable({"type": "string"}),
            "name": _nullable({"type": "string"}),
            **more,
        },
        extra=True,
    )


# When an imported message was said: Unix seconds, or ISO 8601 (UTC unless it says).
_TIMESTAMP: Schema = _nullable(
    {"oneOf": [{"type": "number"}, {"type": "string", "format": "date-time"}]}
)


_STORED_MESSAGE = _object(
    ["index", "role", "content"],
    {
        "index": {"type": "integer", "minimum": 1},
        "role": {"type": "string"},
        "content": _CONTENT,
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
        "name": {"type": "string"},
        "timestamp": {"type": "string", "format": "date-time"},
    },
)

_PIN_VIEW = _object(
    ["id", "content", "importance", "source_index", "pin_type", "created"],
    {
        "id": {"type": "string"},
        "content": {"type": "string"},
        "importance": {"type": "number"},
        "source_index": _nullable({"type": "integer"}),
        "pin_type": {"type": "string"},
        "created": {"type": "number"},
    },
)

_SESSION_PROPERTIES: dict[str, Schema] = {
    "session_id": {"type": "string"},
    "user_id": _nullable({"type": "string"}),
    "message_count": {"type": "integer", "minimum": 0},
    "turns": {"type": "integer", "minimum": 0},
    "ended": {"type": "boolean"},
    "preset": _nullable({"type": "string"}),
    "tiers_version": {"type": "integer"},
    "window": {"type": "array", "items": _ref("StoredMessage")},
    "summaries": {"type": "array", "items": _object(["range", "text", "ts"], {
        "range": _RANGE, "text": {"type": "string"}, "ts": {"type": "number"},
        "fallback": {"type": "boolean"}, "span": _object(["since", "until"], {
            "since": {"type": "number"}, "until": {"type": "number"}})})},
    "rolling_summary": _nullable(_object(["text", "version", "range"], {
        "text": {"type": "string"}, "version": {"type": "integer"}, "range": _RANGE,
        "turn": {"type": "integer"}, "ts": {"type": "number"}, "fallback": {"type": "boolean"}})),
    "key_qa": {"type": "array", "items": {"type": "object"}},
    "facts": {"type": "array", "items": {"type": "object"}},
    "pins": {"type": "array", "items": _ref("Pin")},
    "pending_jobs": {"type": "integer", "minimum": 0},
}  # fmt: skip


def _session_view(**more: Schema) -> Schema:
    properties = {**_SESSION_PROPERTIES, **more}
    return _object(list(properties), properties)


_COMPONENTS: dict[str, Schema] = {
    "Error": _object(["error"], {"error": _object(
        ["message", "type", "param", "code"],
        {"message": {"type": "string"}, "type": {"type": "string"},
         "param": _nullable({"type": "string"}), "code": _nullable({"type": "string"})},
    )}),
    "Message": _message(["system", "developer", "user", "assistant", "tool", "function"]),
    "StoredMessage": _STORED_MESSAGE,
    "Pin": _PIN_VIEW,
    "ChatCompletionRequest": _object(["model", "messages"], {
        "model": {"type": "string", "minLength": 1, "maxLength": 1024},
        "messages": {"type": "array", "minItems": 1, "items": _ref("Message")},
        "stream": _nullable({"type": "boolean"}),
        "stream_options": _nullable(_object([], {
            "include_usage": _nullable({"type": "boolean"})}, extra=True)),
    }, extra=True),
    "ImportBody": _object(["messages"], {
        "messages": {"type": "array", "minItems": 1,
                     "items": _message(["user", "assistant", "tool"], timestamp=_TIMESTAMP)}}),
    "PinBody": _object(["content"], {
        "content": {"type": "string", "minLength": 1, "maxLength": 4000},
        "importance": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "source_index": _nullable({"type": "integer", "minimum": 1, "maximum": 2**53}),
    }),
    "PinEditBody": _object([], {
        "content": {"type": "string", "minLength": 1, "maxLength": 4000},
        "importance": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
    }),
    "Session": _session_view(),
    "ListedSession": _object(
        ["session_id", "user_id", "message_count", "turns", "created", "updated", "ended",
         "bytes"],
        {"session_id": {"type": "string"}, "user_id": _nullable({"type": "string"}),
         "message_count": {"type": "integer", "minimum": 0},
         "turns": {"type": "integer", "minimum": 0},
         "created": _nullable({"type": "number"}), "updated": {"type": "number"},
         "ended": {"type": "boolean"}, "bytes": _nullable({"type": "integer"})}),
    "StoredReceipt": _object(["request_id", "at", "model", "client_tokens", "receipt"], {
        "request_id": _nullable({"type": "string"}), "at": {"type": "number"},
        "model": {"type": "string"}, "client_tokens": {"type": "integer"},
        "receipt": {"type": "object"}}),
}  # fmt: skip

_HEADERS = [
    {"name": "X-Session-Id", "in": "header", "required": False, "schema": _ID,
     "description": "the conversation; without it the request is passed through"},
    {"name": "X-User-Id", "in": "header", "required": False, "schema": _ID},
    {"name": "X-Memory-Mode", "in": "header", "required": False,
     "schema": {"type": "string", "enum": ["on", "read", "off"]}},
]  # fmt: skip

_SESSION_PATH = "/memory/sessions/{sid}"

PATHS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"post": {
        "summary": "Chat completions with memory (the body is forwarded; only messages change)",
        "parameters": _HEADERS,
        "requestBody": _json_body(_ref("ChatCompletionRequest")),
        "responses": {
            "200": {"description": "the upstream's answer, JSON or an SSE stream"},
            **_errors("400", "413", "502", "503", "504"),
        },
    }},
    "/memory/sessions": {"get": {
        "summary": "The caller's sessions, newest activity first",
        "parameters": [
            {"name": "search", "in": "query", "required": False, "schema": _ID,
             "description": "a part of the session id"},
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
        "responses": {**_ok(_object(["sessions"], {
            "sessions": {"type": "array", "items": _ref("ListedSession")}})),
            **_errors(*_API_ERRORS)},
    }},
    _SESSION_PATH: {
        "parameters": [_SESSION],
        "get": {"summary": "The session's tiers",
                "responses": {**_ok(_ref("Session")), **_errors("404", *_API_ERRORS)}},
        "delete": {"summary": "Erase the session",
                   "responses": {**_NO_CONTENT, **_errors("404", *_API_ERRORS)}},
    },
    _SESSION_PATH + "/messages": {"parameters": [_SESSION], "post": {
        "summary": "Import messages as if they had been exchanged",
        "parameters": [_HEADERS[1]],
        "requestBody": _json_body(_ref("ImportBody")),
        "responses": {**_ok(_object(["message_count", "imported", "pending_jobs"], {
            "message_count": {"type": "integer"}, "imported": {"type": "integer"},
            "pending_jobs": {"type": "integer"}})), **_errors("413", *_API_ERRORS)},
    }},
    _SESSION_PATH + "/context": {"parameters": [_SESSION], "post": {
        "summary": "The context a chat request would forward; nothing recorded",
        "parameters": [_HEADERS[1]],
        "requestBody": _json_body(_ref("ChatCompletionRequest")),
        "responses": {**_ok(_object(["messages", "receipt"], {
            "messages": {"type": "array", "items": {"type": "object"}},
            "receipt": {"type": "object"}})), **_errors("413", *_API_ERRORS)},
    }},
    _SESSION_PATH + "/flush": {"parameters": [_SESSION], "post": {
        "summary": "Run the session's pending jobs now",
        "responses": {**_ok(_object(["ran", "pending_jobs"], {
            "ran": {"type": "integer"}, "pending_jobs": {"type": "integer"}})),
            **_errors("404", *_API_ERRORS)},
    }},
    _SESSION_PATH + "/pins": {
        "parameters": [_SESSION],
        "get": {"summary": "The session's pins, most important first",
                "responses": {**_ok(_object(["pins"], {
                    "pins": {"type": "array", "items": _ref("Pin")}})),
                    **_errors("404", *_API_ERRORS)}},
        "post": {"summary": "Pin a fact", "requestBody": _json_body(_ref("PinBody")),
                 "responses": {**_ok(_ref("Pin"), "201", "pinned"),
                               **_errors("404", "413", *_API_ERRORS)}},
    },
    _SESSION_PATH + "/receipts": {"parameters": [_SESSION], "get": {
        "summary": "The receipts of the session's last recorded turns, newest first",
        "responses": {**_ok(_object(["receipts"], {
            "receipts": {"type": "array", "items": _ref("StoredReceipt")}})),
            **_errors("404", *_API_ERRORS)},
    }},
    _SESSION_PATH + "/pins/{pin_id}": {
        "parameters": [_SESSION, _PIN],
        "patch": {"summary": "Change a pin's content or importance",
                  "requestBody": _json_body(_ref("PinEditBody")),
                  "responses": {**_ok(_ref("Pin")), **_errors("404", "413", *_API_ERRORS)}},
        "delete": {"summary": "Remove a pin",
                   "responses": {**_NO_CONTENT, **_errors("404", *_API_ERRORS)}},
    },
    _SESSION_PATH + "/end": {"parameters": [_SESSION], "post": {
        "summary": "Close the session: pending jobs run, the final summary is kept",
        "responses": {**_ok(_session_view(flushed_jobs={"type": "integer"})),
                      **_errors("404", *_API_ERRORS)},
    }},
    _SESSION_PATH + "/export": {"parameters": [_SESSION], "get": {
        "summary": "The whole session, as JSON or Markdown",
        "parameters": [{"name": "format", "in": "query", "required": False,
                        "schema": {"type": "string", "enum": ["json", "markdown"]}}],
        "responses": {"200": {"description": "the export", "content": {
            JSON: {"schema": _session_view(
                messages={"type": "array", "items": _ref("StoredMessage")},
                meta={"type": "object"})},
            "text/markdown": {"schema": {"type": "string"}}}},
            **_errors("404", *_API_ERRORS)},
    }},
    "/memory/users/{uid}": {
        "parameters": [_USER],
        "get": {"summary": "The user's sessions",
                "responses": {**_ok(_object(["user_id", "sessions"], {
                    "user_id": {"type": "string"},
                    "sessions": {"type": "array", "items": {"type": "string"}}})),
                    **_errors("404", *_API_ERRORS)}},
        "delete": {"summary": "Erase the user and every session of theirs",
                   "responses": {**_NO_CONTENT, **_errors("404", *_API_ERRORS)}},
    },
}  # fmt: skip


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "memory-gateway",
            "version": __version__,
            "description": "An OpenAI-compatible proxy with long-conversation memory. "
            'Errors use OpenAI\'s envelope: {"error": {message, type, param, code}}.',
        },
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": _COMPONENTS,
        },
        "paths": PATHS,
    }


_BODY = json.dumps(openapi_document()).encode()


async def serve_openapi(request: Request) -> Response:
    return Response(_BODY, media_type=JSON)
