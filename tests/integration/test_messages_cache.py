"""Anthropic's prompt cache through the gateway: a session replayed turn by turn, its
usage read as the upstream bills it (``cache_read_input_tokens``). The fake upstream
caches as Anthropic does: prefixes ending at a ``cache_control`` mark, read back from a
later request's marks (``devsupport/fake_anthropic_cache``)."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from devsupport.fake_upstream import FakeUpstream
from tests.integration.test_prompt_cache import MEDIUM  # messages of ~40 tokens
from tests.support.clients import Memory
from tests.support.fixtures import GatewayFactory
from tests.support.metrics import moved, scrape

QUESTIONS = [f"Tell me more about topic {t} and the river, please." for t in range(6)]


def replay(gateway_url: str, key: str, session: str) -> list[dict[str, Any]]:
    """Six turns of a live conversation; each answer's usage."""
    usages = []
    with anthropic.Anthropic(
        base_url=gateway_url, api_key=key, default_headers={"X-Session-Id": session}, max_retries=0
    ) as client:
        for question in QUESTIONS:
            answer = client.messages.create(
                model="claude-fake",
                max_tokens=200,
                system="You are a helpful assistant.",
                messages=[{"role": "user", "content": question}],
            )
            usages.append(answer.usage.model_dump())
    return usages


def read_share(usages: list[dict[str, Any]]) -> float:
    """Of the prompts after the first, the share the cache served."""
    later = usages[1:]
    read = sum(u["cache_read_input_tokens"] or 0 for u in later)
    total = sum(
        u["input_tokens"]
        + (u["cache_read_input_tokens"] or 0)
        + (u["cache_creation_input_tokens"] or 0)
        for u in later
    )
    return read / total


@pytest.mark.parametrize("stable", [True, False])
def test_the_stable_part_is_read_from_the_cache_turn_after_turn(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    api_key: str,
    session_id: str,
    stable: bool,
) -> None:
    fake_upstream.anthropic.cache.min_tokens = 64  # prompts of a test's size are cached
    gateway = make_gateway(memory={"preset": "hybrid-recall", "stable_layout": stable})
    memory = Memory(gateway, api_key, session_id)
    memory.add(120, MEDIUM)
    memory.flush()
    before = scrape(gateway.url)
    usages = replay(gateway.url, api_key, session_id)
    # What Anthropic read from its cache is counted as the upstream's cached tokens.
    read = sum(u["cache_read_input_tokens"] or 0 for u in usages)
    after = scrape(gateway.url)
    assert moved(before, after, "memory_gateway_upstream_cached_tokens_total") == read
    # Counted under their own route, as chat's are under theirs (not "unmatched").
    counted = moved(before, after, "memory_gateway_requests_total", route="/v1/messages",
                    method="POST", status="200")  # fmt: skip
    assert counted == len(QUESTIONS)
    bodies = [r.json() for r in fake_upstream.messages_requests()]
    assert all(
        sum("cache_control" in b for m in body["messages"] for b in m["content"]) <= 1
        for body in bodies
    )
    share = read_share(usages)
    if stable:
        # The memory, the window and the client's prompt: all but the last answer, the
        # recalled excerpts and the new message.
        assert share > 0.6, usages
        assert all(u["cache_read_input_tokens"] for u in usages[1:]), usages
    else:
        # Rebuilt every turn, the memory changes with each question, and everything after
        # the client's prompt with it: no mark, as a write no turn reads costs 1.25 times.
        assert share == 0
        assert not any(u["cache_creation_input_tokens"] for u in usages), usages
