"""The checkpoint of an import in progress, and where a re-run resumes (pure but for
reading and writing the file).

Before each batch is sent the checkpoint says: this session, this file, the first
``done`` messages acknowledged with the session at ``message_count`` after them, and
``sending`` more on their way. An interruption can land before the gateway appended the
batch or after it (the import of one batch is atomic on the gateway), so on a re-run the
session's message count tells which: ``message_count`` (resume at ``done``) or
``message_count + sending`` (the batch landed: resume after it). Any other count means
the session changed meanwhile, and resuming would duplicate or skip messages.

Notes:
    The file may change between the runs (a line the gateway refused, fixed): what was
    already imported is then compared by a hash of those messages, and resuming is
    allowed when they are the same. A batch in flight from a changed file is refused:
    whether it landed as it was cannot be told.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from gateway.commands.failures import UsageError

VERSION = 1


@dataclass(frozen=True, slots=True)
class Checkpoint:
    session: str
    file: str
    file_sha256: str
    done: int  # the file's messages acknowledged (system messages not counted)
    done_sha256: str  # a hash of those messages (transcript.MessagesDigest)
    message_count: int  # the session's message count after them
    sending: int  # the batch sent after them and not yet acknowledged

    def save(self, path: Path) -> None:
        """Written whole or not at all: a Ctrl-C mid-write leaves the previous one."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"version": VERSION, **asdict(self)}, indent=1) + "\n")
        os.replace(tmp, path)


def load(path: Path) -> Checkpoint | None:
    """The checkpoint at ``path``; None when there is none."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.pop("version") != VERSION:
            raise ValueError("another version")
        return Checkpoint(**data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        raise UsageError(
            f"{path} is not a checkpoint of this import ({error}); remove it, or run with "
            "--restart to import the whole file again"
        ) from None


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def resume_at(checkpoint: Checkpoint, count: int, *, same_file: bool) -> int | None:
    """How many of the file's messages are in the session, seen its ``count`` now; None
    when that cannot be told (the session changed, or a changed file's batch landed)."""
    if count == checkpoint.message_count:
        return checkpoint.done
    if same_file and checkpoint.sending and count == checkpoint.message_count + checkpoint.sending:
        return checkpoint.done + checkpoint.sending
    return None
