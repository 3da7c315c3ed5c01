"""Every key a gateway writes is in the key schema (``SCHEMA`` in gateway/store/keys.py):
one gateway with every feature that writes keys (gateway keys and the admin API, rate
limits of a tenant and a key, a user's sessions, images, the inspector's login, the
in-process worker summarizing and ending a session) records turns on a private Redis,
and every key Redis holds is checked, again and again as the turns go on: it belongs to
exactly one family, has the type the schema gives it, and expires exactly when the schema
says it does. Every family of the schema is seen, but those listed in NOT_DRIVEN."""

from __future__ import annotations

import base64
import io
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from devsupport.servers import RedisProcess, ServerThread, running_redis
from gateway.store.keys import SCHEMA, SessionKeys, shapes_of
from tests.support.clients import Memory, register_content, say, sdk
from tests.support.fixtures import USED_KEYS, GatewayFactory, find_secrets, redis_dump
from tests.support.waiting import wait_for

ADMIN = "admin-key-of-the-schema-test-0123"
INSPECTOR = "inspector-key-of-the-schema-test-0123"
OPERATOR = "sk-operator-" + secrets.token_urlsafe(16)
USED_KEYS += [ADMIN, INSPECTOR, OPERATOR]
USER = "schema-user"

# Families this test does not make: written only by an edit or a regenerate (branches),
# an embeddings model (vectors), no version since an old one (index); the lease, the
# jobs hash and the jobs' order live while a job waits or runs, the quota's holds while a
# turn is in flight, which a scan may or may not catch.
NOT_DRIVEN = {
    "mg:{<tenant>}:held",
    "mg:{<tenant>.<session>}:branches",
    "mg:{<tenant>.<session>}:vectors",
    "mg:{<tenant>.<session>}:index",
    "mg:{<tenant>.<session>}:lease",
    "mg:{<tenant>.<session>}:jobs",
    "mg:{<tenant>.<session>}:joborder",
}


def problem(key: str, kind: str, ttl: int) -> str | None:
    """What is wrong with a key Redis holds (its ``TYPE`` and ``TTL``), against the schema."""
    shapes = shapes_of(key)
    if len(shapes) != 1:
        return f"{key}: in {len(shapes)} families of the schema"
    (shape,) = shapes
    if kind != shape.redis_type:
        return f"{key}: a {kind}, the schema says a {shape.redis_type}"
    if (ttl >= 0) != shape.expires:
        return f"{key}: TTL {ttl}, the schema says it expires: {shape.ttl}"
    return None


class KeyScan:
    """Every key of one Redis, checked each time it is called; the families seen so far."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.seen: set[str] = set()
        self.problems: list[str] = []

    def __call__(self) -> set[str]:
        for raw in self.client.scan_iter(count=1000):
            with self.client.pipeline(transaction=False) as pipe:
                kind, ttl = pipe.type(raw).ttl(raw).execute()
            if kind == b"none":
                continue  # gone between the scan and the look (a lease released, say)
            key = raw.decode()
            found = problem(key, kind.decode(), ttl)
            if found is not None:
                self.problems.append(found)
            self.seen |= {shape.pattern for shape in shapes_of(key)}
        return self.seen


@pytest.fixture
def private_redis() -> Iterator[RedisProcess]:
    with running_redis() as server:
        yield server
        with server.client() as client:
            leaks = find_secrets(redis_dump(client), USED_KEYS)
        assert not leaks, f"bearer key material found in Redis: {sorted(set(leaks))[:5]}"


@pytest.fixture
def every_feature(
    private_redis: RedisProcess, make_gateway: GatewayFactory, api_key: str
) -> ServerThread:
    # (Redis first: it stops after the gateway.)
    limits = {"requests_per_minute": 1000, "tokens_per_minute": 1_000_000, "concurrent": 10}
    return make_gateway(
        redis_url=private_redis.url,
        memory={"preset": "hybrid-recall", "media": "store"},
        upstream={"api_key": OPERATOR},
        auth={"mode": "keys", "admin_key": ADMIN, "keys": [{"key": api_key, "tenant": "t-a"}]},
        limits={"tenant": limits, "key": limits, "address": limits},
        ui={"enabled": True, "admin_key": INSPECTOR},
    )


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def image_turn(gateway: ServerThread, key: str, session: str) -> None:
    url = "data:image/png;base64," + base64.b64encode(png()).decode()
    text = register_content("Here is the picture of my red square, keep it please.")
    content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
    answer = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": content}]},
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session, "X-User-Id": USER},
        timeout=30,
    )
    assert answer.headers["x-memory-status"] == "ok", answer.text


def slow_stream(gateway: ServerThread, key: str) -> None:
    body = {
        "model": "slow-stream",  # five chunks 0.3 s apart: a request in flight a while
        "stream": True,
        "messages": [{"role": "user", "content": "tell me slowly"}],
    }
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream(
        "POST", gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        for _ in response.iter_bytes():
            pass


def test_every_key_a_gateway_writes_is_in_the_schema(
    every_feature: ServerThread, private_redis: RedisProcess, api_key: str, session_id: str
) -> None:
    gateway = every_feature
    with private_redis.client() as client:
        drive(gateway, KeyScan(client), api_key, session_id)


def drive(gateway: ServerThread, scan: KeyScan, api_key: str, session_id: str) -> None:
    # The inspector: a failed login (counted per address), then a login (a session).
    with httpx.Client(base_url=gateway.url, headers={"Origin": gateway.url}) as browser:
        assert browser.post("/ui/login", data={"key": "wrong-" * 4}).status_code == 401
        login = browser.post("/ui/login", data={"key": INSPECTOR, "next": "/ui"})
        assert login.status_code == 303
        assert browser.get("/ui").status_code == 200
    # The admin API: a gateway key made (its record and the keys' version).
    admin = {"Authorization": f"Bearer {ADMIN}"}
    made = httpx.post(gateway.url + "/admin/keys", json={"tenant": "t-b"}, headers=admin)
    assert made.status_code == 201, made.text
    USED_KEYS.append(made.json()["key"])
    # A user's turns: an image, a pin, enough messages for summaries, under rate limits.
    image_turn(gateway, api_key, session_id)
    chat = sdk(gateway, api_key, session_id, **{"X-User-Id": USER})
    say(chat, "Remember: the wifi password of my office is tulip-42")
    for n in range(7):
        say(chat, f"turn {n}: my locker code number {n} is K{n}{n}")
    scan()
    # A request in flight holds a lease in the in-flight set, until its last byte.
    streaming = threading.Thread(target=slow_stream, args=(gateway, api_key))
    streaming.start()
    wait_for(lambda: "mg:{rl.<tenant>}:<scope>:busy" in scan(), what="a request in flight")
    streaming.join()
    # The worker summarizes; then the session ends (the user's history and profile).
    memory = Memory(gateway, api_key, session_id)
    wait_for(lambda: memory.state()["pending_jobs"] == 0 and memory.state()["summaries"])
    scan()
    assert memory.http.post(memory.base + "/end").json()["ended"] is True
    memory.http.close()

    expected = {shape.pattern for shape in SCHEMA} - NOT_DRIVEN
    wait_for(lambda: expected <= scan(), what=f"every family: {expected - scan.seen} missing")
    assert scan.problems == []


def test_a_key_the_schema_does_not_know_is_found(private_redis: RedisProcess) -> None:
    with private_redis.client() as client:
        stray_keys_are_found(client, KeyScan(client))


def stray_keys_are_found(client: Any, scan: KeyScan) -> None:
    meta = SessionKeys("ab" * 16, "a session").meta
    client.set("mg:{ui}:cart:" + "ab" * 32, "1", ex=60)  # no family
    client.set(meta, "1")  # a family's key, of the wrong type and with no expiry
    client.hset("mg:{auth}:keys", "k", "v")  # a family's key, as the schema says
    assert scan() == {"mg:{<tenant>.<session>}:meta", "mg:{auth}:keys"}
    assert sorted(scan.problems) == [
        f"{meta}: a string, the schema says a hash",
        "mg:{ui}:cart:" + "ab" * 32 + ": in 0 families of the schema",
    ]
    client.delete(meta, "mg:{ui}:cart:" + "ab" * 32)
    client.hset(meta, "sid", "a session")
    scan.problems.clear()
    scan()
    assert scan.problems == [f"{meta}: TTL -1, the schema says it expires: retention"]
