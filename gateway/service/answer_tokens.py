"""The answer's tokens for the access line (``tokens_out``), counted off the client's time
and with bounded work, however long the answer.

An answer can be as long as ``upstream.max_response_bytes``: a client that left an
endless stream leaves the gateway that much text to count, and counting it on the event
loop froze every other request for tens of seconds. So:

* an answer shorter than ``offload.HEAVY_CHARS`` is counted on the loop once the response
  is complete (cheaper there than a hop to a thread);
* a longer one in the heavy-work pool (tiktoken releases the GIL while it encodes), and
  at most ``COUNTED_CHARS`` of it: the rest's tokens are extrapolated from those, and the
  line then says ``tokens_out_estimated``. The access line waits for that count
  (``request_log.wait_for``); the client does not.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway import offload
from gateway.memory.model import Message, content_text
from gateway.observability import request_log
from gateway.text.tokens import TokenCounter, text_chars

log = logging.getLogger(__name__)

# At most this much of an answer is tokenized (~60 ms of one thread for random letters,
# the worst case; ~10 ms for prose).
COUNTED_CHARS = 256 * 1024


def note_tokens_out(counter: TokenCounter, answer: Message, model: str) -> None:
    """Note ``tokens_out`` on the request's access line, counted when and where it costs
    the other requests least."""
    if text_chars(answer) < offload.HEAVY_CHARS:
        payload = answer.to_openai()
        request_log.after_response(
            lambda: request_log.note(tokens_out=counter.count_payload(payload, model))
        )
        return
    counting = asyncio.ensure_future(offload.off_loop(count_bounded, counter, answer, model))
    counting.add_done_callback(_noted)  # run in the request's context: its access line
    request_log.wait_for(counting)


def count_bounded(counter: TokenCounter, answer: Message, model: str) -> tuple[int, bool]:
    """The answer's tokens, and whether they are extrapolated: past ``COUNTED_CHARS``,
    only that much of its text is counted and the rest is assumed alike."""
    texts = _texts(answer)
    total = sum(len(text) for text in texts)
    if total <= COUNTED_CHARS:
        return sum(counter.count_text(text, model) for text in texts), False
    sample: list[str] = []
    left = COUNTED_CHARS
    for text in texts:
        if left <= 0:
            break
        sample.append(text[:left])
        left -= len(sample[-1])
    counted = sum(counter.count_text(text, model) for text in sample)
    return round(counted * total / (COUNTED_CHARS - left)), True


def _texts(answer: Message) -> list[str]:
    """What ``TokenCounter.count_payload`` counts of an assistant message."""
    data: dict[str, Any] = answer.to_openai()
    texts = [content_text(data.get("content"))]
    for call in data.get("tool_calls") or ():
        function = call.get("function") or {}
        texts += [str(function.get("name", "")), str(function.get("arguments", ""))]
    return [text for text in texts if text]


def _noted(counting: asyncio.Future[tuple[int, bool]]) -> None:
    if counting.cancelled():
        return
    error = counting.exception()
    if error is not None:
        log.warning("the answer's tokens were not counted: %r", error)
        return
    tokens, estimated = counting.result()
    if estimated:
        request_log.note(tokens_out=tokens, tokens_out_estimated=True)
    else:
        request_log.note(tokens_out=tokens)
