"""Recall's sentence encoder through the real gateway: a fact asked for in other words is
recalled with it, and a message sharing the question's words is without it."""

from __future__ import annotations

from typing import Any

from tests.support.clients import Memory, import_all
from tests.support.fixtures import GatewayFactory

FILLER = [
    "Could you suggest a good way to structure the weekly planning meeting?",
    "Let us go over the budget spreadsheet again and tidy the categories.",
    "I was reading about sourdough starters and hydration levels yesterday.",
    "The garden needs watering twice a week when the weather is warm.",
]
ANSWER = "We were introduced at a friend's wedding in Porto, and married two years later."
# Shares the question's words, not its meaning.
DECOY = "Did you meet the deadline first? My wife asked where the report went."
QUESTION = "Where did you first meet your wife?"


def _conversation() -> list[dict[str, str]]:
    planted = {5: ANSWER, 11: DECOY}
    messages = []
    for index in range(1, 31):
        text = planted.get(index) or FILLER[index % len(FILLER)]
        messages.append({"role": "user" if index % 2 else "assistant", "content": text})
    return messages


def _tiers(encoder: dict[str, Any] | None) -> dict[str, Any]:
    recall: dict[str, Any] = {"hits": 1, "min_score": 0.05}
    if encoder is not None:
        recall["encoder"] = encoder
    return {
        "window": {"messages": 4, "keep_last": 2},
        "recall": recall,
        "priority": ["window_keep", "recall", "window"],
    }


def test_the_encoder_recalls_a_fact_asked_for_in_other_words(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    plain_gateway = make_gateway(memory={"tiers": _tiers(None)})
    plain = Memory(plain_gateway, api_key, session_id)
    import_all(plain, _conversation())
    assert plain.context(QUESTION)["receipt"]["recalled"] == ["11"]  # the shared words
    # Gateways sharing a Redis share its job stream: they must share one configuration.
    plain_gateway.stop()

    gateway = make_gateway(memory={"tiers": _tiers({"weight": 0.9})})
    encoded = Memory(gateway, api_key, session_id + "-e")
    import_all(encoded, _conversation())  # the flushes run the encoding jobs
    assert encoded.context(QUESTION)["receipt"]["recalled"] == ["5"]
