"""Fuzzing the public HTTP surface of a real gateway (real Redis, real-socket fake upstream).

* the memory API: schemathesis, generating from the gateway's own ``/openapi.json``,
  valid and invalid requests;
* chat-completions: hypothesis, bodies and headers sent as raw bytes over a socket (wrong
  types, unknown roles, tool results answering no call, 10,000 nested arrays, bodies over
  the limit, invalid UTF-8, CR/LF, huge and non-ASCII session and user ids).

Every answer must be below 500, and every error the OpenAI envelope — except a 400 that
uvicorn's HTTP parser sends before the app runs, for header bytes it refuses (control
characters); that one is plain text and allowed only for such requests. Afterwards the
gateway's Redis (a fresh server per test) must hold nothing from a rejected request:
only sessions that got a 2xx, and only well-formed messages in them.

The default run is short and derandomized (CI, ~300 requests); ``MEMORY_GATEWAY_FUZZ_SCALE=20``
runs 20 times as many examples, randomized (a long run, a few minutes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from starlette.datastructures import Headers

from devsupport.gateways import build_settings, start_gateway
from devsupport.servers import RedisProcess, ServerThread
from gateway.auth.identity import bearer_key, tenant_id
from gateway.store.keys import SessionKeys
from tests.support.envelope import assert_envelope
from tests.support.fixtures import find_secrets, redis_dump

SCALE = int(os.environ.get("MEMORY_GATEWAY_FUZZ_SCALE", "1"))
SECRET = "fuzz-tenant-secret"
KEYS = ("sk-fuzz-" + "a" * 24, "sk-fuzz-" + "b" * 24)
SESSIONS = ("fz-1", "fz-2", "fz-café", "fz-会話")
USER = "user-1"
MAX_BODY = 64_000
# Header bytes uvicorn's parser refuses (a 400 before the app, without the envelope):
# control characters other than tab. CR and LF end the header line instead.
PARSER_REFUSES = frozenset(range(0x20)) - {0x09} | {0x7F}


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples * SCALE,
        derandomize=SCALE == 1,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


@dataclass
class Tally:
    """What a fuzz run sent and got back, and which sessions it may have stored."""

    statuses: Counter[int] = field(default_factory=Counter)
    accepted: set[tuple[str, str]] = field(default_factory=set)  # (tenant, session id)

    def report(self, name: str) -> str:
        by_class = Counter(f"{status // 100}xx" for status in self.statuses.elements())
        return f"{name}: {sum(self.statuses.values())} requests, {dict(sorted(by_class.items()))}"


@pytest.fixture
def fuzz_target(
    fake_upstream_server: tuple[Any, ServerThread],
) -> Iterator[tuple[ServerThread, RedisProcess]]:
    """A gateway on a Redis of its own, so that everything in it comes from this test."""
    redis = RedisProcess().start()
    upstream_url = fake_upstream_server[1].url + "/v1"
    overrides = {"server": {"max_body_bytes": MAX_BODY, "tenant_secret": SECRET}}
    gateway = start_gateway(build_settings(upstream_url, redis.url, **overrides))
    try:
        yield gateway, redis
    finally:
        gateway.stop()
        redis.cleanup()


def tenant(key: str) -> str:
    return tenant_id(SECRET.encode(), key)


# --- the memory API, by schemathesis ------------------------------------------------


def test_memory_api_under_schemathesis(fuzz_target: tuple[ServerThread, RedisProcess]) -> None:
    gateway, redis = fuzz_target
    key = KEYS[0]
    auth = {"Authorization": f"Bearer {key}"}
    tally = Tally()
    # A session and a user that exist, so that valid requests get past the 404.
    seeded = httpx.post(
        f"{gateway.url}/memory/sessions/{SESSIONS[0]}/messages",
        json={"messages": [{"role": "user", "content": "hi"}]},
        headers={**auth, "X-User-Id": USER},
    )
    assert seeded.status_code == 200, seeded.text
    tally.accepted.add((tenant(key), SESSIONS[0]))
    schema = schemathesis.openapi.from_url(gateway.url + "/openapi.json")
    operations = [
        result.ok() for result in schema.include(path_regex="^/memory/").get_all_operations()
    ]

    def strategies(operation: Any) -> Iterator[st.SearchStrategy[schemathesis.Case]]:
        yield operation.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE)
        yield operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE)
        known = {"sid": SESSIONS[0], "uid": USER}
        names = set(re.findall(r"{(\w+)}", operation.path))
        yield operation.as_strategy(path_parameters={n: known[n] for n in names if n in known})

    for operation in operations:
        for strategy in strategies(operation):

            @fuzz_settings(examples=4)
            @given(case=strategy)
            def one(case: schemathesis.Case) -> None:
                response = case.call(base_url=gateway.url, headers=auth, timeout=30)
                tally.statuses[response.status_code] += 1
                sid = (case.path_parameters or {}).get("sid")
                if response.status_code < 300 and isinstance(sid, str):
                    # Negative cases may send another Authorization (another tenant). The
                    # sid is sent percent-encoded (an escape already in it kept as one),
                    # so the gateway sees it unquoted.
                    sent = Headers(raw=[(b"authorization", _auth_sent(response))])
                    tally.accepted.add((tenant(bearer_key(sent)), unquote(sid)))
                if response.status_code < 300 and case.path.endswith("/imports"):
                    # An export's import makes the sessions its answer names.
                    by = Headers(raw=[(b"authorization", _auth_sent(response))])
                    for session in response.json()["sessions"]:
                        tally.accepted.add((tenant(bearer_key(by)), session["session_id"]))
                case.validate_response(response, checks=[not_a_server_error])
                if response.status_code >= 400:
                    assert_envelope(json.loads(response.content))

            one()

    print(tally.report("schemathesis, memory API"), file=sys.stderr)
    assert len(operations) == 21
    assert max(tally.statuses) < 500
    assert any(s < 300 for s in tally.statuses) and any(400 <= s < 500 for s in tally.statuses)
    assert_no_garbage(redis, tally.accepted)


def _auth_sent(response: schemathesis.Response) -> bytes:
    value = response.request.headers.get("Authorization", "")
    return value if isinstance(value, bytes) else value.encode("latin-1")


# --- chat-completions, by hypothesis over a raw socket ------------------------------

_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
)
junk = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
call_ids = st.sampled_from(["c1", "c2"])
tool_call = st.fixed_dictionaries(
    {
        "id": call_ids,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": st.just("f"), "arguments": st.just("{}")}),
    }
)
part = (
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=30)})
    | st.fixed_dictionaries(
        {"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": st.text()})}
    )
    | st.dictionaries(st.sampled_from(["type", "text", "image_url", "refusal"]), junk)
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "tool", "system", "developer"])
        | st.sampled_from(["function", "wizard", "User", ""])
        | junk
    },
    optional={
        "content": st.text(max_size=80) | st.none() | st.lists(part, max_size=3) | junk,
        "tool_calls": st.lists(tool_call, max_size=2) | st.lists(junk, max_size=2) | junk,
        "tool_call_id": call_ids | junk,
        "name": st.text(max_size=10) | junk,
    },
)
chat_body = st.fixed_dictionaries(
    {
        # Not the fake upstream's special models (error-500 is an upstream 5xx by design).
        "model": st.just("fake-model") | st.text(max_size=20).map(lambda t: "m-" + t) | junk,
        "messages": st.lists(message, max_size=5) | junk,
    },
    optional={"stream": st.booleans() | junk, "temperature": junk, "user": junk},
)

texts = st.text(min_size=1, max_size=40)


@st.composite
def good_body(draw: st.DrawFn) -> dict[str, Any]:
    """What a real client sends: a whole history, one new message, or tool results."""
    turns = draw(st.lists(st.tuples(texts, texts), max_size=3))
    history: list[dict[str, Any]] = []
    for question, answer in turns:
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    ending = draw(st.sampled_from(["question", "tool results", "tool results alone"]))
    if ending == "question":
        new = [{"role": "user", "content": draw(texts | st.lists(part, min_size=1, max_size=2))}]
    else:
        ids = draw(st.lists(call_ids, min_size=1, max_size=2, unique=True))
        calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                 for i in ids]  # fmt: skip
        asked = [{"role": "user", "content": "weather?"},
                 {"role": "assistant", "content": None, "tool_calls": calls}]  # fmt: skip
        results = [{"role": "tool", "tool_call_id": i, "content": "sunny"} for i in ids]
        new = results if ending == "tool results alone" else asked + results
    system = [{"role": "system", "content": "be brief"}] if draw(st.booleans()) else []
    return {
        "model": "fake-model",
        "messages": system + history + new,
        "stream": draw(st.booleans()),
    }


@st.composite
def raw_body(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A JSON body, sometimes broken on the way; and whether to send it chunked."""
    data = json.dumps(draw(good_body() | chat_body), ensure_ascii=draw(st.booleans())).encode()
    how = draw(st.sampled_from(["as is"] * 6 + ["truncate", "bad utf-8", "deep", "big"]))
    if how == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif how == "bad utf-8":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80"])) + data[at:]
    elif how == "deep":
        depth = draw(st.sampled_from([150, 250, 10_000]))
        data = data[:-1] + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
    elif how == "big":
        data = data[:-1] + b', "pad": "' + b"x" * draw(st.integers(MAX_BODY, 2 * MAX_BODY)) + b'"}'
    return data, draw(st.booleans())


def _id_values(pool: tuple[str, ...]) -> st.SearchStrategy[bytes | None]:
    return (
        st.sampled_from([s.encode() for s in pool])
        | st.none()
        | st.text(max_size=40).map(str.encode)  # any Unicode, sent as UTF-8
        | st.binary(max_size=40)  # latin-1, invalid UTF-8, control bytes, CR/LF
        | st.integers(129, 100_000).map(lambda n: b"s" * n)
        | st.sampled_from([b"", b"  ", b"a\rb", b"a\nb", b"a\x00b", b"\xc3\xa9" * 65])
    )


good_headers = st.fixed_dictionaries(
    {
        "Authorization": st.sampled_from([f"Bearer {k}".encode() for k in KEYS]),
        "X-Session-Id": st.sampled_from([s.encode() for s in SESSIONS]),
        "X-User-Id": st.sampled_from([None, USER.encode()]),
        "X-Memory-Mode": st.sampled_from([None, b"on", b"read"]),
    }
)
any_headers = st.fixed_dictionaries(
    {
        "Authorization": st.sampled_from([f"Bearer {k}".encode() for k in KEYS]),
        # Always present: without it the gateway passes the body through unread, and
        # the fake upstream's answer to garbage is not the gateway's to judge.
        "X-Session-Id": _id_values(SESSIONS).filter(lambda v: v is not None),
        "X-User-Id": _id_values((USER, "user-2")),
        "X-Memory-Mode": st.none() | st.sampled_from([b"on", b"read", b"off", b"ON", b"maybe"]),
    }
)


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes


def send(port: int, path: str, head: dict[str, bytes | None], body: bytes, chunked: bool) -> Reply:
    lines = [f"POST {path} HTTP/1.1".encode(), b"Host: gateway", b"Connection: close"]
    lines += [b"Content-Type: application/json"]
    lines += [name.encode() + b": " + value for name, value in head.items() if value is not None]
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
        payload = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
    else:
        lines.append(b"Content-Length: %d" % len(body))
        payload = body
    raw = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        # It may answer (413, 400) and close before the whole body is sent.
        with contextlib.suppress(OSError):
            sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + payload)
        try:
            while chunk := sock.recv(65536):
                raw += chunk
        except ConnectionResetError:
            pass
    head_bytes, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head_bytes.split(b"\r\n")
    fields = {}
    for line in header_lines:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip()
    if fields.get(b"transfer-encoding") == b"chunked":
        rest = _dechunk(rest)
    return Reply(int(status_line.split()[1]), fields.get(b"content-type", b"").decode(), rest)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


def session_of(head: dict[str, bytes | None]) -> str | None:
    """The session id the gateway reads from these headers (the parser strips blanks)."""
    try:
        return (head["X-Session-Id"] or b"").strip(b" \t").decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_chat_completions_under_hypothesis(fuzz_target: tuple[ServerThread, RedisProcess]) -> None:
    gateway, redis = fuzz_target
    tally = Tally()
    parser_refusals = 0

    @fuzz_settings(examples=150)
    @given(body=raw_body(), head=good_headers | any_headers)
    def one(body: tuple[bytes, bool], head: dict[str, bytes | None]) -> None:
        nonlocal parser_refusals
        reply = send(gateway.port, "/v1/chat/completions", head, *body)
        tally.statuses[reply.status] += 1
        assert reply.status < 500, reply
        if reply.status >= 400:
            # Every refusal is the envelope, the HTTP parser's too (bytes it refuses in a
            # header), which are counted apart.
            assert reply.content_type.startswith("application/json"), reply
            error = json.loads(reply.body)
            assert_envelope(error)
            if error["error"]["code"] == "invalid_request" and reply.status == 400:
                sent = b"".join(v for v in head.values() if v is not None)
                parser_refusals += bool(PARSER_REFUSES & set(sent))
        session = session_of(head)
        if reply.status == 200 and session is not None:
            key = (head["Authorization"] or b"").decode().removeprefix("Bearer ")
            tally.accepted.add((tenant(key), session))

    one()
    print(tally.report("hypothesis, chat-completions"), file=sys.stderr)
    print(f"  of which {parser_refusals} 400s from the HTTP parser", file=sys.stderr)
    assert max(tally.statuses) < 500
    assert tally.statuses[200] and sum(n for s, n in tally.statuses.items() if s >= 400)
    assert tally.accepted  # some turns were stored, so the check below has data to judge
    assert_no_garbage(redis, tally.accepted)


# --- no stored garbage --------------------------------------------------------------

_KEY = re.compile(rb"^mg:\{([0-9a-f]+)\.([ui]?)([0-9a-f]+)\}:([a-z]+)$")
_TENANTS = re.compile(rb"^mg:tenants:\{t[0-9]+\}$")
_USAGE = re.compile(rb"^mg:\{([0-9a-f]+)\}:usage$")  # a tenant's stored bytes


def assert_no_garbage(redis: RedisProcess, accepted: set[tuple[str, str]]) -> None:
    """Only sessions that got a 2xx are stored, and every stored message is well-formed."""
    tags = {SessionKeys(t, sid).tag.encode(): sid for t, sid in accepted}
    tenants = {t for t, _ in accepted}
    with redis.client() as client:
        assert not find_secrets(redis_dump(client), list(KEYS)), "bearer key stored"
        for key in client.scan_iter(count=1000):
            if key.startswith(b"mg:jobs:"):
                for _, notice in client.xrange(key):
                    assert (notice[b"tenant"].decode(), notice[b"sid"].decode()) in accepted
                continue
            if _TENANTS.match(key):  # the catalog's index of tenants
                assert {m.decode() for m in client.zrange(key, 0, -1)} <= tenants, key
                continue
            usage = _USAGE.match(key)
            if usage is not None:
                assert usage.group(1).decode() in tenants, key
                assert int(client.get(key)) > 0, key
                continue
            match = _KEY.match(key)
            assert match, f"a key outside the schema: {key!r}"
            tenant_hex, kind_of_tag, _, kind = match.groups()
            tag = b"{" + key.split(b"{", 1)[1].split(b"}", 1)[0] + b"}"
            if kind_of_tag == b"i":  # the catalog's index of a tenant's sessions
                members = {(tenant_hex.decode(), m.decode()) for m in client.zrange(key, 0, -1)}
                assert members <= accepted, key
                continue
            if kind_of_tag == b"u":
                members = client.smembers(key) if kind == b"sessions" else set()
                assert {(tenant_hex.decode(), m.decode()) for m in members} <= accepted, key
                continue
            assert tag in tags, f"a session no accepted request named: {key!r}"
            if kind == b"meta":
                assert client.hget(key, "sid").decode() == tags[tag]
            if kind == b"log":
                assert_well_formed([json.loads(m) for m in client.lrange(key, 0, -1)], key)


def assert_well_formed(log: list[dict[str, Any]], key: bytes) -> None:
    """Each message the chat API would take back, and tool results that answer a call."""
    open_calls: set[str] = set()
    for i, message in enumerate(log):
        where = f"{key!r} message {i + 1}: {message}"
        assert message["role"] in ("user", "assistant", "tool", "function"), where
        assert message["role"] != "function" or isinstance(message.get("name"), str), where
        assert isinstance(message.get("tokens"), int) and isinstance(message.get("ts"), float)
        content = message.get("content")
        assert content is None or isinstance(content, (str, list)), where
        for content_part in content if isinstance(content, list) else ():
            assert isinstance(content_part, dict), where
            for name, kind in (("type", str), ("text", str), ("refusal", str), ("image_url", dict)):
                assert name not in content_part or isinstance(content_part[name], kind), where
        assert isinstance(message.get("name", ""), str), where
        if message["role"] == "assistant":
            calls = message.get("tool_calls", [])
            assert all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in calls), where
            open_calls = {c["id"] for c in calls}
        elif message["role"] == "tool":
            assert message.get("tool_call_id") in open_calls, where
        else:
            open_calls = set()
