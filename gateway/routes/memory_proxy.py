"""``POST /v1/chat/completions`` and ``POST /v1/responses``: the memory proxy.

One route serves both APIs; what differs between them (body, answer, stream) is its
``Dialect`` (``gateway/dialects``), and every memory decision is the service's
(``service/turn_service``). For a request with ``X-Session-Id``: parse it, open its turn,
forward the context, relay the answer as it arrives, and have the turn recorded once the
upstream has ended it cleanly — before the last bytes reach the client, so a client that
saw ``[DONE]`` (or ``response.completed``) finds its turn in memory on its next request.
"""

from __future__ import annotations

from collections.abc import Awaitable
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.auth.authenticator import Authenticator, Caller
from gateway.auth.identity import MemoryMode, header_id, memory_mode
from gateway.config import Settings
from gateway.dialects.base import Dialect
from gateway.dialects.chat.dialect import CHAT
from gateway.errors import InvalidRequest, UpstreamError
from gateway.http import rate_limits, token_costs
from gateway.memory.model import Message
from gateway.observability import metrics, request_log
from gateway.routes.over_chat import ResponsesUpstream
from gateway.routes.passthrough import Passthrough
from gateway.routes.relay import (
    CLIENT_CLOSED,
    ClientGone,
    raw_headers,
    read_body,
    relay_stream,
    relay_watched,
    streamed,
    unless_client_leaves,
)
from gateway.service.replies import close_quietly, parsed, read_whole
from gateway.service.turn import Turn
from gateway.service.turn_service import AsSent, Forwarded, TurnService
from gateway.upstream.client import Upstream, UpstreamResponse
from gateway.upstream.headers import media_type, request_headers

_MEMORY_OFF = {"x-memory-status": "off"}


def _status(headers: dict[str, str], status: str) -> dict[str, str]:
    """``headers`` saying ``status`` instead: "not_recorded" when memory was used but the
    upstream gave no answer to record (an error status), "degraded" when one was lost."""
    return {**headers, "x-memory-status": status}


class MemoryProxy:
    """The memory proxy of one API, told by its ``dialect`` (chat completions by default)."""

    def __init__(
        self,
        settings: Settings,
        *,
        upstream: Upstream,
        turns: TurnService,
        auth: Authenticator,
        passthrough: Passthrough,
        dialect: Dialect = CHAT,
        responses: ResponsesUpstream | None = None,
    ) -> None:
        self.settings = settings
        self.dialect = dialect
        self.upstream = upstream
        self.turns = turns
        self.auth = auth
        self.passthrough = passthrough
        # The Responses route's choice of upstream API (``upstream.responses``): None for
        # chat completions, and for a Responses upstream that is always native.
        self.responses = responses if responses is not None and responses.mode != "native" else None

    async def handle(self, request: Request) -> Response:
        caller = self.auth.identify(request.headers)  # before any other work
        session_id = header_id(request.headers, "X-Session-Id")
        if session_id is None:
            if self.settings.server.require_session:
                raise InvalidRequest(
                    "X-Session-Id header is required", param="X-Session-Id", code="missing_session"
                )
            if self.responses is None:
                return await self.passthrough.forward(request, caller, extra=_MEMORY_OFF)
            body = await read_body(request, self.settings.server.max_body_bytes)
            return await self._as_sent(request, caller, body, None, _MEMORY_OFF)
        body = await read_body(request, self.settings.server.max_body_bytes)
        mode = memory_mode(request.headers)
        user_id = caller.user_id(header_id(request.headers, "X-User-Id"))
        parsed = await self.dialect.parse(body, self.settings.server)
        request_log.note(
            session_id=request_log.client_string(session_id),
            memory_mode=mode.value,
            model=request_log.model_field(parsed.model),
            stream=parsed.stream,
        )
        if mode is MemoryMode.OFF:
            return await self._as_sent(request, caller, body, parsed.messages, _MEMORY_OFF)
        requested = self.dialect.requested_output(parsed.body)
        turn = await self.turns.open(
            caller, session_id, user_id, mode, parsed.messages, parsed.model, requested
        )
        if isinstance(turn, AsSent):
            extra = {"x-memory-status": turn.status}
            return await self._as_sent(request, caller, body, parsed.messages, extra)
        # Of the history, only what this turn stores: a call kept from an earlier answer
        # and sent back with it must not refuse the session.
        parsed.check_recorded(turn.plan.to_record)
        # The context as counted, reserved against a token limit before it goes (429 when
        # it would pass it: the turn is not forwarded, nothing is recorded).
        await rate_limits.reserve(turn.context.receipt.total_tokens)
        headers = request_headers(
            request.headers.items(),
            api_key=self.upstream.key_for(caller.upstream_key),
            rewritten=True,
            allowlist=self.passthrough.allowlist,
            key_header=self.upstream.key_header,
        )

        def send(turn: Turn) -> Awaitable[UpstreamResponse]:
            if self.responses is not None:
                context = turn.context.openai_messages()

                async def conversation() -> tuple[dict[str, Any], list[dict[str, Any]]]:
                    return parsed.body, context

                return self.responses.open(
                    lambda: parsed.forwarded(context, turn.plan.resolved),
                    conversation,
                    query=request.scope.get("query_string", b""),
                    headers=headers,
                )
            return self.upstream.open(
                "POST",
                request.scope["path"],  # not request.url: building it is ~2% of a request
                query=request.scope.get("query_string", b""),
                headers=headers,
                content=parsed.forwarded(turn.context.openai_messages(), turn.plan.resolved),
            )

        timer = metrics.timer(request.scope)
        timer.upstream_sent()
        forwarding = self.turns.forward(turn, send)
        try:
            if not parsed.stream:
                return await unless_client_leaves(request.receive, self._whole(request, forwarding))
            sent = await unless_client_leaves(request.receive, forwarding)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        timer.upstream_answered()
        if sent.refusal is not None:
            return _read(sent.reply, sent.refusal, _status(sent.headers, "not_recorded"))
        return await self._stream(request, sent)

    async def _as_sent(
        self,
        request: Request,
        caller: Caller,
        body: bytes,
        messages: tuple[Message, ...] | None,
        extra: dict[str, str],
    ) -> Response:
        """The request forwarded as the client sent it (memory off, or nothing for it to
        do); under a token limit, its prompt reserved as parsed (images at their cost).
        ``messages``: None when it was not parsed (no session)."""
        tokens = None
        if rate_limits.counting_tokens() and messages is not None:
            tokens = token_costs.body_tokens(len(body), messages)
        opener = None
        if self.responses is not None:
            # Over chat as the memory route's answers are, only without memory.
            responses, query = self.responses, request.scope.get("query_string", b"")

            async def conversation() -> tuple[dict[str, Any], list[dict[str, Any]]]:
                parsed = await self.dialect.parse(body, self.settings.server)
                return parsed.body, [m.to_openai() for m in parsed.messages]

            def opener(headers: list[tuple[str, str]]) -> Awaitable[UpstreamResponse]:
                return responses.open(lambda: body, conversation, query=query, headers=headers)

        return await self.passthrough.forward(
            request, caller, body=body, extra=extra, tokens=tokens, opener=opener
        )

    async def _whole(
        self, request: Request, forwarding: Awaitable[Forwarded[UpstreamResponse]]
    ) -> Response:
        """A whole answer: relayed once read, and once recorded."""
        sent = await forwarding
        upstream, turn, headers = sent.reply, sent.turn, sent.headers
        raw = await read_whole(upstream) if sent.refusal is None else sent.refusal
        metrics.timer(request.scope).upstream_answered()  # the whole answer: relayed only so
        # "ok" only for an answer recorded (or, in read mode, not meant to be).
        extra = _status(headers, "not_recorded")
        if upstream.status_code in (200, 401):  # (a refusal read already is a 400)
            self._judged(request, upstream.status_code)
            completion = await parsed(raw)
            answer, usage = self.dialect.answer(completion), self.dialect.usage(completion)
            if upstream.status_code == 200 and answer is not None:
                stored = await self.turns.record(turn, answer, usage)
                extra = headers if stored else _status(headers, "degraded")
            self._completed(turn, answer, usage)
        return _read(upstream, raw, extra)

    async def _stream(self, request: Request, sent: Forwarded[UpstreamResponse]) -> Response:
        """A streamed answer, relayed as it arrives (an error status's too, as it came)."""
        upstream, headers = sent.reply, sent.headers
        self._judged(request, upstream.status_code)
        if upstream.status_code != 200:
            body = relay_stream(upstream, decoded=True)
            return streamed(upstream, body, decoded=True, extra=_status(headers, "not_recorded"))
        received = media_type(upstream.headers)
        if received not in (None, "text/event-stream"):
            # An upstream that ignored stream=true: its JSON (or HTML) would reach the SDK
            # as an empty stream. Nothing has been sent yet: a plain error still can be.
            await close_quietly(upstream)
            raise UpstreamError(
                f"the upstream answered a streaming request with {received}, not an event stream",
                code="upstream_not_streaming",
            )
        turn = sent.turn
        body = relay_watched(
            upstream,
            self.dialect.watch(),
            partial(self.turns.record, turn) if turn.records else None,
            lambda watch: self._completed(turn, watch.message(), watch.usage),
        )
        return streamed(upstream, body, decoded=True, extra=headers)

    def _judged(self, request: Request, status: int) -> None:
        """The upstream took the client's key (200), or refused it (401)."""
        if status == 200:
            self.auth.accepted(request.headers)
        elif status == 401:
            self.auth.refused(request.headers)

    def _completed(self, turn: Turn, answer: Message | None, usage: Any) -> None:
        rate_limits.charge(self.turns.completed(turn, answer, usage))  # tokens a minute


def _read(upstream: UpstreamResponse, raw: bytes, extra: dict[str, str]) -> Response:
    """An answer the gateway read whole, relayed as it came (decoded)."""
    response = Response(raw, status_code=upstream.status_code)
    response.raw_headers = raw_headers(upstream, decoded=True, extra=extra)
    response.headers["content-length"] = str(len(raw))  # the decoded body's length
    return response
