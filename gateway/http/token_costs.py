"""What a request's prompt will cost before it goes upstream, and what its answer says it
cost: the rate limits' reservation and settlement (``rate_limits``), for requests whose
prompt the gateway does not count itself (every request but a memory turn, whose context
it counts anyway).

Estimates never read less than the client sent: a token every 4 bytes of the body (what
OpenAI's own limiter assumes), but an inline image at what the API bills for it, where the
body has been parsed and the image is known to be one (its base64 would otherwise count
hundreds of times its cost). A body of unknown length (chunked) is ``UNKNOWN``: the
limiter reserves the whole budget for it. Uploads (``multipart/*``, raw bytes) are no
prompt: nothing is reserved for them, and their answer's usage, when it has one, is
charged after; but on the paths that take a prompt (chat, Responses, completions,
embeddings, moderations) a body is estimated whatever its declared type (an upstream
may parse it as JSON all the same).

An answer's usage is read from its last ``TAIL_BYTES`` (a JSON body's ``usage`` object
comes near its end, a stream's in its last events), without parsing the rest: a large
answer (a batch of embeddings) costs no more than a small one.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.memory import images as media
from gateway.memory.model import Message

BYTES_PER_TOKEN = 4
# A body whose length is not declared: as large as any budget.
UNKNOWN = sys.maxsize
TAIL_BYTES = 16 * 1024
_UPLOADS = ("multipart/", "application/octet-stream", "audio/", "image/", "video/")
_PROMPT_PATHS = frozenset(
    f"/v1/{path}"
    for path in ("chat/completions", "responses", "completions", "embeddings", "moderations")
)
_USAGE = b'"usage"'
# The last ``usage`` keys tried: the answer's own is among them (an answer that is no
# JSON, a file downloaded, may hold thousands of them).
_TRIED = 8
_DECODER = json.JSONDecoder()


def body_tokens(size: int, messages: Iterable[Message]) -> int:
    """A parsed chat (or Responses) body's prompt tokens: its ``size`` bytes a token every
    4, but its images' data URLs at the tokens of their image (read from its header)."""
    inline = tokens = 0
    for message in messages:
        if not isinstance(message.content, list):
            continue
        for part in message.content:
            if media.is_image(part):
                inline += len(media.image_url(part))  # base64: one byte a character
                tokens += media.part_tokens(part)
    return math.ceil(max(0, size - inline) / BYTES_PER_TOKEN) + tokens


def length_tokens(path: str, headers: Mapping[str, str], body: bytes | None = None) -> int:
    """An unparsed body's prompt tokens, by its length: ``body``'s, else the declared one
    (``UNKNOWN`` when it is chunked); 0 for no body, or an upload to a path that takes
    no prompt."""
    kind = headers.get("content-type", "").lower()
    if kind.startswith(_UPLOADS) and path not in _PROMPT_PATHS:
        return 0
    if body is not None:
        return math.ceil(len(body) / BYTES_PER_TOKEN)
    declared = headers.get("content-length")
    if declared is not None:
        return math.ceil(int(declared) / BYTES_PER_TOKEN) if declared.isdigit() else 0
    return UNKNOWN if "transfer-encoding" in headers else 0


class Tail:
    """The last ``TAIL_BYTES`` of an answer, as it is relayed."""

    def __init__(self) -> None:
        self._kept = bytearray()

    def add(self, chunk: bytes) -> None:
        self._kept += chunk[-TAIL_BYTES:]
        if len(self._kept) > 2 * TAIL_BYTES:  # trimmed now and then: a stream of small
            del self._kept[:-TAIL_BYTES]  # events is not copied whole at each one

    def tokens(self) -> int | None:
        """The tokens the last ``usage`` object in it says the answer took (None: none
        found, or none that says)."""
        tail = bytes(self._kept[-TAIL_BYTES:])
        end = len(tail)
        for _ in range(_TRIED):
            at = tail.rfind(_USAGE, 0, end)
            if at < 0:
                break
            end = at
            rest = tail[at + len(_USAGE) :].lstrip()
            if not rest.startswith(b":"):
                continue
            rest = rest[1:].lstrip()
            if not rest.startswith(b"{"):
                continue  # "usage": null (a chunk before the usage chunk)
            try:
                usage, _ = _DECODER.raw_decode(rest.decode("utf-8", "replace"))
            except ValueError:
                continue
            counted = usage_tokens(usage)
            if counted is not None:
                return counted
        return None


def usage_tokens(usage: Any) -> int | None:
    """An answer's tokens by its ``usage``: its total, else its parts (chat's prompt and
    completion, Responses' input and output, and Anthropic's cache reads and writes, which
    its ``input_tokens`` leaves out); None when it says none."""
    if not isinstance(usage, dict):
        return None
    total = _count(usage.get("total_tokens"))
    if total is not None:
        return total
    parts = [
        _count(usage.get(name))
        for name in (
            "prompt_tokens",
            "completion_tokens",
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        )
    ]
    known = [part for part in parts if part is not None]
    return sum(known) if known else None


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
