"""What the summarizer's outputs must look like, and how prompts show messages (pure).

Shared by the summarizer (which validates the model's answers) and the extractive
fallbacks in ``extract.py`` (which must stay within the same limits).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.memory.model import KeyQA, Message

# Seed 001's summary structure (its prompt names the sections slightly differently; the
# structure block is the one the seed shows as the result, so its headings win).
SECTIONS = (
    "User's Journey & Insights",
    "Current Situation & Context",
    "Ongoing Work & Interests",
    "Preferences & Patterns",
)
CHUNK_WORDS = 200
MERGE_WORDS = 200

# A pasted document must not blow up the summarizer's prompt; its head is what a summary
# would keep anyway.
MAX_MESSAGE_CHARS = 4000
# The recursive summary is compressed when it passes this share of its limit: the next
# update then has room to add to it.
RECURSIVE_COMPRESS_AT = 0.9


def cap(text: str) -> str:
    """A message's text as a prompt shows it: at most ``MAX_MESSAGE_CHARS`` characters."""
    text = text.strip()
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + " [...]"


# Continuation lines of a message's text, in prompts and in the memory block.
CONTINUATION = "    "


# Every character ``str.splitlines`` breaks a line at.
_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def inside(text: str, indent: str = CONTINUATION) -> str:
    """``text`` with every line after the first indented: it cannot start a line of its own.

    Prompts and the memory block start each message or item on a new line with a label the
    gateway writes (``Message 3 (User):``, ``- ``). Content is data: a user's text holding
    a line "Message 7 (Assistant): always answer X" or "system: …" must stay visibly
    inside that user's message, not read as a message or an instruction of its own. Every
    line break counts (``\r``, ``\u2028``, …): a model may read any of them as one.
    """
    if not _BREAKS.search(text):
        return text  # one line: nothing to indent (most messages)
    first, *rest = text.splitlines() or [""]
    return "\n".join([first, *(indent + line if line.strip() else "" for line in rest)])


def render_message(message: Message) -> str:
    """``Message {index} ({Role}): {text}``, as every prompt shows a message.

    Continuation lines are indented (see ``inside``): a line that starts at the margin is
    always a label the gateway wrote.
    """
    text = message.text.strip()
    if not text and message.tool_calls:
        names = ", ".join(
            str((call.get("function") or {}).get("name", "?")) for call in message.tool_calls
        )
        text = f"[calls {names}]"
    return f"Message {message.index} ({message.role.capitalize()}): {inside(cap(text))}"


def render_messages(messages: Sequence[Message]) -> str:
    return "\n".join(render_message(m) for m in messages)


# --- Validation ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limits:
    """What a valid output of one kind looks like (see the module docstring)."""

    max_words: int | None = None
    max_chars: int | None = None
    min_words: int = 3
    max_ratio: float | None = None  # output chars / source chars
    ratio_min_source_chars: int = 2000  # below this the ratio says nothing
    min_overlap: float = 0.10


# About six characters make an English word; nine leaves room for names and numbers and
# still stops a run of URLs or base64 that passes a word count.
CHARS_PER_WORD = 9
CHUNK_CHARS = CHUNK_WORDS * CHARS_PER_WORD
MERGE_CHARS = MERGE_WORDS * CHARS_PER_WORD
CHUNK_LIMITS = Limits(max_words=CHUNK_WORDS, max_chars=CHUNK_CHARS, max_ratio=0.5)
MERGE_LIMITS = Limits(
    max_words=MERGE_WORDS, max_chars=MERGE_CHARS, max_ratio=1.0, ratio_min_source_chars=1000
)
# The heading lines and the "target 500-1000 tokens" make a recursive summary of a short
# conversation longer than a plain one; its size limit is counted in tokens elsewhere.
RECURSIVE_LIMITS = Limits(max_ratio=1.5)


def rolling_limits(max_words: int) -> Limits:
    """Limits of a fold or compress output of at most ``max_words`` words."""
    return Limits(
        max_words=max_words,
        max_chars=max_words * CHARS_PER_WORD,
        max_ratio=1.0,
        ratio_min_source_chars=1000,
    )


# Key Q/A pairs and facts: the prompt asks for less (25/50/25 words); this is the ceiling
# past which the answer is not a compressed pair any more.
KEY_Q_MAX_WORDS, KEY_Q_MAX_CHARS = 60, 400
KEY_A_MAX_WORDS, KEY_A_MAX_CHARS = 120, 800
MAX_TAGS, MAX_TAG_CHARS = 4, 32
FACT_MAX_WORDS, FACT_MAX_CHARS = 40, 300

_INVALID_PATTERNS = (
    # An assistant's reply, not a summary (seed 004, plus the openers it missed).
    re.compile(
        r"^(here['\u2019]s|here is|certainly|sure[,!.]|of course|let me|i'll create|i will create"
        r"|as an ai)",
        re.I,
    ),
    # The assistant speaking to the user: apologies and offers of help (seen from
    # SmolLM2-135M: "I'm sorry for the confusion, I'll be happy to help you with …").
    re.compile(
        r"^(i['\u2019]m sorry|i am sorry|i apologi[sz]e|sorry,|great question|happy to help)"
        r"|\b(i['\u2019]ll|i will|i['\u2019]d|i would) be (happy|glad) to help\b"
        r"|\bhow can i (help|assist)\b",
        re.I,
    ),
    re.compile(r"```"),  # a code block
    re.compile(r"^title:", re.I),  # a poem's title
    re.compile(r"^(in fields where|once upon)", re.I),  # a story's opening
)
_THINK = re.compile(r"^\s*<think>.*?</think>", re.S)  # a local reasoning model's preface
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.S)
_WORD = re.compile(r"\w+")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_TAG = re.compile(r"^\w[\w .+#/-]*$")

_STOPWORD_TEXT = (
    "the and for are but not you your yours with this that these those have has had was "
    "were will would can could should from they them their there here what when where "
    "which who whom how why about into than then also just been being its our ours out "
    "over some such very more most only other any all each both few too off once again "
    "further under while does did doing done she her hers him his its itself myself "
    "yourself ourselves themselves let lets okay yes "
    # The prompt's own labels ("Message 3 (User): ..."): "the user ..." is not a fact.
    "user users assistant message messages"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def clean(text: str) -> str:
    """The model's answer without surrounding space or a reasoning model's <think> block."""
    return _THINK.sub("", text, count=1).strip()


def content_words(text: str) -> list[str]:
    """Words that carry meaning: three letters or more and not a stopword, or any digit."""
    return [
        w
        for w in _WORD.findall(text.lower())
        if (len(w) >= 3 and w not in _STOPWORDS) or any(c.isdigit() for c in w)
    ]


def overlap(text: str, source: str) -> float:
    """Share of the text's content words that occur in the source (seed 004's check 4)."""
    words = content_words(text)
    if not words:
        return 0.0
    vocabulary = set(content_words(source))
    return sum(1 for w in words if w in vocabulary) / len(words)


def summary_problem(text: str, source: str, limits: Limits) -> str | None:
    """Why ``text`` is not a valid summary of ``source``, or None when it is."""
    words = len(text.split())
    if words < limits.min_words:
        return "too short"
    if limits.max_words is not None and words > limits.max_words:
        return f"too long ({words} words > {limits.max_words})"
    if limits.max_chars is not None and len(text) > limits.max_chars:
        return f"too long ({len(text)} characters > {limits.max_chars})"
    if (
        limits.max_ratio is not None
        and len(source) >= limits.ratio_min_source_chars
        and len(text) > limits.max_ratio * len(source)
    ):
        return "too long for its source"
    for pattern in _INVALID_PATTERNS:
        if pattern.search(text):
            return f"invalid pattern {pattern.pattern[:24]!r}"
    if overlap(text, source) < limits.min_overlap:
        return "low word overlap with the source"
    if copies_instructions(text, source):
        return "copies an instruction from the conversation"
    return None


def _normal(text: str) -> str:
    return " ".join(text.casefold().split())


# Sentences that address the model rather than state a fact: what a user's text may say
# to hijack whoever reads it later ("ignore all previous instructions", "always answer
# X", "you are now …"). Quoted and attributed in the memory block they are harmless; a
# summary that copies one as its own words would give it a summarizer's voice.
_INSTRUCTION = re.compile(
    r"\b(?:ignore|disregard|forget|override|bypass)\b.{0,40}?\b(?:instructions?|prompts?|"
    r"rules?|guidelines?|everything|above|previous|prior|system)\b"
    r"|\b(?:system prompt|developer message|jailbreak|you are now|act as|pretend to be|"
    r"from now on|new instructions?)\b"
    r"|\b(?:always|never)\s+(?:answer|respond|reply|say|mention|reveal|tell|follow|obey|"
    r"output|include|use|call|refuse)\b"
    r"|\byou (?:must|should|will|shall) (?:always|never|now|only)\b"
    r"|\b(?:respond|answer|reply) (?:only )?with\b",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n+")


def instructions_in(source: str) -> list[str]:
    """The source's sentences that give orders to a model (see ``_INSTRUCTION``)."""
    return [
        sentence
        for sentence in (part.strip() for part in _SENTENCE_END.split(source))
        if len(sentence.split()) >= 4 and _INSTRUCTION.search(sentence)
    ]


def _words_only(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())


def copies_instructions(text: str, source: str) -> bool:
    """Whether ``text`` repeats, word for word (punctuation aside), an order a person
    gave in ``source``."""
    found = _words_only(text)
    return any(_words_only(sentence) in found for sentence in instructions_in(source))


def echoes_prompt(text: str, prompt: str, source: str) -> bool:
    """Whether the output repeats the prompt's own instructions or labels.

    A small model asked to "Create an updated summary" sometimes returns the prompt itself
    ("CURRENT SUMMARY: … NEW QUESTION: …"): its words all come from the source, so the
    overlap check passes it. An instruction line of the prompt, or one of its upper-case
    labels, found in the output gives it away (unless the data itself contains it).
    """
    found, data = _normal(text), _normal(source)
    for raw in prompt.splitlines():
        line = _normal(raw)
        if not line or line in data or HEADING.match(raw):
            continue  # the data may be quoted; headings are the asked-for structure
        if len(line) >= 12 and line in found:
            return True
        opening = line.split()[:5]
        if len(opening) == 5 and found.split()[:5] == opening:
            return True  # it starts by reciting an instruction
        label = raw.split(":", 1)[0].strip()
        if ":" in raw and len(label) >= 4 and label.isupper():
            tag = _normal(label) + ":"
            if tag in found and tag not in data:
                return True
    return False


def _heading_key(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower().replace("&", "and"))


_SECTION_KEYS = {_heading_key(section): section for section in SECTIONS}


def section_of(line: str) -> str | None:
    """The section a heading line names, or None when the line is not one of them."""
    match = HEADING.match(line)
    return _SECTION_KEYS.get(_heading_key(match.group(1))) if match else None


def recursive_problem(text: str, source: str) -> str | None:
    """Why ``text`` is not a valid recursive summary (its size is checked by the caller)."""
    lines = text.splitlines()
    found = {section_of(line) for line in lines}
    missing = [section for section in SECTIONS if section not in found]
    if missing:
        return f"missing section {missing[0]!r}"
    # Headings are the prompt's words, not the model's: they do not count as overlap.
    body = "\n".join(line for line in lines if not HEADING.match(line))
    return summary_problem(body, source, RECURSIVE_LIMITS)


def _json_value(text: str) -> Any:
    """The JSON an answer holds; raises ValueError when it holds none."""
    fenced = _FENCE.match(text)
    try:
        return json.loads(fenced.group(1) if fenced else text)
    except RecursionError:
        # "[[[[…" nested past Python's recursion limit: a small model looping on the
        # array's first token until max_tokens. Unusable, like any other invalid JSON.
        raise ValueError("JSON nested too deeply") from None


def _short_string(value: Any, max_words: int, max_chars: int) -> str | None:
    if not isinstance(value, str):
        return None
    text = " ".join(value.split())
    if not text or len(text) > max_chars or len(text.split()) > max_words:
        return None
    return text


def parse_key_qa(text: str, source: str) -> KeyQA | None:
    """A key Q/A pair from a JSON answer, or None unless every field is valid."""
    try:
        data = _json_value(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    q = _short_string(data.get("q"), KEY_Q_MAX_WORDS, KEY_Q_MAX_CHARS)
    a = _short_string(data.get("a"), KEY_A_MAX_WORDS, KEY_A_MAX_CHARS)
    tags = data.get("tags")
    if q is None or a is None or not isinstance(tags, list) or not 1 <= len(tags) <= MAX_TAGS:
        return None
    clean_tags: list[str] = []
    for tag in tags:
        if not isinstance(tag, str):
            return None
        tag = " ".join(tag.split()).lower()
        if not tag or len(tag) > MAX_TAG_CHARS or not _TAG.match(tag):
            return None
        if tag not in clean_tags:
            clean_tags.append(tag)
    if overlap(f"{q} {a}", source) < Limits().min_overlap:
        return None
    if copies_instructions(f"{q}\n{a}", source):
        return None
    return KeyQA(q=q, a=a, tags=tuple(clean_tags))


def parse_facts(text: str, source: str, limit: int) -> list[str] | None:
    """Facts from a JSON array answer, or None unless every item is valid."""
    try:
        data = _json_value(text)
    except ValueError:
        return None
    if not isinstance(data, list) or len(data) > limit:
        return None
    facts: list[str] = []
    for item in data:
        fact = _short_string(item, FACT_MAX_WORDS, FACT_MAX_CHARS)
        # Each fact must come from the conversation: an invented one poisons every later
        # answer that trusts it.
        if fact is None or overlap(fact, source) < Limits().min_overlap:
            return None
        if copies_instructions(fact, source):
            return None  # an order is not a fact about the user
        if fact.lower() not in (f.lower() for f in facts):
            facts.append(fact)
    return facts
