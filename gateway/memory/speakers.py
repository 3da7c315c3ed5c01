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
("will", "may") name no one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gateway.caching import memo

# A name's parts: runs of letters, cut where a capital follows a small letter.
_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


# Kept for the process: a pure function of a name, met at every request of its session.
@memo(maxsize=4096)
def name_parts(name: str) -> frozenset[str]:
    """The lower-cased parts of a speaker's name ("FahimKhan" -> fahim, khan)."""
    return frozenset(part.lower() for part in _PART.findall(name))


def named_speaker(said: Iterable[str], speakers: Iterable[str]) -> str | None:
    """The one speaker whose name a question's words (``terms.words``: lower-cased,
    stopwords out, possessives folded) name; None when none is named, or several."""
    words = frozenset(said)
    if not words:
        return None
    found = None
    for speaker in speakers:
        if name_parts(speaker) & words:
            if found is not None and found != speaker:
                return None
            found = speaker
    return found
