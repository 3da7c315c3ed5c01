"""Reading a conversation file for ``memory-gateway import`` (no IO but the file itself).

Two formats, told apart by their shape:

* JSONL: one message object per line (blank lines skipped).
* One JSON document: an array of messages, or an object with ``"messages"`` (a
  chat-completions request body, or this gateway's own ``export`` JSON).

Every message is checked here, before anything is sent, with the gateway's own rules
(``MessageShape``), so that a problem is reported as ``FILE:LINE: …``. In a document the
line is the one its message starts on: the messages array is walked element by element
with ``raw_decode``. System and developer messages are set aside (the system prompt is the
client's; the gateway never stores it), and an export's ``"index"`` is dropped.

Notes:
    JSON is read as strictly as the gateway reads it: NaN and Infinity are refused, and
    so are strings that are not valid Unicode (a lone surrogate escape), which could not
    be sent.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from gateway.commands.checkpoint import Checkpoint
from gateway.commands.failures import UsageError
from gateway.dialects.chat.request import MessageShape, validation_error
from gateway.dialects.exports import json_kind

ROLES = ("user", "assistant", "tool", "system", "developer")
SKIPPED_ROLES = ("system", "developer")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SHOWN_VALUE_CHARS = 40


class MalformedFile(UsageError):
    """A file that cannot be imported, with the line at fault when there is one."""

    def __init__(self, name: str, line: int | None, reason: str, hint: str = "") -> None:
        where = f"{name}:{line}" if line else name
        super().__init__(f"{where}: {reason}{hint}")
        self.name = name
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of the file and the line it starts on."""

    line: int
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Transcript:
    name: str
    kind: Literal["jsonl", "document"]
    entries: tuple[Entry, ...]  # the messages to import, in order
    skipped: tuple[Entry, ...]  # system and developer messages
    sha256: str  # of the file's bytes


def read_transcript(path: Path) -> Transcript:
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read {name}: {error.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise MalformedFile(name, line, "not UTF-8 text") from None
    kind, found = parse_transcript(text, name)
    kept = tuple(e for e in found if e.message["role"] not in SKIPPED_ROLES)
    skipped = tuple(e for e in found if e.message["role"] in SKIPPED_ROLES)
    return Transcript(name, kind, kept, skipped, hashlib.sha256(raw).hexdigest())


class MessagesDigest:
    """A running hash of messages' content: what a resumed import must find unchanged."""

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self._hash = hashlib.sha256()
        for entry in entries:
            self.add(entry)

    def add(self, entry: Entry) -> None:
        self._hash.update(json.dumps(entry.message, sort_keys=True, ensure_ascii=False).encode())
        self._hash.update(b"\n")

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def sent_prefix_changed(mark: Checkpoint, entries: Sequence[Entry]) -> bool:
    """Whether the messages an interrupted import sent (``mark``) are no longer the first
    ``entries`` of the file, which has changed since."""
    return (
        mark.done > len(entries)
        or MessagesDigest(entries[: mark.done]).hexdigest() != mark.done_sha256
    )


def parse_transcript(
    text: str, name: str
) -> tuple[Literal["jsonl", "document"], tuple[Entry, ...]]:
    """The format and every message of a file's text, each checked (``MalformedFile``)."""
    lines = _Lines(text)
    start = skip_whitespace(text, 0)
    if start == len(text):
        raise MalformedFile(name, None, "the file is empty")
    if text[start] == "[" or (text[start] == "{" and not _looks_like_jsonl(text)):
        values = _document_messages(text, start, name, lines)
        return "document", tuple(_entry(value, line, name) for line, value in values)
    return "jsonl", tuple(_jsonl(text, name))


def _looks_like_jsonl(text: str) -> bool:
    """Whether a file starting with ``{`` is JSONL rather than one object.

    One object on one line is both: it is a document when it has ``"messages"``. A
    pretty-printed document's first lines are never whole objects; JSONL's are, except
    a broken one: either of its first two lines is enough.
    """
    nonblank = [line for line in text.splitlines() if line.strip()][:2]
    whole = [_strict_value(line) for line in nonblank]
    if len(nonblank) == 1 and isinstance(whole[0], dict):
        return "messages" not in whole[0] or "role" in whole[0]
    return any(isinstance(value, dict) for value in whole)


_MISSING = object()


def _strict_value(text: str) -> Any:
    try:
        return _decode(text)
    except ValueError:
        return _MISSING


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# As strict as the gateway: NaN and Infinity are not JSON (the export import reads with it).
DECODER = json.JSONDecoder(parse_constant=_no_constant)


def raw_decode(text: str, pos: int) -> tuple[Any, int]:
    """``DECODER.raw_decode``, with a value nested past Python's stack a ``ValueError``
    like any other that is not JSON (not a crash with a traceback)."""
    try:
        return DECODER.raw_decode(text, pos)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def skip_whitespace(text: str, pos: int) -> int:
    """The offset of the first character at or after ``pos`` that is not JSON whitespace."""
    return _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]


def _decode(text: str) -> Any:
    value, end = raw_decode(text, skip_whitespace(text, 0))
    if skip_whitespace(text, end) != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def _json_problem(error: ValueError) -> str:
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON: {error.msg} (column {error.colno})"
    return f"not valid JSON: {error}"


def _jsonl(text: str, name: str) -> Iterator[Entry]:
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            value = _decode(line)
        except ValueError as error:
            raise MalformedFile(name, number, _json_problem(error)) from None
        yield _entry(value, number, name)


class _Lines:
    """Line numbers of offsets in a text."""

    def __init__(self, text: str) -> None:
        self.newlines = [match.start() for match in re.finditer("\n", text)]

    def of(self, offset: int) -> int:
        return bisect.bisect_left(self.newlines, offset) + 1

    def column(self, offset: int) -> int:
        line = self.of(offset)
        return offset - (self.newlines[line - 2] if line > 1 else -1)


class _Walk:
    """A JSON document walked by hand down to its messages: each value is decoded with
    ``raw_decode``; the punctuation between them is read here."""

    def __init__(self, text: str, name: str, lines: _Lines) -> None:
        self.text = text
        self.name = name
        self.lines = lines

    def skip(self, pos: int) -> int:
        return skip_whitespace(self.text, pos)

    def fail(self, pos: int, reason: str) -> MalformedFile:
        column = self.lines.column(pos)
        return MalformedFile(
            self.name, self.lines.of(pos), f"not valid JSON: {reason} (column {column})"
        )

    def value(self, pos: int) -> tuple[Any, int]:
        try:
            return raw_decode(self.text, pos)
        except json.JSONDecodeError as error:
            raise self.fail(error.pos, error.msg) from None
        except ValueError as error:  # NaN, Infinity, nested too deeply
            raise MalformedFile(self.name, self.lines.of(pos), _json_problem(error)) from None

    def expect(self, pos: int, allowed: str, what: str) -> str:
        char = self.text[pos : pos + 1]
        if char not in tuple(allowed):
            found = repr(char) if char else "the end of the file"
            raise self.fail(pos, f"expected {what}, found {found}")
        return char

    def array(self, pos: int) -> tuple[list[tuple[int, Any]], int]:
        """The elements of the array at ``pos`` with their lines, and the offset after it."""
        elements: list[tuple[int, Any]] = []
        pos = self.skip(pos + 1)
        if self.text[pos : pos + 1] == "]":
            return elements, pos + 1
        while True:
            value, end = self.value(pos)
            elements.append((self.lines.of(pos), value))
            pos = self.skip(end)
            if self.expect(pos, ",]", "',' or ']' after a message") == "]":
                return elements, pos + 1
            pos = self.skip(pos + 1)

    def object_messages(self, pos: int) -> tuple[list[tuple[int, Any]] | None, int]:
        """The ``messages`` array of the object at ``pos`` (None when it has none) and the
        offset after the object."""
        messages: list[tuple[int, Any]] | None = None
        pos = self.skip(pos + 1)
        if self.text[pos : pos + 1] == "}":
            return None, pos + 1
        while True:
            self.expect(pos, '"', "a property name in double quotes")
            key, end = self.value(pos)
            pos = self.skip(end)
            self.expect(pos, ":", "':' after a property name")
            pos = self.skip(pos + 1)
            if key == "messages":  # the last one wins, as in any JSON parser
                if self.text[pos : pos + 1] == "[":
                    messages, end = self.array(pos)
                else:
                    value, end = self.value(pos)
                    raise MalformedFile(
                        self.name,
                        self.lines.of(pos),
                        f'"messages" must be an array, not {json_kind(value)}',
                    )
            else:
                _, end = self.value(pos)
            pos = self.skip(end)
            if self.expect(pos, ",}", "',' or '}'") == "}":
                return messages, pos + 1
            pos = self.skip(pos + 1)


def _document_messages(text: str, start: int, name: str, lines: _Lines) -> list[tuple[int, Any]]:
    walk = _Walk(text, name, lines)
    if text[start] == "[":
        messages, end = walk.array(start)
    else:
        found, end = walk.object_messages(start)
        if found is None:
            raise MalformedFile(
                name,
                None,
                'a JSON object with no "messages" (expected an array of messages, '
                'an object with "messages", or JSONL: one message per line)',
            )
        messages = found
    end = walk.skip(end)
    if end != len(text):
        raise walk.fail(end, "extra data after the document")
    return messages


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _SHOWN_VALUE_CHARS else text[: _SHOWN_VALUE_CHARS - 1] + "…"


def _entry(value: Any, line: int, name: str) -> Entry:
    """``value`` checked as a message (the gateway's rules), ``index`` dropped."""
    if not isinstance(value, dict):
        raise MalformedFile(name, line, f"expected a message object, found {json_kind(value)}")
    if "role" not in value:
        raise MalformedFile(name, line, 'message has no "role"')
    role = value["role"]
    if role not in ROLES:
        raise MalformedFile(
            name, line, f'"role" must be one of {", ".join(ROLES)}, not {_shown(role)}'
        )
    content = value.get("content")
    if content is not None and not isinstance(content, str | list):
        raise MalformedFile(
            name,
            line,
            '"content" must be a string, an array of content parts, or null, '
            f"not {json_kind(content)}",
        )
    message = {k: v for k, v in value.items() if k != "index"}
    try:
        MessageShape.model_validate(message)
    except ValidationError as error:
        problem = validation_error(message, error).message
        raise MalformedFile(name, line, problem) from None
    try:
        json.dumps(message, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedFile(
            name, line, "a string is not valid Unicode (a lone surrogate escape such as \\ud800)"
        ) from None
    return Entry(line, message)
