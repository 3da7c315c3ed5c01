"""The memory API: see, import, preview, flush, pin, end, export and erase a session.

Scoped to the caller's tenant like the proxy (the bearer key's keyed hash): a session of
another tenant is simply not there, so "does not exist" and "belongs to someone else"
get the same 404.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gateway.chat_request import (
    MessageShape,
    check_tool_results,
    check_turn_tool_results,
    parse_chat_request,
    parse_json,
    validation_error,
)
from gateway.errors import GatewayError, InvalidRequest
from gateway.identity import Identity, MemoryMode, check_id, header_id
from gateway.memory.assemble import window_units
from gateway.memory.export import session_markdown
from gateway.memory.model import Message, Pin, SessionState
from gateway.memory.reconcile import Reconciled
from gateway.memory.service import MemoryService
from gateway.memory.tiers.pins import score_importance
from gateway.routes.relay import read_body
from gateway.store.keys import SessionKeys, UserKeys
from gateway.tenancy import Tenants
from gateway.worker import JobRunner

# Enough to show a session's window whatever the preset.
STATE_TAIL = 200
# Redis list indexes are signed 64-bit: a larger message index is an error there, not a miss.
MAX_INDEX = 2**53
# A tool call's results follow it directly: a short tail of the log shows which are open.
TOOL_CHECK_TAIL = 16


class NotFound(GatewayError):
    status = 404
    type = "not_found"
    code = "not_found"


class _ImportMessage(MessageShape):
    # The conversation only: a system prompt is the client's, never stored.
    role: Literal["user", "assistant", "tool"]


class _ImportBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[_ImportMessage] = Field(min_length=1)


class _PinBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: StrictStr = Field(min_length=1, max_length=4000)
    importance: float | None = Field(default=None, ge=0, le=1)
    source_index: int | None = Field(default=None, ge=1, le=MAX_INDEX)


def _parse(model: type[BaseModel], raw: bytes) -> tuple[Any, Any]:
    """The validated body and the client's JSON it came from."""
    data = parse_json(raw or b"{}")
    try:
        return model.model_validate(data), data
    except ValidationError as error:
        raise validation_error(data, error) from None


def _message_view(message: Message) -> dict[str, Any]:
    return {"index": message.index, **message.to_openai()}


class MemoryAPI:
    def __init__(
        self,
        memory: MemoryService,
        runner: JobRunner,
        tenants: Tenants,
        *,
        max_body_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.memory = memory
        self.store = memory.store
        self.runner = runner
        self.tenants = tenants
        self.max_body_bytes = max_body_bytes
        self.clock = clock

    def routes(self) -> list[Route]:
        base = "/memory/sessions/{sid}"
        return [
            Route(base, self.get_session, methods=["GET"]),
            Route(base, self.erase_session, methods=["DELETE"]),
            Route(base + "/messages", self.import_messages, methods=["POST"]),
            Route(base + "/context", self.context, methods=["POST"]),
            Route(base + "/flush", self.flush, methods=["POST"]),
            Route(base + "/pins", self.list_pins, methods=["GET"]),
            Route(base + "/pins", self.add_pin, methods=["POST"]),
            Route(base + "/pins/{pin_id}", self.delete_pin, methods=["DELETE"]),
            Route(base + "/end", self.end, methods=["POST"]),
            Route(base + "/export", self.export, methods=["GET"]),
            Route("/memory/users/{uid}", self.get_user, methods=["GET"]),
            Route("/memory/users/{uid}", self.erase_user, methods=["DELETE"]),
        ]

    async def _keys(self, request: Request) -> SessionKeys:
        session_id = check_id(request.path_params["sid"], "session_id")
        return SessionKeys(await self.tenants.tenant_of(request.headers), session_id)

    async def _existing(self, request: Request) -> tuple[SessionKeys, SessionState]:
        keys = await self._keys(request)
        state = await self.store.load(keys, STATE_TAIL)
        if not state.exists:
            raise NotFound(f"session {keys.session_id!r} not found", param="session_id")
        return keys, state

    def _state_view(self, keys: SessionKeys, state: SessionState) -> dict[str, Any]:
        empty = Reconciled(prompt=(), prior=state.tail, to_record=(), new=())
        units = window_units(empty, state.tiers, self.memory.composition)
        window = [m for unit in reversed(units) for m in unit]
        rolling = state.tiers.rolling
        return {
            "session_id": keys.session_id,
            "user_id": state.user_id,
            "message_count": state.message_count,
            "turns": state.turns,
            "ended": state.ended,
            "preset": self.memory.config.preset if self.memory.config.tiers is None else None,
            "tiers_version": state.tiers.version,
            "window": [_message_view(m) for m in window],
            "summaries": [s.to_data() for s in state.tiers.summaries],
            "rolling_summary": rolling.to_data() if rolling else None,
            "key_qa": [k.to_data() for k in state.tiers.key_qa],
            "facts": [f.to_data() for f in state.tiers.facts],
            "pins": [p.to_data() for p in sorted(state.pins, key=lambda p: -p.importance)],
            "pending_jobs": state.pending_jobs,
        }

    async def get_session(self, request: Request) -> Response:
        keys, state = await self._existing(request)
        return JSONResponse(self._state_view(keys, state))

    async def import_messages(self, request: Request) -> Response:
        keys = await self._keys(request)
        _, data = _parse(_ImportBody, await read_body(request, self.max_body_bytes))
        messages = tuple(Message.from_openai(m) for m in data["messages"])
        user_id = header_id(request.headers, "X-User-Id")
        # Tool results must answer a call, in the import or at the end of the stored log:
        # an orphan stored now would be forwarded, and refused upstream, on every turn.
        stored = await self.store.load(keys, TOOL_CHECK_TAIL)
        check_tool_results(messages, stored.tail)
        count = await self.memory.import_messages(keys, user_id, messages, now=self.clock())
        _, _, pending = await self.store.job_state(keys)
        return JSONResponse(
            {"message_count": count, "imported": len(messages), "pending_jobs": len(pending)}
        )

    async def context(self, request: Request) -> Response:
        keys = await self._keys(request)
        chat = parse_chat_request(await read_body(request, self.max_body_bytes))
        user_id = header_id(request.headers, "X-User-Id")  # as the proxy would see it
        identity = Identity(keys.tenant, keys.session_id, user_id, MemoryMode.READ)
        turn = await self.memory.prepare(identity, chat.messages, chat.model)
        check_turn_tool_results(chat.messages, turn.plan.new, turn.plan.prior)
        return JSONResponse(
            {"messages": turn.context.openai_messages(), "receipt": turn.context.receipt.to_json()}
        )

    async def flush(self, request: Request) -> Response:
        keys, _ = await self._existing(request)
        ran = await self.runner.flush(keys)
        _, _, pending = await self.store.job_state(keys)
        return JSONResponse({"ran": ran, "pending_jobs": len(pending)})

    async def list_pins(self, request: Request) -> Response:
        _, state = await self._existing(request)
        pins = sorted(state.pins, key=lambda p: (-p.importance, -p.created))
        return JSONResponse({"pins": [p.to_data() for p in pins]})

    async def add_pin(self, request: Request) -> Response:
        keys, _ = await self._existing(request)
        body, _ = _parse(_PinBody, await read_body(request, self.max_body_bytes))
        importance = body.importance
        if importance is None and body.source_index is not None:
            # Seed 004's heuristic scores the message the pin came from.
            source = await self.store.messages(keys, body.source_index, body.source_index)
            importance = score_importance(source[0]) if source else None
        pin = Pin(
            id=f"pin_{secrets.token_hex(6)}",
            content=body.content,
            importance=0.8 if importance is None else importance,
            source_index=body.source_index,
            pin_type="manual",
            created=self.clock(),
        )
        await self.store.add_pin(keys, pin)
        return JSONResponse(pin.to_data(), status_code=201)

    async def delete_pin(self, request: Request) -> Response:
        keys, _ = await self._existing(request)
        if not await self.store.delete_pin(keys, request.path_params["pin_id"]):
            raise NotFound("pin not found", param="pin_id")
        return Response(status_code=204)

    async def end(self, request: Request) -> Response:
        keys, state = await self._existing(request)
        # Pending jobs run first, so the final summary is complete; with a user, it goes
        # to their history and their cross-session profile is rebuilt.
        await self.runner.end(keys)
        _, after = await self._existing(request)
        ran = state.pending_jobs - after.pending_jobs
        return JSONResponse({**self._state_view(keys, after), "flushed_jobs": ran})

    async def export(self, request: Request) -> Response:
        fmt = request.query_params.get("format", "json")
        if fmt not in ("json", "markdown"):
            raise InvalidRequest("format must be json or markdown", param="format")
        keys, state = await self._existing(request)
        messages = await self.store.messages(keys, 1, -1)
        meta = await self.store.meta(keys)
        if fmt == "markdown":
            text = session_markdown(
                keys.session_id, meta, state, messages, self._state_view(keys, state)
            )
            return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")
        view = self._state_view(keys, state)
        view["messages"] = [_message_view(m) for m in messages]
        view["meta"] = {k: v for k, v in meta.items() if k in ("created", "updated", "ended")}
        return Response(
            json.dumps(view, ensure_ascii=False),
            media_type="application/json",
            headers={"content-disposition": 'attachment; filename="session.json"'},
        )

    async def erase_session(self, request: Request) -> Response:
        keys = await self._keys(request)
        if not await self.store.erase_session(keys):
            raise NotFound(f"session {keys.session_id!r} not found", param="session_id")
        return Response(status_code=204)

    async def get_user(self, request: Request) -> Response:
        user = await self._user(request)
        sessions = await self.store.user_sessions(user)
        if not sessions:
            raise NotFound(f"user {user.user_id!r} not found", param="user_id")
        return JSONResponse({"user_id": user.user_id, "sessions": sessions})

    async def erase_user(self, request: Request) -> Response:
        user = await self._user(request)
        if not await self.store.erase_user(user):
            raise NotFound(f"user {user.user_id!r} not found", param="user_id")
        return Response(status_code=204)

    async def _user(self, request: Request) -> UserKeys:
        user_id = check_id(request.path_params["uid"], "user_id")
        return UserKeys(await self.tenants.tenant_of(request.headers), user_id)
