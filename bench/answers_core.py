"""What ``bench/answers.py`` decides without talking to a server: the prompts (the
question as the client asks it, the judge's), the judge's verdict, the baseline's
history (dated, cut from the front), the resumable ``--out`` file's bookkeeping, and
the table. Pure: unit-tested in tests/unit/bench/test_answers_core.py.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.realtalk import CATEGORIES, RealConversation, RealMessage, speaker_name
from gateway.memory.block import day_label

ALL = "all"
FULL_HISTORY = "full history"

# Sent as the system message with every question, through the gateway and straight to
# the model alike (the gateway adds its memory; the baseline sends the whole history).
# REALTALK's questions sometimes call the two people by other names than the files do.
ANSWER_SYSTEM = (
    "The conversation so far is a chat between two friends: the user's messages are "
    "{user}'s and the assistant's messages are {assistant}'s (a question may call them by "
    "other names). Answer the question about that conversation from what was said in it, "
    "in a few words. For a question about when something happened, give the date, "
    "counting relative times ('yesterday', 'last week') from the day the message was sent."
)

# The judge prompt of LoCoMo's J metric as mem0's evaluation runs it: ACCURACY_PROMPT of
# mem0ai/mem0, evaluation/metrics/llm_judge.py (Apache-2.0; commit 67230435…), the
# protocol Mem0, Zep, Memobase and others publish J with. Its wording is kept so that
# our J reads like theirs; only its typographic quotes are ASCII here and trailing
# spaces dropped. It asks for a JSON label; mem0 also sends response_format json_object
# (``--judge-json``), and ``parse_verdict`` reads either form.
JUDGE_PROMPT = """
Your task is to label an answer to a question as 'CORRECT' or 'WRONG'. You will be given the following data:
    (1) a question (posed by one user to another user),
    (2) a 'gold' (ground truth) answer,
    (3) a generated answer
which you will score as CORRECT/WRONG.

The point of the question is to ask about something one user should know about the other user based on their prior conversations.
The gold answer will usually be a concise and short answer that includes the referenced topic, for example:
Question: Do you remember what I got the last time I went to Hawaii?
Gold answer: A shell necklace
The generated answer might be much longer, but you should be generous with your grading - as long as it touches on the same topic as the gold answer, it should be counted as CORRECT.

For time related questions, the gold answer will be a specific date, month, year, etc. The generated answer might be much longer or use relative time references (like "last Tuesday" or "next month"), but you should be generous with your grading - as long as it refers to the same date or time period as the gold answer, it should be counted as CORRECT. Even if the format differs (e.g., "May 7th" vs "7 May"), consider it CORRECT if it's the same date.

Now it's time for the real question:
Question: {question}
Gold answer: {gold_answer}
Generated answer: {generated_answer}

First, provide a short (one sentence) explanation of your reasoning, then finish with CORRECT or WRONG.
Do NOT include both CORRECT and WRONG in your response, or it will break the evaluation script.

Just return the label CORRECT or WRONG in a json format with the key as "label".
"""  # noqa: E501  (the protocol's own lines)

# Settings a resumed run must share with the records it finds: another model, judge,
# preset or prompt would mix two measurements in one table.
SETUP_KEYS = ("model", "judge_model", "preset", "prompts")


def prompts_digest() -> str:
    """A short fingerprint of both prompts: a changed prompt is another measurement."""
    return hashlib.sha256((ANSWER_SYSTEM + JUDGE_PROMPT).encode()).hexdigest()[:12]


def ask_messages(conversation: RealConversation, question: str) -> list[dict[str, str]]:
    """What the client sends to ask a question: the system line and the question."""
    user, assistant = conversation.speakers
    system = ANSWER_SYSTEM.format(user=user, assistant=assistant)
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def judge_messages(question: str, gold: str, answer: str) -> list[dict[str, str]]:
    """The judge's request: the prompt alone, as one user message (as mem0 sends it)."""
    text = JUDGE_PROMPT.format(question=question, gold_answer=gold, generated_answer=answer)
    return [{"role": "user", "content": text}]


_LABEL = re.compile(r"""["']label["']\s*:\s*["']\s*(CORRECT|WRONG)\s*["']""", re.IGNORECASE)
_WORD = re.compile(r"\b(CORRECT|WRONG)\b")  # upper case: "correct" is a word of reasoning


def parse_verdict(reply: str) -> str | None:
    """``CORRECT`` or ``WRONG`` from the judge's reply, or None when it names neither.

    The JSON label first (``{"label": "CORRECT"}``, also inside prose or a code fence);
    else the last of the two words in capitals, since the prompt asks the judge to
    finish with its label ("INCORRECT" is neither: the boundary is a letter).
    """
    if found := _LABEL.search(reply):
        return found.group(1).upper()
    words = _WORD.findall(reply)
    return words[-1] if words else None


def dated_history(messages: Sequence[RealMessage]) -> list[dict[str, str]]:
    """The baseline's history: every message as user/assistant, the first message of
    each day (UTC) prefixed with it, "[Sat 2024-01-13] …", the day label the gateway's
    memory block writes. The gateway imports each message's time; without the days the
    full history could not answer the temporal questions that the gateway can. Each
    carries its speaker's ``name``, as the gateway's import does."""
    history, last = [], ""
    for message in messages:
        day = day_label(message.timestamp)
        text = f"[{day}] {message.text}" if day and day != last else message.text
        last = day or last
        name = speaker_name(message.speaker)
        history.append({"role": message.role, "content": text, "name": name})
    return history


def keep_from(costs: Sequence[int], limit: int) -> int:
    """Index of the oldest message kept when the history is cut from the front to fit
    ``limit`` tokens: the newest messages whose costs add up to at most ``limit``."""
    start, total = len(costs), 0
    while start > 0 and total + costs[start - 1] <= limit:
        start, total = start - 1, total + costs[start - 1]
    return start


def select(conversations: Sequence[RealConversation], spec: str) -> list[RealConversation]:
    """``--conversations``: ``all``, a count (the first N), or comma-separated ids or
    parts of ids ("Chat_4", "Emi_Paola"), each naming exactly one conversation."""
    spec = spec.strip()
    if spec in ("", ALL):
        return list(conversations)
    if spec.isdigit():
        if int(spec) < 1:
            raise ValueError("--conversations: a count of at least 1")
        return list(conversations[: int(spec)])
    chosen: list[RealConversation] = []
    for name in (part.strip() for part in spec.split(",") if part.strip()):
        exact = [c for c in conversations if c.id.lower() == name.lower()]
        # "Chat_1" is a prefix of "Chat_10_…" too: a part matches up to an underscore.
        found = exact or [c for c in conversations if _names(c.id, name)]
        if len(found) != 1:
            known = ", ".join(c.id for c in conversations)
            what = "no" if not found else "more than one"
            raise ValueError(f"--conversations: {what} conversation matches {name!r} ({known})")
        if found[0] not in chosen:
            chosen.append(found[0])
    return chosen


def _names(conversation_id: str, part: str) -> bool:
    pattern = rf"(^|_){re.escape(part.lower())}(_|$)"
    return re.search(pattern, conversation_id.lower()) is not None


# --- The --out file: one JSON object a line ---------------------------------------------
#
# {"run": {...}}      a run started: its commit and settings (never a key)
# {"row": …, …}       a question's state in one row: its answer, then its grade; the last
#                     line of a (row, conversation, number) is its state
# {"summary": {...}}  a run ended: the table's numbers

Key = tuple[str, str, int]  # (row, conversation id, question number)


def record_key(record: Mapping[str, Any]) -> Key:
    return (str(record["row"]), str(record["conversation"]), int(record["number"]))


def parse_out(lines: Iterable[str]) -> tuple[list[dict[str, Any]], dict[Key, dict[str, Any]]]:
    """The runs the file records, and each question's last state.

    A line that is not a whole JSON object (a run killed while writing it) is skipped:
    its question is simply done again.
    """
    runs: list[dict[str, Any]] = []
    records: dict[Key, dict[str, Any]] = {}
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("run"), dict):
            runs.append(item["run"])
        elif "row" in item and "conversation" in item and "number" in item:
            records[record_key(item)] = item
    return runs, records


def setup_conflict(runs: Sequence[Mapping[str, Any]], setup: Mapping[str, Any]) -> str | None:
    """Why the records of earlier runs may not be mixed with this one's, or None."""
    if not runs:
        return None
    last = runs[-1]
    differ = [k for k in SETUP_KEYS if last.get(k) != setup.get(k)]
    if not differ:
        return None
    changes = ", ".join(f"{k} {last.get(k)!r} -> {setup.get(k)!r}" for k in differ)
    return f"the file's records were made with other settings ({changes}): use another --out"


def next_step(record: Mapping[str, Any] | None) -> str | None:
    """What a question still needs: ``answer``, ``judge``, or None (done).

    A call that failed for good (the server refused the request: 4xx) is an answer, a
    wrong one, and is not asked again; a failure that may pass (no connection, a
    timeout, 5xx, 429) is asked again by the next run. So is a grade the judge failed
    to give; a verdict it gave but that names neither label stays WRONG (temperature 0
    would give the same reply).
    """
    if record is None or (record.get("answer") is None and not record.get("final")):
        return "answer"
    if record.get("verdict") is None:
        return "judge"
    return None


@dataclass
class Reply:
    """A chat completion's text, or why there is none; its usage and headers."""

    text: str | None
    error: str | None = None
    status: int | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        """The server refused this request as such (4xx): asking again gives the same."""
        status = self.status or 0
        return self.error is not None and 400 <= status < 500 and status not in (408, 429)


def answer_fields(reply: Reply) -> dict[str, Any]:
    """What a record keeps of an answer: the text or the failure, and the usage."""
    return {
        "answer": reply.text,
        "error": reply.error,
        "final": reply.final,
        "prompt_tokens": reply.usage.get("prompt_tokens"),
        "completion_tokens": reply.usage.get("completion_tokens"),
    }


def context_refused(status: int | None, text: str) -> bool:
    """Whether a model server's refusal says the prompt was too long for its context
    (vLLM: "maximum context length", llama.cpp: "exceeds the available context size",
    OpenAI: "context_length_exceeded"): the baseline then cuts more and asks again."""
    return status == 400 and _TOO_LONG.search(text) is not None


_TOO_LONG = re.compile(r"context|too (long|many tokens)|maximum .*length|n_ctx", re.IGNORECASE)


def context_from(models: Any, props: Any, model: str) -> int | None:
    """The model's context window as its server tells it, when it does: vLLM's
    ``GET /v1/models`` (``max_model_len`` of the model's entry), llama.cpp's ``GET
    /props`` (``n_ctx``, also under ``default_generation_settings``); None otherwise."""
    entries = models.get("data") if isinstance(models, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            found = entry.get("max_model_len")
            if isinstance(found, int) and found > 0:
                return found
    if isinstance(props, dict):
        settings = props.get("default_generation_settings")
        for where in (props, settings if isinstance(settings, dict) else {}):
            found = where.get("n_ctx")
            if isinstance(found, int) and found > 0:
                return found
    return None


def cost(record: Mapping[str, Any], price_in: float, price_out: float) -> float | None:
    """A question's billed-equivalent cost in dollars at the prices per million tokens:
    the model's own usage when it reported one, else the forwarded tokens (no output)."""
    prompt = record.get("prompt_tokens")
    if prompt is None:
        prompt = record.get("forwarded_tokens")
    if prompt is None:
        return None
    output = record.get("completion_tokens") or 0
    return float(prompt * price_in + output * price_out) / 1e6


def summarize(
    records: Iterable[Mapping[str, Any]],
    rows: Sequence[str],
    price_in: float,
    price_out: float,
) -> list[dict[str, Any]]:
    """Per row and category (then all), over the graded questions: J (the share judged
    CORRECT), n, answers that failed, replies that named no label, mean forwarded tokens
    and mean cost per question; ``pending`` counts questions not graded yet."""
    chosen = [r for r in records if r["row"] in rows]
    out = []
    for row in rows:
        mine = [r for r in chosen if r["row"] == row]
        for category in [*CATEGORIES.values(), ALL]:
            these = [r for r in mine if category in (ALL, r["category"])]
            graded = [r for r in these if r.get("verdict") is not None]
            tokens = [r["forwarded_tokens"] for r in graded if r.get("forwarded_tokens")]
            costs = [c for r in graded if (c := cost(r, price_in, price_out)) is not None]
            out.append({
                "row": row,
                "category": category,
                "n": len(graded),
                "correct": sum(r["verdict"] == "CORRECT" for r in graded),
                "j": _mean([r["verdict"] == "CORRECT" for r in graded]),
                "no_answer": sum(r.get("answer") is None for r in graded),
                "unparsed": sum(bool(r.get("unparsed")) for r in graded),
                "pending": len(these) - len(graded),
                "mean_forwarded_tokens": _mean(tokens),
                "mean_cost": _mean(costs),
                "truncated": sum(bool(r.get("truncated")) for r in graded),
            })  # fmt: skip
    return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def format_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """The markdown table: a line per row and category."""
    header = ["row", "category", "J", "n", "no answer", "unparsed", "pending",
              "mean fwd tok", "cost/question"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summary:
        j = "-" if s["j"] is None else f"{100 * s['j']:.1f}%"
        row = s["row"]
        if row == FULL_HISTORY and s["truncated"]:  # said where the number is read
            row += f" (front-cut for {s['truncated']} of {s['n']})"
        tokens = s["mean_forwarded_tokens"]
        money = s["mean_cost"]
        cells = [
            row, s["category"], j, s["n"], s["no_answer"], s["unparsed"], s["pending"],
            "-" if tokens is None else f"{tokens:,.0f}",
            "-" if money is None else f"${money:.6f}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def truncation_note(summary: Sequence[Mapping[str, Any]], context_tokens: int | None) -> str:
    """The line under the table on the baseline's cuts (rows named FULL_HISTORY)."""
    overall = [s for s in summary if s["row"] == FULL_HISTORY and s["category"] == ALL]
    if not overall:
        return ""
    cut, n = overall[0]["truncated"], overall[0]["n"]
    window = f"{context_tokens:,}-token context" if context_tokens else "context"
    if not cut:
        return f"{FULL_HISTORY}: sent whole for every question (none cut to the model's {window})"
    return (
        f"{FULL_HISTORY}: the oldest messages dropped to fit the model's {window} for "
        f"{cut} of {n} questions (cut from the front; answer room and question kept)"
    )
