"""An upstream's reply as the service reads it: whole, closed after, its failures raised
as the gateway's errors."""

from __future__ import annotations

from typing import Any, Protocol

import anyio

from gateway import codec, offload
from gateway.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable
from gateway.upstream.body import UpstreamResponseTooLarge, UpstreamStreamBroken


class Reply(Protocol):
    """What the service needs of an upstream reply (``upstream.client.UpstreamResponse``)."""

    status_code: int

    async def read(self) -> bytes: ...

    async def aclose(self) -> None: ...


async def close_quietly(reply: Reply) -> None:
    """Close the reply even from a cancelled task (a client that left)."""
    with anyio.CancelScope(shield=True):
        await reply.aclose()


async def read_whole(reply: Reply) -> bytes:
    """The whole (decoded) body, the connection closed after; a broken or oversized
    answer as the gateway's error."""
    try:
        return await reply.read()
    except UpstreamResponseTooLarge as error:
        raise UpstreamError(str(error), code=error.code) from None
    except UpstreamStreamBroken as error:
        if error.timeout:
            raise UpstreamTimeout(str(error)) from None
        raise UpstreamUnreachable(str(error)) from None
    finally:
        await close_quietly(reply)


async def parsed(raw: bytes) -> Any:
    """A whole answer's JSON (None: not JSON), parsed in the heavy-work pool when it is
    large: an upstream may answer up to ``upstream.max_response_bytes``, and the other
    clients' requests would wait out its parse."""
    return await offload.sized(len(raw), _loads_or_none, raw)


def _loads_or_none(raw: bytes) -> Any:
    try:
        return codec.loads(raw)
    except ValueError:
        return None
