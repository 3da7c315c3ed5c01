"""The words recall matches on: lower-cased, stopwords dropped, Snowball-stemmed (pure).

"cooking", "cooked" and "cooks" are one term ("cook"), so a question finds the message
that said it in another form; numbers and names stay themselves. The stemmer is
PyStemmer's English Snowball stemmer (a C extension): a few microseconds a message.
"""

from __future__ import annotations

import re

import Stemmer

from gateway.caching import memo, memo_when_short

_TOKEN = re.compile(r"[a-z0-9]+(?:['.-][a-z0-9]+)*")
# Words too common to tell messages apart; numbers and names are what recall is for.
_STOPWORDS_TEXT = """a about above after again against all am an and any are as at be because been
    before being below between both but by can could did do does doing down during each
    few for from further had has have having he her here hers herself him himself his how
    i if in into is it its itself just me more most my myself no nor not now of off on
    once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too
    under until up very was we were what when where which while who whom why will with
    would you your yours yourself yourselves also okay ok yes yeah please thanks thank
    hi hello hey sure really well like get got let lets let's i'm i've i'd i'll it's
    that's don't can't won't you're we're they're what's there's say said tell told
    know think want need make one two much many"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())
# Longer "words" (a pasted hash, a run of random letters) are nobody's search term: left
# out, so that one cannot become a posting of a megabyte.
MAX_WORD_CHARS = 64


# Kept for the process, not built per app: a constant (English Snowball, a pure function
# of a word), made on first use, not at import; its own small cache of stems goes with it.
@memo(maxsize=1)
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


def words(text: str) -> list[str]:
    """The text's lower-cased words that are not stopwords, possessives folded
    ("kate's" -> "kate"), before stemming."""
    found = []
    for token in _TOKEN.findall(text.lower().replace("\u2019", "'")):
        if token in STOPWORDS or len(token) > MAX_WORD_CHARS:
            continue
        if token.endswith("'s"):
            token = token[:-2]
        found.append(token)
    return found


def stems(tokens: list[str]) -> list[str]:
    stemmed: list[str] = _stemmer().stemWords(tokens)
    return stemmed


def terms(text: str) -> tuple[str, ...]:
    """The indexed terms of a text, in order."""
    return tuple(stems(words(text)))


# Kept for the process, not per app: a pure function of a text, which recall reads again
# from turn to turn (the best hits' for the second pass, a session's facts: ``fact_keys``;
# a text is one string object while it is held, and so hashed once). A chat message's or
# a fact's, not a pasted document's: at most 2,048 texts of 1,024 characters, ~35 MB.
@memo_when_short(limit=1024, maxsize=2048)
def distinct_terms(text: str) -> frozenset[str]:
    """The distinct indexed terms of a text."""
    return frozenset(terms(text))
