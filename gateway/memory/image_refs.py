"""Images of a conversation's messages: taken in as references, sent back as bytes (pure).

A message's data-URL images become references when the message enters memory
(``ingest``): what is recorded, reconciled, counted and recalled is then small, and the
same whether a client sends an image once or resends it with its whole history. The
bytes go to the session's media hash, once each (``memory.media: store``), or nowhere
(``drop``).

What is forwarded gets its references back as data URLs (``hydrate``), within the room
``upstream.max_request_bytes`` leaves: when the images do not all fit, the oldest give
way first (a placeholder text instead), this turn's own last (``fit``). A reference
whose bytes are not at hand (dropped, or expired) is sent as its placeholder.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.memory import images as media
from gateway.memory.model import Message


@dataclass(frozen=True, slots=True)
class Ref:
    """One reference part of a forwarded context: where it is, and what it names."""

    message: int  # position in the context's messages
    part: int  # position in that message's content
    sha256: str
    mime: str
    size: int  # characters it takes in the body, sent


class MediaRejected(ValueError):
    """An image part that cannot be taken in; ``param`` names it in the request."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def data_url_chars(messages: Sequence[Message]) -> int:
    """The characters of the messages' image parts ``ingest`` changes (0: it has nothing
    to do), about what it decodes."""
    return sum(
        len(media.image_url(part)) or 1
        for message in messages
        if isinstance(message.content, list)
        for part in message.content
        if _taken_in(part)
    )


_TAIL = 32


def ingest(messages: Sequence[Message]) -> tuple[tuple[Message, ...], dict[str, media.Blob]]:
    """The messages with their data-URL images as references, and those images' bytes by
    hash. Raises ``MediaRejected`` for data that is not an image.

    A reference a client sends (copied from a session's stored messages) is not taken
    as one: its bytes, size and count would be the client's word. It becomes its
    placeholder text."""
    out: list[Message] = []
    blobs: dict[str, media.Blob] = {}
    # A history resent with its images (or one image sent many times) carries the same
    # data URL again and again: each is decoded and hashed once. Found by its length and
    # tail, then compared whole: hashing each string as a dict key read every byte of
    # it holding the GIL (~1 ms a 3.4 MB body), where the comparison is a memcmp.
    seen: dict[tuple[int, str], list[media.Decoded]] = {}
    for i, message in enumerate(messages):
        content = message.content
        if not isinstance(content, list) or not any(_taken_in(p) for p in content):
            out.append(message)
            continue
        parts: list[Any] = []
        for j, part in enumerate(content):
            if media.is_reference_url(part):
                part = {"type": "text", "text": media.placeholder(part)}
            elif media.is_image(part) and media.is_data_url(media.image_url(part)):
                url = media.image_url(part)
                alike = seen.setdefault((len(url), url[-_TAIL:]), [])
                decoded_once = next((d for d in alike if d.blob.url == url), None)
                try:
                    decoded = decoded_once or media.decode(url)
                except media.MediaError as error:
                    param = f"messages.{i}.content.{j}.image_url.url"
                    raise MediaRejected(f"{param}: {error}", param) from None
                if decoded_once is None:
                    alike.append(decoded)
                blobs.setdefault(decoded.blob.sha256, decoded.blob)
                part = media.to_reference(part, decoded)
            parts.append(part)
        # Counted again (tokens 0): a reference costs its image's tokens.
        out.append(message.with_content(parts, tokens=0))
    return tuple(out), blobs


def _taken_in(part: Any) -> bool:
    """Whether ``ingest`` changes the part: a data URL, or a client's reference."""
    return media.is_image(part) and (
        media.is_data_url(media.image_url(part)) or media.is_reference_url(part)
    )


def references(messages: Sequence[Message]) -> list[Ref]:
    """Every reference part of ``messages``, oldest first."""
    return list(_references(messages))


def _references(messages: Sequence[Message]) -> Iterator[Ref]:
    for i, message in enumerate(messages):
        if not isinstance(message.content, list):
            continue
        for j, part in enumerate(message.content):
            found = media.reference(part)
            if found is not None:
                mime = str(found.get("mime") or "application/octet-stream")
                yield Ref(i, j, found["sha256"], mime, media.sent_size(found))


def named(messages: Sequence[Message]) -> frozenset[str]:
    """The hashes the messages' references name."""
    return frozenset(ref.sha256 for ref in _references(messages))


@dataclass(frozen=True, slots=True)
class Fitted:
    """Which references are sent as bytes; ``fits``: False when even this turn's own
    images (from message ``protected_from`` on) are over the room alone."""

    sent: frozenset[tuple[int, int]]
    fits: bool


def fit(refs: Sequence[Ref], room: int, protected_from: int) -> Fitted:
    """The references sent within ``room`` characters: all of them when they fit, else
    without the oldest, one by one (those of messages from ``protected_from`` on last)."""
    total = sum(ref.size for ref in refs)
    order = sorted(refs, key=lambda ref: (ref.message >= protected_from, ref.message, ref.part))
    left_out: set[tuple[int, int]] = set()
    for ref in order:
        if total <= room:
            break
        left_out.add((ref.message, ref.part))
        total -= ref.size
    sent = frozenset((r.message, r.part) for r in refs) - left_out
    protected = {(r.message, r.part) for r in refs if r.message >= protected_from}
    return Fitted(sent, fits=protected <= sent)


def hydrate(
    messages: Sequence[Message], sent: frozenset[tuple[int, int]], urls: Mapping[str, str]
) -> tuple[Message, ...]:
    """The messages as forwarded: each reference in ``sent`` whose data URL is in
    ``urls`` (by hash) as that data URL, every other one as its placeholder text. A
    message's token count stays the one memory planned with."""
    out = []
    for i, message in enumerate(messages):
        content = message.content
        if not isinstance(content, list) or not any(media.reference(p) for p in content):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            found = media.reference(part)
            if found is None:
                parts.append(part)
            elif (i, j) in sent and found["sha256"] in urls:
                parts.append(media.forwarded(part, urls[found["sha256"]]))
            else:
                parts.append({"type": "text", "text": media.placeholder(part)})
        out.append(message.with_content(parts))
    return tuple(out)
