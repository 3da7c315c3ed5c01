"""``memory-gateway inspect ID`` and ``memory-gateway sessions``: a session's tiers and the
tenant's sessions as tables in the terminal.

Everything shown comes from the memory API's JSON; conversation text is always rendered
as plain text (never as rich markup, so a message saying "[bold]" shows as written).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gateway.commands.api_client import MemoryClient
from gateway.ui.present import ago, human_bytes, message_text

SHORT_CHARS = 240  # a window message, a pin: one line each
BAR_CHARS = 30


def run_inspect(args: argparse.Namespace, client: MemoryClient, out: Console) -> int:
    state = client.session(args.session)
    receipts = client.receipts(args.session)
    last = receipts[0] if receipts else None
    if args.json:
        print_json(out, {**state, "last_receipt": last})
        return 0
    out.print(header(state))
    empty: list[str] = []
    for title, render in (
        ("window", lambda state: window_table(state, out.width)),
        ("summaries", summaries_table),
        ("rolling summary", rolling_panel),
        ("key Q/A", key_qa_table),
        ("facts", facts_table),
        ("pins", pins_table),
    ):
        shown = render(state)
        if shown is None:
            empty.append(title)
        else:
            out.print(shown)
    if empty:
        out.print(Text(f"empty: {', '.join(empty)}", style="dim"))
    if receipts is None:
        out.print(Text("no receipt yet (this gateway does not keep receipts)", style="dim"))
    elif last is None:
        out.print(Text("no receipt yet: no chat request has used this session", style="dim"))
    else:
        out.print(receipt_table(last))
    return 0


def run_sessions(args: argparse.Namespace, client: MemoryClient, out: Console) -> int:
    sessions = client.sessions(args.search, args.limit)
    if not sessions:
        found = f" matching {args.search!r}" if args.search else ""
        out.print(f"no sessions{found}")
        return 0
    table = Table(title="sessions", title_justify="left")
    table.add_column("session", overflow="fold")  # an id is shown whole, even folded
    table.add_column("user", overflow="fold")
    table.add_column("messages", justify="right")
    table.add_column("turns", justify="right")
    table.add_column("size", justify="right")
    table.add_column("last activity")
    table.add_column("ended")
    now = time.time()
    for session in sessions:
        updated = session.get("updated") or session.get("created")
        table.add_row(
            Text(str(session.get("session_id", ""))),
            Text(str(session.get("user_id") or "—")),
            str(session.get("message_count", "")),
            str(session.get("turns", "")),
            human_bytes(session.get("bytes")),
            f"{ago(now - float(updated))} ({local_time(float(updated))})" if updated else "—",
            _ended(session.get("ended")),
        )
    out.print(table)
    more = " (the limit: --limit shows more)" if args.limit and len(sessions) >= args.limit else ""
    out.print(f"{len(sessions)} session{'s' if len(sessions) != 1 else ''}{more}")
    return 0


def print_json(out: Console, document: Any) -> None:
    """``--json``: the memory API's answer as it came, indented, never wrapped or styled."""
    out.print(json.dumps(document, indent=2, ensure_ascii=False), soft_wrap=True)


def header(state: dict[str, Any]) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows = [
        ("session", state.get("session_id")),
        ("user", state.get("user_id") or "—"),
        ("messages", state.get("message_count")),
        ("turns", state.get("turns")),
        ("ended", _ended(state.get("ended"))),
        ("preset", state.get("preset") or "custom (memory.tiers)"),
        ("pending jobs", state.get("pending_jobs")),
        ("tiers version", state.get("tiers_version")),
    ]
    for name, value in rows:
        grid.add_row(name, Text(str(value)))
    return Panel(grid, title="session", title_align="left", expand=False)


def window_table(state: dict[str, Any], width: int = 100) -> Table | None:
    window = state.get("window") or []
    if not window:
        return None
    table = Table(title=f"window ({len(window)} messages)", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("role")
    table.add_column("content")
    # One line per message where the terminal allows: the content is cut to what is left
    # of its width after the index, the role, the borders and the padding.
    index_chars = max(len(str(m.get("index", ""))) for m in window)
    role_chars = max(len(str(m.get("role", ""))) for m in window)
    limit = min(SHORT_CHARS, max(20, width - index_chars - role_chars - 10))
    for message in window:
        table.add_row(
            str(message.get("index", "")),
            str(message.get("role", "")),
            Text(shorten(message_text(message), limit)),
        )
    return table


def summaries_table(state: dict[str, Any]) -> Table | None:
    summaries = state.get("summaries") or []
    if not summaries:
        return None
    table = Table(title=f"summaries ({len(summaries)})", title_justify="left")
    table.add_column("messages", no_wrap=True)
    table.add_column("written", no_wrap=True)
    table.add_column("text")
    for summary in summaries:
        written = iso(summary["ts"]) if summary.get("ts") else "—"
        if summary.get("fallback"):
            written += " (no model)"
        table.add_row(span(summary.get("range")), written, Text(summary.get("text", "")))
    return table


def rolling_panel(state: dict[str, Any]) -> Panel | None:
    rolling = state.get("rolling_summary")
    if not rolling:
        return None
    title = (
        f"rolling summary v{rolling.get('version')}, messages {span(rolling.get('range'))}"
        f", turn {rolling.get('turn')}"
    )
    return Panel(Text(rolling.get("text", "")), title=title, title_align="left")


def key_qa_table(state: dict[str, Any]) -> Table | None:
    pairs = state.get("key_qa") or []
    if not pairs:
        return None
    table = Table(title=f"key Q/A ({len(pairs)})", title_justify="left")
    table.add_column("turn", justify="right")
    table.add_column("question")
    table.add_column("answer")
    table.add_column("tags")
    for pair in pairs:
        table.add_row(
            str(pair.get("turn", "")),
            Text(pair.get("q", "")),
            Text(pair.get("a", "")),
            Text(", ".join(pair.get("tags") or ())),
        )
    return table


def facts_table(state: dict[str, Any]) -> Table | None:
    facts = state.get("facts") or []
    if not facts:
        return None
    table = Table(title=f"facts ({len(facts)})", title_justify="left")
    table.add_column("key")
    table.add_column("fact")
    table.add_column("messages", no_wrap=True)
    table.add_column("current")
    for fact in facts:
        table.add_row(
            Text(fact.get("key") or "—"),
            Text(fact.get("text", "")),
            span(fact.get("range")),
            "superseded" if fact.get("superseded") else "yes",
        )
    return table


def pins_table(state: dict[str, Any]) -> Table | None:
    pins = state.get("pins") or []
    if not pins:
        return None
    table = Table(title=f"pins ({len(pins)})", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("importance", justify="right")
    table.add_column("from #", justify="right")
    table.add_column("content")
    for pin in pins:
        source = pin.get("source_index")
        table.add_row(
            Text(str(pin.get("id", ""))),
            f"{float(pin.get('importance', 0)):.2f}",
            "—" if source is None else str(source),
            Text(shorten(str(pin.get("content", "")))),
        )
    return table


def receipt_table(entry: dict[str, Any]) -> Group:
    """The last request's token budget, split per tier, with a bar each."""
    receipt = entry.get("receipt") or {}
    tiers: dict[str, int] = receipt.get("tiers") or {}
    budget = int(receipt.get("budget_tokens") or 0)
    total = int(receipt.get("total_tokens") or sum(tiers.values()))
    scale = budget or total or 1
    when = f", {iso(float(entry['at']))}" if entry.get("at") else ""
    model = f", model {entry['model']}" if entry.get("model") else ""
    table = Table(title=f"last request's context{model}{when}", title_justify="left")
    table.add_column("tier")
    table.add_column("tokens", justify="right")
    table.add_column("of budget", justify="right")
    table.add_column("")
    for tier, tokens in tiers.items():
        table.add_row(tier, str(tokens), f"{100 * tokens / scale:.0f}%", bar(tokens, scale))
    sections: dict[str, int] = receipt.get("memory_sections") or {}
    for section, tokens in sections.items():
        table.add_row(
            Text(f"  memory: {section}", style="dim"),
            Text(str(tokens), style="dim"),
            "",
            "",
        )
    table.add_row(
        Text("total", style="bold"),
        str(total),
        f"{100 * total / scale:.0f}%",
        f"budget {budget}" if budget else "",
    )
    notes = [
        f"window messages {ranges(receipt.get('window_indexes') or [])}",
        "summaries " + (", ".join(span(s) for s in receipt.get("summaries") or []) or "none"),
        f"pins {len(receipt.get('pins') or [])}",
        f"recalled {ranges(receipt.get('recalled') or []) or 'none'}",
    ]
    dropped = receipt.get("dropped") or {}
    if dropped:
        notes.append("dropped " + ", ".join(f"{k} {v}" for k, v in dropped.items()))
    if entry.get("client_tokens") is not None:
        notes.append(f"the client sent {entry['client_tokens']} tokens")
    return Group(table, Text("; ".join(notes), style="dim"))


# --- formatting helpers --------------------------------------------------------------------


def shorten(text: str, limit: int = SHORT_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def span(value: Any) -> str:
    if not isinstance(value, dict):
        return "—"
    start, end = value.get("start"), value.get("end")
    return str(start) if start == end else f"{start}-{end}"


def ranges(indexes: Sequence[int | str]) -> str:
    """``[5, 6, 7, 9]`` as ``5-7, 9``. A receipt's recalled keys are strings: "12" in
    this session, "<session>#5" in another (listed as they are, after the runs)."""
    numbers = sorted(int(i) for i in indexes if isinstance(i, int) or str(i).isdigit())
    others = [str(i) for i in indexes if not (isinstance(i, int) or str(i).isdigit())]
    runs: list[list[int]] = []
    for index in numbers:
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ", ".join([*(str(a) if a == b else f"{a}-{b}" for a, b in runs), *others])


def bar(part: float, whole: float, width: int = BAR_CHARS) -> str:
    filled = round(width * min(part / whole, 1.0)) if whole > 0 else 0
    return "█" * filled + "·" * (width - filled)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


def local_time(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _ended(value: Any) -> str:
    if not value:
        return "no"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"yes, {iso(float(value))}"
    return "yes"
