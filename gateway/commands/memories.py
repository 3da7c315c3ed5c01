"""``memory-gateway facts ID`` and ``memory-gateway search QUERY``: a session's durable
facts, listed, corrected or deleted one by one, and a session's or a user's memories that
best answer a query — through the memory API, shown as tables (or the raw JSON).

Text from the conversation is rendered as plain text, never as rich markup.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gateway.commands.api_client import MemoryClient
from gateway.commands.failures import UsageError
from gateway.commands.show import print_json


def run_facts(args: argparse.Namespace, client: MemoryClient, out: Console) -> int:
    if args.correct is not None and args.delete is not None:
        raise UsageError("--correct and --delete: one at a time")
    if args.correct is not None:
        fact_id, text = args.correct
        fixed = client.correct_fact(args.session, fact_id, text)
        out.print(f"corrected {fact_id}: now {fixed.get('id')} ({fixed.get('text')!r})")
        return 0
    if args.delete is not None:
        client.delete_fact(args.session, args.delete)
        out.print(f"deleted {args.delete}")
        return 0
    facts = client.facts(args.session)
    if args.json:
        print_json(out, {"facts": facts})
        return 0
    if not facts:
        out.print("no facts")
        return 0
    table = Table(title="facts (oldest first)", title_justify="left")
    table.add_column("id", overflow="fold")
    table.add_column("key", overflow="fold")
    table.add_column("fact", overflow="fold")
    table.add_column("state")
    for fact in facts:
        state = "superseded" if fact.get("superseded") else "current"
        if fact.get("corrected"):
            state += ", corrected"
        table.add_row(
            Text(str(fact.get("id", ""))),
            Text(str(fact.get("key", ""))),
            Text(str(fact.get("text", ""))),
            state,
        )
    out.print(table)
    return 0


def run_search(args: argparse.Namespace, client: MemoryClient, out: Console) -> int:
    if (args.session is None) == (args.user is None):
        raise UsageError("search needs --session or --user (one of them)")
    results = client.search(args.query, session=args.session, user=args.user, limit=args.limit)
    if args.json:
        print_json(out, {"results": results})
        return 0
    if not results:
        out.print("nothing found")
        return 0
    table = Table(title=f"memories for {args.query!r}", title_justify="left")
    for name in ("score", "kind", "session", "id", "date", "text"):
        table.add_column(name, overflow="fold", justify="right" if name == "score" else "left")
    for found in results:
        table.add_row(f"{_number(found.get('score')):.3f}", str(found.get("kind", "")),
                      Text(str(found.get("session_id", ""))), Text(str(found.get("id", ""))),
                      str(found.get("date") or "—"), Text(str(found.get("text", ""))))  # fmt: skip
    out.print(table)
    return 0


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
