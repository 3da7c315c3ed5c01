"""The memory API: see, import, preview, flush, pin, end, export and erase a session.

Scoped to the caller's tenant like the proxy (the bearer key's keyed hash): a session of
another tenant is simply not there, so "does not exist" and "belongs to someone else"
get the same 404.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gateway import codec, offload
from gateway.auth.authenticator import Authenticator, Caller
from gateway.auth.identity import Identity, MemoryMode, check_id, header_id
from gateway.dialects.base import Dialect, ProxiedRequest
from gateway.dialects.chat.dialect import CHAT
from gateway.dialects.chat.request import (
    DEFAULT_LIMITS,
    MessageLimits,
    check_message_count,
    check_message_sizes,
    check_raw_message_count,
    check_tool_results,
    check_turn_tool_results,
    parse_chat_request,
    parse_json,
    validation_error,
)
from gateway.dialects.exports import FORMATS, Conversation, ExportError, read_export
from gateway.dialects.responses.dialect import RESPONSES, parse_responses_request
from gateway.dialects.tool_names import name_error, recorded_bad_name
from gateway.errors import Forbidden, InvalidRequest, NotFound
from gateway.memory.model import Message
from gateway.routes.relay import read_body
from gateway.routes.schemas import FactEditBody, ImportBody, PinBody, PinEditBody, SearchBody
from gateway.service.facts import FactEdits, fact_view
from gateway.service.operations import SessionOperations
from gateway.service.searching import MOST_SESSIONS, Search
from gateway.service.turn import another_users
from gateway.store.catalog import ListedSession
from gateway.store.keys import SessionKeys, UserKeys

# A tool call's results follow it directly: a short tail of the log shows which are open.
TOOL_CHECK_TAIL = 16


def parse_import(raw: bytes, limits: MessageLimits) -> tuple[Message, ...]:
    """The messages of an import body, within the caps a chat request has."""
    check_raw_message_count(raw, limits)
    data = parse_json(raw or b"{}")
    if isinstance(data, dict):
        check_message_count(data.get("messages"), limits)
    try:
        body = ImportBody.model_validate(data)
    except ValidationError as error:
        raise validation_error(data, error) from None
    check_message_sizes(data["messages"], limits)
    messages = tuple(  # (the validator made each timestamp a float)
        Message.from_openai(raw).but(ts=float(shape.timestamp or 0.0))
        for raw, shape in zip(data["messages"], body.messages, strict=True)
    )
    bad = recorded_bad_name(messages, messages)  # every imported message is stored
    if bad is not None:
        raise name_error(f"messages.{bad.position}.{bad.path}", bad.name)
    return messages


def parse_export(
    raw: bytes, fmt: str, limits: MessageLimits
) -> list[tuple[Conversation, tuple[Message, ...]]]:
    """The conversations of a ChatGPT or Claude export (``gateway.dialects.exports``, as the CLI's
    ``import --from`` reads them) with their messages, each within a chat request's caps."""
    data = parse_json(raw)
    try:
        conversations = list(read_export(fmt, data))
    except ExportError as error:
        param = str(error.number - 1) if error.number else None  # its index in the array
        raise InvalidRequest(str(error), param=param) from None
    read = []
    for conversation in conversations:
        number = conversation.number

        def where(i: int, path: str, number: int = number) -> str:
            return f"conversation {number}, message {i + 1}"

        check_message_sizes(conversation.messages, limits, where)
        messages = tuple(
            Message.from_openai(m).but(ts=float(m.get("timestamp", 0.0)))
            for m in conversation.messages
        )
        read.append((conversation, messages))
    return read


# A clock a little ahead of ours is a clock; a message said next year is not: it would
# pass for the newest of the session for recall's dates and the memory block's.
FUTURE_SKEW_S = 24 * 3600


def check_not_future(messages: Sequence[Message], now: float) -> None:
    """Refuse (400) an imported message said later than a day from ``now``."""
    for i, message in enumerate(messages):
        if message.ts > now + FUTURE_SKEW_S:
            param = f"messages.{i}.timestamp"
            raise InvalidRequest(f"{param}: the message is dated in the future", param=param)


def parse_body(model: type[BaseModel], raw: bytes) -> tuple[Any, Any]:
    """The validated body and the client's JSON it came from."""
    data = parse_json(raw or b"{}")
    try:
        return model.model_validate(data), data
    except ValidationError as error:
        raise validation_error(data, error) from None


def _parse_either(raw: bytes, limits: MessageLimits) -> tuple[Dialect, ProxiedRequest]:
    """A chat-completions body, or a Responses API one (``input`` and no ``messages``)."""
    try:
        body = codec.loads(raw)
    except ValueError:
        body = None  # the chat parser names the problem
    if isinstance(body, dict) and "input" in body and "messages" not in body:
        return RESPONSES, parse_responses_request(raw, limits)
    return CHAT, parse_chat_request(raw, limits)


def _limit(request: Request, default: int = 50, most: int = 1000) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise InvalidRequest(f"limit must be an integer from 1 to {most}", param="limit")
    return int(raw)


class MemoryAPI:
    def __init__(
        self,
        operations: SessionOperations,
        auth: Authenticator,
        *,
        max_body_bytes: int,
        limits: MessageLimits = DEFAULT_LIMITS,
    ) -> None:
        self.limits = limits  # on messages, as in chat requests (server.max_messages...)
        self.ops = operations
        self.memory = operations.memory
        self.store = operations.store
        self.auth = auth
        self.max_body_bytes = max_body_bytes
        self.facts = FactEdits(operations.store, operations.clock)
        self.searching = Search(operations.memory)

    def routes(self) -> list[Route]:
        base = "/memory/sessions/{sid}"
        return [
            Route("/memory/sessions", self.list_sessions, methods=["GET"]),
            Route(base, self.get_session, methods=["GET"]),
            Route(base, self.erase_session, methods=["DELETE"]),
            Route(base + "/messages", self.import_messages, methods=["POST"]),
            Route(base + "/context", self.context, methods=["POST"]),
            Route(base + "/receipts", self.receipts, methods=["GET"]),
            Route(base + "/flush", self.flush, methods=["POST"]),
            Route(base + "/pins", self.list_pins, methods=["GET"]),
            Route(base + "/pins", self.add_pin, methods=["POST"]),
            Route(base + "/pins/{pin_id}", self.edit_pin, methods=["PATCH"]),
            Route(base + "/pins/{pin_id}", self.delete_pin, methods=["DELETE"]),
            Route(base + "/facts", self.list_facts, methods=["GET"]),
            Route(base + "/facts/{fact_id}", self.correct_fact, methods=["PATCH"]),
            Route(base + "/facts/{fact_id}", self.delete_fact, methods=["DELETE"]),
            Route(base + "/search", self.search_session, methods=["POST"]),
            Route(base + "/end", self.end, methods=["POST"]),
            Route(base + "/export", self.export, methods=["GET"]),
            Route("/memory/users/{uid}", self.get_user, methods=["GET"]),
            Route("/memory/users/{uid}", self.erase_user, methods=["DELETE"]),
            Route("/memory/users/{uid}/search", self.search_user, methods=["POST"]),
            Route("/memory/users/{uid}/imports", self.import_export, methods=["POST"]),
        ]

    async def _caller(self, request: Request) -> Caller:
        return await self.auth.memory_caller(request.headers)

    async def _keys(self, request: Request) -> SessionKeys:
        caller = await self._caller(request)  # before any other work
        return await self.session_keys(caller, request.path_params["sid"])

    async def session_keys(self, caller: Caller, session_id: str) -> SessionKeys:
        """The keys of a session of the caller's tenant (the MCP server's tools' too)."""
        session_id = check_id(session_id, "session_id")
        keys = SessionKeys(caller.tenant, session_id)
        if caller.users is not None:
            # A key limited to some users: another user's session is not there for it.
            meta = await self.store.sessions.meta(keys)
            if meta and not caller.may_see(meta.get("user_id")):
                raise NotFound(f"session {session_id!r} not found", param="session_id")
        return keys

    async def visible_sessions(
        self, caller: Caller, search: str | None, limit: int
    ) -> list[ListedSession]:
        """The tenant's sessions the caller may see, the last active first."""
        if search is not None:
            check_id(search, "search")
        listed = await self.ops.sessions(caller.tenant, search=search, limit=limit)
        return [s for s in listed if caller.may_see(s.user_id)]

    async def list_sessions(self, request: Request) -> Response:
        caller = await self._caller(request)
        search = request.query_params.get("search") or None
        visible = await self.visible_sessions(caller, search, _limit(request))
        return JSONResponse({"sessions": [session.to_data() for session in visible]})

    async def get_session(self, request: Request) -> Response:
        keys = await self._keys(request)
        return JSONResponse(self.ops.view(keys, await self.ops.existing(keys)))

    async def receipts(self, request: Request) -> Response:
        keys = await self._keys(request)
        await self.ops.existing(keys)
        return JSONResponse({"receipts": await self.ops.receipts(keys)})

    async def import_messages(self, request: Request) -> Response:
        keys = await self._keys(request)
        raw = await read_body(request, self.max_body_bytes)
        messages = await offload.sized(len(raw), parse_import, raw, self.limits)
        check_not_future(messages, self.ops.clock())
        caller = await self._caller(request)
        user_id = caller.user_id(header_id(request.headers, "X-User-Id"))
        # Tool results must answer a call, in the import or at the end of the stored log:
        # an orphan stored now would be forwarded, and refused upstream, on every turn.
        stored = await self.store.sessions.load(keys, TOOL_CHECK_TAIL)
        check_tool_results(messages, stored.tail)
        recorder = self.memory.recorder
        # Its bytes are reserved against the quota before anything is written (429).
        count = await recorder.import_messages(
            keys, user_id, messages, now=self.ops.clock(), quota=caller.quota_bytes
        )
        _, _, pending = await self.store.sessions.job_state(keys)
        return JSONResponse(
            {"message_count": count, "imported": len(messages), "pending_jobs": len(pending)}
        )

    async def context(self, request: Request) -> Response:
        """What the proxy would forward for this body, recording nothing: ``messages`` for
        a chat-completions body, ``input`` for a Responses API one."""
        keys = await self._keys(request)
        raw = await read_body(request, self.max_body_bytes)
        # As the proxy would see it.
        user_id = (await self._caller(request)).user_id(header_id(request.headers, "X-User-Id"))
        return JSONResponse(await self.preview(keys, user_id, raw))

    async def preview(self, keys: SessionKeys, user_id: str | None, raw: bytes) -> dict[str, Any]:
        """The context a turn of ``raw`` (a chat-completions or Responses API body) by
        ``user_id`` would forward in the session, and its receipt; nothing is recorded."""
        dialect, parsed = await offload.sized(len(raw), _parse_either, raw, self.limits)
        identity = Identity(keys.tenant, keys.session_id, user_id, MemoryMode.READ)
        turn = await self.memory.prepare(
            identity,
            parsed.messages,
            parsed.model,
            requested_output=dialect.requested_output(parsed.body),
        )
        check_turn_tool_results(parsed.messages, turn.plan.new, turn.plan.prior)
        parsed.check_recorded(turn.plan.to_record)
        field = "input" if dialect is RESPONSES else "messages"
        context = turn.context.openai_messages()
        forwarded = codec.loads(parsed.forwarded(context, turn.plan.resolved))
        return {field: forwarded[field], "receipt": turn.context.receipt.to_json()}

    async def flush(self, request: Request) -> Response:
        ran, pending = await self.ops.flush(await self._keys(request))
        return JSONResponse({"ran": ran, "pending_jobs": pending})

    async def list_pins(self, request: Request) -> Response:
        state = await self.ops.existing(await self._keys(request))
        pins = sorted(state.pins, key=lambda p: (-p.importance, -p.created))
        return JSONResponse({"pins": [p.to_data() for p in pins]})

    async def add_pin(self, request: Request) -> Response:
        keys = await self._keys(request)
        body, _ = parse_body(PinBody, await read_body(request, self.max_body_bytes))
        caller = await self._caller(request)
        pin = await self.ops.add_pin(
            keys, body.content, body.importance, body.source_index, quota=caller.quota_bytes
        )
        return JSONResponse(pin.to_data(), status_code=201)

    async def edit_pin(self, request: Request) -> Response:
        keys = await self._keys(request)
        body, _ = parse_body(PinEditBody, await read_body(request, self.max_body_bytes))
        quota = (await self._caller(request)).quota_bytes
        pin = await self.ops.edit_pin(
            keys, request.path_params["pin_id"], body.content, body.importance, quota
        )
        return JSONResponse(pin.to_data())

    async def delete_pin(self, request: Request) -> Response:
        await self.ops.delete_pin(await self._keys(request), request.path_params["pin_id"])
        return Response(status_code=204)

    async def list_facts(self, request: Request) -> Response:
        keys = await self._keys(request)
        facts = await self.facts.facts(keys)
        return JSONResponse({"facts": [fact_view(keys.session_id, f) for f in facts]})

    async def correct_fact(self, request: Request) -> Response:
        keys = await self._keys(request)
        body, _ = parse_body(FactEditBody, await read_body(request, self.max_body_bytes))
        fact = await self.facts.correct(keys, request.path_params["fact_id"], body.text)
        return JSONResponse(fact_view(keys.session_id, fact))

    async def delete_fact(self, request: Request) -> Response:
        keys = await self._keys(request)
        await self.facts.delete(keys, request.path_params["fact_id"])
        return Response(status_code=204)

    async def search_session(self, request: Request) -> Response:
        keys = await self._keys(request)
        body, _ = parse_body(SearchBody, await read_body(request, self.max_body_bytes))
        return JSONResponse({"results": await self.search_session_memory(keys, body)})

    async def search_session_memory(self, keys: SessionKeys, body: SearchBody) -> list[Any]:
        await self.ops.existing(keys)
        return await self.searching.search(keys.tenant, [keys.session_id], body.query, body.limit)

    async def search_user(self, request: Request) -> Response:
        user = await self._user(request)
        body, _ = parse_body(SearchBody, await read_body(request, self.max_body_bytes))
        return JSONResponse({"results": await self.search_user_memory(user, body)})

    async def search_user_memory(self, user: UserKeys, body: SearchBody) -> list[Any]:
        """The best memories of the user's last active sessions (404 without any)."""
        sessions = await self.store.users.newest_sessions(
            user, await self._user_sessions(user), MOST_SESSIONS
        )
        return await self.searching.search(user.tenant, sessions, body.query, body.limit)

    async def import_export(self, request: Request) -> Response:
        """A ChatGPT or Claude data export (its ``conversations.json`` as the body): each
        conversation a session of the user, unless that session exists already (imported
        before: a retried or resumed import adds nothing twice)."""
        caller = await self._caller(request)
        user = user_keys(caller, request.path_params["uid"])
        fmt = request.query_params.get("format")
        if fmt not in FORMATS:
            raise InvalidRequest("format must be chatgpt or claude", param="format")
        raw = await read_body(request, self.max_body_bytes)
        read = await offload.sized(len(raw), parse_export, raw, fmt, self.limits)
        now = self.ops.clock()
        for conversation, messages in read:
            try:
                check_not_future(messages, now)
            except InvalidRequest as error:
                raise InvalidRequest(
                    f"conversation {conversation.number}: {error.message}",
                    param=str(conversation.number - 1),
                ) from None
        importing = [(c, m) for c, m in read if m]
        # Every session is looked at before anything is written: one of another user's
        # refuses the whole import (404, as for any session the caller cannot see).
        states = await asyncio.gather(*(
            self.store.sessions.load(SessionKeys(user.tenant, c.session_id), 1)
            for c, _ in importing
        ))  # fmt: skip
        counts = []
        for (conversation, _), state in zip(importing, states, strict=True):
            if another_users(state.user_id, user.user_id):
                raise NotFound(f"session {conversation.session_id!r} not found", param="session_id")
            counts.append(state.message_count)
        quota = caller.quota_bytes
        sessions, imported, sent = [], 0, 0
        for (conversation, messages), count in zip(importing, counts, strict=True):
            status = "existing"
            if not count:
                keys = SessionKeys(user.tenant, conversation.session_id)
                count = await self.memory.recorder.import_messages(
                    keys, user.user_id, messages, now=self.ops.clock(), quota=quota
                )
                status, imported, sent = "imported", imported + 1, sent + len(messages)
            sessions.append({
                "session_id": conversation.session_id, "title": conversation.title,
                "status": status, "messages": len(messages), "message_count": count,
            })  # fmt: skip
        return JSONResponse({
            "user_id": user.user_id,
            "conversations": len(read),
            "imported": imported,
            "existing": len(sessions) - imported,
            "empty": len(read) - len(importing),
            "messages": sent,
            "sessions": sessions,
        })  # fmt: skip

    async def end(self, request: Request) -> Response:
        return JSONResponse(await self.ops.end(await self._keys(request)))

    async def export(self, request: Request) -> Response:
        fmt = request.query_params.get("format", "json")
        if fmt not in ("json", "markdown"):
            raise InvalidRequest("format must be json or markdown", param="format")
        keys = await self._keys(request)
        if fmt == "markdown":
            text = await self.ops.export_markdown(keys)
            return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")
        return Response(
            await self.ops.export_json(keys),
            media_type="application/json",
            headers={"content-disposition": 'attachment; filename="session.json"'},
        )

    async def erase_session(self, request: Request) -> Response:
        await self.ops.erase(await self._keys(request))
        return Response(status_code=204)

    async def get_user(self, request: Request) -> Response:
        user = await self._user(request)
        sessions = await self._user_sessions(user)
        profile = await self.store.users.user_profile(user)
        return JSONResponse(
            {
                "user_id": user.user_id,
                "sessions": sessions,
                "profile": {k: profile.get(k, d) for k, d in (("summary", ""), ("facts", []))}
                if profile
                else None,
                "facts": await self.facts.user_facts(user, sessions),
            }
        )

    async def _user_sessions(self, user: UserKeys) -> list[str]:
        """The user's sessions (404 without any: unknown here, or another tenant's)."""
        sessions = await self.store.users.user_sessions(user)
        if not sessions:
            raise NotFound(f"user {user.user_id!r} not found", param="user_id")
        return sessions

    async def erase_user(self, request: Request) -> Response:
        await self.erase_user_memory(await self._user(request))
        return Response(status_code=204)

    async def erase_user_memory(self, user: UserKeys) -> None:
        if not await self.store.sessions.erase_user(user):
            raise NotFound(f"user {user.user_id!r} not found", param="user_id")

    async def _user(self, request: Request) -> UserKeys:
        return user_keys(await self._caller(request), request.path_params["uid"])


def user_keys(caller: Caller, user_id: str) -> UserKeys:
    """The keys of a user of the caller's tenant, if the caller may act for them (403)."""
    allowed = caller.user_id(check_id(user_id, "user_id"))
    if allowed is None:  # auth.trust_user_header: false
        raise Forbidden(
            "user ids are not trusted in this configuration (auth.trust_user_header)",
            param="user_id",
            code="user_not_allowed",
        )
    return UserKeys(caller.tenant, allowed)
