"""Token counting with tiktoken that never touches the network.

tiktoken downloads an encoding's BPE file on first use, which fails (or hangs) on a machine
without internet. We use a model's own encoding only when its file is already in
tiktoken's cache, and otherwise ``cl100k_base`` from the file shipped in this package
(``cl100k.py``). cl100k counts within a few percent of o200k on English chat, which is
what a budget needs; the encoding in use is logged once per model and counter.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import tiktoken

from gateway.caching import BoundedMap, memo, memo_when_short
from gateway.compat.tiktoken import cached_locally, encoding_name_for_model
from gateway.memory import images as media
from gateway.memory.counting import TOKENS_PER_MESSAGE, TOKENS_PER_REPLY
from gateway.memory.model import Message, content_text
from gateway.text import cl100k

log = logging.getLogger(__name__)

SHIPPED_ENCODING = cl100k.NAME
# A model name no encoding is known for: what it counts, it counts in the shipped one
# (a stored message's ``line_tokens``, in ``model.LINE_ENCODING``).
LINE_MODEL = "memory-gateway/lines"


def encoding_for_model(model: str) -> tiktoken.Encoding:
    """The model's own encoding when tiktoken has its file, else the shipped cl100k."""
    try:
        name = encoding_name_for_model(model)
    except KeyError:
        name = SHIPPED_ENCODING
    if name != SHIPPED_ENCODING and not cached_locally(name):
        name = SHIPPED_ENCODING
    # The model is the client's string: shown cut and escaped, at DEBUG (a client naming a
    # new model with every request would otherwise write a line each time).
    log.debug("token counting for model %r uses encoding %s", model[:64], name)
    return cl100k.encoding() if name == SHIPPED_ENCODING else tiktoken.get_encoding(name)


# The memory block is made of the same texts request after request (a session's
# summaries, facts, pins, its recalled messages): count each once. Bounded, and keyed by
# the text itself, so a changed summary is simply a new entry.
_CACHED_TEXT_CHARS = 4096  # a summary fits; a pasted document is counted, not kept


# From this length the tokens are counted in a NumPy buffer rather than a list: tiktoken
# encodes without the GIL, but builds a list of a million ints holding it (~20 ms at a
# megabyte, when the event loop cannot run); a buffer is one copy.
_BUFFER_CHARS = 64 * 1024


def count_with(encoding: tiktoken.Encoding, text: str) -> int:
    """The tokens of ``text``, special tokens' text counted as text."""
    if len(text) >= _BUFFER_CHARS:
        try:
            return len(encoding.encode_to_numpy(text, disallowed_special=()))
        except UnicodeEncodeError:
            pass  # a lone surrogate: ``encode`` knows how to count it
    return len(encoding.encode(text, disallowed_special=()))


# Where the lines of a text are counted apart: after a line break followed by a character
# that is neither whitespace nor "/". Notes: tiktoken splits a text into pieces by a
# regular expression before BPE merges within each piece, and no piece of cl100k's or
# o200k's crosses such a point: a piece holding a line break ends with the run of
# whitespace and line breaks it is in, and only o200k's punctuation piece may run on past
# line breaks, into "/". Python's \s holds every character tiktoken's does (and a few
# more: no split there, which is always exact). So the tokens of a text are the sum of its
# lines' tokens, exactly (tests/unit/text/test_tokens.py checks it on random texts). The memory
# block is new at every request (its recalled excerpts change) but its lines are not: each
# is counted once (the cache), not the whole block every time.
_LINES = re.compile(r"(?<=[\r\n])(?=[^\s/])")


def split_lines(text: str) -> list[str]:
    """``text`` cut where ``_LINES`` cuts it. Without a carriage return, by ``str.find``:
    the same pieces five times faster than the look-behind pattern on a memory block."""
    if "\r" in text:
        return _LINES.split(text)
    pieces = []
    start = 0
    end = len(text)
    at = text.find("\n")
    while at != -1:
        after = at + 1
        if after < end and not text[after].isspace() and text[after] != "/":
            pieces.append(text[start:after])
            start = after
        at = text.find("\n", after)
    pieces.append(text[start:])
    return pieces


class LineCount(partial[int]):
    """A counter of texts whose count of a text is the sum of its pieces' counts, cut where
    ``split_lines`` cuts (``TokenCounter.count_text`` counts them so). Whoever knows what
    the lines of a long text count (the memory block's, each counted once) may add them
    up instead of counting the text (``block.lines_add_up``): the same number, exactly.
    (A ``partial``: called as fast as one.)"""

    by_lines = True
    # The encoding it counts with: counters of one encoding count alike (what one of them
    # counted, another may reuse: ``block.counts_as_recorded``).
    encoding = ""


def text_chars(message: Message) -> int:
    """About how many characters ``TokenCounter.count_message`` would tokenize: its text
    and its tool calls (to tell a large message from a small one without reading it)."""
    content = message.content
    if isinstance(content, str):
        size = len(content)
    elif isinstance(content, list):
        texts = (part.get("text") for part in content if isinstance(part, dict))
        size = sum(len(text) for text in texts if isinstance(text, str))
    else:
        size = 0
    for call in message.tool_calls or ():
        function = call.get("function") or {}
        size += len(str(function.get("arguments", "")))
    return size


def uncounted_chars(messages: Iterable[Message]) -> int:
    """The characters counting would tokenize for those of ``messages`` without a count."""
    return sum(text_chars(m) for m in messages if not m.tokens)


class TokenCounter:
    """Counts tokens the way the chat-completions API bills a prompt."""

    def __init__(self, default_model: str = "gpt-4o") -> None:
        self.default_model = default_model
        self._per_model: BoundedMap[str, Callable[[str], int]] = BoundedMap(64)
        # The memos of counting, one set per counter (one counter per app, built in
        # wiring.py). The encoding is looked up once per model, not at every text.
        self.encoding_for_model = memo(maxsize=64)(encoding_for_model)
        self._count = memo_when_short(limit=_CACHED_TEXT_CHARS, maxsize=8192)(self._encode)
        # A memory item of several lines (a summary, a Q&A pair) is counted at every
        # request it is a candidate for: one lookup of the whole text, not a split and one
        # per line. (A single line is one piece: ``_count``'s memo already holds it.)
        self._count_lines = memo_when_short(limit=_CACHED_TEXT_CHARS, maxsize=8192)(self._by_lines)

    def warm(self) -> None:
        """Load the default model's encoding now (start-up), not at the first request."""
        self.encoding_for_model(self.default_model)

    def _encode(self, text: str, model: str) -> int:
        return count_with(self.encoding_for_model(model), text)

    def _by_lines(self, text: str, model: str) -> int:
        return sum(self._count(line, model) for line in split_lines(text))

    def count_text(self, text: str, model: str | None = None) -> int:
        if not text:
            return 0
        model = model or self.default_model
        if "\n" not in text and "\r" not in text:
            return self._count(text, model)
        return self._count_lines(text, model)

    def for_model(self, model: str) -> Callable[[str], int]:
        """``count_text`` for one model, as the same object at every call: what is derived
        with it can be remembered by it (``assemble``'s tier items). It says that its
        counts add up line by line (``LineCount``)."""
        count = self._per_model.get(model)
        if count is None:
            count = LineCount(self.count_text, model=model)
            count.encoding = self.encoding_for_model(model).name
            self._per_model.put(model, count)
        return count

    def count_message(self, message: Message, model: str | None = None) -> int:
        return TOKENS_PER_MESSAGE + self.count_payload(message.to_openai(), model)

    def count_payload(self, data: dict[str, Any], model: str | None = None) -> int:
        content = data.get("content")
        if isinstance(content, list) and any(media.is_image(part) for part in content):
            # An image costs what the API bills for it, not its placeholder's words.
            texts = [part for part in content if not media.is_image(part)]
            total = self.count_text(content_text(texts), model)
            total += sum(media.part_tokens(part) for part in content if media.is_image(part))
        else:
            total = self.count_text(content_text(content), model)
        for call in data.get("tool_calls") or ():
            function = call.get("function") or {}
            total += self.count_text(str(function.get("name", "")), model)
            total += self.count_text(str(function.get("arguments", "")), model)
        if data.get("name"):
            total += 1
        return total

    def count_prompt(self, messages: Iterable[Message], model: str | None = None) -> int:
        """Tokens of a whole prompt, using each message's stored count when it has one."""
        total = TOKENS_PER_REPLY
        for message in messages:
            total += message.tokens or self.count_message(message, model)
        return total
