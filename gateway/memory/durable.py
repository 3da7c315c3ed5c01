"""Durable facts: what a user states about themselves, kept and updated (pure).

Names, preferences, dates, numbers, decisions and "never do X" constraints outlive any
summary. Each fact gets a key naming what it is about ("seat", "dentist appointment",
"never schedule"), so that when the user changes their mind the newer fact wins and the
older one is marked superseded (kept for the record, never sent as current).

Notes:
    Keys are derived from the wording, not asked from a model, so the model's facts and
    the model-free ones agree: "my X is Y" keys on X; "I prefer / like / hate …" on the
    object's first words; "never / always / don't …" on the verb phrase with its numbers
    and times removed, so "never book before 10am" and later "never book before 9am"
    share a key and the second supersedes the first.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from gateway.memory.model import Fact, Message

_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
_PREFER = (
    r"\bi (?:really )?(?:prefer|like|love|hate|dislike|don't like|do not like) "
    r"(?P<key>[a-z][a-z -]{1,30})"
)
_RULE = (
    r"\b(?P<key>(?:never|always|don't ever|do not ever|please never|please always|"
    r"(?:nothing|no one|nobody|no meetings?) (?:should|must|may|can|shall))"
    r"\b[a-z ,'-]{3,60})"
)
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("is", re.compile(r"\bmy (?P<key>[a-z][a-z' -]{1,40}?) (?:is|are|was|will be)\b", re.I)),
    ("name", re.compile(r"\b(?:call me|my name's|i am called|i'm called) (?P<key>)", re.I)),
    ("allergy", re.compile(r"\b(?:i'm|i am) allergic to\b(?P<key>)", re.I)),
    ("prefer", re.compile(_PREFER, re.I)),
    ("rule", re.compile(_RULE, re.I)),
    ("live", re.compile(r"\bi (?:live|work|study) (?:in|at) (?P<key>)", re.I)),
)
_TIMEY = re.compile(
    r"\b(\d+(?:[:.]\d+)?\s*(?:am|pm|h|hours?|minutes?|days?)?|today|tomorrow|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday|anything|any|"
    r"from now on|actually|instead)\b",
    re.I,
)
MAX_FACT_CHARS = 240


@dataclass(frozen=True, slots=True)
class Found:
    key: str
    text: str
    index: int  # the (last) message it was said in
    start: int = 0  # the first message of the range it came from (0: ``index``)
    fallback: bool = False  # read from the user's words, not written by the model
    ts: float = 0.0  # when it was said (0: unknown)


def fact_key(kind: str, key: str) -> str:
    """A stable key: lower case, single spaces, no numbers or times."""
    key = _TIMEY.sub(" ", key.lower()) if kind in ("rule", "prefer") else key.lower()
    key = re.sub(r"[^a-z' -]", " ", key)
    words = key.split()[:4]
    label = {"name": "name", "allergy": "allergy", "live": "lives"}.get(kind, " ".join(words))
    return f"{kind}:{label}" if kind in ("rule", "prefer") else label


def key_of(text: str) -> str | None:
    """The key of one factual sentence, or None if it states no durable fact."""
    for kind, pattern in _PATTERNS:
        match = pattern.search(text)
        if match:
            key = fact_key(kind, match.group("key") or kind)
            return key or None
    return None


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def extract(messages: Sequence[Message]) -> list[Found]:
    """Durable facts the user stated, model-free: one per keyed sentence."""
    found: list[Found] = []
    for message in messages:
        if message.role != "user":
            continue  # the user's own words; the assistant's restatements add nothing
        for sentence in sentences(message.text):
            key = key_of(sentence)
            if key is not None:
                text = sentence[:MAX_FACT_CHARS]
                found.append(Found(key, text, message.index, fallback=True, ts=message.ts))
    return found


def keyed(texts: Iterable[str], start: int, end: int, ts: float = 0.0) -> list[Found]:
    """The model's facts (plain sentences) with keys; unkeyable ones keep their words.
    ``ts``: when the last message they were read from was said."""
    out = []
    for text in texts:
        key = key_of(text) or " ".join(re.sub(r"[^a-z0-9 ]", " ", text.lower()).split()[:5])
        out.append(Found(key, text[:MAX_FACT_CHARS], end, start, ts=ts))
    return out


def merge(facts: tuple[Fact, ...], found: Sequence[Found], keep: int) -> tuple[Fact, ...]:
    """Add new facts; an older current fact with the same key becomes superseded."""
    merged = list(facts)
    # The current facts of each key, by position: looking them up by scanning ``merged``
    # made a long fallback extraction quadratic (15 messages of 100 KB: 3.5 s).
    current_of: dict[str, list[int]] = {}
    for i, fact in enumerate(merged):
        if not fact.superseded:
            current_of.setdefault(fact.key, []).append(i)
    # What a correction replaced, by key: found again (a job over the messages that said
    # it, an edit's re-extraction), it does not come back over the correction.
    replaced: dict[str, set[str]] = {}
    fixed = corrected_keys(merged)
    for fact in merged:
        if fact.superseded and fact.key in fixed:
            replaced.setdefault(fact.key, set()).add(normal(fact.text))
    for new in found:
        same = current_of.get(new.key, [])
        if any(normal(merged[i].text) == normal(new.text) for i in same):
            continue  # said again: nothing new
        if normal(new.text) in replaced.get(new.key, ()):
            continue  # what a correction replaced
        for i in same:
            merged[i] = replace(merged[i], superseded=True)
        current_of[new.key] = [len(merged)]
        merged.append(
            Fact(
                new.text,
                new.start or new.index,
                new.index,
                key=new.key,
                fallback=new.fallback,
                ts=new.ts,
            )
        )
    current = [f for f in merged if not f.superseded]
    superseded = [f for f in merged if f.superseded]
    # Bounded: current facts first; the oldest superseded ones go when space runs out.
    room = max(0, keep - len(current))
    kept = set(map(id, current[-keep:])) | set(map(id, superseded[-room:] if room else []))
    return tuple(f for f in merged if id(f) in kept)


def union(fact_lists: Sequence[Sequence[str]], keep: int) -> list[str]:
    """Facts of several sessions, oldest session first: the newer wins per key."""
    found = [Found(key_of(text) or normal(text), text, 0) for texts in fact_lists for text in texts]
    return [fact.text for fact in current(merge((), found, keep=keep * 2))][-keep:]


def corrected_keys(facts: Iterable[Fact]) -> frozenset[str]:
    """The keys whose current fact is a correction."""
    return frozenset(f.key for f in facts if f.corrected and not f.superseded)


def fact_id(fact: Fact) -> str:
    """A fact's id in the memory API: stable while the fact is stored (derived from what
    it says and where it came from; a correction is a new fact, with a new id)."""
    said = f"{fact.key}\x00{fact.text}\x00{fact.start}\x00{fact.end}\x00{fact.ts!r}"
    return "fact_" + hashlib.sha256(said.encode()).hexdigest()[:16]


def find(facts: Sequence[Fact], wanted: str) -> int | None:
    """The position of the fact with id ``wanted``, if there is one."""
    return next((i for i, fact in enumerate(facts) if fact_id(fact) == wanted), None)


def correct(facts: tuple[Fact, ...], position: int, text: str, now: float) -> tuple[Fact, ...]:
    """The facts with ``facts[position]`` replaced by ``text``: the old one superseded (kept
    for the record), the correction current, on the same key and source messages so that
    it takes the old one's place, and winning over the old wording found again."""
    old = facts[position]
    fixed = Fact(text[:MAX_FACT_CHARS], old.start, old.end, key=old.key or normal(old.text),
                 ts=now, corrected=True)  # fmt: skip

    def goes(i: int, fact: Fact) -> bool:
        # Every current fact of the key (one, unless stored by an older version).
        return i == position or (bool(old.key) and fact.key == old.key)

    superseded = tuple(
        replace(f, superseded=True) if goes(i, f) else f for i, f in enumerate(facts)
    )
    return (*superseded, fixed)


def without(facts: tuple[Fact, ...], position: int) -> tuple[Fact, ...]:
    """The facts without ``facts[position]`` (a fact the user wants gone is gone, not kept
    superseded)."""
    return facts[:position] + facts[position + 1 :]


def current(facts: Iterable[Fact]) -> list[Fact]:
    return [f for f in facts if not f.superseded]


def normal(text: str) -> str:
    """Text compared as words: lower case, letters and digits only."""
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", text.lower()).split())
