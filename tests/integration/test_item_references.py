"""``item_reference``s memory does not hold (issue 34): forwarded as sent, for the upstream
that stored the item to resolve, or to refuse as OpenAI does; never stored. The real
OpenAI SDK → gateway → the fake upstream, which keeps its output items as OpenAI does."""

from __future__ import annotations

import httpx
import openai
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread
from devsupport.stored import stored_log
from gateway.memory.model import content_text
from tests.support.clients import register_content, sdk


def test_a_reference_to_an_item_only_the_upstream_holds_is_forwarded(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    # An answer memory never saw (memory off): the upstream stored it, memory did not.
    unseen = sdk(gateway, api_key, session_id, **{"X-Memory-Mode": "off"})
    first = unseen.responses.create(model="fake-model", input=register_content("my hat is red"))
    item_id = first.output[0].id
    client = sdk(gateway, api_key, session_id)
    answer = client.responses.create(
        model="fake-model",
        input=[
            {"role": "user", "content": "my hat is red"},
            {"type": "item_reference", "id": item_id},  # type: ignore[list-item]
            {"role": "user", "content": register_content("what is my hat?")},
        ],
    )
    assert answer.output_text == "Your hat is red."
    forwarded = fake_upstream.responses_requests()[-1].json()["input"]
    assert {"type": "item_reference", "id": item_id} in forwarded
    # Only what memory could read is stored: the messages and the new answer.
    log = stored_log(redis_server, api_key, session_id)
    assert [(m["role"], content_text(m["content"])) for m in log] == [
        ("user", "my hat is red"),
        ("user", "what is my hat?"),
        ("assistant", "Your hat is red."),
    ]


def test_a_reference_nobody_holds_is_the_upstreams_404_and_nothing_is_stored(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(
            model="fake-model",
            input=[
                {"role": "user", "content": "hello there"},
                {"type": "item_reference", "id": "msg_nobody"},  # type: ignore[list-item]
                {"role": "user", "content": register_content("and again, hello")},
            ],
        )
    assert "msg_nobody" in raised.value.message
    assert raised.value.response.headers["x-memory-status"] == "not_recorded"
    assert stored_log(redis_server, api_key, session_id) == []


def test_a_reference_memory_resolved_is_not_forwarded_in_the_context_preview(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    first = client.responses.create(model="fake-model", input=register_content("my dog is Rex"))
    body = {
        "model": "fake-model",
        "input": [
            {"role": "user", "content": "my dog is Rex"},
            {"type": "item_reference", "id": first.output[0].id},
            {"role": "user", "content": "what is my dog?"},
        ],
    }
    headers = {"Authorization": f"Bearer {api_key}"}
    url = f"{gateway.url}/memory/sessions/{session_id}/context"
    preview = httpx.post(url, json=body, headers=headers, timeout=10)
    assert preview.status_code == 200, preview.text
    items = preview.json()["input"]
    assert all(item.get("type") != "item_reference" for item in items)
    texts = [content_text(item["content"]) for item in items if item.get("type") == "message"]
    assert texts[-3:] == ["my dog is Rex", "ack: my dog is Rex", "what is my dog?"]
