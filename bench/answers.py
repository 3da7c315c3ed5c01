"""Answer accuracy through the gateway: REALTALK's questions answered by a model, graded
by a judge model (LoCoMo's J), against the full history sent straight to the same model.

Each conversation (``bench/realtalk.py``) is imported into a real gateway (``memory-gateway
serve``, embedded Redis) through ``POST /memory/sessions/{sid}/messages`` with its
messages' times; every question is then asked through ``POST /v1/chat/completions``
with ``X-Session-Id`` (``X-Memory-Mode: read``: the questions are not recorded), once per
``--budget``. The baseline sends the dated history and the question straight to the
model, cut from the front when it does not fit the model's context. A judge grades each
answer against the gold answer, CORRECT or WRONG, with mem0's LoCoMo prompt
(``bench/answers_core.py``). Every answer and grade goes to ``--out`` (JSONL) as it is
made: a rerun does only what is missing.

    .venv/bin/python bench/answers.py --model-url http://127.0.0.1:8000/v1 --model qwen \\
        --conversations 1 --questions-per-conversation 10 --out answers.jsonl

Keys come from the environment (``--model-key-env``, ``--judge-key-env``), never from
the command line, and are written nowhere. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
# Benchmark the working tree, as the gateway subprocess does (it runs with cwd=ROOT).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import answers_core as core  # noqa: E402
from bench import realtalk  # noqa: E402
from bench._harness import DIE_WITH_PARENT, commit, free_port, stop, wait_healthy  # noqa: E402
from bench.recall import (  # noqa: E402
    CountingRelay,
    TimestampRefused,
    load_conversation,
    message_tokens,
    prompt_tokens,
)
from gateway.presets import PRESETS  # noqa: E402
from gateway.text.tokens import TokenCounter  # noqa: E402

NO_KEY = "sk-no-key"  # what a local server without keys is sent
SHRINK = 0.75  # the baseline's cut when the server says the prompt is still too long
ATTEMPTS = 4


def log(text: str) -> None:
    """Progress goes to stderr; stdout holds the table."""
    print(text, file=sys.stderr, flush=True)


def one_line(text: object) -> str:
    return " ".join(str(text).split())


# --- Talking to OpenAI-compatible servers ----------------------------------------------


class Endpoint:
    """One OpenAI-compatible base URL (``…/v1``) and the key it is sent."""

    def __init__(self, url: str, key: str, timeout_s: float, connections: int) -> None:
        self.url = url.rstrip("/")
        self.client = httpx.Client(
            base_url=self.url,
            headers={"authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(timeout_s, connect=10),
            limits=httpx.Limits(max_connections=connections + 2),
        )

    def complete(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> core.Reply:
        try:
            response = self.client.post("/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as error:
            return core.Reply(None, f"{type(error).__name__}: {one_line(error)}")
        kept = {k.lower(): v for k, v in response.headers.items() if k.lower().startswith("x-")}
        if response.status_code != 200:
            refusal = f"{response.status_code}: {one_line(response.text)[:300]}"
            return core.Reply(None, refusal, response.status_code, headers=kept)
        try:
            data = response.json()
            text = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return core.Reply(None, f"malformed answer: {one_line(response.text)[:300]}", 200)
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        if not isinstance(text, str):
            return core.Reply(None, "no text in the answer", 200, usage, kept)
        return core.Reply(text, None, 200, usage, kept)

    def close(self) -> None:
        self.client.close()


def check_server(what: str, url: str, key_env: str) -> tuple[str | None, Any]:
    """Whether the server answers ``GET /models`` with our key: (an error line, or None;
    the models list it gave). Any HTTP answer but 401/403 is a server that is there."""
    headers = {"authorization": f"Bearer {os.environ.get(key_env) or NO_KEY}"}
    try:
        response = httpx.get(url.rstrip("/") + "/models", headers=headers, timeout=10)
    except httpx.HTTPError as error:
        return f"{what} at {url} is unreachable ({type(error).__name__}: {one_line(error)})", None
    if response.status_code in (401, 403):
        return f"{what} at {url} refused the key from ${key_env} ({response.status_code})", None
    try:
        return None, response.json()
    except ValueError:
        return None, None


def discover_context(url: str, models: Any, model: str) -> int | None:
    """The answering model's context window, if its server says (vLLM, llama.cpp)."""
    props = None
    root = re.sub(r"/v1/?$", "", url.rstrip("/"))
    with contextlib.suppress(httpx.HTTPError, ValueError):
        response = httpx.get(root + "/props", timeout=5)
        if response.status_code == 200:
            props = response.json()
    return core.context_from(models, props, model)


# --- The gateway -----------------------------------------------------------------------


@contextlib.contextmanager
def gateway(args: argparse.Namespace, summarizer: str, budget: int, work: Path) -> Iterator[str]:
    """``memory-gateway serve`` on ``work`` (its Redis data stays there for the next
    budget's gateway), the model as its upstream; its base URL."""
    port = free_port()
    settings: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
        "upstream": {
            "base_url": args.model_url,
            "timeouts": {"first_byte_s": args.timeout, "idle_s": args.timeout},
        },
        "redis": {"url": "embedded", "data_dir": str(work / "redis")},
        "memory": {"preset": args.preset, "budget_tokens": budget},
        "summarizer": {
            "base_url": summarizer,
            "model": args.summarizer_model or args.model,
            "timeout_s": args.summarizer_timeout,
        },
        # Only the import's flushes run jobs, in order, as in bench/recall.py.
        "worker": {"in_process": False},
    }
    if args.context_tokens:  # the gateway fits its budget to the window, answer room kept
        settings["models"] = [
            {"match": args.model, "context_tokens": args.context_tokens,
             "output_reserve_tokens": args.max_tokens}
        ]  # fmt: skip
    config = work / f"gateway-{budget}.yaml"
    config.write_text(json.dumps(settings, indent=2))  # JSON is YAML
    logfile = work / f"gateway-{budget}.log"
    command = [sys.executable, "-c", DIE_WITH_PARENT, "-m", "gateway.cli", "serve"]
    with logfile.open("wb") as output:
        process = subprocess.Popen(
            [*command, "--config", str(config), "--port", str(port)],
            cwd=ROOT, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, process, logfile)
        yield base
    finally:
        stop(process)


def import_conversations(
    base: str,
    key: str,
    conversations: Sequence[realtalk.RealConversation],
    args: argparse.Namespace,
) -> None:
    """Every conversation into its session, with its times, summaries made per batch."""
    with httpx.Client(
        base_url=base,
        headers={"authorization": f"Bearer {key}"},
        timeout=httpx.Timeout(30, read=args.summarizer_timeout * 200),
    ) as client:
        for number, conversation in enumerate(conversations, 1):
            messages = [m.to_import() for m in conversation.messages]
            load_conversation(client, conversation.id, messages, args.batch)
            log(f"{conversation.id}: imported ({number}/{len(conversations)})")


# --- One question --------------------------------------------------------------------


Work = tuple[realtalk.RealConversation, realtalk.Question]


def answer_body(args: argparse.Namespace, messages: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "model": args.model,
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": False,
    }


def through_gateway(gateway_v1: Endpoint, args: argparse.Namespace, work: Work) -> dict[str, Any]:
    """Ask through the gateway's proxy: memory added, nothing recorded. Forwarded
    tokens: the receipt's (``X-Memory-Context-Tokens``)."""
    conversation, question = work
    headers = {"x-session-id": conversation.id, "x-memory-mode": "read"}
    reply = gateway_v1.complete(
        answer_body(args, core.ask_messages(conversation, question.question)), headers
    )
    tokens = reply.headers.get("x-memory-context-tokens")
    return {
        **core.answer_fields(reply),
        "forwarded_tokens": int(tokens) if tokens and tokens.isdigit() else None,
        "memory_status": reply.headers.get("x-memory-status"),
    }


class Baseline:
    """The full history straight to the model, cut from the front to its context."""

    def __init__(self, model: Endpoint, args: argparse.Namespace) -> None:
        self.model, self.args = model, args
        self.counter = TokenCounter()
        self.histories: dict[str, tuple[list[dict[str, str]], list[int]]] = {}
        self.lock = threading.Lock()

    def _history(self, conversation: realtalk.RealConversation) -> tuple[list[Any], list[int]]:
        with self.lock:
            if conversation.id not in self.histories:
                history = core.dated_history(conversation.messages)
                costs = [message_tokens(m, self.counter, self.args.model) for m in history]
                self.histories[conversation.id] = (history, costs)
            return self.histories[conversation.id]

    def __call__(self, work: Work) -> dict[str, Any]:
        conversation, question = work
        history, costs = self._history(conversation)
        system, asked = core.ask_messages(conversation, question.question)
        own = prompt_tokens([system, asked], self.counter, self.args.model)
        window = self.args.context_tokens
        limit = sum(costs) if window is None else window - self.args.max_tokens - own
        for _ in range(ATTEMPTS):
            start = core.keep_from(costs, max(limit, 0))
            reply = self.model.complete(answer_body(self.args, [system, *history[start:], asked]))
            # Our count is cl100k's; the model's tokenizer may count more: cut further.
            if not core.context_refused(reply.status, reply.error or ""):
                break
            limit = int(sum(costs[start:]) * SHRINK)
        return {
            **core.answer_fields(reply),
            "forwarded_tokens": own + sum(costs[start:]),
            "truncated": start,
        }


def grade(judge: Endpoint, args: argparse.Namespace, record: dict[str, Any]) -> dict[str, Any]:
    """The judge's verdict on a record's answer. An answer that failed for good is WRONG
    without asking: the user got nothing."""
    if record.get("answer") is None:
        return {"verdict": "WRONG", "judge_reply": None, "judge_error": None, "unparsed": False}
    body: dict[str, Any] = {
        "model": args.judge_model,
        "messages": core.judge_messages(record["question"], record["gold"], record["answer"]),
        "max_tokens": args.judge_max_tokens,
        "temperature": 0,
        "stream": False,
    }
    if args.judge_json:
        body["response_format"] = {"type": "json_object"}
    reply = judge.complete(body)
    if reply.text is None:
        return {"verdict": None, "judge_reply": None, "judge_error": reply.error}
    verdict = core.parse_verdict(reply.text)
    return {
        "verdict": verdict or "WRONG",
        "unparsed": verdict is None,
        "judge_reply": reply.text[:1000],
        "judge_error": None,
    }


class Out:
    """The --out file, appended to by every thread, a whole line at a time."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("a", encoding="utf-8")
        self.lock = threading.Lock()

    def write(self, item: dict[str, Any]) -> None:
        line = json.dumps(item, ensure_ascii=False) + "\n"
        with self.lock:
            self.file.write(line)
            self.file.flush()

    def close(self) -> None:
        self.file.close()


def run_row(
    row: str,
    works: Sequence[Work],
    ask: Callable[[Work], dict[str, Any]],
    judge: Endpoint,
    args: argparse.Namespace,
    records: dict[core.Key, dict[str, Any]],
    out: Out,
) -> None:
    """Answer and grade what the row still needs, ``--concurrency`` at a time."""
    done = [0]
    lock = threading.Lock()

    def one(work: Work) -> None:
        conversation, question = work
        key = (row, conversation.id, question.number)
        record = records.get(key) or {}
        if core.next_step(record) == "answer":  # (an empty record: never asked)
            record = {
                "row": row, "conversation": conversation.id, "number": question.number,
                "category": question.category, "question": question.question,
                "gold": question.answer, **ask(work),
            }  # fmt: skip
            out.write(record)
        if core.next_step(record) == "judge":
            record = {**record, **grade(judge, args, record)}
            out.write(record)
        records[key] = record
        with lock:
            done[0] += 1
            if done[0] % 10 == 0 or done[0] == len(works):
                log(f"{row}: {done[0]}/{len(works)} answered and graded")

    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(one, works))


# --- The run ----------------------------------------------------------------------------


def gateway_row(args: argparse.Namespace, budget: int) -> str:
    return f"gateway {args.preset} @ {budget}"


def pending(row: str, works: Sequence[Work], records: dict[core.Key, Any]) -> list[Work]:
    return [w for w in works if core.next_step(records.get((row, w[0].id, w[1].number)))]


def run(args: argparse.Namespace, works: Sequence[Work], records: dict[core.Key, Any]) -> None:
    """Every row's missing answers and grades, written to --out as they come."""
    key = os.environ.get(args.model_key_env) or NO_KEY
    judge_key = os.environ.get(args.judge_key_env) or NO_KEY
    connections = args.concurrency
    judge = Endpoint(args.judge_url, judge_key, args.timeout, connections)
    out = Out(args.out)
    try:
        todo = {b: pending(gateway_row(args, b), works, records) for b in args.budgets}
        conversations = list({w[0].id: w[0] for ws in todo.values() for w in ws}.values())
        if conversations:
            with (
                CountingRelay(args.summarizer_url, args.summarizer_timeout * 2) as relay,
                tempfile.TemporaryDirectory(prefix="answers-") as work,
            ):
                for budget in [b for b in args.budgets if todo[b]]:
                    with gateway(args, relay.url, budget, Path(work)) as base:
                        if conversations:
                            import_conversations(base, key, conversations, args)
                            conversations = []
                        proxy = Endpoint(base + "/v1", key, args.timeout, connections)
                        ask = functools.partial(through_gateway, proxy, args)
                        try:
                            run_row(gateway_row(args, budget), todo[budget], ask, judge,
                                    args, records, out)  # fmt: skip
                        finally:
                            proxy.close()
                calls, failed = relay.reset()
                log(f"summarizer calls: {sum(calls.values())} ({failed} without a model answer)")
        if not args.no_baseline and (left := pending(core.FULL_HISTORY, works, records)):
            model = Endpoint(args.model_url, key, args.timeout, connections)
            try:
                run_row(core.FULL_HISTORY, left, Baseline(model, args), judge, args, records, out)
            finally:
                model.close()
    finally:
        judge.close()
        out.close()


def describe(args: argparse.Namespace, works: Sequence[Work], revision: str) -> str:
    """The line above the table: what was measured, by what, on which commit."""
    conversations = len({w[0].id for w in works})
    summarizer = args.summarizer_url or "none (model-free fallback summaries)"
    window = args.context_tokens or "unknown (cut only when the server refuses)"
    return (
        f"answers (J, LoCoMo's judge prompt): REALTALK ({args.data}), {conversations} "
        f"conversation(s), {len(works)} questions; answers by {args.model} at "
        f"{args.model_url} (context {window}, max_tokens {args.max_tokens}), judge "
        f"{args.judge_model} at {args.judge_url}; gateway preset {args.preset}, summarizer "
        f"{summarizer}; cost at ${args.price_in}/${args.price_out} per M tokens in/out; "
        f"commit {revision}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    files = realtalk.dataset_files(args.data) if args.data.is_dir() else []
    if not files:
        log(f"answers: no REALTALK data (Chat_*.json) in {args.data}; pass --data PATH")
        return 2
    try:
        conversations = core.select(
            [realtalk.load_conversation(f) for f in files], args.conversations
        )
    except ValueError as error:
        log(f"answers: {error}")
        return 2
    works = [(c, q) for c in conversations for q in c.questions[: args.questions_per_conversation]]
    servers = [("the answering model's server", args.model_url, args.model_key_env)]
    if args.judge_url != args.model_url or args.judge_key_env != args.model_key_env:
        servers.append(("the judge's server", args.judge_url, args.judge_key_env))
    for what, url, env in servers:
        missing, models = check_server(what, url, env)
        if missing:
            log(f"answers: {missing}")
            return 2
        if url == args.model_url and args.context_tokens is None:
            args.context_tokens = discover_context(url, models, args.model)
    lines = args.out.read_text(encoding="utf-8").splitlines() if args.out.exists() else []
    runs, records = core.parse_out(lines)
    revision = commit()
    setup = {
        "model": args.model, "judge_model": args.judge_model, "preset": args.preset,
        "prompts": core.prompts_digest(),
    }  # fmt: skip
    if conflict := core.setup_conflict(runs, setup):
        log(f"answers: {args.out}: {conflict}")
        return 2
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    started = datetime.now(UTC).isoformat(timespec="seconds")
    with contextlib.closing(Out(args.out)) as out:
        out.write({"run": {**setup, "commit": revision, "started": started, "settings": settings}})
    rows = [gateway_row(args, b) for b in args.budgets]
    rows += [] if args.no_baseline else [core.FULL_HISTORY]
    wanted = [(row, c.id, q.number) for row in rows for c, q in works]
    done = sum(1 for k in wanted if not core.next_step(records.get(k)))
    log(describe(args, works, revision) + f"; {done} of {len(wanted)} answers already graded")
    began = time.monotonic()
    try:
        run(args, works, records)
    except TimestampRefused as error:
        log(f"answers: {error}")
        return 1
    chosen = [records[k] for k in wanted if k in records]
    summary = core.summarize(chosen, rows, args.price_in, args.price_out)
    print(describe(args, works, revision))
    print()
    print(core.format_table(summary))
    if note := core.truncation_note(summary, args.context_tokens):
        print()
        print(note)
    seconds = round(time.monotonic() - began, 1)
    with contextlib.closing(Out(args.out)) as out:
        out.write({"summary": {"commit": revision, "seconds": seconds, "rows": summary}})
    left = sum(s["pending"] for s in summary if s["category"] == core.ALL)
    if left:
        log(f"answers: {left} question(s) not answered or graded yet: run again to finish them")
    return 1 if left else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-url", required=True, help="OpenAI-compatible …/v1 that answers")
    parser.add_argument("--model", required=True, help="the answering model's name")
    parser.add_argument("--judge-url", help="OpenAI-compatible …/v1 of the judge (--model-url)")
    parser.add_argument("--judge-model", help="the judge model's name (default --model)")
    parser.add_argument(
        "--model-key-env",
        default="ANSWERS_MODEL_KEY",
        help="environment variable holding the model's key (unset: none)",
    )
    parser.add_argument(
        "--judge-key-env",
        default="ANSWERS_JUDGE_KEY",
        help="environment variable holding the judge's key (unset: none)",
    )
    parser.add_argument("--data", type=Path, default=realtalk.default_data_dir(ROOT))
    parser.add_argument(
        "--conversations",
        default="all",
        help="all, a count (the first N), or ids/parts of ids, comma-separated",
    )
    parser.add_argument(
        "--questions-per-conversation",
        type=int,
        default=None,
        help="ask only each conversation's first N questions",
    )
    parser.add_argument(
        "--budget",
        default="3000",
        help="gateway memory.budget_tokens, comma-separated for several rows",
    )
    parser.add_argument("--preset", default="hybrid-recall", choices=list(PRESETS))
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=None,
        help="the answering model's context window (default: asked of its "
        "server; unknown: the baseline is cut only when refused)",
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="answer length")
    parser.add_argument("--judge-max-tokens", type=int, default=128)
    parser.add_argument(
        "--judge-json",
        action="store_true",
        help="send the judge response_format json_object, as mem0 does",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="questions asked at once")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per model call")
    parser.add_argument("--price-in", type=float, default=0.15, help="$ per M input tokens")
    parser.add_argument("--price-out", type=float, default=0.60, help="$ per M output tokens")
    parser.add_argument(
        "--summarizer-url",
        help="OpenAI-compatible …/v1 for the gateway's "
        "summaries (default: none, model-free fallback summaries)",
    )
    parser.add_argument("--summarizer-model", help="(default --model)")
    parser.add_argument("--summarizer-timeout", type=float, default=120)
    parser.add_argument("--batch", type=int, default=500, help="messages imported per flush")
    parser.add_argument("--no-baseline", action="store_true", help="gateway rows only")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("answers.jsonl"),
        help="JSONL of every answer and grade; a rerun resumes it",
    )
    args = parser.parse_args(argv)
    args.judge_url = args.judge_url or args.model_url
    args.judge_model = args.judge_model or args.model
    try:
        args.budgets = [int(b) for b in args.budget.split(",")]
    except ValueError:
        parser.error("--budget: comma-separated numbers of tokens")
    if not args.budgets or min(args.budgets) <= 0:
        parser.error("--budget: positive numbers of tokens")
    if args.concurrency < 1:
        parser.error("--concurrency: at least 1")
    if args.questions_per_conversation is not None and args.questions_per_conversation < 1:
        parser.error("--questions-per-conversation: at least 1")
    if args.context_tokens is not None and args.context_tokens <= args.max_tokens:
        parser.error("--context-tokens: more than --max-tokens")
    if not 1 <= args.batch <= 500:
        parser.error("--batch: 1 to 500 messages")
    return args


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
