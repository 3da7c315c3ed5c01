"""Prompt caching: how much of what the gateway forwards can a provider reuse (issue 31)?

Replays REALTALK conversations (``bench/realtalk.py``; read from ``--data``, never copied
into the repository) as a chat app uses the gateway. Per conversation
(``--conversations``, default 1, 2 and 4):

1. its first 60 % of messages (``--share``; moved on to the next user message) are
   imported through ``POST /memory/sessions/{sid}/messages``, flushed as
   ``bench/recall.py`` does (``recall.load_conversation``);
2. the next ``--turns`` turns (40) are sent live, one by one: the client sends its system
   prompt and the new user message (consecutive messages of the user joined by a line
   break), and the upstream answers with the conversation's real next message (the
   other speaker's consecutive messages, joined the same way). After every 4th turn
   (``--every``) one of the conversation's own questions is asked as a user turn: the
   first in the file's order not asked yet whose evidence is all in messages already
   sent; the upstream answers with the dataset's answer. Every turn is recorded, the
   questions too, and the session's jobs are flushed after each turn (a worker that
   keeps up, and runs that repeat exactly).

The gateway runs in this process (``devsupport.gateways``) on a real redis-server, with
its summarizer the fake upstream's ``fake-summarizer`` (deterministic, valid summaries
and facts; ``--summarizer none``: a 503, and the gateway's model-free fallbacks), and
its clock moved to a minute after each conversation's last imported message, so that
the prompts (the memory block's dates) do not depend on the day of the run. The chat
upstream is the fake upstream with one model of its own that answers what the script
says and keeps what it was sent: what the gateway forwarded.

Two baselines replay the same turns in-process: **full history** (the client resends
every message, no gateway) and a **sliding window** (the newest messages that fit the
budget with the system prompt and the new message).

For each forwarded request the messages are rendered as one flat list of cl100k token
ids, in order: per message ``<|im_start|>``, its role's token, ``<|im_sep|>`` (3 tokens
of framing, as the chat-completions API bills each message), then its text's tokens
(``content_text``: the text parts of a list), and at the end the 3 tokens that prime the
reply. Its length is the prompt's billed size (each role is one cl100k token). Its
longest common prefix with the previous request of the same session gives the cacheable
tokens (``gateway.memory.prompt_cache``): ``openai`` for the table (from 1,024, in
128-token steps), ``prefix`` (a local server) in ``--json``. The first request of each
session has no previous one and is left out of the per-turn numbers (40 turns and 10
questions per conversation: 147 measured requests on the default three).

Columns: mean prompt tokens per turn; cacheable share (cached / prompt tokens, summed);
billed-equivalent per turn, uncached + cached x (1 - discount), at 50 % and 90 % off;
evidence forwarded at the questions (``recall.score_question``: the share of each
question's evidence messages in the forwarded text, verbatim, the question left out).

    .venv/bin/python bench/cache.py --dataset realtalk --quick        # ~1 min
    .venv/bin/python bench/cache.py --dataset realtalk                # 1,500 / 3,000 / 6,000
    .venv/bin/python bench/cache.py --dataset realtalk --budgets 3000 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import itertools
import json
import platform
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import realtalk, recall  # noqa: E402
from bench._harness import commit, table  # noqa: E402
from devsupport.fake_upstream import ChatCall, FakeUpstream  # noqa: E402
from devsupport.gateways import build_settings, start_gateway  # noqa: E402
from devsupport.servers import RedisProcess, ServerThread, redis_server_binary  # noqa: E402
from gateway.memory.counting import TOKENS_PER_MESSAGE, TOKENS_PER_REPLY  # noqa: E402
from gateway.memory.model import content_text  # noqa: E402
from gateway.memory.prompt_cache import (  # noqa: E402
    billed_equivalent,
    cacheable_tokens,
    common_prefix,
)
from gateway.presets import PRESETS  # noqa: E402
from gateway.text.tokens import encoding_for_model  # noqa: E402

CHAT_MODEL = "bench-chat"  # the fake upstream's scripted model (below)
ENCODING_MODEL = "gpt-4o-mini"  # counted with cl100k, the gateway's shipped encoding
API_KEY = "sk-bench-prompt-cache"
SYSTEM = recall.PROBE_SYSTEM  # the chat app's system prompt, sent with every turn
IM_START, IM_SEP = 100264, 100266  # cl100k's chat framing tokens (ids outside the text's)
DISCOUNTS = (0.5, 0.9)
GATEWAY, FULL_HISTORY, SLIDING_WINDOW = "gateway", "full history", "sliding window"
DEFAULT_CONVERSATIONS = "1,2,4"
IMPORT_BATCH = 500


# --- The replay (pure) -----------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One request of the chat app: its user message and the answer the upstream gives."""

    user: str
    answer: str
    question: realtalk.Question | None = None  # set on the question turns


@dataclass(frozen=True)
class Replay:
    """One conversation as replayed: the imported messages, then the live turns."""

    conversation: realtalk.RealConversation
    imported: tuple[realtalk.RealMessage, ...]
    turns: tuple[Turn, ...]


def live_turns(messages: Sequence[realtalk.RealMessage]) -> list[tuple[Turn, int]]:
    """The messages as turns (a user's run of messages, the other speaker's run after it),
    each with the number of messages it spans; a last user run without an answer is left."""
    runs = [(role, list(group)) for role, group in itertools.groupby(messages, lambda m: m.role)]
    turns = []
    for (role, asked), (_, answered) in itertools.pairwise(runs):
        if role == "user":
            text = "\n".join(m.text for m in asked)
            turns.append((Turn(text, "\n".join(m.text for m in answered)), len(asked + answered)))
    return turns


def build_replay(
    conversation: realtalk.RealConversation, share: float, max_turns: int, every: int
) -> Replay:
    """Import the first ``share`` of the messages (up to a user message), replay the next
    ``max_turns`` turns, and a question after every ``every``-th (see the module's text)."""
    messages = conversation.messages
    cut = round(share * len(messages))
    while cut < len(messages) and messages[cut].role != "user":
        cut += 1
    place = {m.dia_id: i for i, m in enumerate(messages)}
    asked: set[int] = set()
    sent = cut  # messages of the conversation sent so far
    turns: list[Turn] = []
    for n, (turn, size) in enumerate(live_turns(messages[cut:])[:max_turns], 1):
        turns.append(turn)
        sent += size
        if n % every:
            continue
        for question in conversation.scored:
            past = all(place[e] < sent for e in question.evidence)
            if question.number not in asked and past:
                asked.add(question.number)
                turns.append(Turn(question.question, question.answer, question))
                break
    return Replay(conversation, messages[:cut], tuple(turns))


def request(turn: Turn) -> list[dict[str, str]]:
    """What the chat app sends for a turn: its system prompt and the new message."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": turn.user}]


# --- Tokens and the cache model --------------------------------------------------------


class Renderer:
    """Forwarded messages as one flat list of cl100k token ids (see the module's text)."""

    def __init__(self) -> None:
        self.encoding = encoding_for_model(ENCODING_MODEL)
        self.texts: dict[str, list[int]] = {}

    def tokens(self, text: str) -> list[int]:
        found = self.texts.get(text)
        if found is None:
            found = self.texts[text] = self.encoding.encode(text, disallowed_special=())
        return found

    def render(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        flat: list[int] = []
        for message in messages:
            flat += [IM_START, *self.tokens(str(message["role"])), IM_SEP]
            flat += self.tokens(content_text(message.get("content")))
        return [*flat, IM_START, *self.tokens("assistant"), IM_SEP]


@dataclass
class Measured:
    """One forwarded request of a row."""

    conversation: str
    turn: int
    prompt_tokens: int
    common_prefix: int | None  # None: the session's first request
    cached_openai: int
    cached_prefix: int
    question: int | None = None  # the question's number in the file
    evidence: float | None = None  # its share of evidence forwarded


@dataclass
class Row:
    name: str
    budget: int | None
    requests: list[Measured] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        measured = [r for r in self.requests if r.common_prefix is not None]
        prompt = sum(r.prompt_tokens for r in measured)
        questions = [r.evidence for r in self.requests if r.evidence is not None]
        out: dict[str, Any] = {
            "name": self.name,
            "budget": self.budget,
            "turns": len(measured),
            "questions": len(questions),
            "prompt_tokens_per_turn": prompt / len(measured) if measured else 0.0,
            "cacheable_openai": sum(r.cached_openai for r in measured) / prompt if prompt else 0.0,
            "cacheable_prefix": sum(r.cached_prefix for r in measured) / prompt if prompt else 0.0,
            "mean_common_prefix": (
                sum(r.common_prefix or 0 for r in measured) / len(measured) if measured else 0.0
            ),
            "evidence": sum(questions) / len(questions) if questions else None,
            "seconds": round(self.seconds, 1),
        }
        for discount in DISCOUNTS:
            billed = [
                billed_equivalent(r.prompt_tokens, r.cached_openai, discount) for r in measured
            ]
            out[f"billed_{round(discount * 100)}"] = sum(billed) / len(billed) if billed else 0.0
        return out


class Meter:
    """Measures a row's forwarded requests, session by session."""

    def __init__(self, renderer: Renderer, row: Row) -> None:
        self.renderer, self.row = renderer, row
        self.previous: list[int] | None = None

    def new_session(self) -> None:
        self.previous = None

    def measure(
        self,
        replay: Replay,
        number: int,
        forwarded: Sequence[dict[str, Any]],
    ) -> None:
        turn = replay.turns[number]
        tokens = self.renderer.render(forwarded)
        common = None if self.previous is None else common_prefix(tokens, self.previous)
        self.previous = tokens
        measured = Measured(
            replay.conversation.id,
            number,
            len(tokens),
            common,
            cacheable_tokens("openai", common or 0),
            cacheable_tokens("prefix", common or 0),
        )
        if turn.question is not None:
            text = recall.forwarded_text(forwarded, request(turn))
            scored = recall.score_question(
                replay.conversation, turn.question, self.row.budget or 0, text, len(tokens)
            )
            measured.question, measured.evidence = turn.question.number, scored.share
        self.row.requests.append(measured)


# --- Baselines (in-process) ------------------------------------------------------------


def history_of(replay: Replay) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.text} for m in replay.imported]


def run_full_history(replays: Sequence[Replay], renderer: Renderer) -> Row:
    """The client resends everything, every turn."""
    started = time.monotonic()
    row = Row(FULL_HISTORY, None)
    meter = Meter(renderer, row)
    for replay in replays:
        meter.new_session()
        history = history_of(replay)
        for number, turn in enumerate(replay.turns):
            system, user = request(turn)
            meter.measure(replay, number, [system, *history, user])
            history += [user, {"role": "assistant", "content": turn.answer}]
    row.seconds = time.monotonic() - started
    return row


def run_sliding_window(replays: Sequence[Replay], renderer: Renderer, budget: int) -> Row:
    """The newest messages that fit the budget with the system prompt and the new one
    (counted as ``recall.prompt_tokens`` counts: 3 per message, 3 for the reply)."""
    started = time.monotonic()
    row = Row(SLIDING_WINDOW, budget)
    meter = Meter(renderer, row)
    for replay in replays:
        meter.new_session()
        history = history_of(replay)
        costs = [_message_tokens(m, renderer) for m in history]
        for number, turn in enumerate(replay.turns):
            ask = request(turn)
            total = TOKENS_PER_REPLY + sum(_message_tokens(m, renderer) for m in ask)
            start = len(history)
            while start > 0 and total + costs[start - 1] <= budget:
                start, total = start - 1, total + costs[start - 1]
            meter.measure(replay, number, [ask[0], *history[start:], ask[1]])
            answer = {"role": "assistant", "content": turn.answer}
            history += [ask[1], answer]
            costs += [_message_tokens(ask[1], renderer), _message_tokens(answer, renderer)]
    row.seconds = time.monotonic() - started
    return row


def _message_tokens(message: dict[str, str], renderer: Renderer) -> int:
    return TOKENS_PER_MESSAGE + len(renderer.tokens(message["content"]))


# --- The gateway -----------------------------------------------------------------------


@dataclass
class ScriptedUpstream(FakeUpstream):
    """The fake upstream, with a model that answers ``answer`` and keeps what it was sent;
    every other model (the summarizer's) answers as the fake does."""

    answer: str = ""
    forwarded: list[list[dict[str, Any]]] = field(default_factory=list)
    summarizer: bool = True  # False: 503 to the summarizer (model-free fallback summaries)

    async def _chat(self, request: Request, body: dict[str, Any], call: ChatCall) -> Response:
        if call.model != CHAT_MODEL and self.summarizer:
            return await super()._chat(request, body, call)
        if call.model != CHAT_MODEL:
            call.finished = True
            error = {"message": "no summarizer model in this benchmark run"}
            return JSONResponse({"error": error}, status_code=503)
        self.forwarded.append(list(body["messages"]))
        call.finished = True
        message = {"role": "assistant", "content": self.answer}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return JSONResponse(
            {"id": f"chatcmpl-{len(self.forwarded)}", "object": "chat.completion",
             "created": int(time.time()), "model": CHAT_MODEL, "choices": [choice]}
        )  # fmt: skip


class ShiftedClock:
    """The gateway's clock: the wall clock moved to a conversation's own time, so that the
    live turns follow its imported messages and the prompts (the memory block's dates)
    do not depend on the day the benchmark runs."""

    def __init__(self) -> None:
        self.offset = 0.0

    def start_at(self, when: float) -> None:
        self.offset = when - time.time()

    def __call__(self) -> float:
        return time.time() + self.offset


@contextlib.contextmanager
def gateway_stack(
    preset: str,
    budget: int,
    clock: ShiftedClock,
    summarizer: bool = True,
    stable: bool | dict[str, float] = False,
) -> Iterator[tuple[ScriptedUpstream, ServerThread]]:
    """A real redis-server, the scripted upstream and a gateway in front of them."""
    fake = ScriptedUpstream(summarizer=summarizer)
    redis_server = RedisProcess(appendonly=True).start()  # no warning about persistence
    try:
        with ServerThread(fake.app()) as upstream:
            settings = build_settings(
                upstream.url + "/v1",
                redis_server.url,
                memory={"preset": preset, "budget_tokens": budget, "stable_layout": stable},
                # Only the flushes run jobs, after each turn, in order: runs repeat exactly.
                worker={"in_process": False},
            )
            gateway = start_gateway(settings, clock)
            try:
                yield fake, gateway
            finally:
                gateway.stop()
    finally:
        redis_server.cleanup()


def run_gateway(
    replays: Sequence[Replay],
    renderer: Renderer,
    preset: str,
    budget: int,
    summarizer: str,
    layout: str = "rebuilt",
    shares: dict[str, float] | None = None,
) -> Row:
    """Import, then replay every conversation through a gateway with this budget, in this
    layout (``rebuilt``: one memory message after the prompt, made again every turn;
    ``stable``: ``memory.stable_layout``, with ``shares`` if given)."""
    started = time.monotonic()
    row = Row(f"{GATEWAY} ({preset}, {layout})", budget)
    meter = Meter(renderer, row)
    clock = ShiftedClock()
    stable: bool | dict[str, float] = layout == "stable"
    if stable and shares:
        stable = shares
    with gateway_stack(preset, budget, clock, summarizer == "fake", stable) as (fake, gateway):
        auth = {"authorization": f"Bearer {API_KEY}"}
        with httpx.Client(base_url=gateway.url, headers=auth, timeout=120) as client:
            for replay in replays:
                meter.new_session()
                session = replay.conversation.id
                clock.start_at(replay.imported[-1].timestamp + 60)  # the next turn, a minute on
                imported = [m.to_import() for m in replay.imported]
                recall.load_conversation(client, session, imported, IMPORT_BATCH)
                for number, turn in enumerate(replay.turns):
                    fake.answer = turn.answer
                    _send(client, session, turn)
                    meter.measure(replay, number, fake.forwarded[-1])
                    client.post(f"/memory/sessions/{session}/flush", json={}).raise_for_status()
                asked = sum(1 for t in replay.turns if t.question is not None)
                log(
                    f"{row.name} @ {budget}: {session} replayed "
                    f"({len(replay.turns) - asked} turns, {asked} questions)"
                )
    row.seconds = time.monotonic() - started
    return row


def _send(client: httpx.Client, session: str, turn: Turn) -> None:
    body = {"model": CHAT_MODEL, "messages": request(turn), "stream": False}
    response = client.post("/v1/chat/completions", json=body, headers={"x-session-id": session})
    if response.status_code != 200:
        raise RuntimeError(f"{session}: {response.status_code} {response.text[:300]}")
    if response.headers.get("x-memory-status", "ok") != "ok":
        raise RuntimeError(f"{session}: memory {response.headers['x-memory-status']}")


# --- Output ----------------------------------------------------------------------------


def format_table(summaries: Sequence[dict[str, Any]]) -> str:
    header = ["", "budget", "prompt tokens / turn", "cacheable (openai)",
              "billed-equivalent, 50 % off", "90 % off", "evidence at the questions"]  # fmt: skip
    rows = []
    for s in summaries:
        evidence = "-" if s["evidence"] is None else f"{100 * s['evidence']:.1f} %"
        rows.append([
            s["name"],
            "-" if s["budget"] is None else f"{s['budget']:,}",
            f"{s['prompt_tokens_per_turn']:,.0f}",
            f"{100 * s['cacheable_openai']:.1f} %",
            f"{s['billed_50']:,.0f}",
            f"{s['billed_90']:,.0f}",
            evidence,
        ])  # fmt: skip
    return table(header, rows)


def describe(args: argparse.Namespace, replays: Sequence[Replay]) -> str:
    turns = sum(len(r.turns) for r in replays)
    questions = sum(1 for r in replays for t in r.turns if t.question is not None)
    names = ", ".join(r.conversation.id for r in replays)
    return (
        f"prompt cache, REALTALK ({names}): {args.share:.0%} imported, then {turns} requests "
        f"({questions} of them questions; {turns - len(replays)} measured: each session's "
        f"first has no previous prompt), preset {args.preset}, summarizer {args.summarizer}, "
        f"budgets {'/'.join(f'{b:,}' for b in args.budgets)} tokens, cacheable as OpenAI "
        "bills it (>= 1,024 tokens, 128-token steps)"
    )


def versions() -> dict[str, str]:
    """The commit measured and the libraries that decide the numbers."""
    out = {"python": platform.python_version()}
    for name in ("tiktoken", "httpx", "starlette", "uvicorn", "redis"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out["redis-server"] = subprocess.run(
            [redis_server_binary(), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
    return out


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- Command line ----------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("realtalk",), default="realtalk")
    parser.add_argument(
        "--data",
        type=Path,
        default=realtalk.default_data_dir(ROOT),
        help="the directory of REALTALK's Chat_*.json (default: %(default)s)",
    )
    parser.add_argument(
        "--conversations",
        default=DEFAULT_CONVERSATIONS,
        help="comma-separated conversation numbers (Chat_<n>_*.json; default %(default)s)",
    )
    parser.add_argument("--preset", default="hybrid-recall", choices=sorted(PRESETS))
    parser.add_argument("--budgets", default="1500,3000,6000", help="memory.budget_tokens")
    parser.add_argument(
        "--summarizer",
        choices=("fake", "none"),
        default="fake",
        help="fake: the fake upstream's deterministic summaries and facts; none: 503 "
        "(the gateway's model-free fallback summaries, as bench/recall.py without a model)",
    )
    parser.add_argument(
        "--layouts",
        default="rebuilt,stable",
        help="comma-separated: rebuilt (memory rebuilt every turn), stable "
        "(memory.stable_layout: true); default %(default)s",
    )
    parser.add_argument(
        "--stable",
        default="",
        help="the stable layout's settings, e.g. recall_share=0.3,window_share=0.2 "
        "(memory.stable_layout as a mapping; default: its defaults)",
    )
    parser.add_argument("--share", type=float, default=0.6, help="imported before the replay")
    parser.add_argument("--turns", type=int, default=40, help="live turns per conversation")
    parser.add_argument("--every", type=int, default=4, help="a question after every N turns")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: the first conversation, 12 turns"
    )
    args = parser.parse_args(argv)
    try:
        args.conversations = [int(n) for n in args.conversations.split(",")]
        args.budgets = [int(b) for b in args.budgets.split(",")]
        args.layouts = args.layouts.split(",")
        pairs = [item.split("=", 1) for item in args.stable.split(",") if item]
        args.stable = {key: float(value) for key, value in pairs}
    except ValueError:
        parser.error(
            "--conversations and --budgets: comma-separated numbers; --stable: key=number,…"
        )
    if not set(args.layouts) <= {"rebuilt", "stable"}:
        parser.error("--layouts: rebuilt and/or stable")
    if not args.budgets or min(args.budgets) <= 0:
        parser.error("--budgets: positive numbers of tokens")
    if not 0 < args.share < 1 or args.turns < 1 or args.every < 1:
        parser.error("--share in (0, 1), --turns and --every at least 1")
    if args.quick:
        args.conversations, args.turns = args.conversations[:1], 12
    return args


def load_replays(args: argparse.Namespace) -> list[Replay]:
    files = {int(p.name.split("_")[1]): p for p in realtalk.dataset_files(args.data)}
    if missing := [n for n in args.conversations if n not in files]:
        raise FileNotFoundError(
            f"no REALTALK conversation(s) {missing} (Chat_<n>_*.json) in {args.data}; "
            "pass --data PATH to the directory that holds them"
        )
    return [
        build_replay(realtalk.load_conversation(files[n]), args.share, args.turns, args.every)
        for n in args.conversations
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        replays = load_replays(args)
    except FileNotFoundError as error:
        print(f"cache: {error}", file=sys.stderr)
        return 2
    log(describe(args, replays))
    renderer = Renderer()
    started = time.monotonic()
    gateways = [
        run_gateway(replays, renderer, args.preset, b, args.summarizer, layout, args.stable)
        for layout in args.layouts
        for b in args.budgets
    ]
    rows = [*gateways, run_full_history(replays, renderer)]
    rows += [run_sliding_window(replays, renderer, b) for b in args.budgets]
    summaries = [row.summary() for row in rows]
    seconds = time.monotonic() - started
    print(describe(args, replays))
    print()
    print(format_table(summaries))
    log(f"done in {seconds:.0f} s")
    if args.json:
        report = {
            "commit": commit(),
            "versions": versions(),
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "seconds": round(seconds, 1),
            "rows": [
                {**s, "requests": [asdict(r) for r in row.requests]}
                for s, row in zip(summaries, rows, strict=True)
            ],
        }
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
