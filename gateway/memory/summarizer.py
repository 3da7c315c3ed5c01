"""The summarizer: the seeds' prompts, validation of what the model writes, and fallbacks.

INTERFACE CONTRACT (implemented by a helper; do not change signatures without telling):

    class ChatModel(Protocol):
        async def complete(self, messages: list[dict[str, str]], *, max_tokens: int) -> str
        # raises SummarizerUnavailable on any failure (timeout, non-200, bad body)

    @dataclass(frozen=True) class Written: text: str; fallback: bool

    class Summarizer:
        def __init__(self, model: ChatModel | None, counter: TokenCounter) -> None
        async def chunk(self, messages: Sequence[Message]) -> Written
        async def recursive(self, previous: str | None, messages: Sequence[Message],
                            *, start: int, end: int, limit_tokens: int = 7000) -> Written
        async def fold(self, summary: str | None, question: str, answer: str,
                       *, max_words: int = 250) -> Written
        async def compress(self, summary: str | None, messages: Sequence[Message],
                           *, max_words: int = 300) -> Written
        async def key_qa(self, question: str, answer: str) -> tuple[KeyQA, bool]
        async def facts(self, messages: Sequence[Message],
                        *, limit: int = 10) -> tuple[list[str], bool]
        async def merge(self, summaries: Sequence[str]) -> Written

Prompts (each request is a system message that starts with ``[memory-gateway:<kind>]``,
so a fake server can tell the kinds apart, and a user message with the data):

    chunk               seed 004's cloud prompt (topics, decisions, facts, state; <200 words)
    recursive-create    seed 001's initial-creation prompt, its four user-focused sections
    recursive-update    seed 001's recursive-update prompt
    recursive-compress  seed 001's "consolidate and compress when approaching the limit"
    fold / compress     seed 002's incremental updater (<250 words) and compressor (<300)
    key-qa              seed 002's key Q/A pair, asked for as JSON with 1-4 tags
    facts / merge       seed 003's key-fact extraction (as a JSON array) and summary merge

Seed 001's prompt speaks of "spiritual/therapeutic work" (it was written for one app); the
gateway serves any chat app, so that item reads "ongoing work, projects and practices".
Every prompt adds one line the seeds motivate (seed 002's "early high-impact constraint"):
keep names, numbers, dates and stated constraints exactly as written.

Validation (seed 004's ``isInvalidSummary``, adapted per kind by ``Limits``):

* too short (fewer than ``min_words``) or too long (``max_words``/``max_chars``): the
  word-limit kinds (chunk, fold, compress, merge) enforce the limit their prompt states,
  because budgets downstream count on it;
* output/source length ratio, only when the source is long enough to make it meaningful:
  seed 004's 0.3 was tuned for a one-to-two sentence prompt, and on a short source a
  legitimate summary is naturally close to the source's length;
* invalid patterns: an assistant's reply opener (``Here's``, ``Certainly``, ``Sure,``,
  ``Let me``, ``I'll create``, ``As an AI``), a code fence, ``Title:``, story openings;
* word overlap with the source below 10%: the model wrote new content instead of
  summarizing. Only content words count (three letters or more, not stopwords, or any
  token with a digit), otherwise "the" and "and" would make any English text pass;
* recursive summaries must keep the four section headings; JSON kinds are parsed and
  type-checked strictly (a single surrounding ```json fence is tolerated there: cloud
  models add it often and it carries no invented content).

Fallbacks: on any failure (the model unreachable, ``model=None``, an invalid answer) the
summarizer writes a model-free summary and says so (``fallback=True``); memory keeps
working offline. Fallbacks are extractive, never topic labels like seed 004's
``createFallbackSummary``: a remembered summary is only useful if it still holds the exact
seat number or allergy. Sentences are ranked by role (user first) and by signs of a
durable fact (digits, dates, capitalised names, "my ...", "I prefer", "never", "always"),
picked within the same limits as the model's output, and printed in their original order.
Among equals the newest wins, so a fold or compress that must cut keeps the newest content.

Pure except for ``await self.model.complete(...)`` (and log lines that name a kind and a
reason, never content): no clock, no randomness.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.memory.model import KeyQA, Message
from gateway.tokens import TokenCounter

log = logging.getLogger(__name__)


class SummarizerUnavailable(Exception):
    """The summarizer model could not answer (unreachable, timeout, non-200, bad body)."""


class ChatModel(Protocol):
    """One non-streaming chat completion; raises ``SummarizerUnavailable`` on any failure."""

    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int) -> str: ...


@dataclass(frozen=True, slots=True)
class Written:
    """A text the summarizer wrote; ``fallback`` when it was made without the model."""

    text: str
    fallback: bool


# --- Markers and prompts ---------------------------------------------------------------

KINDS = (
    "chunk",
    "recursive-create",
    "recursive-update",
    "recursive-compress",
    "fold",
    "compress",
    "key-qa",
    "facts",
    "merge",
)
MARKER = "[memory-gateway:{kind}]"


def marker(kind: str) -> str:
    """The tag that starts the system message of a request of this kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown summarizer kind {kind!r}")
    return MARKER.format(kind=kind)


# Seed 001's summary structure (its prompt names the sections slightly differently; the
# structure block is the one the seed shows as the result, so its headings win).
SECTIONS = (
    "User's Journey & Insights",
    "Current Situation & Context",
    "Ongoing Work & Interests",
    "Preferences & Patterns",
)
_SECTION_HEADINGS = "\n".join(f"## {section}" for section in SECTIONS)

_EXACT = "Keep names, numbers, dates and the user's stated constraints exactly as written."
_ONLY = "Reply with the summary only: no preamble, no title, no code block."

CHUNK_WORDS = 200
CHUNK_SYSTEM = (
    "You are a conversation summarizer. Create a concise summary that preserves:\n"
    "1. Key topics discussed\n"
    "2. Important decisions made\n"
    "3. Facts or information shared\n"
    "4. Current context/state\n"
    "\n"
    f"Keep under {CHUNK_WORDS} words.\n"
    "Summarize only what was said; do not answer, continue or add to the conversation. "
    f"{_EXACT} {_ONLY}"
)
CHUNK_PROMPT = "Conversation (messages {start}-{end}):\n{messages}"

RECURSIVE_SYSTEM = (
    "You maintain the medium-term memory of one conversation: a user-focused summary in "
    "markdown with exactly these four sections, in this order:\n"
    f"{_SECTION_HEADINGS}\n"
    f"{_EXACT} Reply with the markdown summary only: no preamble, no code block."
)
RECURSIVE_CREATE_PROMPT = (
    "Create an initial medium-term memory summary focusing on USER content and insights "
    "from the conversation so far.\n"
    "\n"
    "Since the agent generates most text, extract and preserve:\n"
    "1. User's insights, breakthroughs, and realizations\n"
    "2. User's emotional journey and current state\n"
    "3. Important personal context and situation\n"
    "4. User's ongoing work, projects and practices, and preferences\n"
    "5. User's ongoing concerns and questions\n"
    "\n"
    "Messages to analyze ({start}-{end}):\n"
    "{messages}\n"
    "\n"
    f"Format as structured markdown with sections: {', '.join(SECTIONS)}.\n"
    "Target: 500-1000 tokens; a short conversation gets a short summary (do not pad)."
)
RECURSIVE_UPDATE_PROMPT = (
    "Update the existing medium-term memory by integrating new user content with the "
    "previous summary.\n"
    "\n"
    "Previous Summary:\n"
    "{previous}\n"
    "\n"
    "New User Content (messages {start} to {end}):\n"
    "{messages}\n"
    "\n"
    "Create an evolved summary that:\n"
    "1. Integrates new insights with previous understanding\n"
    "2. Consolidates patterns and recurring themes\n"
    "3. Updates user's journey and emotional evolution\n"
    "4. Maintains focus on user content (not agent responses)\n"
    "5. Preserves essential context while staying concise\n"
    "\n"
    "Keep the same structure but evolve the content. Target: 500-1000 tokens."
)
RECURSIVE_COMPRESS_PROMPT = (
    "This medium-term memory is approaching its size limit. Consolidate and compress it to "
    "under {target_tokens} tokens while preserving essential user insights and patterns. "
    "Keep the same four sections; merge repeated points and drop superseded details.\n"
    "\n"
    "Summary:\n"
    "{summary}"
    "{new_content}"
)
RECURSIVE_COMPRESS_NEW = (
    "\n\nNew User Content to integrate (messages {start} to {end}):\n{messages}"
)

ROLLING_SYSTEM = f"You maintain the rolling summary of a conversation. {_EXACT} {_ONLY}"
# Seed 002's incremental updater, word for word but for the limit, which is a parameter.
FOLD_PROMPT = (
    "Update this conversation summary with the new Q/A:\n"
    "CURRENT SUMMARY:\n"
    "{summary}\n"
    "NEW QUESTION: {question}\n"
    "NEW ANSWER: {answer}\n"
    "Create an updated summary (under {max_words} words) that integrates the new\n"
    "information naturally."
)
# Seed 002 describes its compressor as "similar shape (under 300 words, takes the previous
# summary plus a batch of new messages instead of one Q/A pair)".
COMPRESS_PROMPT = (
    "Compress this conversation summary and the new messages into one updated summary:\n"
    "CURRENT SUMMARY:\n"
    "{summary}\n"
    "NEW MESSAGES:\n"
    "{messages}\n"
    "Create an updated summary (under {max_words} words) that integrates the new\n"
    "information naturally."
)
NO_SUMMARY = "(none yet)"

KEY_QA_SYSTEM = (
    "You compress one question/answer exchange into a key pair for later recall. Reply "
    'with one compact JSON object and nothing else: {"q": "...", "a": "...", "tags": [...]}. '
    "q: the question in at most 25 words. a: the answer's decisive facts in at most 50 "
    "words, with exact numbers, names and formulas. tags: 1 to 4 short lowercase "
    "relevance keywords."
)
KEY_QA_PROMPT = "QUESTION: {question}\nANSWER: {answer}"

FACTS_SYSTEM = (
    "Extract key facts from this conversation that should be remembered long-term. Focus "
    "on: user preferences, personal details, decisions, dates, numbers, constraints and "
    "important context. Reply with a JSON array of at most {limit} short strings, one fact "
    "each, under 25 words, with names, numbers and dates exactly as written; reply [] if "
    "there are none. Reply with the JSON array only."
)
FACTS_PROMPT = "Conversation:\n{messages}"

MERGE_WORDS = 200
MERGE_SYSTEM = (
    "Merge these conversation summaries into a single concise paragraph. Keep the most "
    f"important details. Stay under {MERGE_WORDS} words. {_EXACT} "
    "Reply with the paragraph only."
)
MERGE_PROMPT = "{summaries}"

# A pasted document must not blow up the summarizer's prompt; its head is what a summary
# would keep anyway.
MAX_MESSAGE_CHARS = 4000
# The recursive summary is compressed when it passes this share of its limit: the next
# update then has room to add to it.
RECURSIVE_COMPRESS_AT = 0.9


def render_message(message: Message) -> str:
    """``Message {index} ({Role}): {text}``, as every prompt shows a message."""
    text = message.text.strip()
    if not text and message.tool_calls:
        names = ", ".join(
            str((call.get("function") or {}).get("name", "?")) for call in message.tool_calls
        )
        text = f"[calls {names}]"
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + " [...]"
    return f"Message {message.index} ({message.role.capitalize()}): {text}"


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
    re.compile(r"```"),  # a code block
    re.compile(r"^title:", re.I),  # a poem's title
    re.compile(r"^(in fields where|once upon)", re.I),  # a story's opening
)
_THINK = re.compile(r"^\s*<think>.*?</think>", re.S)  # a local reasoning model's preface
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.S)
_WORD = re.compile(r"\w+")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
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
    return None


def _heading_key(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower().replace("&", "and"))


_SECTION_KEYS = {_heading_key(section): section for section in SECTIONS}


def _section_of(line: str) -> str | None:
    """The section a heading line names, or None when the line is not one of them."""
    match = _HEADING.match(line)
    return _SECTION_KEYS.get(_heading_key(match.group(1))) if match else None


def recursive_problem(text: str, source: str) -> str | None:
    """Why ``text`` is not a valid recursive summary (its size is checked by the caller)."""
    lines = text.splitlines()
    found = {_section_of(line) for line in lines}
    missing = [section for section in SECTIONS if section not in found]
    if missing:
        return f"missing section {missing[0]!r}"
    # Headings are the prompt's words, not the model's: they do not count as overlap.
    body = "\n".join(line for line in lines if not _HEADING.match(line))
    return summary_problem(body, source, RECURSIVE_LIMITS)


def _json_value(text: str) -> Any:
    """The JSON an answer holds; raises ValueError when it holds none."""
    fenced = _FENCE.match(text)
    return json.loads(fenced.group(1) if fenced else text)


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
        if fact.lower() not in (f.lower() for f in facts):
            facts.append(fact)
    return facts


# --- Extraction (the fallbacks) --------------------------------------------------------

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
_CUES = re.compile(
    r"\b(my|mine|i'm|i am|i've|i have|i'd|i prefer|prefer|prefers|i like|i love|i hate|"
    r"i want|i need|i don't|i do not|i can't|i cannot|i won't|i live|i work|never|always|"
    r"must|allergic|allergy|deadline|budget|decided|decision|remember|we'll|let's)\b",
    re.I,
)
_DATES = re.compile(
    r"\b(jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\b|"
    r"\b(mon|tues|wednes|thurs|fri|satur|sun)day\b|\b(today|tomorrow|yesterday|tonight)\b",
    re.I,
)
_PRONOUNS = frozenset({"I", "I'm", "I've", "I'd", "I'll"})
# The user's words rank ahead of the assistant's (seed 001: "prioritize user insights over
# agent responses"); an earlier summary's sentences rank on their own merits, so among
# equals new content wins.
USER_BONUS = 3
MAX_PIECE_WORDS = 40
RECURSIVE_FALLBACK_NEW_WORDS = 300


def _has_name(sentence: str) -> bool:
    for word in sentence.split()[1:]:
        word = word.strip(".,;:!?\"'()[]")
        if word[:1].isupper() and word not in _PRONOUNS:
            return True
    return False


def fact_score(sentence: str) -> int:
    """How much a sentence looks like a durable fact: digits, cues, dates, names."""
    normal = sentence.replace("\u2019", "'")
    score = 0
    if any(c.isdigit() for c in normal):
        score += 2
    if _CUES.search(normal):
        score += 2
    if _DATES.search(normal):
        score += 1
    if _has_name(normal):
        score += 1
    return score


def sentences(text: str) -> list[str]:
    """Sentences and lines of a text, without bullet marks."""
    out = []
    for part in _SENTENCE.split(text):
        part = _BULLET.sub("", part).strip()
        if part and not _HEADING.match(part):
            out.append(part)
    return out


def _trim(text: str, max_words: int) -> str:
    words = text.split()
    return text if len(words) <= max_words else " ".join([*words[: max_words - 1], "…"])


@dataclass(frozen=True, slots=True)
class _Piece:
    """A sentence a fallback may keep: its place, its group (a role or section), its rank."""

    position: int
    text: str
    score: int
    group: str = ""
    source: int = 0  # which message or summary it comes from


def _pieces(
    texts: Sequence[tuple[str, str, int]], first: int = 0, *, split: bool = True
) -> list[_Piece]:
    """Pieces of ``(text, group, bonus)`` items; filler ("ok", "thanks!") is left out."""
    out: list[_Piece] = []
    for source, (text, group, bonus) in enumerate(texts):
        for sentence in sentences(text) if split else [text.strip()]:
            score = fact_score(sentence)
            if len(sentence.split()) <= 2 and score == 0:
                continue
            out.append(
                _Piece(
                    first + len(out),
                    _trim(sentence, MAX_PIECE_WORDS),
                    score + bonus,
                    group,
                    first + source,
                )
            )
    return out


def select(
    pieces: Sequence[_Piece], budget: int, cost: Callable[[str], int], *, newest: bool = True
) -> list[_Piece]:
    """The highest-ranked pieces that fit ``budget``, in their original order.

    Ties go to the newest piece (or the oldest when ``newest`` is false); a piece that does
    not fit is skipped and a smaller one may still take its room.
    """
    order = sorted(pieces, key=lambda p: (-p.score, -p.position if newest else p.position))
    chosen: list[_Piece] = []
    used = 0
    for piece in order:
        size = cost(piece.text)
        if used + size <= budget:
            chosen.append(piece)
            used += size
    return sorted(chosen, key=lambda p: p.position)


def _words(text: str) -> int:
    return len(text.split())


def _fit(
    pieces: Sequence[_Piece],
    render: Callable[[list[_Piece]], str],
    max_words: int,
    max_chars: int,
    *,
    newest: bool = True,
) -> str:
    """Render the best pieces whose rendering stays within both limits."""
    budget = max_words
    while budget > 0:
        text = render(select(pieces, budget, _words, newest=newest))
        if _words(text) <= max_words and len(text) <= max_chars:
            return text
        budget -= max(1, budget // 10)  # labels and long words cost more than the estimate
    return ""


def _render_lines(pieces: list[_Piece]) -> str:
    """One line per source: ``User: sentence sentence``."""
    lines: list[str] = []
    last: int | None = None
    for piece in pieces:
        if piece.source == last:
            lines[-1] += " " + piece.text
        else:
            lines.append(f"{piece.group}: {piece.text}" if piece.group else piece.text)
        last = piece.source
    return "\n".join(lines)


def _message_items(messages: Sequence[Message]) -> list[tuple[str, str, int]]:
    items = []
    for message in messages:
        text = render_message(message).split(": ", 1)[1]
        bonus = USER_BONUS if message.role == "user" else 0
        items.append((text, message.role.capitalize(), bonus))
    return items


def _summary_items(summary: str | None) -> list[tuple[str, str, int]]:
    if not summary:
        return []
    # A sentence a previous fallback kept as the user's ranks as the user's again.
    return [(s, "", USER_BONUS if s.startswith("User:") else 0) for s in sentences(summary)]


def fallback_rolling(summary: str | None, new: list[tuple[str, str, int]], max_words: int) -> str:
    """A previous summary plus new content, cut to ``max_words`` keeping the newest."""
    pieces = _pieces([*_summary_items(summary), *new])
    return _fit(pieces, _render_lines, max_words, max_words * CHARS_PER_WORD)


def fallback_key_qa(question: str, answer: str) -> KeyQA:
    """The question's and answer's most fact-like sentences, tagged with frequent words."""
    q = _fit(_pieces([(question, "", 0)]), _render_lines, 25, KEY_Q_MAX_CHARS, newest=False)
    # The answer's opening states the answer; later sentences qualify it.
    a = _fit(_pieces([(answer, "", 0)]), _render_lines, 50, KEY_A_MAX_CHARS, newest=False)
    q = " ".join(q.split()) or _trim(" ".join(question.split()), 25)[:KEY_Q_MAX_CHARS]
    a = " ".join(a.split()) or _trim(" ".join(answer.split()), 50)[:KEY_A_MAX_CHARS]
    counts = Counter(content_words(question) * 2 + content_words(answer))
    tags = tuple(w[:MAX_TAG_CHARS] for w, _ in counts.most_common(3)) or ("general",)
    return KeyQA(q=q or "(empty question)", a=a or "(empty answer)", tags=tags)


def fallback_facts(messages: Sequence[Message], limit: int) -> list[str]:
    """The user's sentences that look like durable facts, oldest first."""
    items = [(m.text, "", 0) for m in messages if m.role == "user"]
    pieces = [p for p in _pieces(items) if p.score > 0]
    chosen = select(pieces, limit, lambda _: 1)
    return [_trim(p.text, 25)[:FACT_MAX_CHARS] for p in chosen]


_PREFERENCE = re.compile(
    r"\b(prefers?|preferred|like|likes|love|loves|hate|hates|rather|don't want|always|never"
    r"|style|favou?rite)\b"
)
_WORK = re.compile(
    r"\b(working on|projects?|learning|stud(y|ying|ies)|practi[cs]e|plan|planning|goals?"
    r"|interested|exploring|building|writing)\b"
)
_INSIGHT = re.compile(
    r"\b(reali[sz]ed?|understand|understood|learned|feel|felt|insights?|noticed|discovered)\b"
)


def _classify(sentence: str) -> str:
    """Which of seed 001's sections a user sentence belongs to, by its wording."""
    lower = sentence.lower().replace("\u2019", "'")
    for pattern, section in ((_PREFERENCE, 3), (_WORK, 2), (_INSIGHT, 0)):
        if pattern.search(lower):
            return SECTIONS[section]
    return SECTIONS[1]  # facts of the user's life: current situation and context


def parse_sections(text: str) -> dict[str, list[str]]:
    """Items under each of the four headings; text outside them counts as current context."""
    sections: dict[str, list[str]] = {section: [] for section in SECTIONS}
    current = SECTIONS[1]
    for line in text.splitlines():
        named = _section_of(line)
        if named is not None:
            current = named
        elif not line.strip().startswith("---"):
            sections[current].extend(sentences(line))
    return sections


def render_sections(sections: dict[str, list[str]]) -> str:
    blocks = []
    for section in SECTIONS:
        items = "".join(f"\n- {item}" for item in sections.get(section, ()))
        blocks.append(f"## {section}{items}")
    return "\n\n".join(blocks)


def _cut_to_tokens(text: str, budget: int, counter: TokenCounter) -> str:
    """The longest prefix of ``text`` within ``budget`` tokens (the last guard)."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if counter.count_text(text[:middle]) <= budget:
            low = middle
        else:
            high = middle - 1
    while low > 0 and counter.count_text(text[:low]) > budget:
        low -= 1
    return text[:low]


def fit_sections(pieces: Sequence[_Piece], budget: int, counter: TokenCounter) -> str:
    """The four sections holding the best pieces, within ``budget`` tokens, always."""
    overhead = counter.count_text(render_sections({}))
    costs: dict[str, int] = {}

    def cost(text: str) -> int:
        if text not in costs:
            costs[text] = counter.count_text(f"- {text}") + 1  # and the newline before it
        return costs[text]

    room = budget - overhead
    while room > 0:
        chosen = select(pieces, room, cost)
        sections: dict[str, list[str]] = {section: [] for section in SECTIONS}
        for piece in chosen:
            sections[piece.group].append(piece.text)
        text = render_sections(sections)
        if counter.count_text(text) <= budget:
            return text
        room -= max(1, room // 10)
    # Not even the headings fit a tiny limit: the limit wins over the structure.
    return _cut_to_tokens(render_sections({}), budget, counter)


def _section_pieces(text: str | None) -> list[_Piece]:
    """The items of a sectioned summary, in document order, ranked like any sentence."""
    if not text:
        return []
    pieces: list[_Piece] = []
    for section, items in parse_sections(text).items():
        for item in items:
            bonus = USER_BONUS if item.startswith("User:") else 0
            pieces.append(_Piece(len(pieces), _trim(item, 200), fact_score(item) + bonus, section))
    return pieces


def fallback_recursive(
    previous: str | None, messages: Sequence[Message], budget: int, counter: TokenCounter
) -> str:
    """Seed 001's four sections: the previous items plus the user's new fact-like lines."""
    old = _section_pieces(previous)
    # User focus (seed 001): only the user's words are new content, and only so many of
    # them per update, so an offline summary grows like a model-written one.
    fresh = _pieces([(m.text, "", USER_BONUS) for m in messages if m.role == "user"], len(old))
    fresh = select(fresh, RECURSIVE_FALLBACK_NEW_WORDS, _words)
    fresh = [_Piece(p.position, p.text, p.score, _classify(p.text), p.source) for p in fresh]
    return fit_sections([*old, *fresh], budget, counter)


def fallback_chunk(messages: Sequence[Message]) -> str:
    """The user's fact-like sentences first, then the assistant's, within the chunk limits."""
    if not messages:
        return "No messages."
    text = _fit(_pieces(_message_items(messages)), _render_lines, CHUNK_WORDS, CHUNK_CHARS)
    return text or _trim(render_message(messages[-1]), CHUNK_WORDS)[:CHUNK_CHARS]


def fallback_merge(summaries: Sequence[str]) -> str:
    """One paragraph of the summaries' most fact-like sentences, newest first."""
    pieces = _pieces([item for s in summaries for item in _summary_items(s)], split=False)
    return _fit(pieces, lambda chosen: " ".join(p.text for p in chosen), MERGE_WORDS, MERGE_CHARS)


# --- The summarizer --------------------------------------------------------------------


class Summarizer:
    """Writes every kind of summary with the model, or without it when it fails."""

    def __init__(self, model: ChatModel | None, counter: TokenCounter) -> None:
        self.model = model
        self.counter = counter

    async def _ask(self, kind: str, system: str, prompt: str, *, max_tokens: int) -> str | None:
        """The model's cleaned answer, or None when it is unavailable (or not configured)."""
        if self.model is None:
            return None
        messages = [
            {"role": "system", "content": f"{marker(kind)}\n{system}"},
            {"role": "user", "content": prompt},
        ]
        try:
            answer = await self.model.complete(messages, max_tokens=max_tokens)
        except SummarizerUnavailable as error:
            log.warning("summarizer %s: model unavailable (%s); using the fallback", kind, error)
            return None
        return clean(answer)

    @staticmethod
    def _rejected(kind: str, problem: str) -> None:
        log.info("summarizer %s: rejected the answer (%s); using the fallback", kind, problem)

    async def _summary(
        self, kind: str, system: str, prompt: str, source: str, limits: Limits, max_tokens: int
    ) -> str | None:
        """A validated summary from the model, or None (the caller falls back)."""
        text = await self._ask(kind, system, prompt, max_tokens=max_tokens)
        if text is None:
            return None
        problem = summary_problem(text, source, limits)
        if problem is not None:
            self._rejected(kind, problem)
            return None
        return text

    async def chunk(self, messages: Sequence[Message]) -> Written:
        """Seed 004's summary of a message range (used by seeds 000, 003 and 004)."""
        rendered = render_messages(messages)
        start = messages[0].index if messages else 0
        end = messages[-1].index if messages else 0
        prompt = CHUNK_PROMPT.format(start=start, end=end, messages=rendered)
        text = await self._summary(
            "chunk", CHUNK_SYSTEM, prompt, rendered, CHUNK_LIMITS, max_tokens=CHUNK_WORDS * 2
        )
        return Written(text, False) if text else Written(fallback_chunk(messages), True)

    async def recursive(
        self,
        previous: str | None,
        messages: Sequence[Message],
        *,
        start: int,
        end: int,
        limit_tokens: int = 7000,
    ) -> Written:
        """Seed 001's evolving user-focused summary, always under ``limit_tokens`` tokens.

        Creation or update by the model; past 90% of the limit a compression prompt; past
        the limit still, items are cut section by section (newest and most fact-like kept).
        """
        ceiling = max(1, int(limit_tokens * RECURSIVE_COMPRESS_AT))
        count = self.counter.count_text
        if previous is not None and count(previous) > ceiling:
            # An oversized previous summary (imported, or kept under a larger limit) is cut
            # before it is sent, so the prompt stays bounded as well.
            previous = fit_sections(_section_pieces(previous), ceiling, self.counter)
        if not previous:
            previous = None
        rendered = render_messages(messages)
        source = f"{previous or ''}\n{rendered}"
        target = limit_tokens // 2
        if previous is None:
            kind = "recursive-create"
            prompt = RECURSIVE_CREATE_PROMPT.format(start=start, end=end, messages=rendered)
        elif count(previous) + count(rendered) > ceiling:
            # Previous plus new would already pass the limit: integrate and compress at once.
            kind = "recursive-compress"
            new = RECURSIVE_COMPRESS_NEW.format(start=start, end=end, messages=rendered)
            prompt = RECURSIVE_COMPRESS_PROMPT.format(
                target_tokens=target, summary=previous, new_content=new
            )
        else:
            kind = "recursive-update"
            prompt = RECURSIVE_UPDATE_PROMPT.format(
                previous=previous, start=start, end=end, messages=rendered
            )
        text = await self._recursive_answer(kind, prompt, source, limit_tokens)
        if text is None:
            return Written(fallback_recursive(previous, messages, ceiling, self.counter), True)
        if count(text) <= ceiling:
            return Written(text, False)
        prompt = RECURSIVE_COMPRESS_PROMPT.format(
            target_tokens=target, summary=text, new_content=""
        )
        compressed = await self._recursive_answer("recursive-compress", prompt, text, limit_tokens)
        if compressed is not None and count(compressed) <= ceiling:
            return Written(compressed, False)
        # Last resort: the model's own (valid) text, cut by sections to fit.
        log.info("summarizer recursive: compression did not fit; cutting by sections")
        return Written(fit_sections(_section_pieces(text), ceiling, self.counter), False)

    async def _recursive_answer(
        self, kind: str, prompt: str, source: str, limit_tokens: int
    ) -> str | None:
        text = await self._ask(kind, RECURSIVE_SYSTEM, prompt, max_tokens=limit_tokens)
        if text is None:
            return None
        problem = recursive_problem(text, source)
        if problem is not None:
            self._rejected(kind, problem)
            return None
        return text

    async def fold(
        self, summary: str | None, question: str, answer: str, *, max_words: int = 250
    ) -> Written:
        """Seed 002's incremental update: one Q/A folded into the rolling summary."""
        prompt = FOLD_PROMPT.format(
            summary=summary or NO_SUMMARY, question=question, answer=answer, max_words=max_words
        )
        source = f"{summary or ''}\n{question}\n{answer}"
        text = await self._summary(
            "fold", ROLLING_SYSTEM, prompt, source, rolling_limits(max_words), max_words * 2
        )
        if text:
            return Written(text, False)
        new = [(question, "User", USER_BONUS), (answer, "Assistant", 0)]
        return Written(fallback_rolling(summary, new, max_words), True)

    async def compress(
        self, summary: str | None, messages: Sequence[Message], *, max_words: int = 300
    ) -> Written:
        """Seed 002's full compression: old verbatim turns collapsed into the summary."""
        rendered = render_messages(messages)
        prompt = COMPRESS_PROMPT.format(
            summary=summary or NO_SUMMARY, messages=rendered, max_words=max_words
        )
        source = f"{summary or ''}\n{rendered}"
        text = await self._summary(
            "compress", ROLLING_SYSTEM, prompt, source, rolling_limits(max_words), max_words * 2
        )
        if text:
            return Written(text, False)
        return Written(fallback_rolling(summary, _message_items(messages), max_words), True)

    async def key_qa(self, question: str, answer: str) -> tuple[KeyQA, bool]:
        """Seed 002's key pair: the Q/A compressed, with 1-4 relevance tags."""
        prompt = KEY_QA_PROMPT.format(question=question, answer=answer)
        text = await self._ask("key-qa", KEY_QA_SYSTEM, prompt, max_tokens=300)
        if text is not None:
            pair = parse_key_qa(text, f"{question}\n{answer}")
            if pair is not None:
                return pair, False
            self._rejected("key-qa", "not a valid key pair")
        return fallback_key_qa(question, answer), True

    async def facts(
        self, messages: Sequence[Message], *, limit: int = 10
    ) -> tuple[list[str], bool]:
        """Seed 003's key facts: durable facts from the messages, at most ``limit``."""
        rendered = render_messages(messages)
        system = FACTS_SYSTEM.format(limit=limit)
        prompt = FACTS_PROMPT.format(messages=rendered)
        text = await self._ask("facts", system, prompt, max_tokens=60 * limit + 50)
        if text is not None:
            found = parse_facts(text, rendered, limit)
            if found is not None:
                return found, False
            self._rejected("facts", "not a valid list of facts")
        return fallback_facts(messages, limit), True

    async def merge(self, summaries: Sequence[str]) -> Written:
        """Seed 003's merge of several summaries into one concise paragraph."""
        listed = "\n\n".join(f"Summary {i}: {s}" for i, s in enumerate(summaries, 1))
        prompt = MERGE_PROMPT.format(summaries=listed)
        source = "\n".join(summaries)
        text = await self._summary(
            "merge", MERGE_SYSTEM, prompt, source, MERGE_LIMITS, max_tokens=MERGE_WORDS * 2
        )
        return Written(text, False) if text else Written(fallback_merge(summaries), True)
