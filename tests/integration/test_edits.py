"""Edit and resubmit: real OpenAI SDK → gateway → real fake upstream, real Redis.

A ChatGPT-style client lets its user edit an earlier message and resends the history up
to the edited message: the conversation goes on from the edit, and what it replaced is
kept aside, marked, never sent again.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread
from gateway.auth.identity import tenant_id
from gateway.service.planning import EDIT_AFTER_S
from gateway.store.keys import TENANT_SECRET_KEY, SessionKeys
from tests.support.clients import Memory, sdk
from tests.support.clock import SteppedClock
from tests.support.fixtures import GatewayFactory, on_one_redis_and_a_cluster

redis_server = on_one_redis_and_a_cluster()

# "my": the fake summarizer reads a durable fact from such a sentence.
BUSINESS = "Book me a flight to Lisbon in business class for my trip."
ECONOMY = "Book me a flight to Lisbon in economy class for my trip."


def session_keys(client: Any, key: str, session: str) -> SessionKeys:
    secret = client.get(TENANT_SECRET_KEY)
    assert secret is not None
    return SessionKeys(tenant_id(secret, key), session)


def chat(client: openai.OpenAI, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One turn of a client that sends its whole conversation; the conversation after."""
    answer = client.chat.completions.create(model="fake-model", messages=messages)
    content = answer.choices[0].message.content
    return [*messages, {"role": "assistant", "content": content}]


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def gateway(make_gateway: GatewayFactory, clock: SteppedClock) -> ServerThread:
    return make_gateway(clock=clock)


def as_a_person_would(clock: SteppedClock) -> None:
    """A person reads the answer before editing what led to it (requests sent together are
    never edits of each other: ``EDIT_AFTER_S``)."""
    clock.advance(EDIT_AFTER_S + 0.1)


def upstream_text(fake_upstream: FakeUpstream) -> str:
    """Everything the last chat turn forwarded (messages and injected memory)."""
    return json.dumps(fake_upstream.last_messages())


def run_edit_scenario(
    gateway: ServerThread, clock: SteppedClock, api_key: str, session_id: str
) -> openai.OpenAI:
    client = sdk(gateway, api_key, session_id)
    conversation = chat(client, [{"role": "user", "content": "Hello, I am planning a trip."}])
    before_edit = list(conversation)
    conversation = chat(client, [*conversation, {"role": "user", "content": BUSINESS}])
    chat(client, [*conversation, {"role": "user", "content": "Also a hotel near the river."}])
    # The user edits their second message: the app resends the history up to it.
    as_a_person_would(clock)
    edited = chat(client, [*before_edit, {"role": "user", "content": ECONOMY}])
    chat(client, [*edited, {"role": "user", "content": "And a window seat, thanks."}])
    return client


def test_an_edited_message_starts_a_new_branch(
    gateway: ServerThread,
    clock: SteppedClock,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(gateway, api_key, session_id)
    conversation = chat(client, [{"role": "user", "content": "Hello, I am planning a trip."}])
    before_edit = list(conversation)
    conversation = chat(client, [*conversation, {"role": "user", "content": BUSINESS}])
    chat(client, [*conversation, {"role": "user", "content": "Also a hotel near the river."}])
    assert "business class" in upstream_text(fake_upstream)

    as_a_person_would(clock)
    edited = chat(client, [*before_edit, {"role": "user", "content": ECONOMY}])
    forwarded = upstream_text(fake_upstream)
    assert "economy class" in forwarded
    assert "business class" not in forwarded and "hotel" not in forwarded
    assert edited[-1]["content"] == f"ack: {ECONOMY}"

    chat(client, [*edited, {"role": "user", "content": "And a window seat, thanks."}])
    forwarded = upstream_text(fake_upstream)
    assert "economy class" in forwarded and "window seat" in forwarded
    assert "business class" not in forwarded and "hotel" not in forwarded

    redis = redis_server.client()
    try:
        keys = session_keys(redis, api_key, session_id)
        log = [json.loads(raw)["content"] for raw in redis.lrange(keys.log, 0, -1)]
        branches = [json.loads(raw) for raw in redis.lrange(keys.branches, 0, -1)]
        turns = int(redis.hget(keys.meta, "turns"))
    finally:
        redis.close()
    assert log == [
        "Hello, I am planning a trip.",
        "ack: Hello, I am planning a trip.",
        ECONOMY,
        f"ack: {ECONOMY}",
        "And a window seat, thanks.",
        "ack: And a window seat, thanks.",
    ]
    assert turns == 3  # the abandoned user messages are no longer turns
    (branch,) = branches
    assert branch["from"] == 2 and branch["kind"] == "edit" and branch["at"] > 0
    assert [m["content"] for m in branch["messages"]] == [
        BUSINESS,
        f"ack: {BUSINESS}",
        "Also a hotel near the river.",
        "ack: Also a hotel near the river.",
    ]


def test_export_shows_abandoned_branches_and_erasure_removes_them(
    gateway: ServerThread,
    clock: SteppedClock,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    run_edit_scenario(gateway, clock, api_key, session_id)
    http = httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {api_key}"})
    base = f"/memory/sessions/{session_id}"
    exported = http.get(base + "/export", params={"format": "json"}).json()
    assert [m["index"] for m in exported["messages"]] == [1, 2, 3, 4, 5, 6]
    assert "business class" not in json.dumps(exported["messages"])
    (branch,) = exported["abandoned_branches"]
    assert branch["abandoned"] is True and branch["kind"] == "edit"
    assert branch["branched_after"] == 2
    assert [(m["index"], m["content"]) for m in branch["messages"]][:2] == [
        (3, BUSINESS),
        (4, f"ack: {BUSINESS}"),
    ]
    markdown = http.get(base + "/export", params={"format": "markdown"}).text
    transcript, _, abandoned = markdown.partition("## Abandoned Branches")
    assert "business class" not in transcript and "**Message 3 (User):** " + ECONOMY in transcript
    assert "### Abandoned after message 2 (edited, " in abandoned
    assert "**Message 3 (User):** " + BUSINESS in abandoned

    redis = redis_server.client()
    try:
        keys = session_keys(redis, api_key, session_id)
        assert redis.exists(keys.branches) == 1
        assert redis.ttl(keys.branches) > 0  # expires with the session's other keys
        assert http.delete(base).status_code == 204
        assert redis.exists(keys.branches) == 0
    finally:
        redis.close()
        http.close()


def test_facts_read_from_abandoned_messages_go_with_them(
    make_gateway: GatewayFactory,
    clock: SteppedClock,
    fake_upstream: FakeUpstream,
    api_key: str,
    session_id: str,
) -> None:
    # The default preset reads durable facts every 6 messages: by the time the user edits
    # message 3, a fact was read from it.
    gateway = make_gateway(memory={"preset": "hybrid-recall"}, clock=clock)
    memory = Memory(gateway, api_key, session_id)
    client = sdk(gateway, api_key, session_id)
    conversation = chat(client, [{"role": "user", "content": "Hello, I am planning a trip."}])
    before_edit = list(conversation)
    conversation = chat(client, [*conversation, {"role": "user", "content": BUSINESS}])
    chat(client, [*conversation, {"role": "user", "content": "Also a hotel near the river."}])
    state = memory.flush()
    assert state["facts"] and "business class" in json.dumps(state["facts"])

    as_a_person_would(clock)
    edited = chat(client, [*before_edit, {"role": "user", "content": ECONOMY}])
    forwarded = upstream_text(fake_upstream)
    assert "economy class" in forwarded and "business class" not in forwarded
    state = memory.flush()  # the facts of the new branch are read
    facts = json.dumps(state["facts"])
    assert "economy class" in facts and "business class" not in facts
    assert state["message_count"] == 4

    chat(client, [*edited, {"role": "user", "content": "And a window seat, thanks."}])
    forwarded = upstream_text(fake_upstream)
    assert "economy class" in forwarded
    assert "business class" not in forwarded and "hotel" not in forwarded


def test_a_regenerated_answer_is_kept_as_a_branch_too(
    make_gateway: GatewayFactory, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    client = sdk(make_gateway(), api_key, session_id)
    turn = [{"role": "user", "content": "Tell me a short story."}]
    chat(client, turn)
    chat(client, turn)  # regenerate
    redis = redis_server.client()
    try:
        keys = session_keys(redis, api_key, session_id)
        assert redis.llen(keys.log) == 2
        (branch,) = [json.loads(raw) for raw in redis.lrange(keys.branches, 0, -1)]
        assert int(redis.hget(keys.meta, "turns")) == 1
    finally:
        redis.close()
    assert branch["kind"] == "regenerate" and branch["from"] == 1
    assert [m["role"] for m in branch["messages"]] == ["assistant"]


def test_questions_sent_together_on_one_history_are_not_edits(
    gateway: ServerThread,
    clock: SteppedClock,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(gateway, api_key, session_id)
    base = chat(client, [{"role": "user", "content": "Here is my itinerary: Lisbon, Porto."}])
    as_a_person_would(clock)
    for question in ("Which city is first?", "How many cities are there?"):
        chat(client, [*base, {"role": "user", "content": question}])  # one right after another
    redis = redis_server.client()
    try:
        keys = session_keys(redis, api_key, session_id)
        log = [json.loads(raw)["content"] for raw in redis.lrange(keys.log, 0, -1)]
        assert redis.exists(keys.branches) == 0
    finally:
        redis.close()
    assert log[2::2] == ["Which city is first?", "How many cities are there?"]


def test_a_client_that_sends_single_messages_never_branches(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    for text in ("Hello, I am planning a trip.", BUSINESS, ECONOMY, "Hello, I am planning a trip."):
        chat(client, [{"role": "user", "content": text}])
    redis = redis_server.client()
    try:
        keys = session_keys(redis, api_key, session_id)
        assert redis.llen(keys.log) == 8
        assert redis.exists(keys.branches) == 0
    finally:
        redis.close()
