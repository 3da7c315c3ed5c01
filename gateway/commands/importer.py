"""``memory-gateway import FILE --session ID``: a conversation file into a session.

The file is read and checked whole first (``transcript``), then sent in batches to
``POST /memory/sessions/{sid}/messages``, so the gateway runs the same memory policy as
for a live conversation. A checkpoint written before each batch (``checkpoint``) makes an
interrupted import resumable by running the same command again.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from gateway.commands import checkpoint
from gateway.commands.api_client import ApiError, MemoryClient
from gateway.commands.checkpoint import Checkpoint
from gateway.commands.failures import CommandError, UsageError
from gateway.commands.transcript import (
    Entry,
    MalformedFile,
    MessagesDigest,
    Transcript,
    read_transcript,
    sent_prefix_changed,
)

INTERRUPTED = 130  # the shell's status for a command ended by SIGINT
# "messages.3.content" (the gateway's form) or "messages[3].content".
BATCH_PARAM = re.compile(r"messages(?:\.|\[)(\d+)\]?(?:\.(.+))?$")


def state_file(args: argparse.Namespace) -> Path:
    if args.state_file:
        return Path(args.state_file)
    path = Path(args.file)
    return path.with_name(path.name + ".import-progress.json")


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _lines(batch: Sequence[Entry]) -> str:
    first, last = batch[0].line, batch[-1].line
    return f"line {first}" if first == last else f"lines {first}-{last}"


def progress_bar(err: Console, doing: str, unit: str) -> Progress:
    """A progress bar on stderr: ``{doing} ━━━━━ 12/40 {unit} 0:00:03 0:00:07``; each task's
    description replaces ``doing`` when it is not the default."""
    return Progress(
        TextColumn(doing if doing else "{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit if unit else "{task.fields[unit]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
    )


@dataclass(slots=True)
class Sending:
    """How far an import into one session got: read after a refusal or a Ctrl-C."""

    done: int  # the entries acknowledged
    count: int  # the session's message count after them
    pending: int | None = None  # the session's pending jobs, as the last batch left them


class Refused(Exception):
    """The gateway refused a batch (4xx): none of it landed."""

    def __init__(self, error: ApiError, batch: Sequence[Entry]) -> None:
        super().__init__(str(error))
        self.error = error
        self.batch = batch


def send_batches(
    client: MemoryClient,
    session: str,
    entries: Sequence[Entry],
    at: Sending,
    *,
    path: Path,
    file_sha256: str,
    state: Path,
    batch: int,
    advance: Callable[[int], None],
) -> None:
    """Send ``entries[at.done:]`` into ``session`` in batches, the checkpoint written before
    each (``at`` follows them); ``Refused`` when the gateway refuses one."""
    digest = MessagesDigest(entries[: at.done])
    while at.done < len(entries):
        part = entries[at.done : at.done + batch]
        mark = Checkpoint(
            session=session,
            file=str(path.resolve()),
            file_sha256=file_sha256,
            done=at.done,
            done_sha256=digest.hexdigest(),
            message_count=at.count,
            sending=len(part),
        )
        mark.save(state)
        try:
            result = client.import_messages(session, [e.message for e in part])
        except ApiError as error:
            if 400 <= error.status < 500:  # refused: nothing of the batch landed
                replace(mark, sending=0).save(state)
                raise Refused(error, part) from None
            raise
        at.count = int(result["message_count"])
        at.pending = result.get("pending_jobs")
        for entry in part:
            digest.add(entry)
        at.done += len(part)
        advance(at.done)


def run_import(args: argparse.Namespace, client: MemoryClient, out: Console, err: Console) -> int:
    path, session = Path(args.file), args.session
    if not session:  # (not required by argparse: an export's import takes none)
        raise UsageError(
            "--session is needed: the session to import the file into (or --from chatgpt "
            "or --from claude for the conversations.json of a service's data export)"
        )
    transcript = read_transcript(path)
    if transcript.skipped:
        lines = ", ".join(str(e.line) for e in transcript.skipped[:5])
        more = ", …" if len(transcript.skipped) > 5 else ""
        word = "line" if len(transcript.skipped) == 1 else "lines"
        err.print(
            f"note: skipping {plural(len(transcript.skipped), 'system message')} "
            f"({word} {lines}{more}): the system prompt is the client's, the gateway never "
            "stores it"
        )
    entries = transcript.entries
    if not entries:
        raise UsageError(f"{transcript.name}: no messages to import")
    state = state_file(args)
    count = client.message_count(session)
    start = _resume(args, transcript, state, count, err)
    if count and not start:
        err.print(
            f"note: session {session} already has {plural(count, 'message')}: the file's "
            "messages are added after them"
        )

    at = Sending(done=start, count=count)
    progress = progress_bar(err, "importing", "messages")
    try:
        with progress:
            task = progress.add_task("import", total=len(entries), completed=start)
            send_batches(
                client, session, entries, at, path=path, file_sha256=transcript.sha256,
                state=state, batch=args.batch,
                advance=lambda done: progress.update(task, completed=done),
            )  # fmt: skip
    except Refused as refused:
        raise _refused(refused.error, refused.batch, transcript, at.done, state) from None
    except KeyboardInterrupt:
        # The checkpoint on disk is already right: written before the batch was sent.
        err.print(
            f"interrupted: {at.done} of {plural(len(entries), 'message')} imported into "
            f"session {session}. Run the same command again to resume (checkpoint: {state})."
        )
        return INTERRUPTED
    done, count, pending = at.done, at.count, at.pending
    checkpoint.remove(state)

    skipped = len(transcript.skipped)
    earlier = f", {start} of them by an earlier run" if start else ""
    note = f"; skipped {plural(skipped, 'system message')}" if skipped else ""
    out.print(
        f"imported {plural(done, 'message')} from {transcript.name} into session "
        f"{session}{earlier}{note}"
    )
    jobs = "" if pending is None else f", {plural(int(pending), 'pending job')}"
    out.print(f"session {session} now has {plural(count, 'message')}{jobs}")
    return 0


def _resume(
    args: argparse.Namespace, transcript: Transcript, state: Path, count: int, err: Console
) -> int:
    """How many of the file's messages the session already has from an interrupted run."""
    if args.restart:
        checkpoint.remove(state)
        return 0
    mark = checkpoint.load(state)
    if mark is None:
        return 0
    restart = "run again with --restart to import the whole file from the start"
    if mark.session != args.session:
        raise UsageError(
            f"{state} is the checkpoint of an import into session {mark.session}, not "
            f"{args.session}: give another --state-file, or {restart}"
        )
    entries = transcript.entries
    same_file = mark.file_sha256 == transcript.sha256
    if not same_file and sent_prefix_changed(mark, entries):
        raise UsageError(
            f"{transcript.name} changed since the interrupted import: its first "
            f"{plural(mark.done, 'message')} are not the ones imported; {restart} "
            f"(after the session's {plural(count, 'message')})"
        )
    at = checkpoint.resume_at(mark, count, same_file=same_file)
    if at is None:
        expected = str(mark.message_count)
        if mark.sending and same_file:
            expected += f" (or {mark.message_count + mark.sending} if its last batch landed)"
        raise UsageError(
            f"cannot resume: session {args.session} has {plural(count, 'message')}, the "
            f"interrupted import left it at {expected}, so it changed since; {restart}, "
            f"after the session's messages as they are now (checkpoint: {state})"
        )
    err.print(f"resuming: {at} of {plural(len(entries), 'message')} already imported")
    return at


def _refused(
    error: ApiError, batch: Sequence[Entry], transcript: Transcript, done: int, state: Path
) -> CommandError:
    """The gateway's refusal of a batch, named by the file's line when it can be."""
    after = (
        f"\nthe {plural(done, 'message')} before that batch are imported: fix the file and "
        f"run the same command again to resume (checkpoint: {state})"
        if done
        else ""
    )
    if error.status == 413:
        return UsageError(
            f"the batch of {plural(len(batch), 'message')} from {transcript.name} "
            f"({_lines(batch)}) is larger than the gateway accepts (server.max_body_bytes): "
            f"use a smaller --batch{after}"
        )
    found = BATCH_PARAM.match(error.param or "")
    if error.status == 400 and found and int(found.group(1)) < len(batch):
        entry = batch[int(found.group(1))]
        reason = error.message
        if reason.startswith(f"{error.param}: "):
            reason = reason[len(error.param or "") + 2 :]
        field = found.group(2)
        problem = f"{field}: {reason}" if field else reason
        return MalformedFile(
            transcript.name, entry.line, f"the gateway refused it: {problem}", after
        )
    return CommandError(
        f"the gateway refused the messages of {transcript.name} {_lines(batch)}: {error}{after}"
    )
