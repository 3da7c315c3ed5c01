"""Tenant isolation and erasure, over a real gateway, a real Redis and the fake upstream.

Tenants are bearer keys. The same session and user ids under two keys are two
conversations: nothing one tenant sent may reach what another tenant's requests forward
or what its memory API returns, and "not there" must look the same as "someone else's".
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devsupport.fake_upstream import SLOW_SUMMARIZER_S, FakeUpstream
from devsupport.servers import RedisProcess, ServerThread
from gateway.auth.identity import tenant_id
from gateway.memory.model import Message
from gateway.store.keys import TENANT_SECRET_KEY, SessionKeys, UserKeys
from gateway.store.redis_store import RedisStore
from tests.support.clients import register_content
from tests.support.fixtures import (
    USED_KEYS,
    GatewayFactory,
    find_logged_contents,
    on_one_redis_and_a_cluster,
    redis_dump,
)
from tests.support.jobs import notices
from tests.support.waiting import wait_for

# Every tier that could carry a message elsewhere: a two-message window (so older turns
# come back only through memory), a rolling summary folded every turn with key Q/A pairs,
# facts, pins, lexical recall across the user's sessions, and the cross-session profile.
ALL_TIERS: dict[str, Any] = {
    "window": {"messages": 2, "keep_last": 1},
    "rolling": {},
    "facts": {"use": 10, "extract_every": 2},
    "pins": {"use": 5},
    "recall": {"min_score": 0.1},
    "cross_session": {},
    "priority": ["window_keep", "recall", "pins", "facts", "rolling", "key_qa", "profile",
                 "window"],
}  # fmt: skip

redis_server = on_one_redis_and_a_cluster()


def new_key() -> str:
    key = "sk-iso-" + secrets.token_urlsafe(24)
    USED_KEYS.append(key)  # the end-of-suite scan looks for it in Redis and in the logs
    return key


@dataclass
class Tenant:
    key: str
    marker: str  # in every content this tenant sends, and in nothing else
    http: httpx.Client

    def chat(self, session: str, user: str | None, text: str) -> httpx.Response:
        headers = {"X-Session-Id": session, **({"X-User-Id": user} if user else {})}
        body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
        response = self.http.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        return response


TenantFactory = Callable[[ServerThread, str], Tenant]


@pytest.fixture
def tenant_on() -> Iterator[TenantFactory]:
    """A new tenant (a new bearer key) of a gateway, whose contents carry ``marker``."""
    opened: list[httpx.Client] = []

    def make(gateway: ServerThread, marker: str) -> Tenant:
        key = new_key()
        http = httpx.Client(
            base_url=gateway.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
        opened.append(http)
        return Tenant(key, marker, http)

    yield make
    for http in opened:
        http.close()


@pytest.fixture
def all_tiers(make_gateway: GatewayFactory) -> ServerThread:
    return make_gateway(memory={"tiers": ALL_TIERS})


def memory_views(tenant: Tenant, sessions: list[str], users: list[str]) -> list[str]:
    """Every read the memory API offers a tenant, as text."""
    bodies = []
    for sid in sessions:
        base = f"/memory/sessions/{sid}"
        bodies.append(tenant.http.get(base).text)
        bodies.append(tenant.http.get(base + "/pins").text)
        bodies.append(tenant.http.get(base + "/export", params={"format": "json"}).text)
        bodies.append(tenant.http.get(base + "/export", params={"format": "markdown"}).text)
        probe = {"model": "fake-model", "messages": [{"role": "user", "content": "zebra budget?"}]}
        for user in (None, users[0]):
            headers = {"X-User-Id": user} if user else {}
            bodies.append(tenant.http.post(base + "/context", json=probe, headers=headers).text)
    bodies += [tenant.http.get(f"/memory/users/{uid}").text for uid in users]
    return bodies


SEND = st.tuples(
    st.integers(0, 2),  # tenant
    st.integers(0, 2),  # session id, shared by all tenants
    st.sampled_from([None, 0, 1]),  # user id, shared by all tenants
    st.sampled_from(["say", "remember", "ask"]),
)


ISOLATION_SCALE = int(os.environ.get("MEMORY_GATEWAY_FUZZ_SCALE", "1"))


def test_no_tenant_ever_sees_another_tenants_messages(
    all_tiers: ServerThread, tenant_on: TenantFactory, fake_upstream: FakeUpstream
) -> None:
    checked: Counter[str] = Counter()

    @settings(
        max_examples=20 * ISOLATION_SCALE,
        derandomize=ISOLATION_SCALE == 1,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(sends=st.lists(SEND, min_size=2, max_size=7), ends=st.booleans())
    def example(sends: list[tuple[int, int, int | None, str]], ends: bool) -> None:
        checked["examples"] += 1
        nonce = uuid.uuid4().hex[:8]
        crowd = [tenant_on(all_tiers, f"zq{nonce}t{i}q") for i in range(3)]
        sessions = [f"s-{nonce}-{k}" for k in range(3)]
        users = [f"u-{nonce}-{k}" for k in range(2)]
        seen_before = len(fake_upstream.chat_requests())
        used: set[tuple[int, int]] = set()
        # A session's user is set once, by the first turn naming one (another user's turn
        # on it is a 404, test_auth): later sends name that one.
        owners: dict[tuple[int, int], int] = {}
        for n, (who, sid, uid, kind) in enumerate(sends):
            tenant = crowd[who]
            if uid is not None:
                uid = owners.setdefault((who, sid), uid)
            # Shared words ("zebra", "budget") make every tenant's messages match every
            # question: only the tenant boundary can keep them apart.
            text = {
                "say": f"my budget is {tenant.marker} zebra {n}",
                "remember": f"Remember: the zebra code is {tenant.marker}-{n}",
                "ask": "what is my budget? zebra",
            }[kind]
            tenant.chat(sessions[sid], None if uid is None else users[uid], register_content(text))
            used.add((who, sid))
        for who, sid in sorted(used):
            base = f"/memory/sessions/{sessions[sid]}"
            assert crowd[who].http.post(base + "/flush").status_code == 200
            if ends:  # the user's history and cross-session profile are built from ended ones
                assert crowd[who].http.post(base + "/end").status_code == 200
        for who, sid in sorted(used):  # one more turn each, with every tier there is to forward
            user = users[owners.get((who, sid), 0)]
            crowd[who].chat(sessions[sid], user, "what is my budget? zebra")

        for tenant in crowd:
            others = [t.marker for t in crowd if t is not tenant]
            forwarded = [
                r.body.decode()
                for r in fake_upstream.chat_requests()[seen_before:]
                if r.headers.get("authorization") == f"Bearer {tenant.key}"
            ]
            views = memory_views(tenant, sessions, users)
            checked["forwarded requests"] += len(forwarded)
            checked["memory API reads"] += len(views)
            for text in forwarded + views:
                leaked = [m for m in others if m in text]
                assert not leaked, f"{tenant.marker} sees {leaked}: {text[:300]}"
        # The summarizer sees one session at a time: one tenant's markers per prompt.
        for request in fake_upstream.chat_requests()[seen_before:]:
            if request.json()["model"] == "fake-summarizer":
                checked["summarizer prompts"] += 1
                assert sum(t.marker in request.body.decode() for t in crowd) <= 1

    example()
    # bench/faults.py reads this line: what was checked, and (the test passed) no leak.
    print("isolation: " + ", ".join(f"{n} {what}" for what, n in checked.items())
          + ", 0 cross-tenant leaks", file=sys.stderr)  # fmt: skip
    assert checked["examples"] >= 20 and checked["memory API reads"] > 0


def _same(response: httpx.Response, other: httpx.Response, ids: tuple[str, str]) -> None:
    """Same status and the same body once the id asked for is put aside."""
    assert response.status_code == other.status_code
    assert response.text.replace(ids[0], "ID") == other.text.replace(ids[1], "ID")


def test_someone_elses_session_or_user_looks_exactly_like_a_missing_one(
    all_tiers: ServerThread, tenant_on: TenantFactory, session_id: str
) -> None:
    owner, stranger = tenant_on(all_tiers, "zqownerq"), tenant_on(all_tiers, "zqstrangerq")
    theirs, nowhere = session_id, f"{session_id}-never"
    user, nobody = f"user-{session_id}", f"user-{session_id}-never"
    owner.chat(theirs, user, register_content("Remember: my locker code is zqownerq-77"))
    assert owner.http.post(f"/memory/sessions/{theirs}/flush").status_code == 200
    pin_id = owner.http.get(f"/memory/sessions/{theirs}/pins").json()["pins"][0]["id"]
    before = owner.http.get(f"/memory/sessions/{theirs}/export").text

    probe = {"model": "fake-model", "messages": [{"role": "user", "content": "my locker code?"}]}
    requests: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/memory/sessions/{sid}", {}),
        ("GET", "/memory/sessions/{sid}/pins", {}),
        ("POST", "/memory/sessions/{sid}/pins", {"json": {"content": "zqstrangerq pin"}}),
        ("DELETE", "/memory/sessions/{sid}/pins/" + pin_id, {}),
        ("POST", "/memory/sessions/{sid}/flush", {}),
        ("POST", "/memory/sessions/{sid}/end", {}),
        ("POST", "/memory/sessions/{sid}/context", {"json": probe}),
        ("POST", "/memory/sessions/{sid}/context", {"json": probe, "headers": {"X-User-Id": user}}),
        ("GET", "/memory/sessions/{sid}/export", {"params": {"format": "json"}}),
        ("GET", "/memory/sessions/{sid}/export", {"params": {"format": "markdown"}}),
        ("DELETE", "/memory/sessions/{sid}", {}),
    ]
    for method, path, options in requests:
        found = stranger.http.request(method, path.format(sid=theirs), **options)
        missing = stranger.http.request(method, path.format(sid=nowhere), **options)
        _same(found, missing, (theirs, nowhere))
        assert "zqownerq" not in found.text
    for method in ("GET", "DELETE"):
        found = stranger.http.request(method, f"/memory/users/{user}")
        missing = stranger.http.request(method, f"/memory/users/{nobody}")
        assert found.status_code == 404
        _same(found, missing, (user, nobody))
    # Nothing the stranger did touched the owner's session.
    assert owner.http.get(f"/memory/sessions/{theirs}/export").text == before
    assert owner.http.get(f"/memory/users/{user}").json()["sessions"] == [theirs]


# --- Erasure with a summarization job in flight ----------------------------------------


def scan(redis_server: RedisProcess) -> list[bytes]:
    client = redis_server.client()
    try:
        return redis_dump(client)
    finally:
        client.close()


def keys_left(
    redis_server: RedisProcess, key: str, sessions: list[str], users: list[str]
) -> list[bytes]:
    """Keys Redis still holds for these sessions and users of the tenant ``key`` names."""
    client = redis_server.client()
    try:
        tenant = tenant_id(client.get(TENANT_SECRET_KEY), key)
        tags = [SessionKeys(tenant, s).tag for s in sessions]
        tags += [UserKeys(tenant, u).tag for u in users]
        return [k for tag in tags for k in client.scan_iter(match=f"mg:{tag}:*", count=1000)]
    finally:
        client.close()


def stream_mentions(redis_server: RedisProcess, text: str) -> bool:
    client = redis_server.client()
    try:
        return any(
            text.encode() in value for _, _, fields in notices(client) for value in fields.values()
        )
    finally:
        client.close()


def summarizer_calls(fake: FakeUpstream, kind: str = "") -> int:
    """Calls of the slow summarizer so far (of one kind: ``[memory-gateway:<kind>]``)."""
    return sum(
        1
        for r in fake.chat_requests()
        if r.json()["model"] == "slow-summarizer"
        and r.json()["messages"][0]["content"].startswith(f"[memory-gateway:{kind}")
    )


@pytest.fixture
def slow_gateway(make_gateway: GatewayFactory) -> ServerThread:
    # The default composition: every job kind, and an end that summarizes.
    return make_gateway(memory={"preset": "hybrid-recall"}, summarizer={"model": "slow-summarizer"})


def settle(redis_server: RedisProcess, fake: FakeUpstream, sessions: list[str]) -> None:
    """Wait until no notice of these sessions is left in the job stream (a job's notice
    is deleted when it is acknowledged, after its run) and the slow summarizer has
    answered whatever it was asked last (a call a job gave up on included)."""
    timeout = 10 * SLOW_SUMMARIZER_S + 10
    for sid in sessions:
        wait_for(lambda s=sid: not stream_mentions(redis_server, s), timeout, "jobs acked")
    wait_for(
        lambda: not any(call.model == "slow-summarizer" for call in list(fake.in_flight)),
        timeout,
        "the summarizer's calls answered",
    )


def test_erasing_a_session_mid_summarization_leaves_nothing(
    slow_gateway: ServerThread,
    tenant_on: TenantFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    session_id: str,
) -> None:
    tenant = tenant_on(slow_gateway, "zqerasedq")
    mark = f"zqerase{uuid.uuid4().hex[:8]}"
    user = f"user-{session_id}"
    for n in range(3):  # facts are due at message 6: the worker calls the summarizer
        tenant.chat(session_id, user, register_content(f"my pin code is {mark} number {n}"))
    wait_for(lambda: summarizer_calls(fake_upstream) > 0, 10, "a summarizer call in flight")
    assert tenant.http.delete(f"/memory/sessions/{session_id}").status_code == 204
    settle(redis_server, fake_upstream, [session_id])
    assert keys_left(redis_server, tenant.key, [session_id], [user]) == []
    dump = scan(redis_server)
    assert not [b for b in dump if mark.encode() in b], "content survived the erasure"
    assert not [b for b in dump if session_id.encode() in b], "the session id survived"
    assert tenant.http.get(f"/memory/sessions/{session_id}").status_code == 404
    assert tenant.http.get(f"/memory/users/{user}").status_code == 404


def test_erasing_a_user_while_their_session_ends_leaves_nothing(
    slow_gateway: ServerThread,
    tenant_on: TenantFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    session_id: str,
) -> None:
    """An end is the longest job (flush, final summary, profile merge): erase meanwhile."""
    tenant = tenant_on(slow_gateway, "zqendingq")
    mark = f"zqend{uuid.uuid4().hex[:8]}"
    user = f"user-{session_id}"
    sessions = [f"{session_id}-a", f"{session_id}-b"]
    for sid in sessions:
        tenant.chat(sid, user, register_content(f"my seat is {mark} on flight {sid}"))
    for sid in sessions:  # no job of the turns left: the end's own calls come next
        assert tenant.http.post(f"/memory/sessions/{sid}/flush").status_code == 200
    ending: list[httpx.Response] = []
    calls = summarizer_calls(fake_upstream, "chunk")
    end = threading.Thread(
        target=lambda: ending.append(tenant.http.post(f"/memory/sessions/{sessions[0]}/end"))
    )
    end.start()
    # The end has read the session and asks for its final summary: erase the user now.
    wait_for(lambda: summarizer_calls(fake_upstream, "chunk") > calls, 10, "the final summary")
    assert tenant.http.delete(f"/memory/users/{user}").status_code == 204
    end.join(timeout=10 * SLOW_SUMMARIZER_S + 10)
    assert not end.is_alive()
    settle(redis_server, fake_upstream, sessions)
    assert keys_left(redis_server, tenant.key, sessions, [user]) == []
    dump = scan(redis_server)
    assert not [b for b in dump if mark.encode() in b], "content survived the erasure"
    assert not [b for b in dump if user.encode() in b], "the user id survived"
    assert tenant.http.get(f"/memory/users/{user}").status_code == 404
    for sid in sessions:
        assert tenant.http.get(f"/memory/sessions/{sid}").status_code == 404


def test_erasing_an_ended_session_removes_it_from_its_users_memory(
    make_gateway: GatewayFactory,
    tenant_on: TenantFactory,
    redis_server: RedisProcess,
    session_id: str,
) -> None:
    tenant = tenant_on(make_gateway(memory={"preset": "hybrid-recall"}), "zqhistoryq")
    user, marks = f"user-{session_id}", [f"zqhist{uuid.uuid4().hex[:8]}" for _ in range(2)]
    sessions = [f"{session_id}-{n}" for n in range(2)]
    for sid, mark in zip(sessions, marks, strict=True):
        tenant.chat(sid, user, register_content(f"my seat is {mark} on the night train"))
        assert tenant.http.post(f"/memory/sessions/{sid}/end").status_code == 200
    assert any(marks[0].encode() in b for b in scan(redis_server))  # in the user's profile
    assert tenant.http.delete(f"/memory/sessions/{sessions[0]}").status_code == 204
    dump = scan(redis_server)
    assert not [b for b in dump if marks[0].encode() in b], "the erased session's summary stayed"
    assert any(marks[1].encode() in b for b in dump)  # the other session's memory stays
    assert tenant.http.get(f"/memory/users/{user}").json()["sessions"] == [sessions[1]]


# --- The end-of-suite scan can fail -------------------------------------------------------


def test_the_log_scan_finds_a_logged_content_at_info_and_above_only() -> None:
    content = "my passport number is X1234567"
    records = [
        (logging.DEBUG, f"debug may show {content}"),
        (logging.INFO, "summarizer chunk: rejected the answer (too short)"),
    ]
    assert find_logged_contents(records, {content, "ok"}) == []
    records.append((logging.WARNING, f"turn not recorded: {content!r}"))
    records.append((logging.INFO, "ok"))  # too short to tell content from a log's words
    assert find_logged_contents(records, {content, "ok"}) == [content]


async def test_an_embeddings_job_finishing_after_erasure_writes_nothing_back(
    store: RedisStore,
) -> None:
    keys = SessionKeys("tenant-embed-erase", uuid.uuid4().hex)
    told = [Message("user", "my locker code is 4471")]
    await store.sessions.record(keys, told, now=1.0, user_id=None)
    assert await store.sessions.save_vectors(keys, {1: b"\x00\x01vector"}) is True
    assert await store.sessions.vectors(keys, [1]) == {1: b"\x00\x01vector"}

    await store.sessions.erase_session(keys)
    # The job computed its vectors before the erasure and saves them after it.
    assert await store.sessions.save_vectors(keys, {1: b"\x00\x01vector"}) is False
    leftover = [k async for k in store.client.scan_iter(match=f"mg:{keys.tag}*")]
    assert leftover == []
