"""The images of a turn: taken out of its messages as references when it arrives, sent
again as data URLs while their messages are in the window (``memory.media``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gateway import codec, offload
from gateway.errors import InvalidRequest, PayloadTooLarge
from gateway.memory import image_refs as media_refs
from gateway.memory import images as media
from gateway.memory.assemble import Context
from gateway.memory.model import Message
from gateway.memory.reconcile import Reconciled
from gateway.service.ports import SessionStore
from gateway.store.keys import SessionKeys
from gateway.store.redis_store import StoreUnavailable
from gateway.text.tokens import TokenCounter

log = logging.getLogger(__name__)

# Room left in a forwarded body for what is not its messages (tools, response_format…).
BODY_HEADROOM = 256 * 1024


def _data_urls(mimes: Mapping[str, str], found: Mapping[str, bytes]) -> dict[str, str]:
    return {sha: media.data_url(mimes[sha], data) for sha, data in found.items()}


async def ingested(
    messages: tuple[Message, ...],
) -> tuple[tuple[Message, ...], dict[str, media.Blob]]:
    """``media_refs.ingest`` (off the loop for large images); bad image data is the
    client's error (400)."""
    chars = media_refs.data_url_chars(messages)
    if not chars:
        return messages, {}
    try:
        return await offload.sized(chars, media_refs.ingest, messages)
    except media_refs.MediaRejected as error:
        raise InvalidRequest(str(error), param=error.param, code="invalid_image") from None


class Images:
    def __init__(
        self, store: SessionStore, counter: TokenCounter, mode: str, max_request_bytes: int
    ) -> None:
        self.store = store
        self.counter = counter
        self.mode = mode  # memory.media: "store" keeps images, "drop" only placeholders
        # ``upstream.max_request_bytes``: the window's images give way to stay under it.
        self.max_request_bytes = max_request_bytes

    async def hydrated(
        self,
        keys: SessionKeys,
        context: Context,
        blobs: Mapping[str, media.Blob],
        plan: Reconciled,
        model: str,
    ) -> Context:
        """The context as forwarded: the images of its messages as data URLs, the oldest
        as placeholders where they would take the body over ``max_request_bytes``. Those
        not in this request are read from the session's media hash: a round trip only
        when the window shows an image the client did not send again."""
        refs = media_refs.references(context.messages)
        if not refs:
            return context
        rest = len(codec.dumps(context.openai_messages()))  # references are short
        room = self.max_request_bytes - rest - BODY_HEADROOM
        first_new = _first_new(context.messages, plan.new)
        fitted = media_refs.fit(refs, room, first_new)
        if not fitted.fits:
            raise PayloadTooLarge(
                "this turn's images take the forwarded body over its limit "
                f"(upstream.max_request_bytes: {self.max_request_bytes} bytes)",
                param="messages",
            )
        wanted = {r.sha256: r.mime for r in refs if (r.message, r.part) in fitted.sent}
        # This request's own images go as they came; the others are read and encoded.
        urls = {sha: blobs[sha].url for sha in wanted if sha in blobs and blobs[sha].url}
        missing = [sha for sha in wanted if sha not in urls]
        found: dict[str, bytes] = {sha: blobs[sha].data for sha in missing if sha in blobs}
        missing = [sha for sha in missing if sha not in found]
        if missing and self.mode == "store":
            try:
                found |= await self.store.media(keys, missing)
            except StoreUnavailable as error:
                log.warning("images sent as placeholders: %s", error)
        size = sum(len(data) for data in found.values())
        urls |= await offload.sized(size, _data_urls, wanted, found)
        sent = media_refs.hydrate(context.messages, fitted.sent, urls)
        # An image sent as its placeholder costs the placeholder's words: the receipt
        # (and X-Memory-Context-Tokens) says what went.
        tiers = dict(context.receipt.tiers)
        held_back = {
            ref.message
            for ref in refs
            if (ref.message, ref.part) not in fitted.sent or ref.sha256 not in urls
        }
        recounted = []
        for i, message in enumerate(sent):
            if i in held_back:
                tokens = self.counter.count_message(message, model)
                prompt = i < len(plan.prompt)
                tier = "prompt" if prompt else "new" if i >= first_new else "window"
                tiers[tier] = tiers.get(tier, 0) + tokens - message.tokens
                message = message.but(tokens=tokens)
            recounted.append(message)
        receipt = replace(context.receipt, tiers=tiers)
        return replace(context, messages=tuple(recounted), receipt=receipt)

    def kept(
        self, messages: Sequence[Message], blobs: Mapping[str, media.Blob] | None
    ) -> list[media.Blob]:
        """The images of ``messages`` to store (none with ``memory.media: drop``)."""
        if not blobs or self.mode != "store":
            return []
        return [blobs[sha] for sha in sorted(media_refs.named(messages)) if sha in blobs]


def _first_new(messages: Sequence[Message], new: Sequence[Message]) -> int:
    """Where the turn's new messages begin in its context: the last ones, but for the
    cache-stable layout's late message, which follows new tool results (nothing may come
    between a call and its results). The context holds the plan's own message objects."""
    if new:
        for i, message in enumerate(messages):
            if message is new[0]:
                return i
    return len(messages) - len(new)
