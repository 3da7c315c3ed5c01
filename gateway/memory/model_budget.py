"""How many tokens a request's context may take, given the model it goes to (pure).

``memory.budget_tokens`` is one number for every model; a small local model takes less
(llama.cpp's default context is 2,048 tokens, under the default budget of 3,000). The
budget of a request is the smaller of the two: what the configuration allows and what
the model can take with room left for its answer. ``assemble`` counts the prompt and the
new turn inside the budget, and sends them even when they alone are over it: a request
too long for the model reaches the upstream, which answers in its own words.

When the model's window is not configured (or the gateway's count differs from the
model's own tokenizer), the upstream's refusal says so: ``context_overflow`` reads it
(OpenAI's ``context_length_exceeded``, llama.cpp's ``exceed_context_size_error``, vLLM's
"maximum context length" message) and ``retry_budget`` gives a budget that fits, from the
limit the upstream stated when it stated one.
"""

from __future__ import annotations

import fnmatch
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway import codec

# Room kept for the answer when neither the configuration nor the request says: a
# quarter of the window, at most this.
_DEFAULT_RESERVE = 512
# The gateway's estimate and the model's tokenizer differ; a retry aims this far below
# what the upstream said fits.
_RETRY_MARGIN = 0.9
# An upstream that refused without saying its window: retry within what the smallest
# window in common use takes (llama.cpp's default, 2,048 tokens, less room for an answer).
_UNSTATED_RETRY = 1024

# Words an upstream uses to refuse a prompt longer than its window (and nothing else: a
# retry is only for this).
_OVERFLOW_WORDS = re.compile(
    r"maximum context length|exceeds? the (?:available )?context|context[ _](?:length|window|size)"
    r"[ _](?:exceeded|is exceeded)|prompt is too long|input is too long for the model",
    re.IGNORECASE,
)
_OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_STATED_LIMIT = re.compile(r"maximum context length is (\d[\d,]*) tokens", re.IGNORECASE)
_STATED_COUNT = re.compile(
    r"resulted in (\d[\d,]*) tokens|\((\d[\d,]*) in the messages|requested (\d[\d,]*) tokens",
    re.IGNORECASE,
)


class ModelEntry(Protocol):
    """One ``models:`` entry (``gateway.config.ModelLimits``)."""

    @property
    def match(self) -> str: ...
    @property
    def context_tokens(self) -> int: ...
    @property
    def output_reserve_tokens(self) -> int | None: ...


def entry_for(model: str, entries: Sequence[ModelEntry]) -> ModelEntry | None:
    """The first entry whose name or glob pattern matches ``model`` (case-insensitive)."""
    name = model.casefold()
    for entry in entries:
        if fnmatch.fnmatchcase(name, entry.match.casefold()):
            return entry
    return None


def requested_output(body: Mapping[str, Any]) -> int | None:
    """The answer's length the request asks room for (``max_completion_tokens`` or the
    older ``max_tokens``), when it asks."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _reserve(context_tokens: int, configured: int | None, requested: int | None) -> int:
    if requested is not None:
        return requested  # OpenAI refuses a prompt plus max_tokens over the window
    if configured is not None:
        return configured
    return min(_DEFAULT_RESERVE, context_tokens // 4)


def model_budget(budget_tokens: int, entry: ModelEntry | None, requested: int | None = None) -> int:
    """The request's budget: ``budget_tokens``, or less when the model's window minus
    the room for its answer is smaller (never under 1: ``assemble`` still sends the
    prompt and the new turn)."""
    if entry is None:
        return budget_tokens
    room = entry.context_tokens - _reserve(
        entry.context_tokens, entry.output_reserve_tokens, requested
    )
    return max(1, min(budget_tokens, room))


@dataclass(frozen=True, slots=True)
class Overflow:
    """An upstream's refusal of a prompt too long for its window, with the numbers it
    gave (``limit``: the window; ``counted``: the prompt's tokens by its count)."""

    limit: int | None = None
    counted: int | None = None


def _number(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and value.replace(",", "").isdigit():
        return int(value.replace(",", "")) or None
    return None


def context_overflow(status: int, body: bytes) -> Overflow | None:
    """The refusal in an upstream's error answer, or None for any other answer."""
    if status != 400 or len(body) > 64 * 1024:  # an error body is small
        return None
    try:
        parsed = codec.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    error = parsed.get("error", parsed)
    if isinstance(error, str):
        error = {"message": error}
    if not isinstance(error, dict):
        return None
    message = error.get("message")
    message = message if isinstance(message, str) else ""
    if not (
        error.get("code") in _OVERFLOW_CODES
        or error.get("type") in _OVERFLOW_CODES
        or _OVERFLOW_WORDS.search(message)
    ):
        return None
    limit = _number(error.get("n_ctx"))  # llama.cpp
    counted = _number(error.get("n_prompt_tokens"))
    if limit is None and (found := _STATED_LIMIT.search(message)):
        limit = _number(found.group(1))
    if counted is None and (found := _STATED_COUNT.search(message)):
        counted = _number(next(group for group in found.groups() if group))
    return Overflow(limit, counted)


def retry_budget(sent_tokens: int, overflow: Overflow, requested: int | None = None) -> int:
    """A budget for the one retry after ``overflow``, given the tokens the refused
    context took by the gateway's count.

    With the upstream's limit and count, the refused context scaled to fit (the two
    counts differ by tokenizer); with its limit only, that limit or half of what was
    sent, the smaller; with neither, half of what was sent or what a 2,048-token model
    takes, the smaller (one retry, so it aims low).
    """
    half = max(1, sent_tokens // 2)
    if overflow.limit is None:
        return min(half, _UNSTATED_RETRY)
    room = overflow.limit - _reserve(overflow.limit, None, requested)
    if overflow.counted:
        scaled = int(room * sent_tokens / overflow.counted * _RETRY_MARGIN)
        return max(1, min(scaled, sent_tokens - 1))
    return max(1, min(half, int(room * _RETRY_MARGIN)))


class Ceilings:
    """The budgets that fitted after a model's refusals, per model name, for a while:
    the next requests to that model are planned within them at once, instead of each
    being refused first (an extra upstream call a turn). They expire (``ttl_s``) so that
    a model restarted with a larger window gets the whole budget back; at most
    ``entries`` models are kept (any name a client sends is a model name)."""

    def __init__(self, ttl_s: float = 600.0, entries: int = 256) -> None:
        self.ttl_s = ttl_s
        self.entries = entries
        self._budgets: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def bound(self, model: str, budget: int, now: float) -> int:
        """``budget``, or the smaller one that fitted ``model`` lately."""
        if not self._budgets:
            return budget
        found = self._budgets.get(model)
        if found is None:
            return budget
        ceiling, until = found
        if now >= until:
            del self._budgets[model]
            return budget
        return min(budget, ceiling)

    def fitted(self, model: str, budget: int, now: float) -> None:
        """``budget`` fitted ``model`` after a refusal of a larger context."""
        self._budgets[model] = (budget, now + self.ttl_s)
        self._budgets.move_to_end(model)
        while len(self._budgets) > self.entries:
            self._budgets.popitem(last=False)
