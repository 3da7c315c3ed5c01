"""REALTALK for ``bench/recall.py --dataset realtalk``: loading, evidence, scoring, BM25.

REALTALK (arXiv 2502.13270) is ten real messaging-app conversations between two people
over about three weeks, each with 70-85 memory questions whose answers cite the messages
that hold the evidence. The files are read where they lie (``--data``, by default
``<repo>/../shared/data/realtalk``) and never copied into the repository.

Pure: nothing here talks to a server. ``bench/recall.py`` imports the conversations
through the gateway's memory API and scores what it forwards with ``evidence_share``; its
baselines are built from the same messages (``BM25`` ranks them for the naive-recall one).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

import Stemmer

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "commonsense"}
DATE_FORMAT = "%d.%m.%Y, %H:%M:%S"  # "29.12.2023, 22:42:04": day.month.year
_SESSION_KEY = re.compile(r"session_(\d+)")
_FILE = re.compile(r"Chat_(\d+)_.*\.json")
# One message id ("D2:18", also "D 2:18"), or a range within one session ("D12:3-D12:5").
_ONE = re.compile(r"D\s*(\d+)\s*:\s*(\d+)")
_RANGE = re.compile(r"D\s*(\d+)\s*:\s*(\d+)\s*-\s*D\s*(\d+)\s*:\s*(\d+)")


def default_data_dir(root: Path) -> Path:
    """Where the dataset is looked for: ``shared/data/realtalk`` beside the repository."""
    return root.parent / "shared" / "data" / "realtalk"


@dataclass(frozen=True)
class RealMessage:
    """One message; ``role`` is ``user`` for the conversation's first speaker."""

    dia_id: str
    role: str
    speaker: str
    text: str
    timestamp: float  # Unix seconds; the dataset's local times are read as UTC

    def to_import(self, with_timestamp: bool = True, with_name: bool = True) -> dict[str, object]:
        """The message as ``POST /memory/sessions/{sid}/messages`` takes it: with its
        speaker as the chat API's ``name`` (its pattern has no spaces: "Fahim_Khan"), as
        a client that knows who speaks sends it."""
        message: dict[str, object] = {"role": self.role, "content": self.text}
        if with_name:
            message["name"] = speaker_name(self.speaker)
        if with_timestamp:
            message["timestamp"] = self.timestamp
        return message


@dataclass(frozen=True)
class Question:
    """One question of the dataset, with its evidence parsed (see ``parse_evidence``)."""

    number: int  # its place in the file's ``qa`` list
    question: str
    answer: str
    category: str  # "multi-hop", "temporal" or "commonsense"
    evidence: tuple[str, ...]  # message ids present in the conversation; empty: excluded
    raw_evidence: tuple[str, ...]  # as the file has it
    dropped: tuple[str, ...]  # pieces that named no message of the conversation


@dataclass(frozen=True)
class RealConversation:
    """One file: its messages in order (sessions by number) and its questions."""

    id: str  # the file's stem, "Chat_1_Emi_Elise": the gateway session id too
    speakers: tuple[str, str]  # (user, assistant)
    messages: tuple[RealMessage, ...]
    questions: tuple[Question, ...]

    @cached_property
    def texts(self) -> dict[str, str]:
        """Each message's text by its id."""
        return {m.dia_id: m.text for m in self.messages}

    @property
    def scored(self) -> tuple[Question, ...]:
        """The questions with evidence left after parsing: the ones that are scored."""
        return tuple(q for q in self.questions if q.evidence)


def speaker_name(speaker: str) -> str:
    """A speaker as the chat API's ``name`` takes it (letters, digits, "_" and "-")."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", speaker.strip())[:64]


def parse_time(text: str) -> float:
    """``"29.12.2023, 22:42:04"`` as Unix seconds, the time read as UTC."""
    return datetime.strptime(text.strip(), DATE_FORMAT).replace(tzinfo=UTC).timestamp()


def parse_evidence(raw: Iterable[str], known: Container[str]) -> tuple[list[str], list[str]]:
    """The message ids a question's evidence names, and the pieces dropped in whole or in
    part (unparsable, or naming an id the conversation does not have).

    The dataset's evidence strings are hand-written: each is split on ';' and ','; a piece
    is stripped of whitespace and of a trailing '.'; "D 2:18" is "D2:18"; a range
    "D12:3-D12:5" is D12:3, D12:4, D12:5 (within one session only). Anything else, and
    an id the conversation does not have, is dropped. Ids are returned once each, in order.
    """
    ids: list[str] = []
    dropped: list[str] = []
    for item in raw:
        for piece in re.split(r"[;,]", str(item)):
            piece = piece.strip().rstrip(".").strip()
            if not piece:
                continue
            named = _expand(piece)
            found = [i for i in named if i in known]
            if not found or len(found) < len(named):
                dropped.append(piece)
            ids += [i for i in found if i not in ids]
    return ids, dropped


def _expand(piece: str) -> list[str]:
    """The ids one evidence piece names: one, a range's, or none if unparsable."""
    if one := _ONE.fullmatch(piece):
        return [f"D{int(one[1])}:{int(one[2])}"]
    if span := _RANGE.fullmatch(piece):
        session, first, other, last = (int(g) for g in span.groups())
        if session != other or first > last:
            return []
        return [f"D{session}:{n}" for n in range(first, last + 1)]
    return []


def load_conversation(path: Path) -> RealConversation:
    """One ``Chat_*.json``: sessions ``session_1``, ``session_2``… in numeric order."""
    data = json.loads(path.read_text(encoding="utf-8"))
    sessions = sorted(
        (int(match[1]), key) for key in data if (match := _SESSION_KEY.fullmatch(key))
    )
    rows = [row for _, key in sessions for row in data[key]]
    if not rows:
        raise ValueError(f"{path}: no session_N messages")
    first = rows[0]["speaker"]
    other = next((row["speaker"] for row in rows if row["speaker"] != first), "")
    messages = tuple(
        RealMessage(
            dia_id=row["dia_id"],
            role="user" if row["speaker"] == first else "assistant",
            speaker=row["speaker"],
            text=row["clean_text"],
            timestamp=parse_time(row["date_time"]),
        )
        for row in rows
    )
    known = {m.dia_id for m in messages}
    questions = []
    for number, item in enumerate(data.get("qa", [])):
        raw = tuple(str(e) for e in item.get("evidence") or ())
        evidence, dropped = parse_evidence(raw, known)
        questions.append(
            Question(
                number=number,
                question=item["question"],
                answer=str(item.get("answer", "")),
                category=CATEGORIES.get(int(item["category"]), f"category {item['category']}"),
                evidence=tuple(evidence),
                raw_evidence=raw,
                dropped=tuple(dropped),
            )
        )
    return RealConversation(path.stem, (first, other), messages, tuple(questions))


def dataset_files(data_dir: Path) -> list[Path]:
    """The ``Chat_<n>_*.json`` files of the directory, by conversation number."""
    found = [(int(m[1]), p) for p in data_dir.glob("Chat_*.json") if (m := _FILE.fullmatch(p.name))]
    return [path for _, path in sorted(found)]


def load_all(data_dir: Path) -> list[RealConversation]:
    """Every conversation of the dataset, by number."""
    return [load_conversation(path) for path in dataset_files(data_dir)]


# --- Scoring ---------------------------------------------------------------------------


def normalise(text: str) -> str:
    """Every run of whitespace as one space, stripped: the gateway indents continuation
    lines of a multi-line message, which a verbatim match must not hold against it."""
    return " ".join(text.split())


def found_evidence(evidence: Sequence[str], texts: Mapping[str, str], forwarded: str) -> list[str]:
    """The evidence ids whose message text is in ``forwarded``, verbatim once normalised.

    ``forwarded`` is the normalised text of what a row sends, the question not counted.
    A question's score is ``len(found) / len(evidence)``.
    """
    return [dia_id for dia_id in evidence if normalise(texts[dia_id]) in forwarded]


def describe(conversation: RealConversation) -> dict[str, object]:
    """What --json records of a conversation: sizes, and what evidence parsing dropped."""
    return {
        "id": conversation.id,
        "speakers": {"user": conversation.speakers[0], "assistant": conversation.speakers[1]},
        "messages": len(conversation.messages),
        "questions": len(conversation.questions),
        "scored": len(conversation.scored),
        "excluded": [q.number for q in conversation.questions if not q.evidence],
        "dropped_evidence": {
            str(q.number): list(q.dropped) for q in conversation.questions if q.dropped
        },
    }


# --- The naive recall baseline ---------------------------------------------------------

# A small stopword list: the words that would otherwise match half of every conversation.
_STOPWORDS_TEXT = """a an and are as at be but by did do does for from had has have he her
him his how i if in is it its me my of on or our she so that the their them they this to was
we were what when where which who why will with you your"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())
_WORD = re.compile(r"[a-z0-9]+")


def terms(text: str) -> list[str]:
    """Lowercase alphanumeric runs, stopwords out, no stemming."""
    return [word for word in _WORD.findall(text.lower()) if word not in STOPWORDS]


def stemmed_terms(text: str) -> list[str]:
    """``terms``, Snowball-stemmed ("cooking" and "cooked" are "cook")."""
    stemmed: list[str] = _STEMMER.stemWords(terms(text))
    return stemmed


_STEMMER = Stemmer.Stemmer("english")


class BM25:
    """Plain Okapi BM25 (k1 1.2, b 0.75) over a fixed list of documents; ``split`` makes
    the terms of a document and of a query."""

    def __init__(
        self,
        documents: Sequence[str],
        k1: float = 1.2,
        b: float = 0.75,
        split: Callable[[str], list[str]] = terms,
    ) -> None:
        self.k1, self.b, self.split = k1, b, split
        counts = [Counter(split(d)) for d in documents]
        lengths = [sum(c.values()) for c in counts]
        average = sum(lengths) / len(lengths) if lengths else 0.0
        # term -> [(document, its weight of the term without the idf)]
        self.postings: dict[str, list[tuple[int, float]]] = {}
        for i, count in enumerate(counts):
            norm = k1 * (1 - b + b * lengths[i] / average) if average else k1
            for term, tf in count.items():
                self.postings.setdefault(term, []).append((i, tf * (k1 + 1) / (tf + norm)))
        n = len(counts)
        self.idf = {
            term: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5))
            for term, p in self.postings.items()
        }

    def rank(self, query: str) -> list[int]:
        """Indexes of the documents sharing a term with the query, best first (ties: newer)."""
        scores: dict[int, float] = {}
        for term in set(self.split(query)):
            for i, weight in self.postings.get(term, ()):
                scores[i] = scores.get(i, 0.0) + self.idf[term] * weight
        return sorted(scores, key=lambda i: (-scores[i], -i))
