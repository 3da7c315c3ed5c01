"""The window's always-sent messages keep their images only within the budget.

Before, the window's ``keep_last`` messages were sent whole: stored images made a turn
forward 510k tokens against a 3,000-token budget. Their images now give way to their
placeholder text, the oldest first; the images of the turn's own new message go as sent.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory import images as media
from gateway.memory.assemble import Context
from gateway.memory.counting import TOKENS_PER_REPLY
from gateway.memory.layout import build_context
from gateway.memory.model import Message, Tiers
from gateway.memory.reconcile import Reconciled
from gateway.memory.window_images import images_within
from gateway.presets import PRESETS, Composition, StableLayout
from gateway.text.tokens import TokenCounter

COUNTER = TokenCounter()
COUNT = COUNTER.count_text
# (width, height) of the images: a phone's screenshot is 1,445 tokens at high detail.
SIZES = [(1170, 2532), (1024, 1024), (512, 512), (4000, 3000), (64, 64)]
COMPOSITIONS: dict[str, Composition] = {
    **PRESETS,
    "hybrid-recall, cache-stable": PRESETS["hybrid-recall"].model_copy(
        update={"stable": StableLayout()}
    ),
}


def stored_image(n: int, size: tuple[int, int], detail: str | None = None) -> dict[str, Any]:
    """An image as memory holds it: a reference to its bytes, with its size and tokens."""
    sha = hashlib.sha256(f"image {n}".encode()).hexdigest()
    inner: dict[str, Any] = {"url": media.REF_PREFIX + sha}
    if detail is not None:
        inner["detail"] = detail
    tokens = media.image_tokens(*size, detail)
    media_ = {"sha256": sha, "mime": "image/png", "bytes": 4096, "width": size[0],
              "height": size[1], "tokens": tokens}  # fmt: skip
    return {"type": "image_url", "image_url": inner, "media": media_}


def counted(message: Message) -> Message:
    return message.but(tokens=COUNTER.count_message(message))


def with_images(role: str, text: str, images: list[dict[str, Any]], index: int) -> Message:
    content = [{"type": "text", "text": text}, *images]
    return counted(Message(role=role, content=content, index=index, ts=1.7e9 + index))


def session(images_per_message: list[int], first_image: int = 0) -> tuple[Message, ...]:
    """Stored messages, user and assistant in turn, the users' carrying images."""
    out, n = [], first_image
    for i, count in enumerate(images_per_message, start=1):
        if i % 2:
            images = [stored_image(n + k, SIZES[(n + k) % len(SIZES)]) for k in range(count)]
            n += count
            out.append(with_images("user", f"look at these, number {i}", images, i))
        else:
            out.append(counted(Message(role="assistant", content=f"seen {i}", index=i)))
    return tuple(out)


def forward(
    prior: tuple[Message, ...], new: Message, budget: int, composition: Composition
) -> Context:
    prompt = (counted(Message(role="system", content="You are helpful.")),)
    plan = Reconciled(prompt=prompt, prior=prior, to_record=(new,), new=(new,))
    return build_context(
        plan,
        tiers=Tiers(),
        pins=(),
        composition=composition,
        budget_tokens=budget,
        memory_role="system",
        count=COUNT,
        now=1.7e9 + 1000,
    )


def images_of(messages: tuple[Message, ...] | list[Message]) -> list[dict[str, Any]]:
    return [
        part
        for message in messages
        if isinstance(message.content, list)
        for part in message.content
        if media.is_image(part)
    ]


def test_a_window_of_500k_tokens_of_images_is_sent_within_the_budget() -> None:
    # Two user messages of 360 images each among the last three: 502k tokens.
    prior = session([360, 0, 360, 0])
    assert sum(m.tokens for m in prior) > 500_000
    question = with_images("user", "and this one?", [stored_image(999, (1024, 1024))], 5)
    context = forward(prior, question, 3000, PRESETS["hybrid-recall"])
    assert context.receipt.total_tokens <= 3000 + question.tokens
    assert context.messages[-1] is question  # the client's own image goes as sent
    # The window's messages are there, their oldest images as a placeholder the model can
    # read; the newest of them, as many as the budget leaves room for, as they were.
    window = [m for m in context.messages if m.index in (1, 2, 3, 4)]
    assert [m.index for m in window] == [2, 3, 4]
    sent = images_of(window)
    assert 0 < len(sent) < 5 and sent == images_of([prior[2]])[360 - len(sent) :]
    assert window[1].content[:2] == [
        {"type": "text", "text": "look at these, number 3"},
        {"type": "text", "text": f"[{360 - len(sent)} images]"},
    ]
    assert images_of(context.messages) == sent + images_of([question])
    assert context.receipt.tiers["window"] == sum(m.tokens for m in window)


def test_images_that_fit_are_sent_and_the_oldest_give_way_first() -> None:
    prior = session([2, 0, 2, 0])  # 1,105 + 765 + 1,105 + 765 tokens of images
    question = counted(Message(role="user", content="which is bigger?"))
    roomy = forward(prior, question, 10_000, PRESETS["hybrid"])
    assert len(images_of(roomy.messages)) == 4  # within the budget: nothing changes
    tight = forward(prior, question, 2_500, PRESETS["hybrid"])
    assert tight.receipt.total_tokens <= 2_500
    kept = images_of(tight.messages)
    assert kept == images_of([prior[2]])[len(images_of([prior[2]])) - len(kept) :]
    assert kept, "the newest images fit: they are sent"


def test_images_within_leaves_units_past_keep_and_under_room_alone() -> None:
    prior = session([3, 0, 3])
    units = [(prior[2],), (prior[1],), (prior[0],)]
    assert images_within(units, 2, 10**6, COUNT) == units
    out = images_within(units, 2, 0, COUNT)
    assert out[2] == units[2]  # not always sent: the window's own budget decides
    assert not images_of(list(out[0]) + list(out[1]))
    assert out[0][0].tokens < prior[2].tokens and out[0][0].index == prior[2].index


@settings(max_examples=60, deadline=None)
@given(
    images=st.lists(st.integers(0, 240), min_size=1, max_size=9),
    new_images=st.integers(0, 3),
    budget=st.sampled_from([800, 3000, 8000, 30_000]),
    preset=st.sampled_from(sorted(COMPOSITIONS)),
    detail=st.sampled_from([None, "low"]),
)
def test_the_window_never_takes_the_context_past_the_budget_with_its_images(
    images: list[int], new_images: int, budget: int, preset: str, detail: str | None
) -> None:
    prior = session(images)
    if detail is not None:
        prior = tuple(_low(m) for m in prior)
    own = [stored_image(10_000 + k, SIZES[k], detail) for k in range(new_images)]
    question = with_images("user", "what do you see now?", own, 0)
    context = forward(prior, question, budget, COMPOSITIONS[preset])
    receipt = context.receipt
    # Within the budget, beside the client's own new message (always sent as it is).
    assert receipt.total_tokens <= budget + question.tokens
    assert receipt.total_tokens == sum(m.tokens for m in context.messages) + TOKENS_PER_REPLY
    assert context.messages[-1] is question
    # Every window message is a stored one, its images sent or as their placeholders.
    for message in context.messages[1:-1]:
        if not message.index:
            continue  # the memory message
        stored = prior[message.index - 1]
        assert message.tool_calls == stored.tool_calls and message.role == stored.role
        if message.content != stored.content:
            # Its first images as one placeholder where the first was; the others as sent.
            gone = len(images_of([stored])) - len(images_of([message]))
            assert gone > 0 and images_of([message]) == images_of([stored])[gone:]
            first = stored.content.index(images_of([stored])[0])
            one = media.placeholder(stored.content[first])
            text = one if gone == 1 else f"[{gone} images]"
            assert message.content[first] == {"type": "text", "text": text}
            assert message.content[:first] == stored.content[:first]
            assert message.tokens < stored.tokens


def _low(message: Message) -> Message:
    if not isinstance(message.content, list):
        return message
    parts = [
        {
            **p,
            "image_url": {**p["image_url"], "detail": "low"},
            "media": {**p["media"], "tokens": 85},
        }
        if media.is_image(p)
        else p
        for p in message.content
    ]
    return counted(replace(message, content=parts))
