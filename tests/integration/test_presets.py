"""Each seed's acceptance criteria, driven through the memory API against real Redis.

The summarizer is the fake upstream's ``fake-summarizer`` model; which prompt each job
sent is read back from the requests the fake upstream saw.
"""

from __future__ import annotations

from typing import Any

import httpx

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import ServerThread
from gateway.text.tokens import TokenCounter
from tests.support.clients import ranges
from tests.support.fixtures import GatewayFactory, on_one_redis_and_a_cluster

redis_server = on_one_redis_and_a_cluster()


def window(state: dict[str, Any]) -> list[int]:
    return [m["index"] for m in state["window"]]


def summarizer_kinds(fake: FakeUpstream) -> list[str]:
    kinds = []
    for request in fake.chat_requests():
        body = request.json()
        if body["model"] == "fake-summarizer":
            system = body["messages"][0]["content"]
            kinds.append(system.split("]", 1)[0].removeprefix("[memory-gateway:"))
    return kinds


def summarizer_prompts(fake: FakeUpstream, kind: str) -> list[str]:
    prompts = []
    for request in fake.chat_requests():
        body = request.json()
        if body["model"] == "fake-summarizer" and body["messages"][0]["content"].startswith(
            f"[memory-gateway:{kind}]"
        ):
            prompts.append("\n".join(m["content"] for m in body["messages"]))
    return prompts


def test_seed_000_rolling_window(
    make_gateway: GatewayFactory, memory_for: Any, fake_upstream: FakeUpstream
) -> None:
    memory = memory_for(make_gateway(memory={"preset": "rolling-window", "budget_tokens": 50_000}))
    memory.add(21)
    state = memory.flush()
    assert ranges(state) == [] and window(state) == list(range(1, 22))
    memory.add(1)  # the 22nd interaction
    state = memory.flush()
    assert ranges(state) == [(2, 22)] and window(state) == list(range(2, 23))
    for count in range(23, 86):
        memory.add(1)
        state = memory.state()
        assert len(state["window"]) <= 21
        if count in (43, 64, 85):
            state = memory.flush()
            assert ranges(state)[-1] == (count - 20, count)  # created at every 22nd
    assert ranges(state) == [(23, 43), (44, 64), (65, 85)]
    assert window(state) == list(range(65, 86))
    # newest summary first in what is forwarded
    receipt = memory.context()["receipt"]
    assert receipt["summaries"] == [{"start": 65, "end": 85}, {"start": 44, "end": 64},
                                    {"start": 23, "end": 43}]  # fmt: skip
    assert summarizer_kinds(fake_upstream) == ["chunk"] * 4


def test_seed_001_recursive_summary(
    make_gateway: GatewayFactory, memory_for: Any, fake_upstream: FakeUpstream
) -> None:
    memory = memory_for(make_gateway(memory={"preset": "recursive-summary"}))
    memory.add(10)
    assert memory.flush()["rolling_summary"] is None
    memory.add(1)  # message 11
    state = memory.flush()
    assert state["rolling_summary"]["range"] == {"start": 1, "end": 10}
    assert state["rolling_summary"]["version"] == 1
    assert window(state) == list(range(2, 12))
    memory.add(10)  # message 21: integrates 2-11
    state = memory.flush()
    assert state["rolling_summary"]["range"] == {"start": 1, "end": 11}
    assert state["rolling_summary"]["version"] == 2
    assert window(state) == list(range(12, 22))
    memory.add(10)  # message 31: integrates 12-21
    state = memory.flush()
    assert state["rolling_summary"]["range"] == {"start": 1, "end": 21}
    assert window(state) == list(range(22, 32))
    created, *updates = summarizer_prompts(fake_upstream, "recursive-create") + summarizer_prompts(
        fake_upstream, "recursive-update"
    )
    assert "Message 1 (User)" in created and "Message 10 (Assistant)" in created
    assert "Message 11" not in created
    assert "Message 2 (Assistant)" in updates[0] and "Message 11 (User)" in updates[0]
    assert "Message 12 (Assistant)" in updates[1] and "Message 21 (User)" in updates[1]
    assert "Message 11 (" not in updates[1]


def test_seed_001_summary_stays_under_its_token_limit(
    make_gateway: GatewayFactory, memory_for: Any
) -> None:
    tiers = {"window": {"messages": 10}, "recursive": {"limit_tokens": 300},
             "priority": ["window_keep", "rolling", "window"]}  # fmt: skip
    memory = memory_for(make_gateway(memory={"tiers": tiers, "budget_tokens": 50_000}))
    long_text = "message {i}: my detail number {i} is " + "quite long and specific " * 30
    counter = TokenCounter()
    for _ in range(8):
        memory.add(10, long_text)
        state = memory.flush()
        if state["rolling_summary"]:
            assert counter.count_text(state["rolling_summary"]["text"]) <= 300


def test_seed_002_rolling_summary(
    make_gateway: GatewayFactory, memory_for: Any, fake_upstream: FakeUpstream
) -> None:
    memory = memory_for(make_gateway(memory={"preset": "rolling-summary"}))
    per_turn: list[list[str]] = []
    for turn in range(1, 17):
        before = len(summarizer_kinds(fake_upstream))
        memory.add(2, "turn {i}: my value number {i} is v{i}")
        state = memory.flush()
        per_turn.append([k for k in summarizer_kinds(fake_upstream)[before:] if k != "key-qa"])
        assert len(state["rolling_summary"]["text"].split()) < 300
        assert state["rolling_summary"]["turn"] == turn
        if turn in (8, 12, 16):
            assert len(state["key_qa"]) <= 6  # pruned on compression
    compress_turns = [t for t, kinds in enumerate(per_turn, 1) if kinds == ["compress"]]
    fold_turns = [t for t, kinds in enumerate(per_turn, 1) if kinds == ["fold"]]
    assert compress_turns == [8, 12, 16], per_turn
    assert fold_turns == [t for t in range(1, 17) if t not in (8, 12, 16)]
    assert len(window(state)) == 6  # the last 3 turns verbatim
    context = memory.context()
    memory_message = context["messages"][0]["content"]
    assert "## Summary of the conversation so far" in memory_message
    assert "## Key questions and answers" in memory_message


def test_seed_003_progressive(make_gateway: GatewayFactory, memory_for: Any) -> None:
    memory = memory_for(make_gateway(memory={"preset": "progressive", "budget_tokens": 50_000}))
    memory.add(19, "message {i}: my fact{i} is value{i}")
    assert ranges(memory.flush()) == []
    memory.add(1)  # 20 buffered: the oldest 16 are summarized
    state = memory.flush()
    assert ranges(state) == [(1, 16)]
    assert window(state) == [17, 18, 19, 20]  # only what no summary covers
    assert len(state["facts"]) > 0
    memory.add(64, "message {i}: my fact{i} is value{i}")  # 84: five summaries
    state = memory.flush()
    assert ranges(state) == [(1, 16), (17, 32), (33, 48), (49, 64), (65, 80)]
    memory.add(16)  # 100: a sixth summary: more than 5 merge into one
    state = memory.flush()
    assert ranges(state) == [(1, 96)]
    assert len(state["facts"]) > 15
    memory_message = memory.context()["messages"][0]["content"]
    facts_section = memory_message.split("## Key facts\n", 1)[1].split("\n\n", 1)[0]
    assert len(facts_section.splitlines()) == 15  # capped in context


def test_seed_004_hybrid(make_gateway: GatewayFactory, memory_for: Any) -> None:
    memory = memory_for(make_gateway(memory={"preset": "hybrid", "budget_tokens": 50_000}))
    memory.add(14)
    assert ranges(memory.flush()) == []
    memory.add(1)
    assert ranges(memory.flush()) == [(1, 15)]
    memory.add(45)
    state = memory.flush()
    assert ranges(state) == [(1, 15), (16, 30), (31, 45), (46, 60)]
    assert window(state) == list(range(53, 61))
    for n, importance in enumerate([0.1, 0.9, 0.5, 0.95, 0.3, 0.7, 0.8]):
        response = memory.http.post(
            memory.base + "/pins", json={"content": f"pin {n}", "importance": importance}
        )
        assert response.status_code == 201
    receipt = memory.context()["receipt"]
    assert receipt["summaries"] == [{"start": 46, "end": 60}, {"start": 31, "end": 45},
                                    {"start": 16, "end": 30}]  # fmt: skip
    pins = {p["id"]: p["content"] for p in memory.state()["pins"]}
    top_five = ["pin 3", "pin 1", "pin 6", "pin 5", "pin 2"]  # importance .95 .9 .8 .7 .5
    assert [pins[p] for p in receipt["pins"]] == top_five


def test_seed_004_truncation_order_under_the_3000_token_budget(
    make_gateway: GatewayFactory, memory_for: Any
) -> None:
    memory = memory_for(make_gateway(memory={"preset": "hybrid"}))  # budget 3000
    memory.add(45, "message {i}: " + "a long and detailed line of conversation " * 40)
    memory.flush()
    for n in range(5):
        pin = {"content": f"pinned fact {n}: " + "detail " * 380, "importance": 0.5 + n / 10}
        assert memory.http.post(memory.base + "/pins", json=pin).status_code == 201
    receipt = memory.context()["receipt"]
    assert receipt["total_tokens"] <= 3000
    assert receipt["window_indexes"][-3:] == [43, 44, 45]  # last 3 messages always kept
    assert len(receipt["window_indexes"]) < 8  # older window messages gave way first
    assert len(receipt["pins"]) == 5  # then pins, by importance
    assert receipt["dropped"].get("summaries", 0) >= 1  # summaries give way before pins


def test_context_preview_is_exactly_what_the_proxy_forwards(
    gateway: ServerThread,
    memory_for: Any,
    fake_upstream: FakeUpstream,
    api_key: str,
    session_id: str,
) -> None:
    memory = memory_for(gateway)
    memory.add(40, "message {i}: my item{i} is thing{i}")
    memory.flush()
    question = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "what is my item3?"},
    ]
    body = {"model": "fake-model", "messages": question}
    preview = memory.http.post(memory.base + "/context", json=body).json()
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id},
    )
    assert response.status_code == 200
    assert fake_upstream.last_messages() == preview["messages"]
    assert response.headers["x-memory-context-tokens"] == str(preview["receipt"]["total_tokens"])
    assert preview["messages"][0] == {"role": "system", "content": "Be kind."}
    assert preview["messages"][1]["content"].startswith("[Conversation memory")
