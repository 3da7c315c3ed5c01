"""Images in a conversation (issue 23): counted, stored once, sent only while in the window.

A real redis-server, the real-socket fake upstream (which keeps every body it was sent),
and the real OpenAI SDK as the client. The images are PNGs of random pixels: they do not
compress, so each is 2.5 MiB of bytes and ~3.4 MB of base64 in a body.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
from typing import Any

import openai
import pytest
from PIL import Image

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess
from gateway.memory.images import REF_PREFIX, image_tokens
from gateway.store.keys import SessionKeys
from gateway.text.tokens import TOKENS_PER_MESSAGE, TokenCounter
from tests.support.clients import register_content, sdk
from tests.support.fixtures import GatewayFactory

MIB = 1024 * 1024
SIDE = 935  # 935 x 935 RGB: 2.5 MiB of pixels
CAP = 8 * MIB  # upstream.max_request_bytes: two images fit, three do not
# A window of four messages: an image leaves it two turns after its own.
SMALL_WINDOW = {"preset": "hybrid", "window_messages": 4}


def random_png(seed: int) -> bytes:
    pixels = hashlib.shake_256(f"pixels {seed} {os.getpid()}".encode()).digest(SIDE * SIDE * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (SIDE, SIDE), pixels).save(out, format="PNG", compress_level=1)
    return out.getvalue()


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def image_message(text: str, png: bytes, detail: str = "high") -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": register_content(text)},
            {"type": "image_url", "image_url": {"url": data_url(png), "detail": detail}},
        ],
    }


def receipt_tiers(header: str) -> dict[str, int]:
    tiers = {}
    for part in header.split(";"):
        name, _, value = part.partition("=")
        if name in ("prompt", "memory", "window", "new"):
            tiers[name] = int(value)
    return tiers


def ask(client: openai.OpenAI, message: dict[str, Any]) -> tuple[dict[str, str], str]:
    raw = client.chat.completions.with_raw_response.create(model="fake-model", messages=[message])
    answer = raw.parse().choices[0].message.content or ""
    return dict(raw.headers), answer


def forwarded(fake: FakeUpstream, since: int) -> list[bytes]:
    """Bodies of the chat requests the turns sent (not the summarizer's)."""
    bodies = []
    for request in fake.chat_requests()[since:]:
        if b"fake-summarizer" not in request.body[:4096] and b'"fake-model"' in request.body:
            bodies.append(request.body)
    return bodies


def session_values(client: Any, keys: SessionKeys) -> dict[bytes, list[bytes]]:
    """Every value stored under the session's keys."""
    found: dict[bytes, list[bytes]] = {}
    for key in client.scan_iter(match=f"mg:{keys.tag.replace('{', '[{]')}:*", count=1000):
        kind = client.type(key)
        if kind == b"list":
            found[key] = list(client.lrange(key, 0, -1))
        elif kind == b"hash":
            found[key] = [v for pair in client.hgetall(key).items() for v in pair]
        elif kind == b"string":
            found[key] = [client.get(key)]
    return found


def test_three_images_then_text_turns(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    gateway = make_gateway(memory=SMALL_WINDOW, upstream={"max_request_bytes": CAP})
    client = sdk(gateway, api_key, session_id)
    counter = TokenCounter()
    images = [random_png(n) for n in range(3)]
    assert all(2.4 * MIB < len(png) < 2.7 * MIB for png in images)
    per_image = image_tokens(SIDE, SIDE, "high")
    assert per_image == 765  # 935 px: its short side down to 768, four tiles

    before = len(fake_upstream.chat_requests())
    for n, png in enumerate(images, 1):
        text = f"What is in holiday picture number {n}?"
        headers, _ = ask(client, image_message(text, png))
        tiers = receipt_tiers(headers["x-memory-receipt"])
        # The new message: its framing, its words, and its image as the API bills it.
        assert tiers["new"] == TOKENS_PER_MESSAGE + counter.count_text(text) + per_image
        if n == 2:
            assert tiers["window"] >= per_image  # the image before it, counted too
        if n == 3:  # image 1 went as a placeholder (the cap): image 2 only is counted
            assert per_image <= tiers["window"] < 2 * per_image
        assert int(headers["x-memory-context-tokens"]) == sum(tiers.values()) + 3
    for n in range(4):
        headers, _ = ask(client, {"role": "user", "content": register_content(f"And then {n}?")})
        if n < 2:  # images still in the window: counted
            assert int(headers["x-memory-context-tokens"]) > per_image
        else:
            assert int(headers["x-memory-context-tokens"]) < per_image

    bodies = forwarded(fake_upstream, before)
    assert len(bodies) == 7
    sizes = [len(body) for body in bodies]
    assert all(size <= CAP for size in sizes), sizes
    encoded = [base64.b64encode(png) for png in images]
    # Turn 1 sends image 1, turn 2 images 1 and 2; turn 3 would hold three (over the
    # cap): image 1, the oldest, gives way to a placeholder.
    assert [[e in body for e in encoded] for body in bodies[:3]] == [
        [True, False, False],
        [True, True, False],
        [False, True, True],
    ]
    assert b"[image 935x935, sha256 " in bodies[2]
    # Text turns: images 2 and 3 (read back from Redis), then 3, then none.
    assert [[e in body for e in encoded] for body in bodies[3:]] == [
        [False, True, True],
        [False, False, True],
        [False, False, False],
        [False, False, False],
    ]
    assert all(size < 100_000 for size in sizes[5:]), sizes
    assert b"memory-gateway:media/" not in b"".join(bodies)  # references never leave

    # Redis holds each image once, in the session's media hash, and nowhere else.
    redis = redis_server.client()
    tenant = redis_tenant(redis, session_id)
    keys = SessionKeys(tenant, session_id)
    values = session_values(redis, keys)
    media = dict(
        zip(values[keys.media.encode()][::2], values[keys.media.encode()][1::2], strict=True)
    )
    assert sorted(media) == sorted(hashlib.sha256(png).hexdigest().encode() for png in images)
    assert all(media[hashlib.sha256(png).hexdigest().encode()] == png for png in images)
    for key, stored in values.items():
        if key == keys.media.encode():
            continue
        for value in stored:
            assert not any(e[:64] in value for e in encoded), key
            assert not any(png[100:164] in value for png in images), key
    log = values[keys.log.encode()]
    assert sum(value.count(REF_PREFIX.encode()) for value in log) == 3
    assert sum(len(value) for value in log) < 20_000
    assert redis.ttl(keys.media) > 0


def redis_tenant(redis: Any, session_id: str) -> str:
    """The tenant id (a keyed hash of the key) of the session, from its meta hash."""
    for key in redis.scan_iter(match="mg:*:meta", count=1000):
        if redis.hget(key, "sid") == session_id.encode():
            tag = key.decode().split(":", 2)[1]  # {tenant.digest}
            return tag[1:].rsplit(".", 1)[0]
    raise AssertionError("no such session")


def test_a_client_resending_its_whole_history(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    """An SDK app that resends every message, images included, on every turn: its
    history lines up with the stored one (an image resent is the same reference), each
    image is stored once, and the images that left the window are not forwarded."""
    gateway = make_gateway(memory=SMALL_WINDOW)
    client = sdk(gateway, api_key, session_id)
    images = [random_png(10 + n) for n in range(2)]
    history: list[dict[str, Any]] = []
    before = len(fake_upstream.chat_requests())
    turns = [image_message(f"Describe garden photo {n}", png) for n, png in enumerate(images)]
    turns += [{"role": "user", "content": register_content(f"Thanks, and {n}?")} for n in range(3)]
    for message in turns:
        history.append(message)
        headers, answer = ask_all(client, history)
        assert headers["x-memory-status"] == "ok"
        history.append({"role": "assistant", "content": answer})
    bodies = forwarded(fake_upstream, before)
    encoded = [base64.b64encode(png) for png in images]
    assert [[e in body for e in encoded] for body in bodies] == [
        [True, False],
        [True, True],
        [True, True],
        [False, True],
        [False, False],
    ]
    assert len(bodies[-1]) < 100_000
    redis = redis_server.client()
    keys = SessionKeys(redis_tenant(redis, session_id), session_id)
    assert redis.llen(keys.log) == 10  # every message once: the resent ones lined up
    assert redis.hlen(keys.media) == 2


def ask_all(client: openai.OpenAI, messages: list[dict[str, Any]]) -> tuple[dict[str, str], str]:
    raw = client.chat.completions.with_raw_response.create(model="fake-model", messages=messages)
    return dict(raw.headers), raw.parse().choices[0].message.content or ""


def test_drop_keeps_no_image_bytes(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    """``memory.media: drop``: the image goes with its own turn only; memory keeps its
    reference (counted, shown as a placeholder) and no bytes."""
    gateway = make_gateway(memory={**SMALL_WINDOW, "media": "drop"})
    client = sdk(gateway, api_key, session_id)
    png = random_png(20)
    before = len(fake_upstream.chat_requests())
    ask(client, image_message("A photo of my cat, what breed?", png, detail="low"))
    headers, _ = ask(client, {"role": "user", "content": register_content("How old is it?")})
    first, second = forwarded(fake_upstream, before)
    encoded = base64.b64encode(png)
    assert encoded in first and encoded not in second
    assert b"[image 935x935, sha256 " in second
    # What went is counted: the placeholder's words, not the image it stands for.
    counter = TokenCounter()
    window = json.loads(second)["messages"][:-1]
    tiers = receipt_tiers(headers["x-memory-receipt"])
    assert tiers["window"] == sum(TOKENS_PER_MESSAGE + counter.count_payload(m) for m in window)
    redis = redis_server.client()
    keys = SessionKeys(redis_tenant(redis, session_id), session_id)
    assert not redis.exists(keys.media)
    assert redis.llen(keys.log) == 4


def test_a_url_image_is_forwarded_as_it_is_and_counted(
    gateway: Any, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    url = "https://images.example.com/cat.png"
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": register_content("Look at this cat picture")},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }
    headers, _ = ask(client, message)
    tiers = receipt_tiers(headers["x-memory-receipt"])
    counter = TokenCounter()
    expected = TOKENS_PER_MESSAGE + counter.count_text("Look at this cat picture") + 765
    assert tiers["new"] == expected
    sent = fake_upstream.last_messages()[-1]["content"]
    assert sent[1] == {"type": "image_url", "image_url": {"url": url}}


@pytest.mark.parametrize(
    ("url", "status", "code"),
    [
        ("data:image/png;base64,!!!not base64!!!", 400, "invalid_image"),
        ("data:image/png;base64," + base64.b64encode(b"just some text").decode(), 400,
         "invalid_image"),
        ("data:image/png,rawbytes", 400, "invalid_image"),
        ("file:///etc/passwd", 400, "invalid_image"),  # never stored, never sent upstream
    ],
)  # fmt: skip
def test_bad_image_data_is_a_400(
    gateway: Any, api_key: str, session_id: str, url: str, status: int, code: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }
    with pytest.raises(openai.APIStatusError) as raised:
        ask(client, message)
    assert raised.value.status_code == status
    error = raised.value.body
    assert isinstance(error, dict)
    assert error["code"] == code
    assert error["param"] == "messages.0.content.1.image_url.url"


def test_an_image_over_max_media_bytes_is_a_413(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(server={"max_media_bytes": 1 * MIB})
    client = sdk(gateway, api_key, session_id)
    with pytest.raises(openai.APIStatusError) as raised:
        ask(client, image_message("Too big a picture?", random_png(30)))
    assert raised.value.status_code == 413
    error = raised.value.body
    assert isinstance(error, dict)
    assert error["param"] == "messages.0.content.1.image_url.url"


def test_memory_api_import_export_and_erase_cover_images(
    gateway: Any, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    import httpx

    png = random_png(40)
    http = httpx.Client(
        base_url=gateway.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    )
    base = f"/memory/sessions/{session_id}"
    try:
        imported = http.post(
            base + "/messages",
            json={"messages": [image_message("An imported photo of a bridge", png),
                               {"role": "assistant", "content": "A stone bridge."}]},
        )  # fmt: skip
        assert imported.status_code == 200, imported.text
        redis = redis_server.client()
        keys = SessionKeys(redis_tenant(redis, session_id), session_id)
        assert redis.hget(keys.media, hashlib.sha256(png).hexdigest()) == png
        markdown = http.get(base + "/export", params={"format": "markdown"}).text
        assert "[image 935x935, sha256 " + hashlib.sha256(png).hexdigest()[:8] in markdown
        exported = http.get(base + "/export").text
        assert base64.b64encode(png)[:64].decode() not in exported
        context = http.post(
            base + "/context",
            json={"model": "m", "messages": [{"role": "user", "content": "which bridge?"}]},
        ).json()
        sent = [m for m in context["messages"] if isinstance(m["content"], list)]
        assert sent[0]["content"][1]["image_url"]["url"] == data_url(png)
        assert http.delete(base).status_code == 204
        assert not redis.exists(keys.media)
    finally:
        http.close()


def test_round_trips_one_more_only_while_the_window_shows_a_stored_image(
    counted_gateway: Any,
    api_key: str,
    session_id: str,
) -> None:
    """The usual text turn stays at two round trips (load, record); a turn whose window
    shows an image the client did not send again reads it: one more."""
    make, trips = counted_gateway
    gateway = make("hybrid", window_messages=4)
    client = sdk(gateway, api_key, session_id)
    small = io.BytesIO()
    Image.frombytes("RGB", (64, 64), os.urandom(64 * 64 * 3)).save(small, format="PNG")
    ask(client, image_message("A small picture of a leaf, which tree?", small.getvalue()))
    counts = []
    for n in range(3):
        trips.calls.clear()
        ask(client, {"role": "user", "content": register_content(f"Tell me more, part {n}")})
        counts.append(list(trips.calls))
    assert [len(calls) for calls in counts] == [3, 3, 2], counts
    assert all("media" in calls for calls in counts[:2])


def test_images_on_a_redis_cluster(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    on_cluster: Any,
    api_key: str,
    session_id: str,
) -> None:
    """The media hash shares its session's slot: stored with the turn's record, read
    back for the window, on a cluster as on one Redis."""
    gateway = make_gateway(on_cluster.url, memory=SMALL_WINDOW)
    client = sdk(gateway, api_key, session_id)
    small = io.BytesIO()
    Image.frombytes("RGB", (80, 60), os.urandom(80 * 60 * 3)).save(small, format="PNG")
    ask(client, image_message("A picture of a harbour, which town?", small.getvalue()))
    before = len(fake_upstream.chat_requests())
    headers, _ = ask(client, {"role": "user", "content": register_content("And its boats?")})
    (body,) = forwarded(fake_upstream, before)
    assert base64.b64encode(small.getvalue()) in body  # read back from the cluster
    assert headers["x-memory-status"] == "ok"
    # Closed here: a cluster client's references form cycles, so only the collector
    # would reclaim it, its sockets still open (a ResourceWarning in a later test).
    with on_cluster.client() as cluster:
        stored = [
            key for key in cluster.scan_iter(match="mg:*:media", count=1000)
            if cluster.hget(key, hashlib.sha256(small.getvalue()).hexdigest())
        ]  # fmt: skip
    assert len(stored) == 1
