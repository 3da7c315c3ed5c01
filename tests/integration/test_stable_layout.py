"""The cache-stable layout (``memory.stable_layout``, issue 31) through the real gateway,
as a hostile or merely unusual client would use it: tool loops across the window's anchor
moves, edits and missed turns, the Responses API, the memory role, images, sizes at
either end of the budget, and a corrupt fingerprint of the last forwarded context.

Every forwarded chat request is checked against OpenAI's rules for tool messages (the
fake upstream refuses calls without their results; ``valid_tools`` also refuses results
without their call).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
from typing import Any

import httpx
import pytest
from PIL import Image

from devsupport.fake_upstream import SMALL_CONTEXT_TOKENS, FakeUpstream, prompt_tokens
from devsupport.servers import RedisProcess, ServerThread
from gateway.auth.identity import tenant_id
from gateway.memory.block import MEMORY_HEADER, RECALLED_HEADER
from gateway.service.planning import EDIT_AFTER_S
from gateway.store.keys import TENANT_SECRET_KEY, SessionKeys
from tests.support.clients import Memory, register_content
from tests.support.clock import SteppedClock
from tests.support.fixtures import GatewayFactory
from tests.support.images import PNG_1PX

STABLE = {"preset": "hybrid-recall", "stable_layout": True}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
# Messages of ~40 tokens: the window holds a step of them.
MEDIUM = "note {i} on topic {t}: " + "we talked about the river and the lazy dog again " * 3
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]


def _post(
    gateway: ServerThread, key: str, session: str, body: dict[str, Any], **headers: str
) -> httpx.Response:
    return httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "fake-model", **body},
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session, **headers},
        timeout=30,
    )


def _ok(response: httpx.Response) -> httpx.Response:
    assert response.status_code == 200, response.text
    assert response.headers["x-memory-status"] == "ok", response.headers
    return response


def valid_tools(messages: list[dict[str, Any]]) -> None:
    """OpenAI's rules: an assistant's tool calls are answered by the tool messages right
    after it, and a tool message answers a call of the assistant message before its run."""
    calls: set[str] = set()
    for n, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            assert message.get("tool_call_id") in calls, f"result without its call at {n}"
            calls.discard(message["tool_call_id"])
            continue
        assert not calls, f"calls {calls} not answered before message {n} ({role})"
        if role == "assistant" and message.get("tool_calls"):
            calls = {c["id"] for c in message["tool_calls"]}
    assert not calls, f"calls {calls} never answered"


def _chat_requests(fake: FakeUpstream) -> list[list[dict[str, Any]]]:
    return [
        r.json()["messages"]
        for r in fake.proxied_requests()
        if r.path.endswith("/chat/completions")
    ]


def _injected(messages: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    """Where memory's two messages are: (position, role, which)."""
    found = []
    for n, message in enumerate(messages):
        text = message.get("content")
        if isinstance(text, str) and text.startswith(MEMORY_HEADER):
            found.append((n, message["role"], "memory"))
        if isinstance(text, str) and text.startswith(RECALLED_HEADER):
            found.append((n, message["role"], "late"))
    return found


def _tiers(response: httpx.Response) -> dict[str, int]:
    parts = (part.partition("=") for part in response.headers["x-memory-receipt"].split(";"))
    return {name: int(value) for name, _, value in parts if value.isdigit()}


def _stable(response: httpx.Response) -> int | None:
    found = re.search(r";stable=(\d+);", response.headers["x-memory-receipt"])
    return int(found.group(1)) if found else None


# --- 1. Tool calls ---------------------------------------------------------------------


def test_tool_loops_across_anchor_moves_keep_calls_and_results_together(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    """A single-message client in a tool loop: it sends a question (the model calls a
    tool), then only the tool's result. 122 messages first, so that loops start at an
    index ≡ 3 (mod 4): anchors (1 mod 16, and half steps) fall on a call's result."""
    gateway = make_gateway(memory=STABLE)
    Memory(gateway, api_key, session_id).add(122, MEDIUM)
    seen = len(_chat_requests(fake_upstream))
    anchors = set()
    for n in range(12):
        question = register_content(f"weather in Paris, take {n}?")
        asked = _ok(_post(gateway, api_key, session_id, {
            "model": "tool-caller", "tools": TOOLS,
            "messages": [SYSTEM, {"role": "user", "content": question}],
        }))  # fmt: skip
        call = asked.json()["choices"][0]["message"]["tool_calls"][0]
        result = {"role": "tool", "tool_call_id": call["id"], "content": f"sunny, {n}C"}
        # (The fake's tool-caller answers a tool message only when it is the last one.)
        answered = _ok(_post(gateway, api_key, session_id, {"messages": [SYSTEM, result]}))
        anchors.add(_window_start(answered))
    requests = _chat_requests(fake_upstream)[seen:]
    assert len(requests) == 24 and len(anchors) >= 2  # the anchor moved (once onto a result)
    for messages in requests:
        valid_tools(messages)
    for messages in requests[1::2]:  # the turns of a tool result
        assert messages[-2:][0]["role"] == "tool"  # the result right after its call…
        assert _injected(messages)[-1] == (len(messages) - 1, "system", "late")  # …then


def _window_start(response: httpx.Response) -> int:
    """The first message index of the window, from the receipt."""
    found = re.search(r";idx=(\d+)-", response.headers["x-memory-receipt"])
    assert found, response.headers["x-memory-receipt"]
    return int(found.group(1))


# --- 2. Edits, regenerate, missed turns ------------------------------------------------


def _history(n: int, start: int = 1) -> list[dict[str, str]]:
    return [
        {
            "role": "user" if i % 2 else "assistant",
            "content": register_content(MEDIUM.format(i=i, t=i % 5)),
        }
        for i in range(start, start + n)
    ]


def _import(gateway: ServerThread, key: str, session: str, messages: list[dict[str, str]]) -> None:
    """Import ``messages`` and run the jobs they make due (landing later, they would change
    the memory between two turns)."""
    memory = Memory(gateway, key, session)
    response = memory.http.post(memory.base + "/messages", json={"messages": messages})
    assert response.status_code == 200, response.text
    memory.flush()


def test_a_turn_the_store_missed_is_forwarded_in_the_window(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    """A full-history client resends a turn the store never recorded (Redis was away):
    it is imported, and forwarded as the window's newest messages."""
    gateway = make_gateway(memory=STABLE)
    history = _history(42)
    _import(gateway, api_key, session_id, history[:40])
    question = register_content("and what did we say last?")
    messages = [SYSTEM, *history, {"role": "user", "content": question}]
    _ok(_post(gateway, api_key, session_id, {"messages": messages}))
    forwarded = _chat_requests(fake_upstream)[-1]
    assert forwarded[-5:-2] == history[-3:]  # the stored window, then the missed turn
    assert _injected(forwarded)[-1] == (len(forwarded) - 2, "system", "late")


def test_edits_and_regenerates_start_the_cached_prefix_again_from_the_edit(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    clock = SteppedClock()
    gateway = make_gateway(memory=STABLE, clock=clock)
    history = _history(60)
    _import(gateway, api_key, session_id, history)
    conversation = [SYSTEM, *history]

    def turn(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], httpx.Response]:
        clock.advance(EDIT_AFTER_S + 0.1)  # a person reads the answer before editing
        response = _ok(_post(gateway, api_key, session_id, {"messages": messages}))
        answer = response.json()["choices"][0]["message"]["content"]
        return [*messages, {"role": "assistant", "content": answer}], response

    for n in range(3):
        conversation, _ = turn([*conversation, {"role": "user", "content": f"go on, {n}"}])
    before = _chat_requests(fake_upstream)[-1]
    # The user edits their last message but one, and the app resends up to it.
    at = conversation.index({"role": "user", "content": "go on, 1"})
    conversation, edit = turn([*conversation[:at], {"role": "user", "content": "go on, edited"}])
    forwarded = _chat_requests(fake_upstream)[-1]
    contents = [m["content"] for m in forwarded]
    assert contents[-1] == "go on, edited"
    assert "go on, 0" in contents and not {"go on, 1", "go on, 2"} & set(contents)
    changed = next(i for i, (a, b) in enumerate(zip(before, forwarded, strict=False)) if a != b)
    assert changed <= contents.index("go on, 0") + 2  # nothing after the edit point is reused
    stable = _stable(edit)
    assert stable is not None and stable < int(edit.headers["x-memory-context-tokens"])

    # A regenerate of the edited turn: the same context; its answer replaced.
    regenerated = _ok(_post(gateway, api_key, session_id, {"messages": conversation[:-1]}))
    assert _chat_requests(fake_upstream)[-1] == forwarded
    stable = _stable(regenerated)
    assert stable is not None and stable >= 1024

    # A client that went on after an edit: the edited message inside its history (its
    # branch is not stored yet when the window is chosen), and a new question.
    at = conversation.index({"role": "user", "content": "go on, edited"})
    went_on = [
        *conversation[:at],
        {"role": "user", "content": "go on, edited twice"},
        {"role": "assistant", "content": "ack: go on, edited twice"},
        {"role": "user", "content": "and then?"},
    ]
    turn(went_on)
    contents = [m["content"] for m in _chat_requests(fake_upstream)[-1]]
    assert contents[-4:-2] == ["go on, edited twice", "ack: go on, edited twice"]
    assert contents[-1] == "and then?" and "go on, edited" not in contents


# --- 3. The Responses API --------------------------------------------------------------


def _responses(
    gateway: ServerThread, key: str, session: str, body: dict[str, Any]
) -> httpx.Response:
    response = httpx.post(
        gateway.url + "/v1/responses",
        json={"model": "fake-model", **body},
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session},
        timeout=30,
    )
    return _ok(response)


def _late_items(items: list[dict[str, Any]]) -> list[int]:
    return [
        n
        for n, item in enumerate(items)
        if item.get("type") == "message"
        and item["content"][0].get("text", "").startswith(RECALLED_HEADER)
    ]


def test_the_responses_api_gets_the_same_order_as_input_items(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(memory=STABLE, upstream={"prompt_cache": {"policy": "prefix"}})
    _import(gateway, api_key, session_id, _history(60))
    seen = len(fake_upstream.responses_requests())
    first = _responses(gateway, api_key, session_id, {
        "input": "what did we say about the river?", "instructions": "Answer briefly.",
        "previous_response_id": "resp_123", "store": False,
    })  # fmt: skip
    body = fake_upstream.responses_requests()[-1].json()
    assert "previous_response_id" not in body and body["instructions"] == "Answer briefly."
    items = body["input"]
    assert items[0]["role"] == "system" and items[0]["content"][0]["text"].startswith(MEMORY_HEADER)
    assert _late_items(items) == [len(items) - 2] and items[-2]["role"] == "system"
    assert items[-1] == {**items[-1], "role": "user"}
    assert _stable(first) is None

    # A streamed tool loop: the call, then only its output, as a stateless agent sends it.
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    asked = httpx.post(
        gateway.url + "/v1/responses",
        json={"model": "tool-caller", "input": "weather in Paris?", "tools": tools, "stream": True},
        headers={"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id},
        timeout=30,
    )
    assert asked.status_code == 200 and "response.completed" in asked.text, asked.text
    output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    answered = httpx.post(
        gateway.url + "/v1/responses",
        json={"model": "fake-model", "input": [output], "tools": tools, "stream": True,
              "previous_response_id": "resp_456"},
        headers={"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id},
        timeout=30,
    )  # fmt: skip
    assert answered.status_code == 200 and "response.completed" in answered.text, answered.text
    body = fake_upstream.responses_requests()[-1].json()
    assert "previous_response_id" not in body
    items = body["input"]
    kinds = [item.get("type", "message") for item in items]
    at = kinds.index("function_call_output")
    assert kinds[at - 1] == "function_call" and items[at - 1]["call_id"] == "call_1"
    assert _late_items(items) == [at + 1] == [len(items) - 1]  # after the output
    stable = _stable(answered)
    assert stable is not None and stable > 1000  # the memory and the window, reused

    # The preview answers the same input items, says what would be reused, records nothing.
    count = Memory(gateway, api_key, session_id).state()["message_count"]
    preview = httpx.post(
        f"{gateway.url}/memory/sessions/{session_id}/context",
        json={"model": "fake-model", "input": "and tomorrow?"},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    assert preview.status_code == 200, preview.text
    shown = preview.json()
    assert _late_items(shown["input"]) == [len(shown["input"]) - 2]
    assert shown["receipt"]["stable_tokens"] > 1000
    assert Memory(gateway, api_key, session_id).state()["message_count"] == count
    assert len(fake_upstream.responses_requests()) - seen == 3


# --- 4. The memory role ----------------------------------------------------------------


@pytest.mark.parametrize("role", ["user", "developer"])
def test_both_injected_messages_take_the_memory_role(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    api_key: str,
    session_id: str,
    role: str,
) -> None:
    """With ``memory_role: user`` the late message and the new one are two user messages
    in a row (as the memory message and a window that opens on a user message are, in
    either layout): OpenAI's and most servers' chat templates take it; a template that
    insists on strict alternation refuses it in both layouts."""
    gateway = make_gateway(memory={**STABLE, "memory_role": role})
    _import(gateway, api_key, session_id, _history(81))  # the window opens on a user message
    question = register_content("what was note 3 about?")
    messages = [SYSTEM, {"role": "user", "content": question}]
    _ok(_post(gateway, api_key, session_id, {"messages": messages}))
    forwarded = _chat_requests(fake_upstream)[-1]
    where = _injected(forwarded)
    assert where == [(1, role, "memory"), (len(forwarded) - 2, role, "late")]
    roles = [m["role"] for m in forwarded]
    assert roles[-3:] == ["user", role, "user"]  # (the import ended on a user message)
    assert roles[2] == "user"  # the window opens on one: after the memory's, for "user"


# --- 5. Images -------------------------------------------------------------------------


def test_an_image_in_the_window_is_sent_while_there_and_its_prefix_reused(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(memory=STABLE, upstream={"prompt_cache": {"policy": "prefix"}})
    _import(gateway, api_key, session_id, _history(60))
    url = f"data:image/png;base64,{PNG_1PX}"
    look = {"role": "user", "content": [
        {"type": "text", "text": register_content("look at this")},
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
    ]}  # fmt: skip
    responses = [_ok(_post(gateway, api_key, session_id, {"messages": [SYSTEM, look]}))]
    for n in range(5):
        question = {"role": "user", "content": register_content(f"and then {n}?")}
        responses.append(_ok(_post(gateway, api_key, session_id, {"messages": [SYSTEM, question]})))
    requests = _chat_requests(fake_upstream)[-6:]
    for n, (response, messages) in enumerate(zip(responses, requests, strict=True)):
        images = [m for m in messages if isinstance(m["content"], list)]
        assert len(images) == 1 and images[0]["content"][1]["image_url"]["url"] == url
        if n and _window_start(response) == _window_start(responses[n - 1]):
            before = _tiers(responses[n - 1])
            stable = _stable(response)
            assert stable is not None
            assert stable >= before["prompt"] + before["memory"] + before["window"]


def test_an_image_in_new_tool_results_is_the_turns_own(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    """A function's output with an image, the late message after it: the image is still
    this turn's own (a 413 when it alone is over the limit, never a placeholder given way
    for it as for the window's), and the receipt counts it there."""
    gateway = make_gateway(memory=STABLE, upstream={"max_request_bytes": MIB})
    _import(gateway, api_key, session_id, _history(40))
    headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}
    for side, status in ((8, 200), (600, 413)):  # ~1.4 MB of base64: over the limit alone
        asked = httpx.post(
            gateway.url + "/v1/responses",
            json={"model": "tool-caller", "input": register_content(f"a picture, {side}?")},
            headers=headers,
            timeout=30,
        )
        call_id = next(i for i in asked.json()["output"] if i["type"] == "function_call")
        picture = {"type": "input_image", "image_url": _png_url(side), "detail": "low"}
        output = {
            "type": "function_call_output",
            "call_id": call_id["call_id"],
            "output": [picture],
        }
        answered = httpx.post(
            gateway.url + "/v1/responses",
            json={"model": "fake-model", "input": [output]},
            headers=headers,
            timeout=30,
        )
        assert answered.status_code == status, answered.text
        if status == 200:
            tiers = _tiers(answered)
            assert min(tiers.values()) >= 0 and tiers["new"] > 85  # the image: 85 at "low"


MIB = 1024 * 1024


def _png_url(side: int) -> str:
    """A PNG of random pixels (it does not compress) as a data URL."""
    pixels = hashlib.shake_256(f"pixels {side} {os.getpid()}".encode()).digest(side * side * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), pixels).save(out, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


# --- 6. Sizes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "text"),
    [(3000, "ok {i}"), (100_000, MEDIUM)],
    ids=["short messages", "a huge budget"],
)
def test_a_window_its_count_bounds_is_appended_to_and_moves_by_steps(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    api_key: str,
    session_id: str,
    budget: int,
    text: str,
) -> None:
    """Where the layout's 48 messages, not its share of the budget, bound the window, it
    still starts at a step's start (16 messages) and is appended to between moves."""
    gateway = make_gateway(
        memory={**STABLE, "budget_tokens": budget},
        upstream={"prompt_cache": {"policy": "prefix"}},
    )
    memory = Memory(gateway, api_key, session_id)
    memory.add(121, text)
    memory.flush()  # the jobs the import made: landing later, they would change the memory
    starts, appended_to = [], 0
    kept = 0  # the tokens of the last context's prompt, memory and window
    for n in range(8):
        response = _ok(_post(gateway, api_key, session_id, {
            "messages": [SYSTEM, {"role": "user", "content": register_content(f"more, {n}")}],
        }))  # fmt: skip
        starts.append(_window_start(response))
        tiers = _tiers(response)
        if n and starts[-1] == starts[-2]:
            stable = _stable(response)
            assert stable is not None and stable >= kept  # all of it, and the last turn
            appended_to += 1
        kept = tiers["prompt"] + tiers["memory"] + tiers["window"]
    assert all((start - 1) % 16 == 0 for start in starts), starts
    assert len(set(starts)) <= 2, starts  # 16 messages are 8 turns: one move at most
    assert appended_to >= 6


@pytest.mark.parametrize(
    ("memory", "stored", "text"),
    [
        ({"budget_tokens": 200}, 60, MEDIUM),  # a tiny budget
        ({"budget_tokens": 3000}, 3, MEDIUM),  # fewer messages than a step
        ({"budget_tokens": 3000}, 64, "ok {i}"),  # a window of 64 tiny messages
        ({"budget_tokens": 3000}, 6, MEDIUM * 40),  # stored messages past the budget
        ({"budget_tokens": 1_000_000}, 130, MEDIUM),  # a huge budget
    ],
    ids=["tiny budget", "under a step", "64 tiny", "huge messages", "huge budget"],
)
def test_any_size_is_answered_within_the_budget_where_it_can_be(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    api_key: str,
    session_id: str,
    memory: dict[str, int],
    stored: int,
    text: str,
) -> None:
    gateway = make_gateway(memory={**STABLE, **memory})
    Memory(gateway, api_key, session_id).add(stored, text)
    budget = memory["budget_tokens"]
    for question in ("short question?", "a question longer than any budget " * 600):
        response = _ok(_post(gateway, api_key, session_id, {
            "messages": [SYSTEM, {"role": "user", "content": register_content(question)}],
        }))  # fmt: skip
        forwarded = _chat_requests(fake_upstream)[-1]
        assert forwarded[0] == SYSTEM and forwarded[-1]["content"] == question
        valid_tools(forwarded)
        tiers = _tiers(response)
        always = tiers["prompt"] + tiers["new"] + 3  # sent whatever the budget
        if always < budget:  # the window's last messages are always sent too
            assert tiers.get("memory", 0) + tiers.get("recall", 0) <= budget - always
        else:
            assert "memory" not in tiers and "recall" not in tiers
            assert [m["content"] for m in forwarded].count(question) == 1


def test_a_smaller_models_budget_and_the_retry_keep_the_layout(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    """A ``models:`` entry's budget, and the retry within a smaller one when the model
    refuses the context as too long: the same order, within the smaller budget; the
    next turn's receipt compares with what was forwarded (the retry's context)."""
    entry = {"match": "fake-*", "context_tokens": 2048, "output_reserve_tokens": 512}
    gateway = make_gateway(
        memory=STABLE, models=[entry], upstream={"prompt_cache": {"policy": "prefix"}}
    )
    _import(gateway, api_key, session_id, _history(120))
    for model, budget in (("fake-model", 1536), ("small-llamacpp", None)):
        responses = []
        for n in range(3):
            question = register_content(f"{model}, question {n}")
            responses.append(_ok(_post(gateway, api_key, session_id, {
                "model": model,
                "messages": [SYSTEM, {"role": "user", "content": question}],
            })))  # fmt: skip
            sent = [m for m in _chat_requests(fake_upstream) if m[-1]["content"] == question]
            assert len(sent) == (2 if model.startswith("small") and n == 0 else 1)
            assert prompt_tokens(sent[-1]) <= SMALL_CONTEXT_TOKENS or budget
            where = _injected(sent[-1])
            assert [which for _, _, which in where] == ["memory", "late"]
            assert where[0][0] == 1 and where[1][0] == len(sent[-1]) - 2
        for response in responses:
            receipt = response.headers["x-memory-receipt"]
            assert budget is None or receipt.endswith(f";budget={budget}")
            assert int(response.headers["x-memory-context-tokens"]) <= _tiers(response)["budget"]
        # Each turn after the first reuses the memory and the last window.
        assert all((_stable(r) or 0) > _tiers(r)["memory"] for r in responses[1:])


# --- 7. The fingerprint of the last forwarded context ----------------------------------


def _meta_keys(redis: Any, key: str, session: str) -> SessionKeys:
    secret = redis.get(TENANT_SECRET_KEY)
    assert secret is not None
    return SessionKeys(tenant_id(secret, key), session)


@pytest.mark.parametrize(
    "garbage",
    [
        b"not a fingerprint at all",
        b"\xff\xfe\x00:12 ::: :-1 abc:99999999999999999999999999 " * 3,
        b"0123456789ab:1 " * 600_000,  # 9 MB of well-formed entries
        b"9" * 5_000_000,
    ],
    ids=["words", "bytes", "enormous", "digits"],
)
def test_a_corrupt_fingerprint_is_only_a_context_that_shares_nothing(
    make_gateway: GatewayFactory,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    garbage: bytes,
) -> None:
    # Redis's default 100 ms deadline is for turns, not for moving 9 MB on a loaded
    # machine (a turn there was served degraded): what is tested is what the gateway
    # makes of the bytes.
    gateway = make_gateway(
        memory=STABLE,
        upstream={"prompt_cache": {"policy": "prefix"}},
        redis={"timeout_ms": 5000},
    )
    _import(gateway, api_key, session_id, _history(40))
    redis = redis_server.client()
    try:
        meta = _meta_keys(redis, api_key, session_id).meta
        redis.hset(meta, "forwarded", garbage)
        answered = _ok(_post(gateway, api_key, session_id, {"messages": [
            SYSTEM, {"role": "user", "content": register_content("after the garbage")},
        ]}))  # fmt: skip
        assert _stable(answered) == 0
        written = redis.hget(meta, "forwarded")
        assert written != garbage and len(written) < 4096  # the turn's own, in its place
        again = _ok(_post(gateway, api_key, session_id, {"messages": [
            SYSTEM, {"role": "user", "content": register_content("and again")},
        ]}))  # fmt: skip
        assert (_stable(again) or 0) > 1000
    finally:
        redis.close()


@pytest.mark.parametrize("mode", ["read", "off"])
def test_read_and_off_modes_and_the_preview_write_no_fingerprint(
    make_gateway: GatewayFactory,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    mode: str,
) -> None:
    gateway = make_gateway(memory=STABLE, upstream={"prompt_cache": {"policy": "prefix"}})
    _import(gateway, api_key, session_id, _history(40))
    first = _ok(_post(gateway, api_key, session_id, {"messages": [
        SYSTEM, {"role": "user", "content": register_content("a turn of mode on")},
    ]}))  # fmt: skip
    assert _stable(first) is None
    redis = redis_server.client()
    try:
        keys = _meta_keys(redis, api_key, session_id)
        meta = keys.meta
        written = redis.hget(meta, "forwarded")
        assert written
        count = redis.llen(keys.log)
        other = _post(gateway, api_key, session_id, {"messages": [
            SYSTEM, {"role": "user", "content": register_content(f"a turn of mode {mode}")},
        ]}, **{"X-Memory-Mode": mode})  # fmt: skip
        assert other.status_code == 200, other.text
        if mode == "read":
            assert other.headers["x-memory-status"] == "ok"
            assert (_stable(other) or 0) > 1000  # against the last turn's context
        else:
            assert other.headers["x-memory-status"] == "off"
            assert "x-memory-receipt" not in other.headers
        preview = httpx.post(
            f"{gateway.url}/memory/sessions/{session_id}/context",
            json={"model": "fake-model", "messages": [SYSTEM, {"role": "user", "content": "?"}]},
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=30,
        )
        assert preview.status_code == 200, preview.text
        assert preview.json()["receipt"]["stable_tokens"] > 1000
        assert redis.hget(meta, "forwarded") == written  # neither wrote its own
        assert redis.llen(keys.log) == count
    finally:
        redis.close()
