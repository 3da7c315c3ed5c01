"""Abandoned branches: their stored form, and the facts an edit takes back."""

from __future__ import annotations

import json

from gateway.memory.branches import Branch, facts_after_branch
from gateway.memory.jobs import Job
from gateway.memory.model import Fact, Message, Tiers


def test_a_stored_branch_reads_back_marked_and_indexed() -> None:
    messages = [
        Message(role="user", content="business class", ts=5.0).to_json(),
        Message(role="assistant", content="booked", tokens=3).to_json(),
    ]
    stored = b",".join(messages).decode()
    raw = f'{{"from":2,"at":1700000000.5,"kind":"edit","messages":[{stored}]}}'
    branch = Branch.from_json(raw)
    assert (branch.kept, branch.at, branch.kind) == (2, 1700000000.5, "edit")
    assert [(m.index, m.role, m.text) for m in branch.messages] == [
        (3, "user", "business class"),
        (4, "assistant", "booked"),
    ]
    assert branch.messages[0].ts == 5.0 and branch.messages[1].tokens == 3
    regenerate = Branch.from_json(json.dumps({"from": 7, "at": 1, "kind": "regenerate"}))
    assert regenerate.kind == "regenerate" and regenerate.messages == ()


def test_no_fact_past_the_cut_changes_nothing() -> None:
    tiers = Tiers(version=3, facts=(Fact("my name is Ada", 1, 2, key="name"),), facts_end=2)
    assert facts_after_branch(tiers, 2, 6) is None
    assert facts_after_branch(Tiers(), 0, 2) is None


def test_facts_read_past_the_cut_go_and_the_rest_is_read_again() -> None:
    seat_14 = Fact("my seat is 14C", 1, 6, key="seat", superseded=True)
    name = Fact("my name is Ada", 1, 6, key="name")
    early = Fact("my city is Lyon", 1, 1, key="city", superseded=True)
    city = Fact("my city is Porto", 2, 2, key="city")
    seat_15 = Fact("my seat is 15A", 7, 12, key="seat")  # from an abandoned message
    cabin = Fact("business class", 7, 12, key="cabin")
    tiers = Tiers(version=4, facts=(seat_14, name, early, city, seat_15, cabin), facts_end=12)
    fixed = facts_after_branch(tiers, 8, 10)
    assert fixed is not None
    updated, job = fixed
    assert updated.version == 5
    # What was read from 7..12 goes; the seat it superseded is current again.
    assert [(f.text, f.superseded) for f in updated.facts] == [
        ("my seat is 14C", False),
        ("my name is Ada", False),
        ("my city is Lyon", True),
        ("my city is Porto", False),
    ]
    # Messages 7 and 8 stay but their facts went with the range: read again from 7.
    assert updated.facts_end == 6
    assert job == Job("facts", 7, 10, 10)


def test_facts_end_past_the_cut_alone_is_moved_back() -> None:
    tiers = Tiers(version=1, facts_end=6)  # read up to 6, nothing found
    fixed = facts_after_branch(tiers, 2, 4)
    assert fixed is not None
    assert fixed[0].facts_end == 2 and fixed[1] == Job("facts", 3, 4, 4)
