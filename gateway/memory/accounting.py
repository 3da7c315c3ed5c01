"""How many tokens a request's messages are, as the gateway counted them (pure).

The metrics, the access line and the stored receipt report it; it is counted here, from
what planning already counted, so that reporting never tokenizes a resent history again.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.memory.counting import TOKENS_PER_MESSAGE, TOKENS_PER_REPLY
from gateway.memory.model import PROMPT_ROLES, Message
from gateway.memory.reconcile import Reconciled


def _estimate(messages: Sequence[Message]) -> int:
    """~4 characters a token: what nothing counted. Tokenizing a whole resent history
    would cost more than the metric is worth; a plain string (the usual content) is
    measured without building its text."""
    chars = 0
    for message in messages:
        content = message.content
        chars += len(content) if isinstance(content, str) else len(message.text)
    return TOKENS_PER_MESSAGE * len(messages) + chars // 4


def tokens_sent(messages: Sequence[Message], plan: Reconciled) -> int:
    """Tokens of the request's messages as the gateway counted them, without recounting.

    The prompt and the new messages were counted when planned; a resent history lines up,
    from its end, with the stored conversation (``plan.prior``), whose messages carry
    their count; what does not line up, or goes past the loaded tail, is estimated.
    """
    total = TOKENS_PER_REPLY + sum(m.tokens for m in plan.prompt) + sum(m.tokens for m in plan.new)
    history = [m for m in messages if m.role not in PROMPT_ROLES]
    history = history[: len(history) - len(plan.new)]
    prior = plan.prior
    lined_up = min(len(history), len(prior))
    unknown = history[: len(history) - lined_up]
    for back in range(1, lined_up + 1):
        known, message = prior[-back], history[-back]
        # Content equality, not ``same_turn_as``: a cheap check is enough for a count.
        if known.tokens and known.role == message.role and known.content == message.content:
            total += known.tokens
        else:
            unknown.append(message)
    return total + _estimate(unknown)
