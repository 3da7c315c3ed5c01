"""The times a question names: written-out dates, and times relative to the present."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory.times import MOST_SPANS, named_days, named_spans


def ordinal(text: str) -> int:
    return datetime.date.fromisoformat(text).toordinal()


# Saturday 27 January 2024: the newest message of an imported conversation, say.
TODAY = ordinal("2024-01-27")


def spans(text: str, today: int = TODAY) -> list[tuple[str, str]]:
    return [
        (datetime.date.fromordinal(a).isoformat(), datetime.date.fromordinal(b).isoformat())
        for a, b in named_spans(text, today)
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("on 29 Dec 2023?", "2023-12-29"),
        ("the 10th of February 2024", "2024-02-10"),
        ("on 10.01.2024", "2024-01-10"),
        ("on 05/01/2024", "2024-01-05"),
        ("5 January 2024", "2024-01-05"),
        ("Dec 29, 2023", "2023-12-29"),
        ("September 3rd, 2025", "2025-09-03"),
        ("2024-01-03", "2024-01-03"),
    ],
)
def test_dates_people_write_are_read(text: str, expected: str) -> None:
    assert named_days(text) == {ordinal(expected)}
    # A span: the day, and the next (people answer after midnight), present or not.
    assert (
        spans(text)
        == spans(text, today=0)
        == [
            (
                expected,
                (datetime.date.fromisoformat(expected) + datetime.timedelta(days=1)).isoformat(),
            )
        ]
    )


@pytest.mark.parametrize("text", ["31.02.2024", "13/25/2024", "version 2024", "at 10.30", ""])
def test_what_is_not_a_date_is_not_read_as_one(text: str) -> None:
    assert named_days(text) == frozenset()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Each span with the day after it, up to today at the latest.
        ("What did I eat yesterday?", ("2024-01-26", "2024-01-27")),
        ("where were we last night", ("2024-01-26", "2024-01-27")),
        ("the day before yesterday", ("2024-01-25", "2024-01-26")),
        ("what did I say this morning?", ("2024-01-27", "2024-01-27")),
        ("three days ago", ("2024-01-23", "2024-01-26")),  # a day either way
        ("a few days ago", ("2024-01-23", "2024-01-26")),
        ("2 weeks ago", ("2024-01-10", "2024-01-17")),  # half a week either way
        ("last week", ("2024-01-15", "2024-01-22")),  # Monday to Sunday
        ("this week", ("2024-01-22", "2024-01-27")),
        ("over the past week", ("2024-01-20", "2024-01-27")),
        ("in the last three days", ("2024-01-24", "2024-01-27")),
        ("last month", ("2023-12-01", "2024-01-01")),
        ("two months ago", ("2023-11-01", "2023-12-01")),
        ("last year", ("2023-01-01", "2024-01-01")),
        ("last weekend", ("2024-01-20", "2024-01-22")),  # today is Saturday: not today's
        ("over the weekend", ("2024-01-27", "2024-01-27")),
        ("on Monday", ("2024-01-22", "2024-01-23")),
        ("last Saturday", ("2024-01-20", "2024-01-21")),  # the one before today
        ("in May", ("2023-05-01", "2023-06-01")),  # the latest May begun
        ("in January", ("2024-01-01", "2024-01-27")),
        ("May 2022", ("2022-05-01", "2022-06-01")),
        ("since November", ("2023-11-01", "2024-01-27")),
        ("on 5 May", ("2023-05-05", "2023-05-06")),  # the latest, today or before
        ("the 20th of January", ("2024-01-20", "2024-01-21")),
        ("January 30th", ("2023-01-30", "2023-01-31")),
        ("at Christmas", ("2023-12-24", "2023-12-27")),
        ("on New Year's Eve", ("2023-12-31", "2024-01-01")),
        ("how did you celebrate the new year?", ("2023-12-31", "2024-01-02")),
        ("New Year 2023", ("2022-12-31", "2023-01-02")),
        # Seasons: northern, meteorological (winter is December to February).
        ("what did we do last summer?", ("2023-06-01", "2023-09-01")),
        ("in the fall", ("2023-09-01", "2023-12-01")),  # the latest begun
        ("during winter", ("2023-12-01", "2024-01-27")),  # under way
        ("this winter", ("2023-12-01", "2024-01-27")),
        ("last winter", ("2022-12-01", "2023-03-01")),  # the latest over
        ("since the summer", ("2023-06-01", "2024-01-27")),
        ("spring 2023", ("2023-03-01", "2023-06-01")),
        ("during spring break of 2022", ("2022-03-01", "2022-06-01")),  # not the latest begun
        ("over the summer vacation", ("2023-06-01", "2023-09-01")),
        ("in winter 2021 - 2022", ("2021-12-01", "2022-03-01")),
    ],
)
def test_times_said_relative_to_the_present_are_read_from_it(
    text: str, expected: tuple[str, str]
) -> None:
    assert spans(text) == [expected]


@pytest.mark.parametrize(
    "text",
    [
        "may I ask you something?",
        "the last day of school",
        "the last week of the semester",
        "a few years ago",  # too vague to name one
        "next week",  # no message is from then yet
        "New Year 2025",
        "what is the weekly planning?",
        "in the past",
        "this summer",  # said in January: one to come
        "summer camp",  # a kind of camp
        "how do you fall asleep?",
    ],
)
def test_what_names_no_time_of_the_conversation_is_not_read(text: str) -> None:
    assert spans(text) == []


@pytest.mark.parametrize(
    ("text", "today"),
    [
        ("December 9999", TODAY),
        ("in May 0000", TODAY),
        ("999 months ago", ordinal("0005-03-01")),
        ("last month", ordinal("0001-01-15")),
        ("on 31 June", TODAY),
        ("at Christmas", ordinal("0001-06-01")),
        ("winter 9999", TODAY),
        ("last winter", ordinal("0001-01-15")),
    ],
)
def test_a_time_outside_the_calendar_is_no_time(text: str, today: int) -> None:
    assert spans(text, today) == []


@pytest.mark.parametrize(
    ("text", "today", "expected"),
    [
        ("this summer", "2024-10-10", ("2024-06-01", "2024-09-01")),  # over, this year's
        ("this summer", "2024-07-10", ("2024-06-01", "2024-07-10")),  # under way
        ("last summer", "2024-07-10", ("2023-06-01", "2023-09-01")),  # this one is not over
        ("this winter", "2024-12-10", ("2024-12-01", "2024-12-10")),
        ("in the spring", "2024-02-10", ("2023-03-01", "2023-06-01")),  # none begun this year
        ("since last summer", "2024-10-10", ("2024-06-01", "2024-10-10")),
        ("since last winter", "2024-10-10", ("2023-12-01", "2024-10-10")),
    ],
)
def test_a_season_is_read_from_the_time_of_year_it_is_said(
    text: str, today: str, expected: tuple[str, str]
) -> None:
    assert spans(text, ordinal(today)) == [expected]


@pytest.mark.parametrize("today", ["2024-04-10", "2024-11-15"])
def test_this_winter_is_only_the_one_under_way(today: str) -> None:
    # In April, the one gone; in November, the one to come: neither is said for sure.
    assert spans("this winter", ordinal(today)) == []


@pytest.mark.parametrize(
    "text", ["in winter 2023", "winter 2023 - 2021", "winter 2023\u20142021", "winter 2023 to 2024"]
)
def test_a_winter_of_one_year_is_its_months_in_that_year(text: str) -> None:
    assert spans(text) == [("2023-01-01", "2023-03-01"), ("2023-12-01", "2024-01-01")]


@pytest.mark.parametrize("text", ["winter 2023\u20142024", "winter 2023/24", "winter 2023 - 2024"])
def test_a_winter_of_two_years_is_the_one_between(text: str) -> None:
    assert spans(text) == [("2023-12-01", "2024-01-27")]


@pytest.mark.parametrize(
    ("text", "today"),
    [("winter 20245", TODAY), ("spring 0000", TODAY), ("this winter", "9999-12-15")],
)
def test_a_season_outside_the_calendar_is_no_time(text: str, today: int | str) -> None:
    assert spans(text, ordinal(today) if isinstance(today, str) else today) == []


def test_a_season_in_the_calendar_s_last_year_is_read() -> None:
    assert spans("spring 9999", ordinal("9999-12-15")) == [("9999-03-01", "9999-06-01")]


def test_relative_times_need_a_present() -> None:
    assert spans("what did I eat yesterday?", today=0) == []


def test_a_written_date_anchors_the_question_not_the_present() -> None:
    # "Friday" is the one before Wednesday the 10th, not the one before today.
    assert spans("What did she bake on Friday before 10.01.2024?") == [("2024-01-05", "2024-01-06")]
    assert spans("What did she bake on Wednesday before 10.01.2024?") == [
        ("2024-01-03", "2024-01-04")
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The week before it, and the day itself.
        ("What show was Kate watching shortly before 7 Jan 2024?", ("2023-12-31", "2024-01-07")),
        ("Did she take the test before December 23rd, 2023?", ("2023-12-16", "2023-12-23")),
        ("What had he finished by 2024-01-10?", ("2024-01-03", "2024-01-10")),
        ("until the 10th of January 2024", ("2024-01-03", "2024-01-10")),
        # The week after it.
        ("What did we do after 03.01.2024?", ("2024-01-03", "2024-01-10")),
        # Up to the present.
        ("What has changed since 29 Dec 2023?", ("2023-12-29", "2024-01-27")),
        # One day on that side, and the next.
        ("What happened on the day before 7 Jan 2024?", ("2024-01-06", "2024-01-07")),
        ("and the day after 7 Jan 2024?", ("2024-01-08", "2024-01-09")),
        ("What did she cook the night before 7 Jan 2024?", ("2024-01-06", "2024-01-07")),
        ("a day before 7 Jan 2024", ("2024-01-06", "2024-01-07")),
        # No side: the day, and the next.
        ("What happened on 7 Jan 2024, and after?", ("2024-01-07", "2024-01-08")),
    ],
)
def test_a_word_before_a_written_date_names_the_days_on_that_side(
    text: str, expected: tuple[str, str]
) -> None:
    assert spans(text) == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What did she do between 2 Jan 2024 and 9 Jan 2024?", [("2024-01-02", "2024-01-10")]),
        ("from 02.01.2024 to 09.01.2024", [("2024-01-02", "2024-01-10")]),
        ("from the 2nd of January 2024 until the 9th of January 2024",
         [("2024-01-02", "2024-01-10")]),
        ("2024-01-02 - 2024-01-09", [("2024-01-02", "2024-01-10")]),
        ("2 Jan 2024 \u2013 9 Jan 2024", [("2024-01-02", "2024-01-10")]),
        ("between 2 Jan 2024, and 9 Jan 2024", [("2024-01-02", "2024-01-10")]),
        # The first end written short: its month and year are the second's.
        ("between 2 and 9 Jan 2024", [("2024-01-02", "2024-01-10")]),
        ("from the 2nd to the 9th of January 2024", [("2024-01-02", "2024-01-10")]),
        ("from Jan 2 to Jan 9, 2024", [("2024-01-02", "2024-01-10")]),
        ("2-9 Jan 2024", [("2024-01-02", "2024-01-10")]),
        ("between 28 Dec and 3 Jan 2024", [("2023-12-28", "2024-01-04")]),
        ("between 29 and 3 Jan 2024", [("2023-12-29", "2024-01-04")]),
        ("between 31 and 3 Mar 2024", [("2024-03-03", "2024-03-04")]),  # no 31 February
        ("item 3 - 2024-01-09", [("2024-01-09", "2024-01-10")]),  # a number, not a day
        # A list's bullets are not dashes between its dates.
        ("What did I do then?\n- 2024-01-02\n- 2024-01-09",
         [("2024-01-02", "2024-01-03"), ("2024-01-09", "2024-01-10")]),
        # Its ends either way round.
        ("between 9 Jan 2024 and 2 Jan 2024", [("2024-01-02", "2024-01-10")]),
        # "and" without "between" joins two days, not the days between them.
        ("on 2 Jan 2024 and 9 Jan 2024",
         [("2024-01-02", "2024-01-03"), ("2024-01-09", "2024-01-10")]),
        # A range, then a date with its own side.
        ("from 2 Jan 2024 to 4 Jan 2024, and after 9 Jan 2024",
         [("2024-01-02", "2024-01-05"), ("2024-01-09", "2024-01-16")]),
    ],
)  # fmt: skip
def test_two_written_dates_joined_name_the_days_between(
    text: str, expected: list[tuple[str, str]]
) -> None:
    assert spans(text) == expected


def test_since_a_date_without_a_present_reads_the_week_after_it() -> None:
    assert spans("since 29 Dec 2023", today=0) == [("2023-12-29", "2024-01-05")]


def test_several_times_are_read_each_once_and_at_most_a_few() -> None:
    assert spans("yesterday, or was it yesterday? or last week") == [
        ("2024-01-26", "2024-01-27"),
        ("2024-01-15", "2024-01-22"),
    ]
    many = " ".join(f"{n} days ago" for n in range(1, 20))
    assert len(named_spans(many, TODAY)) == MOST_SPANS


@given(st.text(max_size=200), st.integers(min_value=0, max_value=ordinal("9999-12-31")))
@settings(max_examples=300, deadline=None)
def test_reading_times_never_fails(text: str, today: int) -> None:
    assert isinstance(named_days(text), frozenset)
    for first, last in named_spans(text, today):
        assert first <= last


@given(
    st.lists(
        st.sampled_from(
            [
                "yesterday",
                "3 days ago",
                "last week",
                "in May",
                "at Christmas",
                "on Monday",
                "last year",
                "two months ago",
                "the new year",
                "last weekend",
                "past week",
                "last summer",
                "this winter",
                "in the fall",
                "since spring",
            ]
        ),
        max_size=4,
    ).map(" and ".join),
    st.dates(min_value=datetime.date(2, 1, 1), max_value=datetime.date(9998, 12, 31)),
)
@settings(max_examples=300, deadline=None)
def test_a_relative_time_ends_by_today(text: str, today: datetime.date) -> None:
    for first, last in named_spans(text, today.toordinal()):
        assert first <= last <= today.toordinal()
