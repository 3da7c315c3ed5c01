"""``memory-gateway import --from chatgpt|claude conversations.json --user ID``: a service's
data export, one session of the user per conversation (``chatgpt-ID``, ``claude-ID``).

The file is read and checked whole first (``gateway.dialects.exports``, which the memory API's
import of an export uses too), its array walked one conversation at a time: what is held
is the file's text and the messages kept, never every conversation's tree at once. Then
each conversation is sent as a conversation file is (``importer.send_batches``: in
batches, the checkpoint written before each), its messages with the times they were said.

Run again, an import resumes: a conversation whose session exists already is left as it
is (an import done before), and the one an interruption cut short, named by the
checkpoint, goes on where it stopped (``checkpoint.resume_at``). A newer export of the
same account can be imported the same way: only its new conversations are added.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from gateway.commands import checkpoint
from gateway.commands.api_client import ApiError, MemoryClient
from gateway.commands.checkpoint import Checkpoint
from gateway.commands.failures import UsageError
from gateway.commands.importer import (
    BATCH_PARAM,
    INTERRUPTED,
    Refused,
    Sending,
    plural,
    progress_bar,
    send_batches,
    state_file,
)
from gateway.commands.transcript import (
    Entry,
    MalformedFile,
    raw_decode,
    sent_prefix_changed,
    skip_whitespace,
)
from gateway.dialects.exports import Conversation, ExportError, read_conversation

_SHOWN_TITLE_CHARS = 40


@dataclass(frozen=True, slots=True)
class ExportFile:
    name: str
    sha256: str  # of the file's bytes: what a resumed import compares first
    conversations: tuple[Conversation, ...]


def read_export_file(path: Path, fmt: str) -> ExportFile:
    """The conversations of an export file, each checked (``MalformedFile`` names the one
    at fault)."""
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read {name}: {error.strerror}") from None
    sha256 = hashlib.sha256(raw).hexdigest()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise MalformedFile(name, line, "not UTF-8 text") from None
    del raw  # the text alone from here
    conversations = []
    for number, value in _conversation_values(text, name):
        try:
            conversations.append(read_conversation(fmt, number, value))
        except ExportError as error:
            raise MalformedFile(name, None, str(error)) from None
    return ExportFile(name, sha256, tuple(conversations))


def _conversation_values(text: str, name: str) -> Iterator[tuple[int, Any]]:
    """Each element of the file's top-level array, decoded one at a time."""
    pos = skip_whitespace(text, 0)
    if text[pos : pos + 1] != "[":
        found = {"": "an empty file", "{": "an object"}.get(text[pos : pos + 1], "something else")
        raise MalformedFile(
            name, None, f"expected the array of conversations of an export, found {found}"
        )
    pos, number = skip_whitespace(text, pos + 1), 0
    if text[pos : pos + 1] == "]":
        pos += 1
    else:
        while True:
            number += 1
            try:
                value, end = raw_decode(text, pos)
            except json.JSONDecodeError as error:
                raise _bad_json(text, name, error.pos, error.msg, number) from None
            except ValueError as error:  # NaN; nested past the stack
                raise _bad_json(text, name, pos, str(error), number) from None
            yield number, value
            pos = skip_whitespace(text, end)
            if text[pos : pos + 1] == "]":
                pos += 1
                break
            if text[pos : pos + 1] != ",":
                raise _bad_json(text, name, pos, "expected ',' or ']'", number)
            pos = skip_whitespace(text, pos + 1)
    pos = skip_whitespace(text, pos)
    if pos != len(text):
        raise _bad_json(text, name, pos, "extra data after the array", number)


def _bad_json(text: str, name: str, pos: int, reason: str, number: int) -> MalformedFile:
    line = text.count("\n", 0, pos) + 1  # counted once, on the way out
    column = pos - text.rfind("\n", 0, pos)
    return MalformedFile(
        name, line, f"not valid JSON: {reason} (column {column}, in conversation {number})"
    )


# --- the import ----------------------------------------------------------------------


def _named(conversation: Conversation) -> str:
    title = conversation.title
    if len(title) > _SHOWN_TITLE_CHARS:
        title = title[: _SHOWN_TITLE_CHARS - 1] + "…"
    shown = f' "{title}"' if title else ""
    return f"conversation {conversation.number}{shown} (session {conversation.session_id})"


def _dates(conversation: Conversation) -> str:
    times = [m["timestamp"] for m in conversation.messages if "timestamp" in m]
    if not times:
        return "undated"
    days = sorted({datetime.datetime.fromtimestamp(t, datetime.UTC).date() for t in times})
    return str(days[0]) if len(days) == 1 else f"{days[0]} to {days[-1]}"


@dataclass
class _Run:
    """What an export's import did so far (reported at its end or at a Ctrl-C)."""

    imported: list[tuple[Conversation, int, bool]] = field(default_factory=list)  # sent, resumed
    present: list[Conversation] = field(default_factory=list)  # imported by an earlier run
    other: list[tuple[Conversation, int]] = field(default_factory=list)  # other messages
    # Imported for another user of the tenant (a session id is the conversation's: one
    # export imports for one user).
    of_other_users: list[tuple[Conversation, str]] = field(default_factory=list)
    current: Conversation | None = None
    at: Sending | None = None


def run_export_import(
    args: argparse.Namespace, client: MemoryClient, out: Console, err: Console
) -> int:
    fmt, path = args.source, Path(args.file)
    if args.session:
        raise UsageError(
            f"--from {fmt} imports each conversation into a session of its own "
            f"({fmt}-ID): leave out --session"
        )
    if not args.user:
        raise UsageError(f"--from {fmt} needs --user: the user the conversations' sessions are of")
    export = read_export_file(path, fmt)
    importable = [c for c in export.conversations if c.messages]
    state = state_file(args)
    mark = _checkpoint(args, state, importable)
    run = _Run()
    progress = progress_bar(err, "", "")
    try:
        with progress:
            overall = progress.add_task("conversations", total=len(importable), unit="")
            task = progress.add_task("", total=None, unit="messages", visible=False)
            for conversation in importable:
                entries = tuple(Entry(i, m) for i, m in enumerate(conversation.messages, 1))
                run.current, run.at = conversation, None
                count, owner = client.held(conversation.session_id)
                if count and owner is not None and owner != args.user:
                    run.of_other_users.append((conversation, owner))
                    progress.advance(overall)
                    continue
                if mark is not None and mark.session == conversation.session_id:
                    start = _resume_at(mark, export, conversation, entries, count)
                    mark = None
                elif count:  # imported before (or another session by that name)
                    if count == len(entries):
                        run.present.append(conversation)
                    else:
                        run.other.append((conversation, count))
                    progress.advance(overall)
                    continue
                else:
                    start = 0
                run.at = Sending(done=start, count=count)
                progress.update(
                    task, description=_named(conversation), total=len(entries),
                    completed=start, visible=True,
                )  # fmt: skip
                send_batches(
                    client, conversation.session_id, entries, run.at, path=path,
                    file_sha256=export.sha256, state=state, batch=args.batch,
                    advance=lambda done: progress.update(task, completed=done),
                )  # fmt: skip
                checkpoint.remove(state)
                run.imported.append((conversation, run.at.done - start, start > 0))
                progress.advance(overall)
    except Refused as refused:
        raise _refused(refused.error, refused.batch, export, run, state) from None
    except KeyboardInterrupt:
        err.print(_interrupted(run, importable, state))
        return INTERRUPTED
    _report(args, export, run, out, err)
    return 0


def _checkpoint(
    args: argparse.Namespace, state: Path, importable: Sequence[Conversation]
) -> Checkpoint | None:
    """The interrupted import's checkpoint: of one of this export's conversations."""
    if args.restart:
        checkpoint.remove(state)
        return None
    mark = checkpoint.load(state)
    if mark is not None and mark.session not in {c.session_id for c in importable}:
        raise UsageError(
            f"{state} is the checkpoint of an import into session {mark.session}, none of "
            f"this export's: give another --state-file, or run again with --restart"
        )
    return mark


def _resume_at(
    mark: Checkpoint,
    export: ExportFile,
    conversation: Conversation,
    entries: Sequence[Entry],
    count: int,
) -> int:
    """Where the conversation an interruption cut short resumes (as a file's import)."""
    session = conversation.session_id
    leave = (
        f"run again with --restart to leave session {session} as it is and import the "
        f"other conversations, or erase it (DELETE /memory/sessions/{session}) and run again"
    )
    same_file = mark.file_sha256 == export.sha256
    if not same_file and sent_prefix_changed(mark, entries):
        raise UsageError(
            f"{export.name}: {_named(conversation)} changed since the interrupted import: "
            f"its first {plural(mark.done, 'message')} are not the ones imported; {leave}"
        )
    at = checkpoint.resume_at(mark, count, same_file=same_file)
    if at is None:
        raise UsageError(
            f"cannot resume {_named(conversation)}: the session has "
            f"{plural(count, 'message')}, the interrupted import left it at "
            f"{mark.message_count}, so it changed since; {leave}"
        )
    return at


def _refused(
    error: ApiError, batch: Sequence[Entry], export: ExportFile, run: _Run, state: Path
) -> UsageError:
    """The gateway's refusal of a conversation's batch, named by the conversation and
    its message."""
    conversation, done = run.current, run.at.done if run.at else 0
    assert conversation is not None  # a batch is only sent for a conversation
    after = f"\nthe conversations before it are imported (checkpoint: {state})"
    if error.status == 413:
        return UsageError(
            f"{export.name}: {_named(conversation)}: the batch of messages "
            f"{batch[0].line}-{batch[-1].line} is larger than the gateway accepts "
            f"(server.max_body_bytes): use a smaller --batch{after}"
        )
    found = BATCH_PARAM.match(error.param or "")
    where = f"messages {batch[0].line}-{batch[-1].line}" if len(batch) > 1 else "a message"
    if error.status == 400 and found and int(found.group(1)) < len(batch):
        where = f"message {batch[int(found.group(1))].line}"
    imported = f", {plural(done, 'message')} of it imported" if done else ""
    return MalformedFile(
        export.name, None, f"{_named(conversation)}{imported}: the gateway refused {where}: "
        f"{error.message}{after}"
    )  # fmt: skip


def _interrupted(run: _Run, importable: Sequence[Conversation], state: Path) -> str:
    done = len(run.imported) + len(run.present) + len(run.other) + len(run.of_other_users)
    where = ""
    if run.current is not None and run.at is not None:
        total = len(run.current.messages)
        where = f" ({run.at.done} of {plural(total, 'message')} of {_named(run.current)})"
    return (
        f"interrupted: {done} of {plural(len(importable), 'conversation')} done{where}. "
        f"Run the same command again to resume (checkpoint: {state})."
    )


def _report(
    args: argparse.Namespace, export: ExportFile, run: _Run, out: Console, err: Console
) -> None:
    sent = sum(n for _, n, _ in run.imported)
    resumed = sum(1 for *_, again in run.imported if again)
    earlier = f", {resumed} of them resumed" if resumed else ""
    out.print(
        f"imported {plural(len(run.imported), 'conversation')} from {export.name} into "
        f"sessions of user {args.user} ({plural(sent, 'message')}){earlier}"
    )
    for conversation, _, _ in run.imported:
        out.print(
            f"  {conversation.session_id}  {plural(len(conversation.messages), 'message')}, "
            f"{_dates(conversation)}  {conversation.title}"
        )
    empty = sum(1 for c in export.conversations if not c.messages)
    if empty:
        out.print(
            f"skipped {plural(empty, 'conversation')} with nothing to import (no text "
            "between the user and the assistant)"
        )
    if run.present:
        out.print(f"skipped {plural(len(run.present), 'conversation')} imported before")
    for conversation, owner in run.of_other_users:
        err.print(
            f"note: {_named(conversation)} was imported for user {owner}, not "
            f"{args.user}: left as it is (a conversation's session is one user's; erase "
            "it to import it for another)"
        )
    for conversation, count in run.other:
        err.print(
            f"note: session {conversation.session_id} exists with "
            f"{plural(count, 'message')}, {_named(conversation)} has "
            f"{len(conversation.messages)}: left as it is (erase the session to import it)"
        )
