"""A session as seed 001's session markdown (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gateway.memory.branches import Branch
from gateway.memory.model import Message, SessionState, content_text


def iso_time(ts: float) -> str:
    """A Unix time as ISO 8601 in UTC: ``2024-01-13T09:05:00Z``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _iso(ts: str | None) -> str:
    return iso_time(float(ts)) if ts else "(open)"


def _start(meta: Mapping[str, str], messages: Sequence[Message]) -> str:
    """When the conversation began: its earliest message's time when that is before the
    session's record was made (an imported conversation's own times: the record was made
    at the import), else the record's time."""
    times = [m.ts for m in messages if m.ts > 0]
    created = meta.get("created")
    if created:
        times.append(float(created))
    return iso_time(min(times)) if times else "(open)"


def _line(index: int, role: str, text: str) -> str:
    return f"**Message {index} ({role.title()}):** {text}"


def session_markdown(
    session_id: str,
    meta: Mapping[str, str],
    state: SessionState,
    messages: Sequence[Message],
    view: Mapping[str, Any],
    branches: Sequence[Branch] = (),
) -> str:
    """Metadata, the short-term window, the medium-term summary, the other tiers, the
    transcript, and the abandoned branches (marked, apart from the transcript)."""
    rolling = state.tiers.rolling
    lines = [
        f"# Session: {session_id}",
        "",
        "## Metadata",
        f"- Start: {_start(meta, messages)}",
        f"- End: {_iso(meta.get('ended'))}",
        f"- Message Count: {state.message_count}",
        f"- Summary Version: {rolling.version if rolling else state.tiers.version}",
        "",
        f"## Short-Term Messages (Last {len(view['window'])})",
    ]
    lines += [_line(m["index"], m["role"], content_text(m.get("content"))) for m in view["window"]]
    lines += ["", "## Medium-Term Summary"]
    if rolling is not None:
        lines.append(f"(messages {rolling.start}-{rolling.end})")
        lines.append(rolling.text)
    for summary in reversed(state.tiers.summaries):
        lines += [f"### Messages {summary.start}-{summary.end}", summary.text]
    if rolling is None and not state.tiers.summaries:
        lines.append("(none yet)")
    if state.tiers.key_qa:
        lines += ["", "## Key Questions and Answers"]
        lines += [f"- Q: {k.q} A: {k.a}" for k in state.tiers.key_qa]
    if state.tiers.facts:
        lines += ["", "## Key Facts", *(f"- {f.text}" for f in state.tiers.facts)]
    if state.pins:
        lines += ["", "## Pins", *(f"- ({p.importance:.2f}) {p.content}" for p in state.pins)]
    lines += ["", "## Full Transcript"]
    lines += [_line(m.index, m.role, m.text) for m in messages]
    if branches:
        lines += ["", "## Abandoned Branches (not part of the conversation)"]
    for branch in branches:
        reason = "edited" if branch.kind == "edit" else "regenerated"
        lines += [
            "",
            f"### Abandoned after message {branch.kept} ({reason}, {iso_time(branch.at)})",
        ]
        lines += [_line(m.index, m.role, m.text) for m in branch.messages]
    return "\n".join(lines) + "\n"
