"""The window's images within the budget (pure).

The window's newest messages are always sent (``WindowTier.keep_last``), whatever their
size, and so were their images: a session whose last messages held hundreds of stored
images forwarded 510k tokens against a 3,000-token budget, on every turn. Now those
images give way, the oldest first, to a placeholder text the model can read (one image's
is ``images.placeholder``: "[image 1024x768, sha256 3f2c9a1b…]"; several of one message
become one "[12 images]"), until the always-sent messages fit what the budget leaves
after the prompt and the new messages. The new messages are not the window: the images the
client sends with this turn go as it sent them.

The rest of the window needs nothing of this: a message beyond ``keep_last`` is sent only
when it fits the budget whole, images included.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.memory import images as media
from gateway.memory.block import Count
from gateway.memory.model import Message

Unit = tuple[Message, ...]


def images_within(units: Sequence[Unit], keep: int, room: int, count: Count) -> list[Unit]:
    """``units`` (newest first) with images of the ``keep`` newest sent as placeholders,
    the oldest first, while those units take more than ``room`` tokens."""
    over = sum(m.tokens for unit in units[:keep] for m in unit) - room
    out = list(units)
    for n in reversed(range(min(keep, len(out)))):  # the oldest always-sent unit first
        if over <= 0:
            break
        unit = []
        for message in out[n]:
            if over > 0:
                message, saved = _placeheld(message, over, count)
                over -= saved
            unit.append(message)
        out[n] = tuple(unit)
    return out


def _placeheld(message: Message, over: int, count: Count) -> tuple[Message, int]:
    """The message with its first images (as few as save ``over`` tokens, or all) as one
    placeholder, where the first of them was; and the tokens saved. One text for all of
    them: a placeholder each would be words enough to pass the budget for hundreds."""
    content = message.content
    if not isinstance(content, list):
        return message, 0
    images = [j for j, part in enumerate(content) if media.is_image(part)]
    image_tokens = saved = 0
    text = ""
    given: list[int] = []
    for j in images:
        image_tokens += media.part_tokens(content[j])
        given.append(j)
        text = media.placeholder(content[j]) if len(given) == 1 else f"[{len(given)} images]"
        # The placeholder's words, and the break that joins it to the message's text.
        saved = image_tokens - count(text) - 1
        if saved >= over:
            break
    if saved <= 0:
        return message, 0
    gone = set(given[1:])
    parts = [
        {"type": "text", "text": text} if j == given[0] else part
        for j, part in enumerate(content)
        if j not in gone
    ]
    return message.with_content(parts, message.tokens - saved), saved
