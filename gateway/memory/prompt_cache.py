"""A model of provider prompt caching: how much of a prompt a provider can reuse.

Providers bill a prompt prefix they have seen recently at a fraction of its price, and
local servers skip its prefill. What they can reuse is the longest common prefix (LCP)
of this request's prompt tokens with an earlier one's, counted by a policy:

    openai   cached only from 1,024 common tokens, in 128-token steps:
             1024 + 128 * floor((lcp - 1024) / 128), else 0 (OpenAI's automatic caching)
    prefix   the whole common prefix (vLLM's automatic prefix caching, llama.cpp's
             prompt cache)
    none     nothing (a provider without a cache, or with it off)

Pure: token ids (or a prefix length already measured) in, a number of tokens out. The
model compares with one previous prompt, the session's last, as a local server with one
slot does; a provider that keeps several prefixes can only cache more.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal

CachePolicy = Literal["openai", "prefix", "none"]
POLICIES: tuple[CachePolicy, ...] = ("openai", "prefix", "none")

OPENAI_MINIMUM = 1024  # the shortest prefix OpenAI caches
OPENAI_STEP = 128  # past the minimum, it caches in steps of this many tokens


def common_prefix(current: Sequence[int], previous: Sequence[int]) -> int:
    """The number of leading tokens the two prompts share."""
    n = 0
    for a, b in zip(current, previous, strict=False):
        if a != b:
            break
        n += 1
    return n


def cacheable_tokens(
    policy: CachePolicy,
    common: int,
    *,
    minimum: int = OPENAI_MINIMUM,
    step: int = OPENAI_STEP,
) -> int:
    """The tokens of a prompt the provider can reuse, given its common prefix's length.

    ``minimum`` and ``step`` are the ``openai`` policy's (other providers with a minimum
    and a granularity can be modelled with their own); ``prefix`` and ``none`` ignore them.
    """
    if common < 0:
        raise ValueError("a common prefix cannot be negative")
    if policy == "none":
        return 0
    if policy == "prefix":
        return common
    if policy == "openai":
        if minimum <= 0 or step <= 0:
            raise ValueError("the minimum and the step must be positive")
        if common < minimum:
            return 0
        return minimum + step * ((common - minimum) // step)
    raise ValueError(f"unknown prompt cache policy: {policy!r}")


def cached_tokens(
    policy: CachePolicy,
    current: Sequence[int],
    previous: Sequence[int] | None,
    *,
    minimum: int = OPENAI_MINIMUM,
    step: int = OPENAI_STEP,
) -> int:
    """The tokens of ``current`` reusable after ``previous`` (none: a first prompt)."""
    if previous is None:
        return 0
    common = common_prefix(current, previous)
    return cacheable_tokens(policy, common, minimum=minimum, step=step)


def billed_equivalent(prompt_tokens: int, cached: int, discount: float) -> float:
    """What a prompt costs in full-price tokens when ``cached`` of its ``prompt_tokens``
    are billed ``discount`` off (0.5: half price; 0.9: a tenth):
    uncached + cached * (1 - discount)."""
    if not 0 <= cached <= prompt_tokens:
        raise ValueError("cached tokens must be between 0 and the prompt's tokens")
    if not 0 <= discount <= 1:
        raise ValueError("the discount is a fraction between 0 and 1")
    return (prompt_tokens - cached) + cached * (1 - discount)


# --- What a session forwarded last: a fingerprint of its messages ----------------------
#
# The gateway cannot see the provider's tokens, but it knows each forwarded message and
# its token count: a context's fingerprint is, per message, a short hash of what it sends
# and its tokens. Two contexts share the tokens of their leading messages whose hashes
# agree (a message that differs part-way counts as not shared: a lower bound).

_HASH_BYTES = 6  # 48 bits a message: a chance collision in a session is negligible


def message_print(sent: bytes, tokens: int) -> str:
    """One message's part of a fingerprint: the hash of its forwarded bytes, its tokens."""
    return f"{hashlib.blake2b(sent, digest_size=_HASH_BYTES).hexdigest()}:{tokens}"


def fingerprint(prints: Sequence[str]) -> str:
    return " ".join(prints)


def shared_tokens(current: str, previous: str) -> int:
    """The tokens of the leading messages the two fingerprints have in common. The
    previous one is read back from the session's meta: split only as far as the current
    one goes, whatever its length."""
    ours = current.split()
    shared = 0
    for a, b in zip(ours, previous.split(maxsplit=len(ours)), strict=False):
        tokens = a.rpartition(":")[2]
        if a != b or not tokens.isdigit():
            break
        shared += int(tokens)
    return shared
