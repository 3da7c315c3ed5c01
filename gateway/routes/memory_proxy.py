"""``POST /v1/chat/completions`` and ``POST /v1/responses``: the memory proxy.

One pipeline serves both APIs; what differs between them (body, answer, stream) is the
route's ``Dialect`` (``gateway/dialects``). For a request with ``X-Session-Id``: load the
session (one Redis round trip), plan the context (pure), forward it, relay the answer as
it arrives, and record the turn once the upstream has ended it cleanly — before the last
bytes reach the client, so a client that saw ``[DONE]`` (or ``response.completed``) finds
its turn in memory on its next request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, NamedTuple

import anyio
from starlette.requests import Request
from starlette.responses import Response

from gateway import codec
from gateway.auth.authenticator import Authenticator, Caller
from gateway.auth.identity import Identity, MemoryMode, header_id, memory_mode
from gateway.config import Settings
from gateway.dialects.base import Dialect, ProxiedRequest, StreamWatcher
from gateway.dialects.chat.dialect import CHAT
from gateway.dialects.chat.request import check_turn_tool_results
from gateway.errors import (
    InvalidRequest,
    MemoryUnavailable,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.http import rate_limits
from gateway.memory.model import Message
from gateway.memory.model_budget import Ceilings, context_overflow, retry_budget
from gateway.observability import metrics, request_log
from gateway.routes.passthrough import Passthrough
from gateway.routes.relay import (
    CLIENT_CLOSED,
    ClientGone,
    close_quietly,
    raw_headers,
    read_body,
    relay_stream,
    streamed,
    unless_client_leaves,
)
from gateway.service.answer_tokens import note_tokens_out
from gateway.service.memory_service import MemoryService
from gateway.service.turn import Turn
from gateway.store.redis_store import StoreUnavailable
from gateway.upstream.body import UpstreamResponseTooLarge, UpstreamStreamBroken
from gateway.upstream.client import Upstream, UpstreamResponse
from gateway.upstream.headers import media_type, request_headers

log = logging.getLogger(__name__)

_MEMORY_OFF = {"x-memory-status": "off"}
# Memory was used, but the upstream gave no answer to record (an error status).
NOT_RECORDED = "not_recorded"
# A stream whose turn could not be stored ends with this error instead of its
# acknowledgement ([DONE], response.completed).
_NOT_STORED = (
    "the answer was not stored in memory (memory store unavailable); resend the turn to "
    "have it remembered"
)


def _kept(answer: Message, limit: int) -> Message:
    """The answer as memory keeps it: its text cut at the size a client's message may
    have. An answer may be up to ``upstream.max_response_bytes``; stored whole, one
    would make the record script copy tens of MB while Redis serves no one else, to keep
    text no context budget could ever send again."""
    text = answer.content
    if not isinstance(text, str) or len(text) <= limit // 4:  # (at most 4 bytes a char)
        return answer
    head = text[:limit]  # (``limit`` bytes take at most as many characters)
    raw = head.encode("utf-8", "surrogatepass")
    if len(raw) <= limit and len(head) == len(text):
        return answer
    cut = raw[: limit - 128].decode("utf-8", "ignore")  # room for the note
    note = f"\n[… this answer was cut at {len(cut):,} of its {len(text):,} characters]"
    return Message(role=answer.role, content=cut + note, tool_calls=answer.tool_calls)


def _unanswered(memory_headers: dict[str, str]) -> dict[str, str]:
    return {**memory_headers, "x-memory-status": NOT_RECORDED}


class MemoryProxy:
    """The memory proxy of one API, told by its ``dialect`` (chat completions by default)."""

    def __init__(
        self,
        settings: Settings,
        *,
        upstream: Upstream,
        memory: MemoryService,
        auth: Authenticator,
        passthrough: Passthrough,
        dialect: Dialect = CHAT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.dialect = dialect
        self.upstream = upstream
        self.memory = memory
        self.auth = auth
        self.passthrough = passthrough
        self.clock = clock
        # Budgets that fitted models after their refusals (``_fitted``).
        self.ceilings = Ceilings()
        # Recording tasks run to completion even if their request is cancelled.
        self._recordings: set[asyncio.Task[bool]] = set()

    async def handle(self, request: Request) -> Response:
        caller = self.auth.identify(request.headers)  # before any other work
        session_id = header_id(request.headers, "X-Session-Id")
        if session_id is None:
            if self.settings.server.require_session:
                raise InvalidRequest(
                    "X-Session-Id header is required", param="X-Session-Id", code="missing_session"
                )
            return await self.passthrough.forward(request, caller, extra=_MEMORY_OFF)
        body = await read_body(request, self.settings.server.max_body_bytes)
        mode = memory_mode(request.headers)
        user_id = caller.user_id(header_id(request.headers, "X-User-Id"))
        parsed = await self.dialect.parse(body, self.settings.server)
        request_log.note(
            session_id=request_log.client_string(session_id),
            memory_mode=mode.value,
            model=request_log.client_string(parsed.model),
            stream=parsed.stream,
        )
        if mode is MemoryMode.OFF:
            return await self.passthrough.forward(request, caller, body=body, extra=_MEMORY_OFF)

        try:
            caller = await self.auth.resolve(caller)
            request_log.note(tenant=caller.tenant)  # a keyed hash of the key, never the key
            if user_id is not None:
                mode_ = self.settings.server.log_user_ids
                keyed = self.auth.tenants.keyed
                request_log.note(user_id=request_log.user_field(user_id, mode_, keyed))
            identity = Identity(
                caller.tenant, session_id, user_id, mode, caller.quota_bytes, caller.users
            )
            # The model's budget, or less when it refused a larger context lately.
            requested = self.dialect.requested_output(parsed.body)
            budget = self.memory.budget_for(parsed.model, requested)
            budget = self.ceilings.bound(parsed.model, budget, self.clock())
            turn = await self.memory.prepare(
                identity, parsed.messages, parsed.model, budget_tokens=budget
            )
        except StoreUnavailable as error:
            if self.settings.redis.on_failure == "closed":
                raise MemoryUnavailable(
                    "memory store unavailable; the gateway is configured to fail closed"
                ) from None
            log.warning("memory degraded for this request: %s", error)
            metrics.degraded("redis_unavailable")
            return await self.passthrough.forward(
                request, caller, body=body, extra={"x-memory-status": "degraded"}
            )
        check_turn_tool_results(parsed.messages, turn.plan.new, turn.plan.prior)
        if not turn.plan.new:
            # Nothing new to answer (the request ends with an assistant message, as in a
            # prefill): forward as sent rather than guess.
            return await self.passthrough.forward(request, caller, body=body, extra=_MEMORY_OFF)
        return await self._forward(request, parsed, turn, caller)

    async def _forward(
        self, request: Request, parsed: ProxiedRequest, turn: Turn, caller: Caller
    ) -> Response:
        headers = request_headers(
            request.headers.items(),
            api_key=caller.upstream_key,
            strip_gateway_headers=True,
            identity_encoding=True,
        )

        def send(turn: Turn) -> Awaitable[UpstreamResponse]:
            content = parsed.forwarded(turn.context.openai_messages())
            return self.upstream.open(
                "POST",
                request.scope["path"],  # not request.url: building it is ~2% of a request
                query=request.scope.get("query_string", b""),
                headers=headers,
                content=content,
            )

        opening = self._fitted(send, turn, self.dialect.requested_output(parsed.body))
        record = turn.identity.mode is MemoryMode.ON
        timer = metrics.timer(request.scope)
        timer.upstream_sent()
        try:
            if not parsed.stream:
                return await unless_client_leaves(
                    request.receive,
                    self._complete(
                        opening,
                        record,
                        timer,
                        lambda ok: (self.auth.accepted if ok else self.auth.refused)(
                            request.headers
                        ),
                    ),
                )
            sent = await unless_client_leaves(request.receive, opening)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        upstream, turn = sent.upstream, sent.turn
        memory_headers = _memory_headers(turn)
        timer.upstream_answered()
        if sent.refusal is not None:
            return _refused(sent, memory_headers)
        if upstream.status_code == 200:
            self.auth.accepted(request.headers)
        elif upstream.status_code == 401:
            self.auth.refused(request.headers)
        if upstream.status_code != 200:
            body = relay_stream(upstream, decoded=True)
            return streamed(upstream, body, decoded=True, extra=_unanswered(memory_headers))
        received = media_type(upstream.headers)
        if received not in (None, "text/event-stream"):
            # An upstream that ignored stream=true: its JSON (or HTML) would reach the SDK
            # as an empty stream. Nothing has been sent yet, so a plain error is still
            # possible.
            await close_quietly(upstream)
            raise UpstreamError(
                f"the upstream answered a streaming request with {received}, not an event stream",
                code="upstream_not_streaming",
            )
        return streamed(
            upstream, self._relay(upstream, turn, record), decoded=True, extra=memory_headers
        )

    async def _complete(
        self,
        opening: Awaitable[_Sent],
        record: bool,
        timer: metrics.RequestTimer,
        accepted: Callable[[bool], None],
    ) -> Response:
        sent = await opening
        upstream, turn = sent.upstream, sent.turn
        memory_headers = _memory_headers(turn)
        if sent.refusal is not None:
            timer.upstream_answered()
            return _refused(sent, memory_headers)
        raw = await _read_whole(upstream)
        timer.upstream_answered()  # the whole answer: it is relayed only once read
        # "ok" only for an answer recorded (or, in read mode, not meant to be).
        headers = _unanswered(memory_headers)
        if upstream.status_code in (200, 401):
            accepted(upstream.status_code == 200)  # the upstream took the client's key, or not
            try:
                completion = codec.loads(raw)
            except ValueError:
                completion = None
            answer = self.dialect.answer(completion)
            if upstream.status_code == 200 and answer is not None:
                stored = not record or await self._record(turn, answer)
                headers = (
                    memory_headers if stored else {**memory_headers, "x-memory-status": "degraded"}
                )
            self._answered(turn, answer, self.dialect.usage(completion))
        response = Response(raw, status_code=upstream.status_code)
        response.raw_headers = raw_headers(upstream, decoded=True, extra=headers)
        response.headers["content-length"] = str(len(raw))  # the decoded body's length
        return response

    async def _fitted(
        self,
        send: Callable[[Turn], Awaitable[UpstreamResponse]],
        turn: Turn,
        requested: int | None,
    ) -> _Sent:
        """The upstream's answer to ``turn``'s context; when it refuses that context as
        longer than the model's window, to one planned again within a budget that fits
        (``model_budget.retry_budget``): once, never for any other answer. Without this,
        a session that outgrew a small model (the default 3,000-token budget against
        llama.cpp's 2,048) would be refused on every turn from then on."""
        upstream = await send(turn)
        if upstream.status_code != 400:  # the one status an overflow comes with
            return _Sent(upstream, turn)
        refusal = await _read_whole(upstream)
        overflow = context_overflow(upstream.status_code, refusal)
        if overflow is None:
            return _Sent(upstream, turn, refusal)
        sent_tokens = turn.context.receipt.total_tokens
        budget = retry_budget(sent_tokens, overflow, requested)
        try:
            smaller = await self.memory.prepare(
                turn.identity, turn.messages, turn.model, budget_tokens=budget
            )
        except StoreUnavailable:
            return _Sent(upstream, turn, refusal)  # the refusal stands, as the upstream said
        if smaller.context.receipt.total_tokens >= sent_tokens:
            # Only the prompt, the new turn and the window's last messages were left: a
            # smaller budget would send the same again.
            return _Sent(upstream, turn, refusal)
        log.info(
            "upstream refused a %d-token context as too long; retrying within %d tokens",
            sent_tokens,
            budget,
        )
        metrics.context_retry()
        request_log.note(context_retry=sent_tokens)
        answer = await send(smaller)
        if answer.status_code == 200:
            self.ceilings.fitted(turn.model, budget, self.clock())
        return _Sent(answer, smaller)

    async def _relay(
        self, upstream: UpstreamResponse, turn: Turn, record: bool
    ) -> AsyncGenerator[bytes, None]:
        """Pass the stream through chunk by chunk while watching it for a clean end.

        The turn is recorded on the acknowledging event (chat's ``[DONE]``, Responses'
        ``response.completed``) before that event is passed on (or, for chat, when the
        upstream closes after a ``finish_reason``); see the dialect's watch for what counts.
        """
        watch = self.dialect.watch()
        recorded = False
        try:
            held = b""  # an event begun but not ended, when the dialect holds those back
            async for chunk in upstream.iter_body(decoded=True):
                watch.feed(chunk)
                if held:
                    chunk, held = held + chunk, b""
                if watch.done and not recorded:
                    recorded = True
                    # The answer's events go out at once; only [DONE] waits for the
                    # record (an upstream often sends the last events and [DONE] in one
                    # chunk, and a fast one sends the whole answer so).
                    before, done = watch.split(chunk)
                    if before:
                        yield before
                    if not await self._record_watched(turn if record else None, watch):
                        # And no acknowledgement: the turn is not stored.
                        yield watch.error_event(_NOT_STORED, "memory_error", "memory_not_recorded")
                        return
                    chunk = done
                else:
                    chunk, held = watch.hold(chunk)
                if chunk:
                    yield chunk
            watch.close()
            # ``held`` is an event the upstream never ended: a client discards it (SSE),
            # so it is dropped, and an error event after it is read whole.
            if not watch.ended:
                # A clean close in mid-answer is a break all the same; without this event
                # the client would take the truncated answer for the whole one.
                log.warning("upstream closed the stream before the answer ended")
                metrics.stream_error("upstream_stream_incomplete")
                yield watch.error_event(
                    "the upstream closed the stream before the answer ended",
                    "upstream_error",
                    "upstream_stream_incomplete",
                )
            elif not recorded and not await self._record_watched(turn if record else None, watch):
                yield watch.error_event(_NOT_STORED, "memory_error", "memory_not_recorded")
        except UpstreamStreamBroken as error:
            # Headers are gone: report in-band, and no [DONE] so the client knows.
            log.warning("upstream stream ended abnormally: %s", error)
            code = error.code
            metrics.stream_error(code)
            yield watch.error_event(str(error), "upstream_error", code)
        finally:
            # What was relayed, however the stream ended (a client that left included).
            self._answered(turn, watch.message(), watch.usage)
            await close_quietly(upstream)

    async def _record_watched(self, turn: Turn | None, watch: StreamWatcher) -> bool:
        """Record a finished stream's turn; False when it should have been and was not."""
        if turn is None:
            return True
        if watch.recordable:
            return await self._record(turn, watch.message())
        if watch.unreadable:
            # Relayed untouched, as it came; the client can tell it is malformed.
            log.warning("turn not recorded: the upstream stream was malformed")
        return True

    async def _record(self, turn: Turn, answer: Message) -> bool:
        """Record the turn whole: shielded, so a disconnect cannot cut it half-way."""
        answer = _kept(answer, self.settings.server.max_message_bytes)
        task = asyncio.ensure_future(self._record_now(turn, answer))
        self._recordings.add(task)
        task.add_done_callback(self._recordings.discard)
        with anyio.CancelScope(shield=True):
            recorded = await asyncio.shield(task)
        return recorded

    async def _record_now(self, turn: Turn, answer: Message) -> bool:
        try:
            await self.memory.record(
                turn,
                answer,
                now=self.clock(),
                retry_s=self.settings.redis.record_retry_s,
                request_id=request_log.current_request_id(),
            )
        except StoreUnavailable as error:
            # The answer is not acknowledged: a stream ends with an error event instead of
            # [DONE], a whole answer says "degraded". A client that resends its history
            # brings the turn back (see reconcile).
            log.warning("turn not recorded: %s", error)
            metrics.degraded("record_failed")
            # A stream's header said "ok" before this: its access line says what happened.
            request_log.note(memory_status="degraded")
            return False
        return True

    def _answered(self, turn: Turn, answer: Message | None, usage: Any) -> None:
        """The answer's tokens on the access line (the upstream's count when it gave one)
        and, with content logging on (``gateway.content`` at DEBUG), the turn's content."""
        rate_limits.charge(turn, answer, usage, self.memory.counter)  # tokens a minute
        if request_log.collecting():
            tokens = _completion_tokens(usage)
            if tokens is not None:
                request_log.note(tokens_out=tokens)
            elif answer is not None:
                # Counted once the client has the whole response, a long answer (one a
                # client left unread, up to upstream.max_response_bytes) off the loop
                # and only in part: see answer_tokens.
                note_tokens_out(self.memory.counter, answer, turn.model)
        if answer is not None and request_log.content_enabled():
            request_log.log_content(
                turn.identity.session_id, turn.context.openai_messages(), answer.to_openai()
            )


class _Sent(NamedTuple):
    """What the upstream answered, to which turn's context (a retry's, after a refusal
    of a context too long); ``refusal``: an error answer already read (and closed)."""

    upstream: UpstreamResponse
    turn: Turn
    refusal: bytes | None = None


def _memory_headers(turn: Turn) -> dict[str, str]:
    """The memory headers of an answer to ``turn`` (noted, with its tokens, for the
    metrics and the access line: once, for the context that went)."""
    receipt = turn.context.receipt
    metrics.tokens(turn.client_tokens, receipt.total_tokens)
    request_log.note(
        tokens_in=turn.client_tokens,
        tokens_context=receipt.total_tokens,
        tiers=receipt.tiers,
        recalled=len(receipt.recalled),
    )
    return {
        "x-memory-status": "ok",
        "x-memory-context-tokens": str(receipt.total_tokens),
        "x-memory-receipt": receipt.header(),
    }


def _refused(sent: _Sent, memory_headers: dict[str, str]) -> Response:
    """An error answer the gateway read (to see whether it was a context too long),
    relayed as it came."""
    raw = sent.refusal or b""
    response = Response(raw, status_code=sent.upstream.status_code)
    response.raw_headers = raw_headers(
        sent.upstream, decoded=True, extra=_unanswered(memory_headers)
    )
    response.headers["content-length"] = str(len(raw))
    return response


async def _read_whole(upstream: UpstreamResponse) -> bytes:
    """The whole (decoded) body, the connection closed after; a broken or oversized
    answer as the gateway's error."""
    try:
        return await upstream.read()
    except UpstreamResponseTooLarge as error:
        raise UpstreamError(str(error), code=error.code) from None
    except UpstreamStreamBroken as error:
        if error.timeout:
            raise UpstreamTimeout(str(error)) from None
        raise UpstreamUnreachable(str(error)) from None
    finally:
        await close_quietly(upstream)


def _completion_tokens(usage: Any) -> int | None:
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None
