"""Who a question is about, when it names one of the conversation's speakers (pure).

A client that knows who speaks sends it as the message's ``name`` (the chat API's field:
"Kate", "kate_smith"; a group chat's people, a support agent's team). When a question
names exactly one of them ("What are Kate's hobbies?"), what that speaker said holds
most of the answer, and the words rarely do: her hobbies are "I love skiing" and "a
cooking class today", with no "Kate" and no "hobby" in them. Recall then lifts that
speaker's messages (``recall.SPEAKER``). A question that names two speakers ("Which
cities have both Kate and Elise been to?") is about both: no one is lifted.

A name is matched by its parts, as a person would say them, in any case and any
alphabet: "Fahim_Khan", "fahim.khan", "Fahim-Khan" and "FahimKhan" are named by "Fahim"
or "Khan", "Zoë" by "zoë" or "Zoe" (and "Jose" by "José"), "प्रिया" by itself; "Kate"
and "kate" are one speaker. Parts of one letter and numbers name no one ("GPT-4o" is
not named by "4"), nor do recall's stopwords ("will"; "may" is a month). A language
written without spaces ("李雷喜欢什么") names no one: its runs of letters are not words.
A role given a single name keeps it for its messages sent without one: an import named
both people, and the client's later turns came unnamed.

A name is read to the chat API's 64 characters: what it costs to index stays bounded
whatever a client sends.
"""

from __future__ import annotations

import re
import unicodedata
from array import array
from collections.abc import Iterable

import regex

from gateway.memory.terms import STOPWORDS

# The roles whose ``name`` names a person (a function's result names the function).
SPOKEN = ("user", "assistant")
# The chat API's longest ``name``: what is read of a longer one.
MAX_NAME_CHARS = 64
# What a speaker's entry costs the process beyond its name (its array, its sets' slots).
_PER_SPEAKER_BYTES = 300
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
# A run of letters with their marks (a vowel sign, a virama, a combining accent).
_LETTERS = regex.compile(r"\p{L}[\p{L}\p{M}]*")
_MARKS = regex.compile(r"\p{M}+")


def parts(text: str) -> frozenset[str]:
    """The parts of a name, or of a question, that can name someone: its runs of letters
    (cut where a capital follows a small letter), composed (NFC) and case-folded, and the
    Latin ones also without their accents, of two letters or more, stopwords out
    ("FahimKhan" -> fahim, khan; "Zoë" -> zoë, zoe)."""
    text = unicodedata.normalize("NFC", _CAMEL.sub(" ", text)).casefold()
    found = set(_LETTERS.findall(text))
    if not text.isascii():  # (once over the text: a question may be 16 KB)
        plain = _MARKS.sub("", unicodedata.normalize("NFD", text))
        found.update(run for run in _LETTERS.findall(plain) if run.isascii())
    return frozenset(part for part in found if len(part) > 1 and part not in STOPWORDS)


class SpeakerIndex:
    """The speakers of an archive's messages, by role and name, and their positions.

    Looked up at every request by the question's words, and a lookup stops at the second
    name found: a client may give each of 20,000 messages a name of its own.
    """

    def __init__(self) -> None:
        # (role, case-folded name) -> its messages' positions, in order; "": no name.
        self.positions: dict[tuple[str, str], array[int]] = {}
        self._by_part: dict[str, set[str]] = {}  # a name's part -> the names that have it
        self._by_role: dict[str, set[str]] = {}  # a role -> the names it was given
        # (role, name) -> the name as its first message wrote it ("FahimKhan": its parts
        # are fahim and khan; the case-folded key's would be one word).
        self._spelled: dict[tuple[str, str], str] = {}

    def add(self, role: str, name: object, position: int) -> int:
        """Record who said the message at ``position``; the bytes a new speaker costs."""
        if role not in SPOKEN:
            return 0
        said = _key(name)
        key = (role, said)
        found = self.positions.get(key)
        if found is not None:
            found.append(position)
            return 0
        self.positions[key] = array("I", [position])
        if said:
            self._spelled[key] = str(name)[:MAX_NAME_CHARS]
        self._index(role, said)
        return 2 * len(said) + _PER_SPEAKER_BYTES

    def _index(self, role: str, said: str) -> None:
        if said:
            self._by_role.setdefault(role, set()).add(said)
            for part in parts(self._spelled[(role, said)]) | parts(said):
                self._by_part.setdefault(part, set()).add(said)

    def truncate(self, keep: int) -> int:
        """Forget the positions from ``keep`` on; the bytes freed."""
        freed = 0
        for key, positions in list(self.positions.items()):
            while positions and positions[-1] >= keep:
                positions.pop()
            if not positions:
                del self.positions[key]
                self._spelled.pop(key, None)
                freed += 2 * len(key[1]) + _PER_SPEAKER_BYTES
        if freed:  # (a speaker gone: rare, the names made again)
            self._by_part.clear()
            self._by_role.clear()
            for role, said in self.positions:
                self._index(role, said)
        return freed

    @property
    def has_names(self) -> bool:
        """Whether a question can name any speaker of these messages (a name with a part
        of two letters or more)."""
        return bool(self._by_part)

    def names(self) -> set[str]:
        """Every name given (case-folded)."""
        return set().union(*self._by_role.values())

    def named(self, asked: Iterable[str], enough: int = 2) -> set[str]:
        """The names a question's ``parts`` name, case-folded: at most ``enough`` of them
        (whether one speaker is named needs no more)."""
        found: set[str] = set()
        for part in asked:
            for name in self._by_part.get(part, ()):
                found.add(name)
                if len(found) >= enough:
                    return found
        return found

    def of(self, name: str) -> list[array[int]]:
        """The positions of ``name``'s messages (a name as ``named`` gives it): those
        that carry the name, and those of a role that carry none when ``name`` is the
        only name that role was given."""
        found = []
        for role in SPOKEN:
            given = self._by_role.get(role, set())
            if name not in given:
                continue
            found.append(self.positions[(role, name)])
            unnamed = self.positions.get((role, ""))
            if unnamed is not None and len(given) == 1:
                found.append(unnamed)
        return found


def _key(name: object) -> str:
    """A message's speaker as indexed: its name's first 64 characters, composed (NFC)
    and case-folded; "" for none."""
    if not isinstance(name, str):
        return ""
    return unicodedata.normalize("NFC", name[:MAX_NAME_CHARS]).casefold()
