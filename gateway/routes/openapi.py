"""The OpenAPI 3.1 document of the gateway's own HTTP surface, served at ``GET /openapi.json``.

Built from the pydantic models the memory API validates and answers with
(``routes/schemas.py``), by a table of its operations; chat completions and responses are
the upstream's APIs, described as far as the gateway reads them. A test holds the
document to the routes the app registers, and schemathesis fuzzes the gateway with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema
from starlette.requests import Request
from starlette.responses import Response

from gateway import __version__
from gateway.auth.identity import MAX_ID_LENGTH
from gateway.dialects.chat.request import MAX_MODEL_LENGTH, ChatCompletionRequest
from gateway.routes import schemas as s

JSON = "application/json"

Schema = dict[str, Any]

_ERROR_TEXT = {
    "400": "invalid request (the envelope's param names the field)",
    "403": "user ids are not trusted in this configuration",
    "404": "no such session, user, pin or fact for this tenant",
    "413": "request body larger than server.max_body_bytes",
    "429": "the tenant's memory is at its quota",
    "502": "upstream unreachable",
    "503": "memory store unavailable",
    "504": "upstream timed out",
}

_ID = {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH,
       "description": "1 to 128 printable characters, no control characters"}  # fmt: skip


def _header(name: str, schema: Schema, description: str | None = None) -> Schema:
    header = {"name": name, "in": "header", "required": False, "schema": schema}
    return header | ({"description": description} if description else {})


_USER_HEADER = _header("X-User-Id", _ID)
_HEADERS = [
    _header("X-Session-Id", _ID, "the conversation; without it the request is passed through"),
    _USER_HEADER,
    _header("X-Memory-Mode", {"type": "string", "enum": ["on", "read", "off"]}),
]


def _path_parameter(name: str, schema: Schema) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _query(name: str, schema: Schema, description: str | None = None) -> Schema:
    query = {"name": name, "in": "query", "required": False, "schema": schema}
    return query | ({"description": description} if description else {})


_PATH_PARAMETERS = {
    "sid": _path_parameter("sid", _ID),
    "uid": _path_parameter("uid", _ID),
    "pin_id": _path_parameter("pin_id", {"type": "string"}),
    "fact_id": _path_parameter("fact_id", {"type": "string"}),
}


@dataclass(frozen=True)
class Operation:
    """One route of the memory API: what it reads, answers and may refuse."""

    summary: str
    answer: type[BaseModel] | None  # None: 204, no body
    errors: tuple[str, ...]
    body: type[BaseModel] | Schema | None = None  # a model, or a schema as it is
    status: str = "200"
    parameters: tuple[Schema, ...] = ()
    markdown: bool = False  # also answers text/markdown (?format=markdown)


# Errors any memory API call may answer with: a bad id or body, Redis down.
_ANY = ("400", "503")
_SESSION = "/memory/sessions/{sid}"

OPERATIONS: dict[tuple[str, str], Operation] = {
    ("/memory/sessions", "get"): Operation(
        "The caller's sessions, newest activity first", s.SessionList, _ANY,
        parameters=(_query("search", _ID, "a part of the session id"),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}))),
    (_SESSION, "get"): Operation("The session's tiers", s.Session, ("404", *_ANY)),
    (_SESSION, "delete"): Operation("Erase the session", None, ("404", *_ANY)),
    (_SESSION + "/messages", "post"): Operation(
        "Import messages as if they had been exchanged", s.Imported, ("413", "429", *_ANY),
        body=s.ImportBody, parameters=(_USER_HEADER,)),
    (_SESSION + "/context", "post"): Operation(
        "The context a chat or Responses request would forward (messages or input); "
        "nothing recorded", s.ContextPreview, ("413", *_ANY),
        body={"anyOf": [{"$ref": "#/components/schemas/ChatCompletionRequest"},
                        {"$ref": "#/components/schemas/ResponsesRequest"}]},
        parameters=(_USER_HEADER,)),
    (_SESSION + "/flush", "post"): Operation(
        "Run the session's pending jobs now", s.Flushed, ("404", *_ANY)),
    (_SESSION + "/pins", "get"): Operation(
        "The session's pins, most important first", s.PinList, ("404", *_ANY)),
    (_SESSION + "/pins", "post"): Operation(
        "Pin a fact", s.Pin, ("404", "413", "429", *_ANY), body=s.PinBody, status="201"),
    (_SESSION + "/receipts", "get"): Operation(
        "The receipts of the session's last recorded turns, newest first", s.ReceiptList,
        ("404", *_ANY)),
    (_SESSION + "/pins/{pin_id}", "patch"): Operation(
        "Change a pin's content or importance", s.Pin, ("404", "413", *_ANY),
        body=s.PinEditBody),
    (_SESSION + "/pins/{pin_id}", "delete"): Operation("Remove a pin", None, ("404", *_ANY)),
    (_SESSION + "/facts", "get"): Operation(
        "The session's durable facts, oldest first (superseded ones marked)", s.FactList,
        ("404", *_ANY)),
    (_SESSION + "/facts/{fact_id}", "patch"): Operation(
        "Correct a fact: the old one is kept superseded, the correction is current",
        s.StoredFact, ("404", "413", *_ANY), body=s.FactEditBody),
    (_SESSION + "/facts/{fact_id}", "delete"): Operation("Delete a fact", None, ("404", *_ANY)),
    (_SESSION + "/search", "post"): Operation(
        "The session's memories (excerpts, facts, pins) that best answer a query",
        s.SearchResults, ("404", "413", *_ANY), body=s.SearchBody),
    (_SESSION + "/end", "post"): Operation(
        "Close the session: pending jobs run, the final summary is kept", s.EndedSession,
        ("404", *_ANY)),
    (_SESSION + "/export", "get"): Operation(
        "The whole session, as JSON or Markdown", s.SessionExport, ("404", *_ANY),
        parameters=(_query("format", {"type": "string", "enum": ["json", "markdown"]}),),
        markdown=True),
    ("/memory/users/{uid}", "get"): Operation(
        "The user's sessions, profile and current facts", s.User, ("403", "404", *_ANY)),
    ("/memory/users/{uid}/search", "post"): Operation(
        "The user's memories across their sessions that best answer a query",
        s.SearchResults, ("403", "404", "413", *_ANY), body=s.SearchBody),
    ("/memory/users/{uid}/imports", "post"): Operation(
        "Import a ChatGPT or Claude data export (its conversations.json as the body): "
        "a session of the user per conversation (chatgpt-ID, claude-ID), its dates kept; "
        "a conversation whose session exists is left as it is", s.ExportImported,
        ("403", "404", "413", "429", *_ANY),
        body={"type": "array", "items": {"type": "object"}},
        parameters=({**_query("format", {"type": "string", "enum": ["chatgpt", "claude"]}),
                     "required": True},)),
    ("/memory/users/{uid}", "delete"): Operation(
        "Erase the user and every session of theirs", None, ("403", "404", *_ANY)),
}  # fmt: skip

# The proxied APIs are the upstream's: only what the gateway reads is described.
_RESPONSES_REQUEST: Schema = {
    "type": "object", "required": ["model", "input"], "properties": {
        "model": {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_LENGTH},
        "input": {"description": "a string (one user message) or an array of input items: "
                  "messages (roles user, assistant, system, developer), function_call and "
                  "function_call_output items are remembered; other item types are forwarded "
                  "beside their message and not stored",
                  "anyOf": [{"type": "string"}, {"type": "array", "minItems": 1,
                                                 "items": {"type": "object"}}]},
        "instructions": {"description": "the client's prompt: forwarded, never stored",
                         "anyOf": [{"type": "string"},
                                   {"type": "array", "items": {"type": "object"}},
                                   {"type": "null"}]},
        "stream": {"type": ["boolean", "null"]},
        "previous_response_id": {"type": ["string", "null"], "description": "removed before "
                                 "forwarding when memory is on: the gateway's memory is the "
                                 "conversation"},
        "store": {"type": ["boolean", "null"], "description": "forwarded as sent"},
    },
}  # fmt: skip

_MESSAGES_REQUEST: Schema = {
    "type": "object", "required": ["model", "max_tokens", "messages"], "properties": {
        "model": {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_LENGTH},
        "max_tokens": {"type": "integer", "minimum": 1},
        "messages": {"description": "user and assistant messages (content a string or "
                     "content blocks: text, image, document, tool_use, tool_result are "
                     "remembered; thinking and server tools' blocks are not stored)",
                     "type": "array", "minItems": 1, "items": {"type": "object"}},
        "system": {"description": "the client's prompt: forwarded, memory's after it",
                   "anyOf": [{"type": "string"},
                             {"type": "array", "items": {"type": "object"}}]},
        "stream": {"type": "boolean"},
    },
}  # fmt: skip
_ANTHROPIC_ERROR: Schema = {
    "type": "object", "required": ["type", "error"], "properties": {
        "type": {"const": "error"},
        "error": {"type": "object", "required": ["type", "message"], "properties": {
            "type": {"type": "string"}, "message": {"type": "string"}}},
    },
}  # fmt: skip

# path: (summary, request model or component name, what the upstream answers, its errors'
# component)
_PROXIED: dict[str, tuple[str, type[BaseModel] | str, str, str]] = {
    "/v1/chat/completions": (
        "Chat completions with memory (the body is forwarded; only messages change)",
        ChatCompletionRequest,
        "the upstream's answer, JSON or an SSE stream",
        "Error",
    ),
    "/v1/responses": (
        "The Responses API with memory (the body is forwarded; only input changes)",
        "ResponsesRequest",
        "the upstream's response, JSON or an SSE event stream",
        "Error",
    ),
    "/v1/messages": (
        "Anthropic's Messages API with memory (the body is forwarded; only messages change, "
        "and memory is added to system); the key in x-api-key or Authorization",
        "MessagesRequest",
        "the upstream's message, JSON or an SSE event stream",
        "AnthropicError",
    ),
}


class _Names(GenerateJsonSchema):
    """Component names without the private underscore, and no per-field titles."""

    def normalize_name(self, name: str) -> str:
        return super().normalize_name(name).lstrip("_")

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _components() -> tuple[dict[type[Any], Schema], dict[str, Schema]]:
    """Each model's reference, and every schema they need (their fields' models too)."""
    models = {op.answer for op in OPERATIONS.values()} | {
        op.body for op in OPERATIONS.values() if isinstance(op.body, type)
    }
    wanted = [m for m in models if m is not None] + [ChatCompletionRequest, s.Error]
    pairs: list[tuple[type[BaseModel], JsonSchemaMode]] = [(m, "validation") for m in wanted]
    refs, defs = models_json_schema(
        sorted(pairs, key=lambda pair: pair[0].__name__),
        ref_template="#/components/schemas/{model}",
        schema_generator=_Names,
    )
    by_model = {model: schema for (model, _), schema in refs.items()}
    extra = {
        "ResponsesRequest": _RESPONSES_REQUEST,
        "MessagesRequest": _MESSAGES_REQUEST,
        "AnthropicError": _ANTHROPIC_ERROR,
    }
    return by_model, {**defs["$defs"], **extra}


def _errors(statuses: tuple[str, ...], envelope: str = "Error") -> dict[str, Schema]:
    """Every gateway error answers with the OpenAI envelope (Anthropic's on its API)."""
    return {
        status: {"description": _ERROR_TEXT[status], "content": {JSON: {"schema": _ref(envelope)}}}
        for status in statuses
    }


def _json_body(schema: Schema) -> Schema:
    return {"required": True, "content": {JSON: {"schema": schema}}}


def _operation(path: str, op: Operation, refs: dict[type[Any], Schema]) -> Schema:
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    parameters = [_PATH_PARAMETERS[name] for name in names] + list(op.parameters)
    if op.answer is None:
        answer: Schema = {"204": {"description": "done"}}
    else:
        content = {JSON: {"schema": refs[op.answer]}}
        if op.markdown:
            content["text/markdown"] = {"schema": {"type": "string"}}
        answer = {op.status: {"description": "OK", "content": content}}
    out: Schema = {"summary": op.summary, "parameters": parameters}
    if isinstance(op.body, dict):
        out["requestBody"] = _json_body(op.body)
    elif op.body is not None:
        out["requestBody"] = _json_body(refs[op.body])
    out["responses"] = {**answer, **_errors(op.errors)}
    return out


def openapi_document() -> dict[str, Any]:
    refs, components = _components()
    paths: dict[str, Schema] = {}
    for path, (summary, body, answer, envelope) in _PROXIED.items():
        request = _ref(body) if isinstance(body, str) else refs[body]
        paths[path] = {"post": {
            "summary": summary,
            "parameters": _HEADERS,
            "requestBody": _json_body(request),
            "responses": {"200": {"description": answer},
                          **_errors(("400", "413", "502", "503", "504"), envelope)},
        }}  # fmt: skip
    for (path, method), op in OPERATIONS.items():
        paths.setdefault(path, {})[method] = _operation(path, op, refs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "memory-gateway",
            "version": __version__,
            "description": "An OpenAI-compatible proxy with long-conversation memory. "
            'Errors use OpenAI\'s envelope: {"error": {message, type, param, code}}; '
            "on /v1/messages, Anthropic's.",
        },
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": components,
        },
        "paths": paths,
    }


class OpenAPIEndpoint:
    """``GET /openapi.json``: the document, built at its first request and kept (it
    depends on the code alone)."""

    def __init__(self) -> None:
        self._served: bytes | None = None

    async def handle(self, request: Request) -> Response:
        if self._served is None:
            self._served = json.dumps(openapi_document()).encode()
        return Response(self._served, media_type=JSON)
