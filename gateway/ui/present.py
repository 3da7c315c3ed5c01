"""How sizes, times and messages read to a person: the terminal commands' and the
inspector's one way of writing them (pure)."""

from __future__ import annotations

from typing import Any


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        parts = [
            str(part.get("text") or part.get("refusal") or f"[{part.get('type', 'part')}]")
            for part in content
            if isinstance(part, dict)
        ]
        text = " ".join(parts)
    else:
        text = content or ""
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        text += f" → {function.get('name', '?')}({function.get('arguments', '')})"
    if message.get("tool_call_id"):
        text = f"[{message['tool_call_id']}] {text}"
    return text.strip()


def human_bytes(size: Any) -> str:
    if size is None:
        return "—"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def ago(seconds: float) -> str:
    if seconds < 10:
        return "just now"
    for limit, unit, name in ((60, 1, "s"), (3600, 60, "min"), (86400, 3600, "h")):
        if seconds < limit:
            return f"{int(seconds // unit)} {name} ago"
    days = int(seconds // 86400)
    return f"{days} day{'s' if days != 1 else ''} ago"
