"""The MCP server at ``/mcp``: the memory API's operations as tools for MCP clients.

An MCP client (Claude Desktop, an agent framework) calls them over MCP's streamable HTTP
transport: search a user's or a session's memory, list and read sessions, pin, correct
and delete facts, erase, and preview the context a turn would forward.

Every tool is a thin call into what the memory API does (``MemoryAPI``, ``SessionOperations``,
``FactEdits``, ``Search``), so the two never differ: the same ids (a search's result names
its ``session_id`` and its ``id``, and that pair is what the edit and delete tools take),
the same bounds, the same tenants.

Notes:
    Each request is checked before the SDK sees any of it, as the memory API's are: a
    cross-site ``Origin``, then the bearer key (``Authenticator.memory_caller``: 401, or
    403), then the body against ``server.max_body_bytes`` (413), each in the gateway's
    error envelope. The caller then travels to the tools in the request's ASGI scope: a
    tool sees only the caller's tenant, and a key bound to users only their sessions.

    Stateless, with JSON responses: each POST is one JSON-RPC exchange answered in its
    own response. No MCP session lives in the process, so any worker of ``serve
    --workers N`` and any replica serves any request, and no stream is held open.

    Origin, not Host: a browser page that rebinds its DNS name to the gateway sends its
    own Host and Origin, and the gateway answers under any host name its operator gives
    it. So a request with an ``Origin`` is refused unless ``server.cors.allow_origins``
    names it (the gateway's own origin included: under rebinding it is the attacker's);
    an MCP client that is not a browser sends none. The SDK's own Host/Origin check is
    off: it would hold the gateway to the host names listed in it.

    A tool's failure is an MCP tool error (an ``isError`` result, its message the
    gateway's): a session of another tenant, or of a user the key is not bound to, is
    "not found" as in the memory API. An unexpected exception is the SDK's generic tool
    error (logged here, its text never sent), never an HTTP 500.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Annotated, Any, ParamSpec, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from gateway import __version__, codec
from gateway.auth.authenticator import Caller
from gateway.auth.identity import MAX_ID_LENGTH
from gateway.errors import Forbidden, GatewayError
from gateway.memory.durable import MAX_FACT_CHARS
from gateway.memory.model import Pin
from gateway.memory.session_markdown import iso_time
from gateway.routes.memory_api import MemoryAPI, user_keys
from gateway.routes.relay import read_body
from gateway.routes.schemas import FactEditBody, PinBody, PinEditBody, SearchBody
from gateway.service.facts import fact_view
from gateway.store.keys import UserKeys
from gateway.store.redis_store import StoreUnavailable

P = ParamSpec("P")
R = TypeVar("R")

# Where the authenticated caller waits for the tools in the request's ASGI scope.
CALLER = "memory_gateway.caller"
# The model a preview names when the client names none: no ``models`` entry matches it,
# so the preset's own budget applies.
PREVIEW_MODEL = "memory-gateway-preview"

INSTRUCTIONS = """\
Long-term memory of the conversations this gateway proxies, for the tenant of your key.
Find memories with search_memory (by user_id or session_id): each result names its kind
(fact, pin or excerpt), its session_id and its id. Correct or delete a fact with
correct_fact / delete_fact, and edit or delete a pin with edit_pin / delete_pin, passing
that session_id and id. An excerpt is a stored message (its id is the message's index):
it cannot be edited, only erased with its session (erase_session) or its user
(erase_user). get_session shows what memory holds for a session; preview_context what
the next turn would send to the model."""

READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)
DESTROY = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True)

# fmt: off
# The tools' arguments, as the client's model reads them (bounds as the memory API's).
SessionId = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, description=(
    "A session's id, as list_sessions and search_memory name it."))]
UserId = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, description=(
    "A user's id (the X-User-Id their conversations were proxied with)."))]
OptionalSessionId = Annotated[str | None, Field(min_length=1, max_length=MAX_ID_LENGTH,
    description="A session's id, as list_sessions and search_memory name it.")]
OptionalUserId = Annotated[str | None, Field(min_length=1, max_length=MAX_ID_LENGTH,
    description="A user's id (the X-User-Id their conversations were proxied with).")]
FactId = Annotated[str, Field(min_length=1, max_length=64, description=(
    "The fact's id (fact_…), as search_memory or get_session gives it."))]
PinId = Annotated[str, Field(min_length=1, max_length=64, description=(
    "The pin's id (pin_…), as search_memory, get_session or add_pin gives it."))]
Importance = Annotated[float | None, Field(ge=0, le=1, description=(
    "How much the pin matters, 0 to 1: the most important pins are sent first."))]
Query = Annotated[str, Field(min_length=1, max_length=4000, description=(
    "What to look for, in words: a question or a few keywords."))]
Results = Annotated[int, Field(ge=1, le=50, description="At most this many results.")]
Search = Annotated[str | None, Field(max_length=MAX_ID_LENGTH, description=(
    "Only the sessions whose id or user id contains this."))]
Sessions = Annotated[int, Field(ge=1, le=1000, description="At most this many sessions.")]
PinText = Annotated[str, Field(min_length=1, max_length=4000, description=(
    "What to keep in mind in every turn of the session, in a sentence."))]
NewPinText = Annotated[str | None, Field(min_length=1, max_length=4000, description=(
    "The pin's new text."))]
SourceIndex = Annotated[int | None, Field(ge=1, description=(
    "The index of the message the pin comes from (an excerpt's id), if any."))]
FactText = Annotated[str, Field(min_length=1, max_length=MAX_FACT_CHARS, description=(
    "The fact as it should read, in one sentence."))]
UserMessage = Annotated[str | None, Field(min_length=1, description=(
    "The next user message of the session."))]
Messages = Annotated[list[dict[str, Any]] | None, Field(min_length=1, description=(
    "Or the request's messages, as a chat-completions client sends them ({role, content} "
    "each)."))]
Model = Annotated[str | None, Field(min_length=1, max_length=256, description=(
    "The model the turn would go to (its context budget applies)."))]
# fmt: on


def _tool_errors(tool: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """The tool, its gateway errors made MCP tool errors with the gateway's message."""

    @functools.wraps(tool)  # (the SDK reads the arguments' schema from the signature)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await tool(*args, **kwargs)
        except GatewayError as error:
            raise ToolError(error.message) from None
        except ValidationError as error:  # a body model's bound, past the schema's
            raise ToolError(str(error)) from None
        except StoreUnavailable:
            # As the memory API answers it (503): without Redis nothing can be read.
            raise ToolError("memory store unavailable; try again shortly") from None

    return run


def _caller(ctx: Context) -> Caller:
    """The caller ``McpServer.__call__`` authenticated for this request."""
    request = ctx.request_context.request
    caller = getattr(request, "scope", {}).get(CALLER)
    if not isinstance(caller, Caller):  # never over /mcp: every request is authenticated
        raise ToolError("not authenticated")
    return caller


def _user(caller: Caller, user_id: str) -> UserKeys:
    if caller.users is not None and user_id not in caller.users:
        # (The memory API's 403 names its header, X-User-Id: a tool has an argument.)
        raise ToolError(f"this key may not act for user {user_id!r}")
    return user_keys(caller, user_id)


def _body(model: type[BaseModel], **fields: Any) -> Any:
    """The memory API's body for these fields (its bounds, its strict types)."""
    return model.model_validate({k: v for k, v in fields.items() if v is not None})


def _pin(pin: Pin | dict[str, Any]) -> dict[str, Any]:
    """A pin as the memory API shows it, with the date it was made."""
    data = pin.to_data() if isinstance(pin, Pin) else pin
    return {**data, "date": iso_time(data["created"])} if data.get("created") else data


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the body already read given first."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


class McpServer:
    """The tools over the memory API, and the ASGI endpoint that serves them at /mcp."""

    def __init__(
        self, api: MemoryAPI, *, max_body_bytes: int, allow_origins: Sequence[str]
    ) -> None:
        self.api = api
        self.ops = api.ops
        self.max_body_bytes = max_body_bytes
        self.allow_origins = frozenset(allow_origins)
        # (It calls logging.basicConfig: a no-op once logging is set up, as ``serve`` does.)
        # No subscriptions/listen: nothing here is pushed to a client (and no stream held).
        self.server: MCPServer[Any] = MCPServer(
            "memory-gateway", instructions=INSTRUCTIONS, version=__version__, subscriptions=False
        )
        tools: list[tuple[Callable[..., Awaitable[dict[str, Any]]], ToolAnnotations]] = [
            (self.search_memory, READ), (self.list_sessions, READ), (self.get_session, READ),
            (self.add_pin, WRITE), (self.edit_pin, WRITE), (self.delete_pin, DESTROY),
            (self.correct_fact, WRITE), (self.delete_fact, DESTROY),
            (self.erase_session, DESTROY), (self.erase_user, DESTROY),
            (self.preview_context, READ),
        ]  # fmt: skip
        for tool, hints in tools:
            # The docstring on one line: the model reads no Python indentation.
            described = " ".join((tool.__doc__ or "").split())
            self.server.add_tool(_tool_errors(tool), description=described, annotations=hints)
        # Made for its session manager (the app it returns is not mounted: ``__call__``
        # is the endpoint). The body bound is checked first, in the gateway's envelope.
        self.server.streamable_http_app(
            stateless_http=True,
            json_response=True,
            max_request_body_size=max_body_bytes,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.sessions = self.server.session_manager

    def routes(self) -> list[Route]:
        # POST only: stateless, there is no stream to GET and no session to DELETE.
        return [Route("/mcp", self, methods=["POST"])]

    def running(self) -> AbstractAsyncContextManager[None]:
        """The transport's task group: entered in the app's lifespan."""
        return self.sessions.run()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        origin = request.headers.get("origin")
        if origin is not None and not self.allow_origins & {origin, "*"}:
            raise Forbidden(
                "requests from a web page's origin are refused: name the origin in "
                "server.cors.allow_origins",
                param="Origin",
                code="origin_not_allowed",
            )
        caller = await self.api.auth.memory_caller(request.headers)
        body = await read_body(request, self.max_body_bytes)
        await self.sessions.handle_request({**scope, CALLER: caller}, _replay(body, receive), send)

    # --- the tools (each docstring is the description the client's model reads) ---

    async def search_memory(
        self,
        query: Query,
        ctx: Context,
        user_id: OptionalUserId = None,
        session_id: OptionalSessionId = None,
        limit: Results = 10,
    ) -> dict[str, Any]:
        """Search the memories of one user (all their recent sessions) or of one session:
        name exactly one of user_id or session_id. Results come best first, each with its
        kind (fact, pin or excerpt), session_id, id, text, date (ISO 8601, UTC) and score.
        A fact's session_id and id go to correct_fact or delete_fact, a pin's to edit_pin
        or delete_pin; an excerpt's id is the index of a stored message."""
        caller = _caller(ctx)
        if (user_id is None) == (session_id is None):
            raise ToolError("name exactly one of user_id or session_id")
        body = _body(SearchBody, query=query, limit=limit)
        if session_id is not None:
            keys = await self.api.session_keys(caller, session_id)
            return {"results": await self.api.search_session_memory(keys, body)}
        assert user_id is not None
        return {"results": await self.api.search_user_memory(_user(caller, user_id), body)}

    async def list_sessions(
        self, ctx: Context, search: Search = None, limit: Sessions = 50
    ) -> dict[str, Any]:
        """List the sessions memory holds, the last active first: each with its
        session_id, user_id, message count, turns, and last_active date (ISO 8601)."""
        visible = await self.api.visible_sessions(_caller(ctx), search or None, limit)
        return {
            "sessions": [
                {**s.to_data(), "last_active": iso_time(s.updated) if s.updated else None}
                for s in visible
            ]
        }

    async def get_session(self, session_id: SessionId, ctx: Context) -> dict[str, Any]:
        """Show what memory holds for a session, tier by tier: the recent window of
        messages, the summaries, the durable facts (each with its id, date, and whether a
        newer one superseded it) and the pins (each with its id and date)."""
        keys = await self.api.session_keys(_caller(ctx), session_id)
        state = await self.ops.existing(keys)
        view = self.ops.view(keys, state)
        view["facts"] = [fact_view(keys.session_id, fact) for fact in state.tiers.facts]
        view["pins"] = [_pin(pin) for pin in view["pins"]]
        return view

    async def add_pin(
        self,
        session_id: SessionId,
        content: PinText,
        ctx: Context,
        importance: Importance = None,
        source_index: SourceIndex = None,
    ) -> dict[str, Any]:
        """Pin a note to a session: it is sent with every turn of it, most important
        first. Returns the pin with its id (for edit_pin and delete_pin)."""
        caller = _caller(ctx)
        keys = await self.api.session_keys(caller, session_id)
        body = _body(PinBody, content=content, importance=importance, source_index=source_index)
        pin = await self.ops.add_pin(
            keys, body.content, body.importance, body.source_index, quota=caller.quota_bytes
        )
        return _pin(pin)

    async def edit_pin(
        self,
        session_id: SessionId,
        pin_id: PinId,
        ctx: Context,
        content: NewPinText = None,
        importance: Importance = None,
    ) -> dict[str, Any]:
        """Change a pin's text or importance (give one or both); its id stays."""
        caller = _caller(ctx)
        if content is None and importance is None:
            raise ToolError("give the pin's new content or importance")
        keys = await self.api.session_keys(caller, session_id)
        body = _body(PinEditBody, content=content, importance=importance)
        pin = await self.ops.edit_pin(
            keys, pin_id, body.content, body.importance, caller.quota_bytes
        )
        return _pin(pin)

    async def delete_pin(
        self, session_id: SessionId, pin_id: PinId, ctx: Context
    ) -> dict[str, Any]:
        """Delete a pin of a session: it is no longer sent with the session's turns."""
        await self.ops.delete_pin(await self.api.session_keys(_caller(ctx), session_id), pin_id)
        return {"deleted": pin_id, "session_id": session_id}

    async def correct_fact(
        self, session_id: SessionId, fact_id: FactId, text: FactText, ctx: Context
    ) -> dict[str, Any]:
        """Correct a remembered fact: the new wording replaces it from now on (in the
        user's profile too), the old one is kept marked superseded. Returns the new
        fact with its new id."""
        keys = await self.api.session_keys(_caller(ctx), session_id)
        body = _body(FactEditBody, text=text)
        return fact_view(keys.session_id, await self.api.facts.correct(keys, fact_id, body.text))

    async def delete_fact(
        self, session_id: SessionId, fact_id: FactId, ctx: Context
    ) -> dict[str, Any]:
        """Delete a remembered fact (from the user's profile too); the messages it came
        from stay in the session until it is erased."""
        keys = await self.api.session_keys(_caller(ctx), session_id)
        await self.api.facts.delete(keys, fact_id)
        return {"deleted": fact_id, "session_id": session_id}

    async def erase_session(self, session_id: SessionId, ctx: Context) -> dict[str, Any]:
        """Erase a session for good: its messages, summaries, facts and pins. Cannot be
        undone."""
        await self.ops.erase(await self.api.session_keys(_caller(ctx), session_id))
        return {"erased": session_id}

    async def erase_user(self, user_id: UserId, ctx: Context) -> dict[str, Any]:
        """Erase a user for good: every session of theirs and their profile. Cannot be
        undone."""
        await self.api.erase_user_memory(_user(_caller(ctx), user_id))
        return {"erased_user": user_id}

    async def preview_context(
        self,
        session_id: SessionId,
        ctx: Context,
        user_message: UserMessage = None,
        messages: Messages = None,
        model: Model = None,
        user_id: OptionalUserId = None,
    ) -> dict[str, Any]:
        """Preview what the gateway would send to the model for the next turn of a
        session (its memory put together with user_message, or with messages), and the
        receipt of what memory added; nothing is recorded. The turn is the session's
        user's unless user_id names another."""
        caller = _caller(ctx)
        if (user_message is None) == (messages is None):
            raise ToolError("give either user_message or messages")
        keys = await self.api.session_keys(caller, session_id)
        owner = (await self.ops.existing(keys)).user_id
        turn_user = _user(caller, user_id).user_id if user_id is not None else owner
        body = {
            "model": model or PREVIEW_MODEL,
            "messages": messages or [{"role": "user", "content": user_message}],
        }
        return await self.api.preview(keys, caller.user_id(turn_user), codec.dumps(body))
