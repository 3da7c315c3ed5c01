"""``memory-gateway export ID``: the gateway's export of a session, to stdout or a file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from gateway.commands.api_client import MemoryClient
from gateway.commands.failures import UsageError


def run_export(args: argparse.Namespace, client: MemoryClient, err: Console) -> int:
    body = client.export(args.session, args.format)
    if args.output in (None, "-"):
        sys.stdout.flush()  # bytes go under the text layer: nothing may wait in it
        sys.stdout.buffer.write(body)
        if not body.endswith(b"\n"):
            sys.stdout.buffer.write(b"\n")
        sys.stdout.flush()
        return 0
    try:
        Path(args.output).write_bytes(body)
    except OSError as error:
        raise UsageError(f"cannot write {args.output}: {error.strerror}") from None
    err.print(f"wrote session {args.session} to {args.output} ({len(body)} bytes)")
    return 0
