"""Structured logs on real gateways: one JSON access line per request, named by the
X-Gateway-Request-Id response header; message content only at DEBUG, keys never.

In-process gateways are read through a JSON handler of the gateway's own on the root
logger; ``serve`` is read from its process's whole output.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from devsupport.servers import RedisProcess, ServerThread
from gateway.auth.identity import tenant_id
from gateway.memory.model import Message
from gateway.observability.request_log import JsonFormatter, RequestIdFilter
from gateway.text.tokens import TokenCounter
from tests.support.clients import register_content, sdk
from tests.support.fixtures import GatewayFactory, find_secrets
from tests.support.processes import Served

SECRET = "log-test-tenant-secret"
REQUEST_ID_HEADER = "x-gateway-request-id"


class JsonLines(logging.Handler):
    """The gateway's handler as ``serve`` sets it up (its formatter and filter), kept."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.addFilter(RequestIdFilter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def parsed(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.lines)]

    def access(self, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """The one access line of a request (written when its response ended, which the
        client may see a moment before the server has finished)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [
                line
                for line in self.parsed()
                if line["logger"] == "gateway.access" and line.get("request_id") == request_id
            ]
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        time.sleep(0.05)  # a second line would come now
        found = [
            line
            for line in self.parsed()
            if line["logger"] == "gateway.access" and line.get("request_id") == request_id
        ]
        assert len(found) == 1, found
        return found[0]


@pytest.fixture
def logs() -> Iterator[JsonLines]:
    handler = JsonLines()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


def receipt_tiers(header: str) -> dict[str, int]:
    """The tiers of an X-Memory-Receipt header: its ``tier=tokens`` parts before ``idx``…"""
    tiers = {}
    for part in header.split(";"):
        name, _, value = part.partition("=")
        if name in ("idx", "sum", "pins", "recalled", "budget", "stable"):
            continue
        tiers[name] = int(value)
    return tiers


def check_chat_line(
    line: dict[str, Any], headers: httpx.Headers, *, api_key: str, session_id: str
) -> None:
    assert line["request_id"] == headers[REQUEST_ID_HEADER]
    assert line["method"] == "POST" and line["route"] == "/v1/chat/completions"
    assert line["status"] == 200 and line["level"] == "INFO"
    assert line["tenant"] == tenant_id(SECRET.encode(), api_key)
    assert line["session_id"] == session_id
    assert line["memory_status"] == headers["x-memory-status"] == "ok"
    assert line["memory_mode"] == "on" and line["model"] == "fake-model"
    assert line["tokens_context"] == int(headers["x-memory-context-tokens"])
    assert line["tiers"] == receipt_tiers(headers["x-memory-receipt"])
    stable = re.search(r";stable=(\d+)", headers["x-memory-receipt"])
    assert line.get("tokens_stable") == (int(stable.group(1)) if stable else None)
    assert sum(line["tiers"].values()) + 3 == line["tokens_context"]
    assert isinstance(line["recalled"], int)
    assert 0 <= line["added_ms"] <= line["duration_ms"]
    assert 0 < line["upstream_ms"] <= line["duration_ms"]


def test_a_chat_request_has_one_access_line_named_by_its_response_header(
    make_gateway: GatewayFactory, logs: JsonLines, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(server={"tenant_secret": SECRET})
    client = sdk(gateway, api_key, session_id, **{"X-User-Id": "user-7"})
    text = register_content("my favourite lighthouse is at Fanad Head")
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": text}]
    )
    answer = raw.parse()
    line = logs.access(raw.headers[REQUEST_ID_HEADER])
    check_chat_line(line, raw.headers, api_key=api_key, session_id=session_id)
    # A user id is logged as a short hash (server.log_user_ids), never as sent.
    assert line["stream"] is False and line["user_id"].startswith("u-")
    assert "user-7" not in json.dumps(line)
    # The new message is all the client sent: tokens_in is its prompt count.
    counted = TokenCounter().count_prompt([Message(role="user", content=text)], "fake-model")
    assert line["tokens_in"] == counted
    assert line["tokens_out"] == 5  # the upstream's usage.completion_tokens
    assert answer.choices[0].message.content == f"ack: {text}"
    assert "upstream_request_id" not in line  # the fake upstream sends none
    assert api_key not in json.dumps(line) and text not in json.dumps(line)


@pytest.mark.parametrize("usage", [False, True], ids=["counted", "reported"])
def test_a_streamed_answer_is_logged_after_its_last_byte_with_its_tokens(
    make_gateway: GatewayFactory, logs: JsonLines, api_key: str, session_id: str, usage: bool
) -> None:
    gateway = make_gateway(server={"tenant_secret": SECRET})
    client = sdk(gateway, api_key, session_id)
    first = register_content("remember that my boat is called Saoirse please")
    client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": first}]
    )
    text = register_content("and now stream me a short answer about the boat")
    with client.chat.completions.with_streaming_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": text}],
        stream=True,
        **({"stream_options": {"include_usage": True}} if usage else {}),  # type: ignore[arg-type]
    ) as raw:
        streamed = "".join(
            chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices
        )
        headers = raw.headers
    assert streamed == f"ack: {text}"
    line = logs.access(headers[REQUEST_ID_HEADER])
    check_chat_line(line, headers, api_key=api_key, session_id=session_id)
    assert line["stream"] is True and "user_id" not in line
    # The stored first turn is not resent: the context holds it, the client sent less.
    assert 0 < line["tokens_in"] < line["tokens_context"]
    assert line["tiers"]["window"] > 0
    expected = 5 if usage else TokenCounter().count_text(streamed, "fake-model")
    assert line["tokens_out"] == expected


def test_records_made_while_serving_carry_the_request_id(
    make_gateway: GatewayFactory, logs: JsonLines, api_key: str, session_id: str
) -> None:
    gateway = make_gateway()
    client = sdk(gateway, api_key, session_id)
    with client.chat.completions.with_streaming_response.create(
        model="sse-truncated",  # the gateway warns: the stream closed mid-answer
        messages=[{"role": "user", "content": register_content("a truncated answer, please")}],
        stream=True,
    ) as raw:
        for _ in raw.iter_bytes():
            pass
        request_id = raw.headers[REQUEST_ID_HEADER]
    logs.access(request_id)
    warnings = [line for line in logs.parsed() if line["logger"] == "gateway.routes.relay"]
    assert [(w["level"], w["request_id"]) for w in warnings] == [("WARNING", request_id)]
    assert "before the answer ended" in warnings[0]["message"]


def test_a_client_request_id_is_honoured_and_a_malformed_one_replaced(
    make_gateway: GatewayFactory, logs: JsonLines, api_key: str, session_id: str
) -> None:
    gateway = make_gateway()
    client = sdk(gateway, api_key, session_id)
    sent = "trace-01HZX8:span.7_a"
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": "hello with an id of my own"}],
        extra_headers={"X-Request-Id": sent},
    )
    assert raw.headers[REQUEST_ID_HEADER] == sent
    assert logs.access(sent)["status"] == 200
    for malformed in ("has spaces in it", "x" * 129, "semi;colon"):
        response = httpx.get(gateway.url + "/healthz", headers={"X-Request-Id": malformed})
        replaced = response.headers[REQUEST_ID_HEADER]
        assert replaced != malformed and replaced.startswith("req_") and len(replaced) == 28
        assert logs.access(replaced)["route"] == "/healthz"
    assert not [line for line in logs.parsed() if line.get("request_id") == "has spaces in it"]


def test_every_response_has_an_id_even_errors_and_passthrough(
    make_gateway: GatewayFactory, logs: JsonLines, api_key: str
) -> None:
    gateway = make_gateway()
    auth = {"Authorization": f"Bearer {api_key}"}
    answers = [
        httpx.get(gateway.url + "/v1/models", headers=auth),  # passed through
        httpx.get(gateway.url + "/no/such/path"),  # 404
        httpx.post(
            gateway.url + "/v1/chat/completions",
            headers={**auth, "X-Session-Id": "s"},
            content=b"{not json",
        ),  # 400
    ]
    assert [a.status_code for a in answers] == [200, 404, 400]
    routes = [logs.access(a.headers[REQUEST_ID_HEADER])["route"] for a in answers]
    assert routes == ["/v1/{path:path}", "unmatched", "/v1/chat/completions"]


def _upstream_with_its_own_id() -> Starlette:
    async def chat(request: Request) -> Response:
        completion = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "fine, thanks"},
                    "finish_reason": "stop",
                }
            ],
        }  # no usage: the gateway counts the answer
        return JSONResponse(completion, headers={"x-request-id": "req_upstream_42"})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def test_the_upstreams_request_id_reaches_the_sdk_unchanged_and_the_line(
    make_gateway: GatewayFactory, logs: JsonLines, api_key: str, session_id: str
) -> None:
    with ServerThread(_upstream_with_its_own_id()) as upstream:
        gateway = make_gateway(upstream={"base_url": upstream.url + "/v1"})
        raw = sdk(gateway, api_key, session_id).chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": "how are you today?"}]
        )
        answer = raw.parse()
    assert answer._request_id == "req_upstream_42"  # what the OpenAI SDK reports
    assert raw.headers["x-request-id"] == "req_upstream_42"
    line = logs.access(raw.headers[REQUEST_ID_HEADER])
    assert line["request_id"] != "req_upstream_42"
    assert line["upstream_request_id"] == "req_upstream_42"
    assert line["tokens_out"] == TokenCounter().count_text("fine, thanks", "fake-model")


def test_the_access_log_can_be_switched_off(make_gateway: GatewayFactory, logs: JsonLines) -> None:
    gateway = make_gateway(server={"access_log": False})
    response = httpx.get(gateway.url + "/healthz")
    assert response.headers[REQUEST_ID_HEADER].startswith("req_")
    time.sleep(0.1)
    assert not [line for line in logs.parsed() if line["logger"] == "gateway.access"]


# --- `memory-gateway serve`: its whole output ---


def _config(tmp_path: Path, upstream_url: str, redis_url: str, **server: str) -> Path:
    config = tmp_path / f"gateway-{len(list(tmp_path.glob('*.yaml')))}.yaml"
    lines = "".join(f"  {key}: {value}\n" for key, value in server.items())
    section = f"server:\n{lines}" if lines else ""  # an empty section is null: refused
    config.write_text(
        f"{section}upstream:\n  base_url: {upstream_url}\n"
        f"redis:\n  url: {redis_url}\n"
        "memory:\n  preset: hybrid\n"
        "summarizer:\n  model: fake-summarizer\n"
    )
    return config


def _chat(url: str, key: str, session: str, texts: list[str], stream: bool = False) -> None:
    import openai

    with openai.OpenAI(
        base_url=url + "/v1", api_key=key, default_headers={"X-Session-Id": session}, max_retries=0
    ) as client:
        for text in texts:
            if stream:
                chunks = client.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": text}], stream=True
                )
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                client.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": text}]
                )
        # The memory API too: an operator's calls carry the key as well.
        response = httpx.get(
            f"{url}/memory/sessions/{session}", headers={"Authorization": f"Bearer {key}"}
        )
        assert response.status_code == 200


def _output(
    tmp_path: Path, upstream_url: str, redis_url: str, key: str, texts: list[str], **server: str
) -> list[str]:
    served = Served(_config(tmp_path, upstream_url, redis_url, **server))
    try:
        _chat(served.url, key, "logged-session", texts[:1])
        _chat(served.url, key, "logged-session", texts[1:], stream=True)
    finally:
        assert served.stop() == 0
    return served.log.read_text().splitlines()


def test_serve_at_debug_logs_content_only_in_content_records_and_never_a_key(
    tmp_path: Path, upstream_url: str, redis_server: RedisProcess, api_key: str
) -> None:
    texts = ["my compass is north-west of Tory Island", "what is my compass?"]
    output = _output(tmp_path, upstream_url, redis_server.url, api_key, texts, log_level="debug")
    records = [json.loads(line) for line in output]  # every line is JSON
    assert not find_secrets(output, [api_key])
    content = [r for r in records if r["logger"] == "gateway.content"]
    assert [(r["level"], r["session_id"]) for r in content] == [("DEBUG", "logged-session")] * 2
    assert content[0]["messages"][-1] == {"role": "user", "content": texts[0]}
    assert content[0]["answer"]["content"] == f"ack: {texts[0]}"
    assert content[1]["answer"]["content"] == "Your compass is north-west."
    for record, text in zip(content, texts, strict=True):
        access = [r for r in records if r["logger"] == "gateway.access"
                  and r["request_id"] == record["request_id"]]  # fmt: skip
        assert len(access) == 1 and text not in json.dumps(access)
    for record in records:
        if record["logger"] != "gateway.content":
            for text in (*texts, "Tory Island", "compass is north-west"):
                assert text not in json.dumps(record), record


def test_serve_at_info_logs_json_lines_without_content(
    tmp_path: Path, upstream_url: str, redis_server: RedisProcess, api_key: str
) -> None:
    texts = ["my lantern is cobalt blue and old", "what is my lantern?"]
    output = _output(tmp_path, upstream_url, redis_server.url, api_key, texts)
    records = [json.loads(line) for line in output]  # every line parses: only JSON
    assert all(set(r) >= {"time", "level", "logger", "message"} for r in records)
    assert not find_secrets(output, [api_key])
    assert not [r for r in records if r["logger"] == "gateway.content" or r["level"] == "DEBUG"]
    for text in (*texts, "cobalt"):
        assert text not in "\n".join(output)
    loggers = {r["logger"] for r in records}
    assert {"uvicorn.error", "gateway.access"} <= loggers and "uvicorn.access" not in loggers
    chats = [r for r in records if r["logger"] == "gateway.access"
             and r["route"] == "/v1/chat/completions"]  # fmt: skip
    assert [(r["stream"], r["status"], r["memory_status"]) for r in chats] == [
        (False, 200, "ok"),
        (True, 200, "ok"),
    ]
    assert all(r["tokens_out"] > 0 and r["tokens_in"] > 0 for r in chats)


def test_serve_can_log_plain_text(
    tmp_path: Path, upstream_url: str, redis_server: RedisProcess, api_key: str
) -> None:
    texts = ["my kettle is the green one", "what is my kettle?"]
    output = _output(tmp_path, upstream_url, redis_server.url, api_key, texts, log_format="text")
    for line in output:
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)
    access = [line for line in output if " INFO gateway.access POST /v1/chat/completions " in line]
    assert len(access) == 2
    assert all("request_id=req_" in line and "session_id=logged-session" in line
               for line in access)  # fmt: skip
    assert any(" INFO uvicorn.error Application startup complete." in line for line in output)
    assert not find_secrets(output, [api_key])


def test_serve_workers_log_json_lines_too(
    tmp_path: Path, upstream_url: str, redis_server: RedisProcess
) -> None:
    """Each worker process applies the logging set-up (uvicorn's log_config)."""
    served = Served(_config(tmp_path, upstream_url, redis_server.url), None, "--workers", "2")
    try:
        ids = [httpx.get(served.url + "/healthz").headers[REQUEST_ID_HEADER] for _ in range(6)]
    finally:
        assert served.stop() == 0
    records = [json.loads(line) for line in served.log.read_text().splitlines()]
    assert sum(r["message"].startswith("Started server process") for r in records) == 2
    logged = [r["request_id"] for r in records if r["logger"] == "gateway.access"]
    assert all(logged.count(request_id) == 1 for request_id in ids)


def test_client_strings_are_cut_escaped_or_left_out_of_log_lines(
    make_gateway: GatewayFactory, logs: JsonLines, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(server={"log_user_ids": "plain"})
    model = "evil\x1b[2J\n{forged}" + "m" * 1000
    client = sdk(gateway, api_key, session_id, **{"X-User-Id": "user-7"})
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hello"}]
    )
    line = logs.access(raw.headers[REQUEST_ID_HEADER])
    # Not a model's name: not logged at all (a client may put anything there).
    assert line["model"] == "(not a model name)"
    assert line["user_id"] == "user-7"  # plain, as configured
    named = client.chat.completions.with_raw_response.create(
        model="meta-llama/Llama-3.1-8B-Instruct:q4@2024",
        messages=[{"role": "user", "content": "hi"}],
    )
    assert logs.access(named.headers[REQUEST_ID_HEADER])["model"] == (
        "meta-llama/Llama-3.1-8B-Instruct:q4@2024"
    )
    everything = "".join(json.dumps(record) for record in logs.parsed())
    assert "m" * 100 not in everything  # the long model name is nowhere, whole
