"""The scripts' typed arguments and replies: each field where its ``.lua`` file reads it.

tests/integration/test_script_codecs.py runs the same codecs against the scripts in a
real Redis.
"""

from __future__ import annotations

import json

import pytest

from gateway.memory.jobs import Job
from gateway.memory.model import Message, Pin
from gateway.store.codecs import (
    ArchivePage,
    Known,
    LoadArgs,
    LoadReply,
    Predicted,
    RecordArgs,
    Recorded,
)
from gateway.store.keys import SessionKeys

KEYS = SessionKeys("tenant-a", "session-1")
FOLD = Job("fold", 1, 2, 4, turn=1, question=1)
PIN = Pin("p1", "The booking reference is QX-48213.", source_index=3)


def record_args(**overrides: object) -> RecordArgs:
    fields: dict[str, object] = {
        "keys": KEYS,
        "messages": [b'{"role":"user"}', b'{"role":"assistant"}'],
        "user_messages": 1,
        "now": 1700000000.25,
        "ttl_s": 3600,
        "generation": "0123456789abcdef",
        "appended": 37,
    }
    fields.update(overrides)
    return RecordArgs(**fields)  # type: ignore[arg-type]


def test_record_args_put_each_field_at_its_argv_position() -> None:
    args = record_args(
        user_id="user-9",
        truncate_to=4,
        expected_count=6,
        vectors=[b"v1", b""],
        predicted=Predicted(first=5, turns=2, jobs=[FOLD], pins=[PIN]),
        record_id="rec-1",
    )
    keys, argv = args.encode()
    assert keys == KEYS.all()
    assert keys[-1] == KEYS.branches  # record.lua finds it as KEYS[#KEYS]
    # 1-based as in the script: ARGV[i] is argv[i - 1].
    assert argv[:15] == [
        3600,
        "1700000000.25",
        "session-1",
        "user-9",
        4,
        6,
        1,
        2,
        5,
        2,
        1,
        1,
        "0123456789abcdef",
        37,
        "rec-1",
    ]
    assert argv[15:17] == [b'{"role":"user"}', b'{"role":"assistant"}']  # unpack(ARGV, 16, 15 + m)
    assert argv[17:19] == [b"v1", b""]  # unpack(ARGV, 16 + m, 15 + 2 * m)
    assert argv[19] == FOLD.id and json.loads(argv[20]) == FOLD.to_data()
    assert argv[21] == PIN.id and json.loads(argv[22]) == PIN.to_data()
    assert len(argv) == 15 + 2 * 2 + 2 * 1 + 2 * 1


def test_record_args_defaults_mean_keep_any_and_none() -> None:
    _, argv = record_args().encode()
    assert argv[3] == ""  # user id: keep the session's
    assert argv[4] == -1  # no truncation
    assert argv[5] == -1  # any length
    assert argv[8:12] == [-1, -1, 0, 0]  # nothing predicted
    assert argv[14] == ""  # no record id
    assert argv[17:19] == [b"", b""]  # no vectors: one empty per message


def test_record_args_take_one_vector_per_message_or_none() -> None:
    with pytest.raises(ValueError, match="one vector per message"):
        record_args(vectors=[b"only one"])


def test_recorded_decodes_the_scripts_reply() -> None:
    recorded = Recorded.decode([7, 8, 4, 1, 1, b"gen-2", 0])
    assert recorded == Recorded(7, 8, 4, True, True, (), "gen-2", repeated=False)


def test_recorded_decodes_a_moved_tail_and_a_repeat() -> None:
    moved = Recorded.decode([-1, 9, 0, 0, 0, b"", 0])
    assert moved.first == -1 and moved.count == 9 and not moved.repeated
    repeated = Recorded.decode([7, 8, 4, 0, 1, None, 1])  # a meta without 'gen'
    assert repeated.repeated and repeated.generation == "" and not repeated.new_user


def test_load_args_name_the_sessions_keys_and_what_the_caller_holds() -> None:
    cold_keys, cold = LoadArgs(KEYS, 24).encode()
    assert cold_keys == (KEYS.meta, KEYS.log, KEYS.tiers, KEYS.pins, KEYS.jobs, KEYS.vec)
    assert cold == [24, "", 0, 0, 0]
    _, warm = LoadArgs(KEYS, 24, Known("g1", 40), vectors=True, most=500).encode()
    assert warm == [24, "g1", 40, 500, 1]


def message(index: int) -> bytes:
    return Message("user" if index % 2 else "assistant", f"message {index}").to_json()


def test_load_reply_aligns_vectors_with_the_logs_end() -> None:
    # Five messages from position 3 (indexes 4..8); the vectors list starts two later.
    reply = [
        [b"gen", b"g7", b"user_id", b"u1", b"turns", b"4"],
        8,
        3,
        1,
        [message(i) for i in range(4, 9)],
        -2,
        [b"v6", b"", b"v8"],
        b'{"version": 3}',
        [b'{"id": "p1"}'],
        2,
    ]
    loaded = LoadReply.decode(reply, Message.from_json)
    assert loaded.fields[b"user_id"] == b"u1"
    assert loaded.log.generation == "g7"
    assert (loaded.log.count, loaded.log.start, loaded.log.warm) == (8, 3, True)
    assert [m.index for m in loaded.log.messages] == [4, 5, 6, 7, 8]
    assert loaded.log.messages[0].text == "message 4"
    assert loaded.log.vectors == (None, None, b"v6", None, b"v8")
    assert (loaded.tiers, loaded.pins, loaded.pending) == (b'{"version": 3}', [b'{"id": "p1"}'], 2)


def test_load_reply_of_a_session_that_does_not_exist() -> None:
    loaded = LoadReply.decode([[], 0, 0, 0, [], 0, [], None, [], 0], Message.from_json)
    assert loaded.fields == {} and loaded.log.messages == () and loaded.tiers is None
    assert loaded.log.generation == ""


def test_archive_page_round_trip() -> None:
    page = ArchivePage(KEYS, 10, 12, vectors=True)
    keys, argv = page.encode()
    assert keys == (KEYS.meta, KEYS.log, KEYS.vec)
    assert argv == [10, 12, 1]
    generation, count, messages, vectors = page.decode(
        [b"g2", 40, [message(i) for i in (11, 12, 13)], 1, [b"v11", b"", b"v13"]], Message.from_json
    )
    assert (generation, count) == ("g2", 40)
    assert [m.index for m in messages] == [11, 12, 13]
    # A non-negative offset: every message of the page has its place in the vectors.
    assert vectors == (b"v11", None, b"v13")
