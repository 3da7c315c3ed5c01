"""Model-free extraction: the summarizer's fallbacks (pure).

A remembered summary is only useful if it still holds the exact seat number or allergy,
so fallbacks are extractive, never topic labels like seed 004's ``createFallbackSummary``.
Sentences are ranked by role (user first) and by signs of a durable fact (digits, dates,
capitalised names, "my ...", "I prefer", "never", "always") and, in a chunk, by the words
only they say there (a chunk's rare terms are its specifics: "Art Basel", "osso buco"),
picked within the same limits as the model's output, and printed in their original order.
Among equals the newest wins, so a fold or compress that must cut keeps the newest
content. Filler ("ok", "haha nice") never makes the cut.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.memory.counting import TextCounter
from gateway.memory.model import KeyQA, Message
from gateway.memory.summary_rules import (
    CHARS_PER_WORD,
    CHUNK_CHARS,
    CHUNK_WORDS,
    FACT_MAX_CHARS,
    HEADING,
    KEY_A_MAX_CHARS,
    KEY_Q_MAX_CHARS,
    MAX_TAG_CHARS,
    MERGE_CHARS,
    MERGE_WORDS,
    SECTIONS,
    content_words,
    render_message,
    section_of,
)

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
        if part and not HEADING.match(part):
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
    texts: Sequence[tuple[str, str, int]],
    first: int = 0,
    *,
    split: bool = True,
    rare: frozenset[str] = frozenset(),
) -> list[_Piece]:
    """Pieces of ``(text, group, bonus)`` items; filler ("ok", "thanks!") is left out. A
    sentence holding ``rare`` words gains a point for each (two at most)."""
    out: list[_Piece] = []
    for source, (text, group, bonus) in enumerate(texts):
        for sentence in sentences(text) if split else [text.strip()]:
            score = fact_score(sentence)
            if rare:
                score += min(2, len(rare.intersection(content_words(sentence))))
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


def _render_lines(pieces: list[_Piece], joint: str = "\n") -> str:
    """One line per source: ``User: sentence sentence``.

    A speaker's label starts each line and all that speaker's sentences follow on it: a
    user's sentence "Assistant: I will always answer X." stays on the user's line.
    """
    lines: list[str] = []
    last: int | None = None
    for piece in pieces:
        if piece.source == last:
            lines[-1] += " " + piece.text
        else:
            lines.append(f"{piece.group}: {piece.text}" if piece.group else piece.text)
        last = piece.source
    return joint.join(lines)


def message_items(messages: Sequence[Message]) -> list[tuple[str, str, int]]:
    items = []
    for message in messages:
        text = render_message(message).split(": ", 1)[1]
        bonus = USER_BONUS if message.role == "user" else 0
        items.append((text, message.role.capitalize(), bonus))
    return items


_SPEAKER = re.compile(r"^(User|Assistant|Tool): ")


def _summary_items(summary: str | None) -> list[tuple[str, str, int]]:
    """A summary's lines; a line a previous fallback wrote for a speaker stays theirs.

    Attribution goes by line, never by sentence: a user's "Assistant: always answer X"
    written on the user's line must not become a line of its own the next time round.
    """
    items: list[tuple[str, str, int]] = []
    for line in (summary or "").splitlines():
        found = _SPEAKER.match(line.strip())
        if found is None:
            items += [(sentence, "", 0) for sentence in sentences(line)]
        else:
            speaker = found.group(1)
            bonus = USER_BONUS if speaker == "User" else 0
            items.append((line.strip()[found.end() :], speaker, bonus))
    return items


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
        named = section_of(line)
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


def _cut_to_tokens(text: str, budget: int, counter: TextCounter) -> str:
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


def fit_sections(pieces: Sequence[_Piece], budget: int, counter: TextCounter) -> str:
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


def section_pieces(text: str | None) -> list[_Piece]:
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
    previous: str | None, messages: Sequence[Message], budget: int, counter: TextCounter
) -> str:
    """Seed 001's four sections: the previous items plus the user's new fact-like lines."""
    old = section_pieces(previous)
    # User focus (seed 001): only the user's words are new content, and only so many of
    # them per update, so an offline summary grows like a model-written one.
    fresh = _pieces([(m.text, "", USER_BONUS) for m in messages if m.role == "user"], len(old))
    fresh = select(fresh, RECURSIVE_FALLBACK_NEW_WORDS, _words)
    fresh = [_Piece(p.position, p.text, p.score, _classify(p.text), p.source) for p in fresh]
    return fit_sections([*old, *fresh], budget, counter)


def rare_words(texts: Sequence[str]) -> frozenset[str]:
    """Content words of four letters or more that only one of the texts says."""
    said = Counter(w for text in texts for w in set(content_words(text)) if len(w) >= 4)
    return frozenset(word for word, times in said.items() if times == 1)


def fallback_chunk(messages: Sequence[Message]) -> str:
    """The chunk's most informative sentences (the user's first: facts, dates, names and
    what only they say), within the chunk limits, in their order."""
    if not messages:
        return "No messages."
    rare = rare_words([m.text for m in messages])
    pieces = _pieces(message_items(messages), rare=rare)
    text = _fit(pieces, _render_lines, CHUNK_WORDS, CHUNK_CHARS)
    return text or _trim(render_message(messages[-1]), CHUNK_WORDS)[:CHUNK_CHARS]


def fallback_merge(summaries: Sequence[str]) -> str:
    """One paragraph of the summaries' most fact-like sentences, newest first."""
    pieces = _pieces([item for s in summaries for item in _summary_items(s)])
    return _fit(pieces, lambda chosen: _render_lines(chosen, " "), MERGE_WORDS, MERGE_CHARS)
