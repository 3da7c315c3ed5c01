"""API dialects: what differs between the chat-completions and Responses APIs.

One request pipeline (``routes/memory_proxy.MemoryProxy``) serves both. A dialect says how a
body becomes (model, stream, messages), how the assembled context (chat-format dicts)
becomes the forwarded body, how a whole answer is read into a ``Message``, and how a
stream is watched for its clean end. Memory itself only ever sees chat-format
``Message``s, so a session may mix both APIs and stays one conversation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gateway.dialects.chat.request import MessageLimits
from gateway.memory.model import Message


class ProxiedRequest(Protocol):
    """A parsed request: what memory needs of it, and how to forward it with a context."""

    @property
    def body(self) -> dict[str, Any]: ...

    @property
    def model(self) -> str: ...

    @property
    def messages(self) -> tuple[Message, ...]: ...

    @property
    def stream(self) -> bool: ...

    def forwarded(
        self, context: Sequence[dict[str, Any]], resolved: frozenset[str] = frozenset()
    ) -> bytes:
        """The body to send upstream, its conversation replaced by ``context``, without
        the item references memory ``resolved`` (``Reconciled.resolved``)."""
        ...

    def check_recorded(self, recorded: Sequence[Message]) -> None:
        """Refuse (400) what memory must not keep of ``recorded``, the request's messages
        a turn stores (a bad function name), naming the client's own field."""
        ...


class StreamWatcher(Protocol):
    """Watches a relayed stream (pure): did it end cleanly, and what was the answer?"""

    def feed(self, chunk: bytes) -> None: ...

    def close(self) -> None: ...

    @property
    def done(self) -> bool:
        """The event that acknowledges the answer arrived: record before passing it on."""
        ...

    @property
    def ended(self) -> bool: ...

    @property
    def unreadable(self) -> bool: ...

    @property
    def recordable(self) -> bool: ...

    def message(self) -> Message: ...

    @property
    def usage(self) -> Any:
        """The answer's usage in chat terms (``prompt_tokens``, ``completion_tokens``)."""
        ...

    def split(self, chunk: bytes) -> tuple[bytes, bytes]:
        """The chunk before the acknowledging event, and the rest from it on."""
        ...

    def hold(self, chunk: bytes) -> tuple[bytes, bytes]:
        """What of a chunk to relay now, and what to hold back until the next one (an
        event not ended yet, if the acknowledging event may be larger than a chunk)."""
        ...

    def error_event(self, message: str, type_: str, code: str) -> bytes:
        """An in-band error event in this API's shape."""
        ...

    def acknowledgement(self) -> bytes:
        """The acknowledging event, for a stored answer whose upstream ended without it
        (b"": none can be made: Responses' ``response.completed`` carries the response)."""
        ...


class Dialect(Protocol):
    name: str

    async def parse(self, raw: bytes, limits: MessageLimits) -> ProxiedRequest: ...

    def requested_output(self, body: Mapping[str, Any]) -> int | None:
        """The answer's length the request asks room for, when it asks."""
        ...

    def answer(self, body: Any) -> Message | None:
        """The assistant's message of a whole (non-streamed) answer, if it finished."""
        ...

    def usage(self, body: Any) -> Any:
        """A whole answer's usage in chat terms."""
        ...

    def watch(self) -> StreamWatcher: ...
