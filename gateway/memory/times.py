"""The times a question names, as spans of calendar days (pure).

Recall favours the messages of a time the question names (``recall.DATE_BOOST``): a date
written out ("on 29 Dec 2023", ``named_days``), the days on one side of one ("before 7
Jan 2024", ``_sided``) or between two ("from 2 Jan 2024 to 9 Jan 2024", ``_ranges``),
and a time said relative to the conversation's present or by its name (``named_spans``):
"yesterday", "two weeks ago", "last month", "on Monday", "in May", "last summer", "at
Christmas". The present is the conversation's, not the clock's: an imported conversation
asked about today still says "yesterday" of its own last days.

Days are proleptic ordinals (``archive.day_of``); a span is its first and last day. What
is read is English as people write it in chat, and only what names one time: "in the
past" or "some day" names none, and "next week" names days no message has yet.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable

Span = tuple[int, int]  # first and last day, both included

_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    )
}
_MONTH = (
    r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
# Dates as people write them: 2024-01-05, 5 Jan 2024, the 5th of January 2024, January 5,
# 2024, 05.01.2024 and 05/01/2024 (day first, as most of the world writes it).
_DATES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], tuple[int, int, int]]]] = [
    (
        re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"),
        lambda m: (int(m[1]), int(m[2]), int(m[3])),
    ),
    (
        re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\.?,?\s+(\d{{4}})\b"),
        lambda m: (int(m[3]), _MONTHS[m[2][:3]], int(m[1])),
    ),
    (
        re.compile(rf"\b{_MONTH}\.?\s+{_DAY},?\s+(\d{{4}})\b"),
        lambda m: (int(m[3]), _MONTHS[m[1][:3]], int(m[2])),
    ),
    (
        re.compile(r"\b(\d{1,2})[./](\d{1,2})[./](\d{4})\b"),
        lambda m: (int(m[3]), int(m[2]), int(m[1])),
    ),
]


def named_days(text: str) -> frozenset[int]:
    """The calendar days a text writes out as dates."""
    return frozenset(day for _, _, day in _written(text.lower()))


def _written(lower: str) -> list[tuple[int, int, int]]:
    """Each date written out in a lowercase text: where it starts and ends, and its day."""
    found = []
    for pattern, parts in _DATES:
        for match in pattern.finditer(lower):
            try:
                found.append((match.start(), match.end(), datetime.date(*parts(match)).toordinal()))
            except ValueError:
                continue  # "31.02.2024", "13/25/2024"
    return sorted(found)


# Two written dates joined as the ends of one stretch: "between 2 Jan 2024 and 9 Jan
# 2024", "from 02.01.2024 to 09.01.2024", "2024-01-02 - 2024-01-09". Without the first
# word, "and" joins two days ("on 2 Jan 2024 and 9 Jan 2024"), not the days between.
# (Within a line: a dash at the start of the next is a list's bullet, not a range.)
_DASHES = r"[-\u2013\u2014]"  # a hyphen, an en or an em dash
_OPEN = r"\b(?:between|from)\s+(?:the\s+)?"
_JOIN = rf"[ \t]*,?[ \t]*(?:and|to|until|till|through|thru|{_DASHES})[ \t]*(?:the[ \t]+)?"
_RANGE_OPENS = re.compile(f"{_OPEN}$")
_RANGE_JOINS = re.compile(f"^{_JOIN}$")
_DASH = re.compile(rf"^[ \t]*{_DASHES}[ \t]*$")


# The first end written short, its month or year left to the second: "between 2 and 9
# Jan 2024", "from the 2nd to the 9th of January 2024", "from Jan 2 to Jan 9, 2024",
# "between 28 Dec and 3 Jan 2024"; and "2-9 Jan 2024" (``_DAY_FIRST`` dates only: before
# "2024-01-09", a number and a dash are seldom a day).
_SHORT_START = re.compile(
    rf"(?:{_OPEN}(?:{_DAY}(?:\s+(?:of\s+)?{_MONTH})?|{_MONTH}\.?\s+{_DAY}){_JOIN}"
    rf"|\b{_DAY}[ \t]*{_DASHES}[ \t]*(?:the[ \t]+)?)$"
)
_DAY_FIRST = re.compile(r"\d{1,2}(?:st|nd|rd|th)?\s")


def _short_start(lower: str, start: int, day: int) -> int | None:
    """The first day of a stretch whose first end, written short before the date at
    ``start`` (``day``), takes its month and year from it; None without one."""
    match = _SHORT_START.search(lower[max(0, start - 40) : start])
    if match is None:
        return None
    number, name = match[1] or match[4] or match[5], match[2] or match[3]
    if match[5] and not _DAY_FIRST.match(lower, start):
        return None
    date = datetime.date.fromordinal(day)
    month = _MONTHS[name[:3]] if name else date.month
    try:
        first = datetime.date(date.year, month, int(number)).toordinal()
        if first > day and name:  # "between 28 Dec and 3 Jan 2024": the December before
            first = datetime.date(date.year - 1, month, int(number)).toordinal()
        elif first > day:  # "between 29 and 3 Jan 2024": the month before
            year, before = _months_back(date, 1)
            first = datetime.date(year, before, int(number)).toordinal()
    except ValueError:
        return None  # "between 31 and 3 Mar 2024", a year 0
    return first


def _ranges(lower: str, written: list[tuple[int, int, int]], today: int) -> list[Span]:
    """The spans of the written dates (``_written``): a stretch between two, from the
    first day to the last (and the day after), its first end maybe written short
    (``_short_start``); each other date with the words before it (``_sided``)."""
    found = []
    at = 0
    while at < len(written):
        start, end, day = written[at]
        if at + 1 < len(written):
            next_start, _, next_day = written[at + 1]
            between = lower[end:next_start]
            if _RANGE_JOINS.match(between) and (
                _DASH.match(between) or _RANGE_OPENS.search(lower[max(0, start - 16) : start])
            ):
                first, last = sorted((day, next_day))
                found.append((first, last + 1))
                at += 2
                continue
        short = _short_start(lower, start, day)
        found.append((short, day + 1) if short is not None else _sided(lower, start, day, today))
        at += 1
    return found


# A written date after a word that points to one side of it names the days on that side:
# "before 7 Jan 2024" the week before it, "after 03.01.2024" the week after, "since 29 Dec
# 2023" up to the present, each with the date itself (people say "before" of the day they
# mean as well); "the day before" it, the one day. A week: what "shortly before" means,
# the commonest case; the boost is a preference, not a filter, so evidence further back is
# still found by its words.
SIDE_DAYS = 7
_SIDE = re.compile(
    r"\b(?:(?:the|a|one)\s+(?:day|night|evening)\s+(?:(?P<day_before>before)|(?P<day_after>after))"
    r"|(?P<weekday>monday|tuesday|wednesday|thursday|friday|saturday|sunday)\s+before"
    r"|(?P<before>before|by|until|till|up\s+to)|(?P<after>after)|(?P<since>since))"
    r"\s+(?:the\s+)?$"
)


def _sided(lower: str, start: int, day: int, today: int) -> Span:
    """The span a date written at ``start`` names, read with the words before it."""
    side = _SIDE.search(lower[max(0, start - 24) : start])
    if side is None:
        return day, day + 1
    if side["day_before"] or side["day_after"]:  # "the day before 7 Jan": the 6th
        one = day - 1 if side["day_before"] else day + 1
        return one, one + 1
    if side["weekday"]:  # "on Friday before 10.01.2024": the latest Friday before it
        named = _latest_before(day, side["weekday"])
        return named, named + 1
    if side["before"]:
        return day - SIDE_DAYS, day
    if side["after"]:
        return day, day + SIDE_DAYS
    return day, max(today, day + 1) if today > 0 else day + SIDE_DAYS  # since


# --- Times relative to the present, and named ones ---------------------------------------

_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
    "a couple of": 2, "couple of": 2, "a few": 3, "few": 3,
}  # fmt: skip
_VAGUE = frozenset({"a couple of", "couple of", "a few", "few"})
_COUNT = r"(\d{1,3}|a\s+couple\s+of|couple\s+of|a\s+few|few|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"  # noqa: E501
_UNIT = r"(day|week|month|year)s?"
# How loosely "N days ago" is meant: a day either way ("two days ago" of Monday evening,
# said on Wednesday morning); "N weeks ago", half a week either way.
_DAY_SLACK = 1
_WEEK_SLACK = 3

_AGO = re.compile(rf"\b{_COUNT}\s+{_UNIT}\s+ago\b")
# "the past week", "the last three days" (not "the last day of school").
_PAST = re.compile(rf"\b(?:past\s+(?:{_COUNT}\s+)?{_UNIT}|last\s+{_COUNT}\s+{_UNIT})\b")
_CALENDAR = re.compile(r"(?<!\bthe\s)\b(last|this)\s+(week|month|year)\b")
_WEEKEND = re.compile(r"\b(?:(last|this)\s+|the\s+)weekend\b")
_WEEKDAY = re.compile(rf"\b(?:on|last|this\s+past)\s+({'|'.join(_WEEKDAYS)})\b")
_SIMPLE = re.compile(
    r"\b(today|tonight|this\s+(?:morning|afternoon|evening)|yesterday|last\s+night"
    r"|the\s+day\s+before\s+yesterday)\b"
)
_SIMPLE_DAYS = {"today": 0, "tonight": 0, "yesterday": 1, "last night": 1}
# A month said alone: "in May", "last March", "May 2023" (not "may I", not "5 May 2024",
# a date ``named_days`` reads).
_MONTH_ALONE = re.compile(
    rf"\b(?:(in|during|since|last|early|late|mid|of)\s+{_MONTH}(?:\s+(\d{{4}}))?"
    rf"|{_MONTH}\s+(\d{{4}}))\b"
)
# A day of a month without a year: "5 May", "the 5th of May", "May 5th" (not "May 2023").
_DAY_OF_MONTH = re.compile(
    rf"\b(?:{_DAY}\s+(?:of\s+)?{_MONTH}|{_MONTH}\.?\s+{_DAY})\b(?!,?\s*\d{{4}})(?!\d)"
)
_HOLIDAYS = re.compile(
    r"\b(?:(christmas\s+eve)|(christmas|xmas)|(new\s+year'?s'?\s+eve|nye)"
    r"|(new\s+year'?s'?\s+day)|(new\s+year'?s?))\b(?:\s+(\d{4}))?"
)
# Each holiday's first and last day as (year, month, day), the year counted from the one
# it ends in, in the order of ``_HOLIDAYS``' groups.
_HOLIDAY_DAYS = [
    ((0, 12, 24), (0, 12, 24)),  # Christmas Eve
    ((0, 12, 24), (0, 12, 26)),  # Christmas (its eve to Boxing Day)
    ((0, 12, 31), (0, 12, 31)),  # New Year's Eve
    ((0, 1, 1), (0, 1, 1)),  # New Year's Day
    ((-1, 12, 31), (0, 1, 1)),  # the new year: the night it turns, either side of midnight
]
# A season with a word that makes it one ("last summer", "in the fall", "during winter")
# or a year ("spring 2024", "winter 2021-2022", "winter 2021/22", "spring break of 2024":
# its break, vacation or term between); alone, "summer" is as often a kind of thing
# ("summer camp") and "fall" a verb. Northern and meteorological: spring is March to May,
# summer June to August, autumn September to November, winter December to February.
_SEASON = re.compile(
    r"\b(?:(since)\s+)?(?:(last|this|past|in|during|over|early|late|mid)\s+)?(?:the\s+)?"
    r"(spring|summer|autumn|fall|winter)\b(?:\s+(?:break|vacation|holidays?|semester|term|camp))?"
    r"(?:\s+(?:of\s+)?(\d{4})(?:\s*[-/\u2013\u2014]\s*(\d{4}|\d{2}))?\b)?"
)
_SEASON_STARTS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
MOST_SPANS = 8  # a question naming more times than this is read for its first ones


def _readers() -> tuple[Callable[[str, datetime.date], list[Span]], ...]:
    return (
        _simple, _ago, _past, _calendar, _weekend, _weekday, _day_of_month, _month, _holiday,
        _season,
    )  # fmt: skip


def named_spans(text: str, today: int) -> tuple[Span, ...]:
    """The spans of days a text names, each with the day after (people answer after
    midnight, and tell of a day the next): its written-out dates, the days on one side
    of one ("before 7 Jan 2024", ``_sided``) or between two (``_ranges``); without any, the
    times it says relative to ``today`` or by their name, which end on ``today`` at the
    latest (none without a known present: ``today`` 0). At most ``MOST_SPANS``, in the
    order found, each once."""
    lower = text.lower()
    found = _ranges(lower, _written(lower), today)
    # A question that writes out a date reads its other times from it ("on Friday before
    # 10.01.2024", ``_sided``), not from the present.
    if today > 0 and not found:
        date = datetime.date.fromordinal(today)
        for read in _readers():
            try:
                spans = read(lower, date)
            except ValueError:
                continue  # a day outside the calendar's years ("999 months ago" in year 5)
            found += [(first, min(last + 1, today)) for first, last in spans if first <= today]
    return tuple(dict.fromkeys(found))[:MOST_SPANS]


def _ordinal(year: int, month: int, day: int) -> int:
    return datetime.date(year, month, day).toordinal()


def _month_span(year: int, month: int) -> Span:
    first = datetime.date(year, month, 1)
    after = datetime.date(year + month // 12, month % 12 + 1, 1)
    return first.toordinal(), after.toordinal() - 1


def _months_back(date: datetime.date, n: int) -> tuple[int, int]:
    months = date.year * 12 + date.month - 1 - n
    return months // 12, months % 12 + 1


def _simple(lower: str, date: datetime.date) -> list[Span]:
    today = date.toordinal()
    found = []
    for match in _SIMPLE.finditer(lower):
        said = " ".join(match[1].split())
        back = 2 if said.startswith("the day") else _SIMPLE_DAYS.get(said, 0)
        found.append((today - back, today - back))
    return found


def _ago(lower: str, date: datetime.date) -> list[Span]:
    today = date.toordinal()
    found = []
    for match in _AGO.finditer(lower):
        n = _count(match[1])
        unit = match[2]
        if unit in ("month", "year") and " ".join(match[1].split()) in _VAGUE:
            continue  # "a few years ago": too vague to name one
        if unit == "day":
            found.append((today - n - _DAY_SLACK, today - n + _DAY_SLACK))
        elif unit == "week":
            found.append((today - 7 * n - _WEEK_SLACK, today - 7 * n + _WEEK_SLACK))
        elif unit == "month":
            found.append(_month_span(*_months_back(date, n)))
        elif date.year - n >= 1:
            found.append((_ordinal(date.year - n, 1, 1), _ordinal(date.year - n, 12, 31)))
    return found


def _past(lower: str, date: datetime.date) -> list[Span]:
    """ "the past week", "the last three days": up to today."""
    today = date.toordinal()
    found = []
    for match in _PAST.finditer(lower):
        said, unit = (match[1], match[2]) if match[2] else (match[3], match[4])
        n = _count(said) if said else 1
        length = {"day": 1, "week": 7, "month": 30, "year": 365}[unit]
        found.append((today - n * length, today))
    return found


def _calendar(lower: str, date: datetime.date) -> list[Span]:
    """ "last week" (Monday to Sunday), "this month", "last year"."""
    today = date.toordinal()
    found = []
    for which, unit in _CALENDAR.findall(lower):
        back = 1 if which == "last" else 0
        if unit == "week":
            monday = today - date.weekday() - 7 * back
            found.append((monday, monday + 6))
        elif unit == "month":
            found.append(_month_span(*_months_back(date, back)))
        elif date.year - back >= 1:
            year = date.year - back
            found.append((_ordinal(year, 1, 1), _ordinal(year, 12, 31)))
    return found


def _weekend(lower: str, date: datetime.date) -> list[Span]:
    """ "last weekend": the one before this week; "this weekend", "the weekend": the
    latest one begun."""
    today = date.toordinal()
    found = []
    for match in _WEEKEND.finditer(lower):
        saturday = today - (date.weekday() - 5) % 7  # the latest Saturday, today or before
        if match[1] == "last" and date.weekday() >= 5:
            saturday -= 7
        found.append((saturday, saturday + 1))
    return found


def _weekday(lower: str, date: datetime.date) -> list[Span]:
    """ "on Monday", "last Monday": the latest Monday before today."""
    found = [_latest_before(date.toordinal(), name) for name in _WEEKDAY.findall(lower)]
    return [(day, day) for day in found]


def _latest_before(day: int, weekday: str) -> int:
    """The latest day named ``weekday`` ("monday") before ``day`` (a week before, on one)."""
    back = (datetime.date.fromordinal(day).weekday() - _WEEKDAYS.index(weekday)) % 7
    return day - (back or 7)


def _day_of_month(lower: str, date: datetime.date) -> list[Span]:
    """ "on 5 May", "May 5th", without a year: the latest such day, today or before."""
    today = date.toordinal()
    found = []
    for match in _DAY_OF_MONTH.finditer(lower):
        day, name = (match[1], match[2]) if match[1] else (match[4], match[3])
        month, number = _MONTHS[name[:3]], int(day)
        for year in (date.year, date.year - 1):
            try:
                ordinal = _ordinal(year, month, number)
            except ValueError:
                continue  # "31 June"; 29 February of another year
            if ordinal <= today:
                found.append((ordinal, ordinal))
                break
    return found


def _month(lower: str, date: datetime.date) -> list[Span]:
    """ "in May": the latest May begun (this year's, or last year's before May); "May
    2023", "in May 2023": that one; "since May": from it to today."""
    found = []
    for match in _MONTH_ALONE.finditer(lower):
        name, year = (match[2], match[3]) if match[2] else (match[4], match[5])
        month = _MONTHS[name[:3]]
        if year is not None:
            found.append(_month_span(int(year), month))
        elif match[1] != "of":  # "of May" without a year: a day of it (``_day_of_month``)
            latest = date.year if month <= date.month else date.year - 1
            if match[1] == "last" and month == date.month:
                latest -= 1
            first, last = _month_span(latest, month)
            found.append((first, date.toordinal() if match[1] == "since" else last))
    return found


def _holiday(lower: str, date: datetime.date) -> list[Span]:
    """Christmas and the new year: the one of the year written ("New Year 2025" turns
    into 2025), or else the latest begun."""
    today = date.toordinal()
    found = []
    for match in _HOLIDAYS.finditer(lower):
        which = next(i for i in range(5) if match[i + 1] is not None)
        (y1, m1, d1), (y2, m2, d2) = _HOLIDAY_DAYS[which]
        years = [int(match[6])] if match[6] else [date.year + 1, date.year, date.year - 1]
        for year in years:
            if not 2 <= year <= 9998:
                break
            first = _ordinal(year + y1, m1, d1)
            if first <= today or match[6]:
                found.append((first, _ordinal(year + y2, m2, d2)))
                break
    return found


def _count(said: str) -> int:
    return int(said) if said.isdigit() else _NUMBERS[" ".join(said.split())]


def _season(lower: str, date: datetime.date) -> list[Span]:
    """ "last summer", "the past winter": the latest one over; "this summer": the one
    under way or, over, this year's (not one to come: nor a winter not under way, which
    in October is the next one and in April the last); "in the summer", "during winter":
    the latest begun; "since" (the summer, last summer): from it to today; "spring
    2024": that one; "winter 2023": its months in 2023 (January, February and December);
    "winter 2021-2022", "winter 2021/22": the one from December 2021."""
    found: list[Span] = []
    for match in _SEASON.finditer(lower):
        try:
            span = _season_named(match, date)
        except ValueError:
            continue  # a season outside the calendar's years
        found += span
    return found


def _season_named(match: re.Match[str], date: datetime.date) -> list[Span]:
    """The spans of one season ``_SEASON`` matched, said on ``date``."""
    since, word, name, year, joined = match[1], match[2], match[3], match[4], match[5]
    start = _SEASON_STARTS[name]
    if year is not None:
        y = int(year)
        if name != "winter":
            return [_season_span(y, start)]
        if joined is not None and int(joined) % 100 == (y + 1) % 100:
            return [_season_span(y, start)]  # "winter 2021-2022": from its December
        return [(_month_span(y, 1)[0], _month_span(y, 2)[1]), _month_span(y, 12)]
    if since is None and word is None:
        return []  # "summer camp", "I fall"
    today = date.toordinal()
    # The latest begun, today or before (a winter, the December before).
    begun = date.year if date.month >= start else date.year - 1
    first, last = _season_span(begun, start)
    if word in ("last", "past") and last >= today:
        first, last = _season_span(begun - 1, start)
    elif word == "this" and (begun != date.year if name != "winter" else last < today):
        return []  # "this summer" said in March: one to come, no message's yet
    return [(first, today if since else last)]


def _season_span(year: int, start: int) -> Span:
    """The three months from month ``start`` of ``year`` (a winter's into the next year)."""
    months = year * 12 + start - 1 + 2  # the third month, counted from year 0
    return _month_span(year, start)[0], _month_span(months // 12, months % 12 + 1)[1]
