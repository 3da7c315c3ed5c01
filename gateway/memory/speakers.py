"""Who a question is about, when it names one of the conversation's speakers (pure).

A client that knows who speaks sends it as the message's ``name`` (the chat API's field:
"Kate", "kate_smith"; a group chat's people, a support agent's team). When a question
names exactly one of them ("What are Kate's hobbies?"), what that speaker said holds
most of the answer, and the words rarely do: her hobbies are "I love skiing" and "a
cooking class today", with no "Kate" and no "hobby" in them. Recall then lifts that
speaker's messages (``recall.SPEAKER``). A question that names two speakers ("Which
cities have both Kate and Elise been to?") is about both: no one is lifted.

A name is matched by its parts, as a person would say them: "Fahim_Khan", "fahim.khan"
and "FahimKhan" are named by "Fahim" or "Khan", in any case; a question's stopwords
("will", "may") name no one. A role given a single name keeps it for its messages sent
without one: an import named both people, and the client's later turns came unnamed.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable

# A name's parts: runs of letters, cut where a capital follows a small letter.
_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# The roles whose ``name`` names a person (a function's result names the function).
SPOKEN = ("user", "assistant")
# What a speaker's entry costs the process beyond its name (its array, its sets' slots).
_PER_SPEAKER_BYTES = 300


def name_parts(name: str) -> frozenset[str]:
    """The lower-cased parts of a speaker's name ("FahimKhan" -> fahim, khan)."""
    return frozenset(part.lower() for part in _PART.findall(name))


class SpeakerIndex:
    """The speakers of an archive's messages, by role and name, and their positions.

    Looked up at every request by the question's few words, never by a walk over the
    names: a client may give each of 20,000 messages a name of its own.
    """

    def __init__(self) -> None:
        # (role, name) -> the positions of its messages, in order; "" where none was given.
        self.positions: dict[tuple[str, str], array[int]] = {}
        self._by_part: dict[str, set[str]] = {}  # a name's part -> the names that have it
        self._by_role: dict[str, set[str]] = {}  # a role -> the names it was given

    def add(self, role: str, name: object, position: int) -> int:
        """Record who said the message at ``position``; the bytes a new speaker costs."""
        if role not in SPOKEN:
            return 0
        said = name if isinstance(name, str) else ""
        key = (role, said)
        found = self.positions.get(key)
        if found is not None:
            found.append(position)
            return 0
        self.positions[key] = array("I", [position])
        if said:
            self._by_role.setdefault(role, set()).add(said)
            for part in name_parts(said):
                self._by_part.setdefault(part, set()).add(said)
        return len(said) + _PER_SPEAKER_BYTES

    def truncate(self, keep: int) -> int:
        """Forget the positions from ``keep`` on; the bytes freed."""
        freed = 0
        for key, positions in list(self.positions.items()):
            while positions and positions[-1] >= keep:
                positions.pop()
            if not positions:
                del self.positions[key]
                freed += len(key[1]) + _PER_SPEAKER_BYTES
        if freed:  # (a speaker gone: rare, the names made again)
            self._by_part.clear()
            self._by_role.clear()
            for role, said in self.positions:
                if said:
                    self._by_role.setdefault(role, set()).add(said)
                    for part in name_parts(said):
                        self._by_part.setdefault(part, set()).add(said)
        return freed

    def names(self) -> set[str]:
        return set().union(*self._by_role.values())

    def named(self, said: Iterable[str]) -> set[str]:
        """The names a question's words (``terms.words``: lower-cased, stopwords out,
        possessives folded) name."""
        found: set[str] = set()
        for word in said:
            found |= self._by_part.get(word, set())
        return found

    def of(self, name: str) -> list[array[int]]:
        """The positions of ``name``'s messages: those that carry the name, and those of
        a role that carry none when ``name`` is the only name that role was given."""
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
