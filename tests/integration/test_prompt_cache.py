"""What the upstream can reuse of a context, over real sockets (issue 31): with
``memory.stable_layout`` a turn's forwarded messages begin with the last turn's (but for
its late message of recalled excerpts, and its new message), and every receipt after a
session's first says how many tokens the upstream can reuse (``stable=N``), from a
fingerprint of the last forwarded context kept in the session's meta.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import ServerThread
from tests.support.clients import LONG, Memory
from tests.support.fixtures import GatewayFactory

# Messages of ~40 tokens: the window holds a step of them.
MEDIUM = "note {i} on topic {t}: " + "we talked about the river and the lazy dog again " * 3
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def _chat(gateway: ServerThread, key: str, session: str, text: str) -> httpx.Response:
    body = {"model": "fake-model", "messages": [SYSTEM, {"role": "user", "content": text}]}
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-memory-status"] == "ok"
    return response


def _forwarded(fake: FakeUpstream, text: str) -> list[dict[str, Any]]:
    chats = [
        r.json()["messages"]
        for r in fake.proxied_requests()
        if r.path.endswith("/chat/completions")
    ]
    (messages,) = [m for m in chats if m[-1].get("content") == text]
    return list(messages)


def _stable(response: httpx.Response) -> int | None:
    found = re.search(r";stable=(\d+);", response.headers["x-memory-receipt"])
    return int(found.group(1)) if found else None


def test_the_stable_layout_appends_and_its_receipts_say_what_is_reused(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(memory={"preset": "hybrid-recall", "stable_layout": True})
    Memory(gateway, api_key, session_id).add(120, MEDIUM)
    flushed = httpx.post(
        f"{gateway.url}/memory/sessions/{session_id}/flush",
        json={},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    assert flushed.status_code == 200, flushed.text
    texts = [f"tell me more, part {n}" for n in range(4)]
    responses = [_chat(gateway, api_key, session_id, text) for text in texts]

    assert _stable(responses[0]) is None  # nothing forwarded before for this session
    reused = 0
    for n in range(1, len(texts)):
        before, now = _forwarded(fake_upstream, texts[n - 1]), _forwarded(fake_upstream, texts[n])
        stable = _stable(responses[n])
        assert stable is not None
        assert stable <= int(responses[n].headers["x-memory-context-tokens"])
        if now[: len(before) - 2] == before[:-2]:  # the window was appended to
            assert now[len(before) - 2] == before[-1]  # the last new message, recorded
            assert stable >= 1024  # OpenAI's minimum, the default policy's
            reused += 1
    assert reused >= 2  # the anchor moves by a step of 16 messages: once in 3 turns at most


def test_the_rebuilt_layout_reports_what_little_it_keeps(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(
        memory={"preset": "hybrid-recall"}, upstream={"prompt_cache": {"policy": "prefix"}}
    )
    Memory(gateway, api_key, session_id).add(120, LONG)
    first = _chat(gateway, api_key, session_id, "what did we say?")
    second = _chat(gateway, api_key, session_id, "and what else?")
    assert _stable(first) is None
    # Only the system prompt is the same: the memory message after it is rebuilt.
    stable = _stable(second)
    assert stable is not None and 0 < stable < 40
