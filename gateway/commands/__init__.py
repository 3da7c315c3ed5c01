"""The operator commands: ``import``, ``export``, ``inspect``, ``sessions``, ``facts`` and
``search``.

They are clients of a running gateway's memory API: tenancy, the memory policy and the
embedded Redis all stay behind the gateway, and the API key picks the tenant as it does
for the proxy. This module declares their arguments and runs them; the modules beside it
do the work (nothing heavy is imported until a command runs, so ``serve`` does not pay
for it).

Exit status: 0 done; 1 the gateway answered with an error or could not be reached; 2 bad
usage, a malformed input file or a refused resume; 130 interrupted (an import resumes
when the same command is run again).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from gateway.commands.api_client import MemoryClient

COMMANDS = frozenset({"import", "export", "inspect", "sessions", "facts", "search"})
_INTERRUPTED = 130


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _connection() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("gateway")
    group.add_argument(
        "--url",
        help="the gateway (default: $MEMORY_GATEWAY_URL, else server.host:port of --config, "
        "else http://127.0.0.1:8080)",
    )
    group.add_argument(
        "--api-key",
        help="the tenant's key (default: $MEMORY_GATEWAY_API_KEY, else $OPENAI_API_KEY)",
    )
    group.add_argument(
        "--config",
        default="config/gateway.yaml",
        help="where to read server.host and server.port when it exists (default: %(default)s)",
    )
    group.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for an answer (%(default)s)"
    )
    return options


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the operator commands to ``memory-gateway``'s subcommands."""
    parent = [_connection()]
    add = commands.add_parser(
        "import",
        parents=parent,
        help="import a conversation file, or a ChatGPT or Claude export (resumable)",
        description="Import a conversation into a session through the gateway's memory API: "
        "a JSONL file of messages (one per line), or one JSON document (an array of "
        'messages, or an object with "messages": a chat-completions body or an export). '
        "System messages are skipped. With --from chatgpt or --from claude, the "
        "conversations.json of that service's data export: each conversation becomes a "
        "session of --user (chatgpt-ID, claude-ID), its messages keeping their dates. "
        "Interrupted, it resumes when run again.",
    )
    add.add_argument("file", help="the JSONL file or JSON document, or the export's file")
    add.add_argument(
        "--from",
        dest="source",
        choices=("chatgpt", "claude"),
        help="the file is this service's conversations.json (its data export)",
    )
    add.add_argument("--session", help="the session id to import into (not with --from)")
    add.add_argument(
        "--user", help="the user id the sessions belong to (X-User-Id; needed with --from)"
    )
    add.add_argument(
        "--batch", type=_positive, default=100, help="messages per request (%(default)s)"
    )
    add.add_argument(
        "--state-file", help="the checkpoint file (default: FILE.import-progress.json)"
    )
    add.add_argument(
        "--restart",
        action="store_true",
        help="ignore an interrupted import's checkpoint and import the whole file",
    )

    export = commands.add_parser(
        "export", parents=parent, help="write a session's export (JSON or markdown)"
    )
    export.add_argument("session", help="the session id")
    export.add_argument("--format", choices=("json", "markdown"), default="json")
    export.add_argument("-o", "--output", help="write to this file (default: stdout)")

    inspect = commands.add_parser(
        "inspect", parents=parent, help="show a session's memory tiers as tables"
    )
    inspect.add_argument("session", help="the session id")
    inspect.add_argument("--json", action="store_true", help="print the raw JSON instead")

    sessions = commands.add_parser(
        "sessions", parents=parent, help="list the tenant's sessions, newest activity first"
    )
    sessions.add_argument("--search", help="only sessions whose id contains this")
    sessions.add_argument("--limit", type=_positive, help="at most this many sessions")

    facts = commands.add_parser(
        "facts", parents=parent, help="list a session's durable facts; correct or delete one"
    )
    facts.add_argument("session", help="the session id")
    facts.add_argument(
        "--correct",
        nargs=2,
        metavar=("FACT_ID", "TEXT"),
        help="replace a current fact's wording (the old one is kept, superseded)",
    )
    facts.add_argument("--delete", metavar="FACT_ID", help="delete a fact")
    facts.add_argument("--json", action="store_true", help="print the raw JSON instead")

    search = commands.add_parser(
        "search", parents=parent, help="a session's or a user's memories that answer a query"
    )
    search.add_argument("query", help="what to look for")
    search.add_argument("--session", help="search this session")
    search.add_argument("--user", help="search this user's sessions")
    search.add_argument(
        "--limit", type=_positive, help="at most this many results (10; 50 at most)"
    )
    search.add_argument("--json", action="store_true", help="print the raw JSON instead")


def run(args: argparse.Namespace) -> int:
    """Run an operator command; its exit status (errors are printed, not raised)."""
    from rich.console import Console

    from gateway.commands.api_client import MemoryClient, api_key, gateway_url
    from gateway.commands.failures import CommandError
    from gateway.commands.transcript import MalformedFile

    # Plain text: ids and file names are never read as markup, and lines are not broken
    # at the terminal's width (tables still fit it).
    options: dict[str, Any] = {"highlight": False, "markup": False, "soft_wrap": True}
    out = Console(file=sys.stdout, **options)
    err = Console(file=sys.stderr, stderr=True, **options)
    try:
        url = gateway_url(args.url, args.config)
        user = getattr(args, "user", None)
        with MemoryClient(url, api_key(args.api_key), timeout=args.timeout, user=user) as client:
            return _dispatch(args, client, out, err)
    except KeyboardInterrupt:
        print("memory-gateway: interrupted", file=sys.stderr)
        return _INTERRUPTED
    except MalformedFile as error:  # FILE:LINE: … first, as compilers print it
        print(error, file=sys.stderr)
        return error.exit_code
    except CommandError as error:
        print(f"memory-gateway {args.command}: {error}", file=sys.stderr)
        return error.exit_code


def _dispatch(args: argparse.Namespace, client: MemoryClient, out: Console, err: Console) -> int:
    if args.command == "import" and args.source:
        from gateway.commands.import_exports import run_export_import

        return run_export_import(args, client, out, err)
    if args.command == "import":
        from gateway.commands.importer import run_import

        return run_import(args, client, out, err)
    if args.command == "export":
        from gateway.commands.export import run_export

        return run_export(args, client, err)
    if args.command in ("facts", "search"):
        from gateway.commands.memories import run_facts, run_search

        return (run_facts if args.command == "facts" else run_search)(args, client, out)
    from gateway.commands.show import run_inspect, run_sessions

    if args.command == "inspect":
        return run_inspect(args, client, out)
    return run_sessions(args, client, out)
