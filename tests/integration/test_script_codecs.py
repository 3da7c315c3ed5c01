"""The scripts' codecs against the scripts themselves, in a real Redis: what an encode
sends is what the ``.lua`` reads, and what it returns is what a decode expects."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devsupport.servers import RedisProcess
from gateway.memory.jobs import Job
from gateway.memory.model import Message, Pin
from gateway.store import scripts
from gateway.store.codecs import (
    ArchivePage,
    Known,
    LoadArgs,
    LoadReply,
    Predicted,
    RecordArgs,
    Recorded,
)
from gateway.store.keys import AUTH_KEYS, AUTH_VERSION, SessionKeys

FOLD = Job("fold", 1, 2, 2, turn=1, question=1)
PIN = Pin("p1", "Remember the blue umbrella.", source_index=1)


@pytest.fixture
def client(redis_server: RedisProcess) -> Iterator[Any]:
    opened = redis_server.client()
    yield opened
    opened.close()


@pytest.fixture
def keys(client: Any) -> Iterator[SessionKeys]:
    made = SessionKeys("tenant-codecs", f"codecs-{uuid.uuid4().hex[:8]}")
    yield made
    client.delete(*made.all())


def run(client: Any, name: str, call: tuple[tuple[str, ...], list[Any]]) -> Any:
    names, argv = call
    return client.evalsha(scripts.sha(name), len(names), *names, *argv)


def append(keys: SessionKeys, texts: list[str], **fields: Any) -> RecordArgs:
    messages = [
        Message("user" if i % 2 == 0 else "assistant", text) for i, text in enumerate(texts)
    ]
    stored = [m.to_json() for m in messages]
    defaults: dict[str, Any] = {
        "keys": keys,
        "messages": stored,
        "user_messages": sum(1 for m in messages if m.role == "user"),
        "now": 100.0,
        "ttl_s": 3600,
        "generation": uuid.uuid4().hex[:16],
        "appended": sum(len(s) for s in stored),
    }
    return RecordArgs(**{**defaults, **fields})


@pytest.fixture(autouse=True)
def loaded_scripts(client: Any) -> None:
    """Every script file is valid Lua to Redis, under the sha the store calls it by."""
    for name in scripts.names():
        assert client.script_load(scripts.source(name)) == scripts.sha(name)


def test_a_record_lands_where_predicted_and_load_reads_it_back(
    client: Any, keys: SessionKeys
) -> None:
    call = append(
        keys,
        ["Where did I leave it?", "By the door."],
        user_id="user-1",
        vectors=[b"\x01\x02", b""],
        predicted=Predicted(first=1, turns=0, jobs=[FOLD], pins=[PIN]),
        record_id="rec-1",
    )
    recorded = Recorded.decode(run(client, "record", call.encode()))
    assert recorded == Recorded(1, 2, 1, True, True, (), call.generation)
    assert json.loads(client.hget(keys.jobs, FOLD.id)) == FOLD.to_data()
    assert json.loads(client.hget(keys.pins, PIN.id)) == PIN.to_data()

    loaded = LoadReply.decode(
        run(client, "load", LoadArgs(keys, 10, vectors=True).encode()), Message.from_json
    )
    assert loaded.fields[b"user_id"] == b"user-1"
    assert [m.text for m in loaded.log.messages] == ["Where did I leave it?", "By the door."]
    assert [m.index for m in loaded.log.messages] == [1, 2]
    assert loaded.log.vectors == (b"\x01\x02", None)
    assert (loaded.log.count, loaded.log.start, loaded.log.warm) == (2, 0, False)
    assert loaded.log.generation == call.generation
    assert loaded.pending == 1 and len(loaded.pins) == 1

    again = Recorded.decode(run(client, "record", call.encode()))
    assert again.repeated and again.first == 1 and client.llen(keys.log) == 2


def test_a_record_keeps_the_job_lease_short(client: Any, keys: SessionKeys) -> None:
    # A runner holds the session's lease for seconds; a turn recorded meanwhile must not
    # stretch it to the retention, or a runner that dies would block the jobs for days.
    assert keys.all()[5] == keys.lease  # record.lua leaves KEYS[6] alone
    client.set(keys.lease, "runner-1", px=5000)
    run(client, "record", append(keys, ["Hello", "Hi"]).encode())
    assert 0 < client.pttl(keys.lease) <= 5000
    assert client.ttl(keys.log) > 3000


def test_a_record_planned_for_another_length_writes_nothing(client: Any, keys: SessionKeys) -> None:
    run(client, "record", append(keys, ["one", "two"]).encode())
    moved = Recorded.decode(
        run(client, "record", append(keys, ["three"], expected_count=5).encode())
    )
    assert moved.first == -1 and moved.count == 2
    assert client.llen(keys.log) == 2


def test_a_sessions_user_is_set_once_by_the_record_itself(client: Any, keys: SessionKeys) -> None:
    # Without a user, then alice's: her session. Then bob's turn (a race lost, or a key
    # acting for any user) appends nothing and changes nothing (before: bob became owner).
    run(client, "record", append(keys, ["hi", "hello"]).encode())
    first = Recorded.decode(
        run(client, "record", append(keys, ["a", "b"], user_id="alice").encode())
    )
    assert first.new_user and first.count == 4
    owned = Recorded.decode(run(client, "record", append(keys, ["c", "d"], user_id="bob").encode()))
    assert owned.first == -2 and owned.count == 4
    assert client.llen(keys.log) == 4 and client.hget(keys.meta, "user_id") == b"alice"
    again = Recorded.decode(
        run(client, "record", append(keys, ["e", "f"], user_id="alice").encode())
    )
    assert again.first == 5 and not again.new_user
    anyone = Recorded.decode(run(client, "record", append(keys, ["g", "h"]).encode()))
    assert anyone.first == 7 and client.hget(keys.meta, "user_id") == b"alice"


def test_a_truncation_keeps_the_branch_and_a_warm_load_reads_from_what_was_kept(
    client: Any, keys: SessionKeys
) -> None:
    first = append(keys, ["question", "first answer"])
    run(client, "record", first.encode())
    regenerate = append(keys, ["second answer"], truncate_to=1)
    recorded = Recorded.decode(run(client, "record", regenerate.encode()))
    assert (recorded.first, recorded.count) == (2, 2)
    assert recorded.generation == regenerate.generation != first.generation
    (branch,) = client.lrange(keys.branches, 0, -1)  # KEYS[#KEYS]: the branches list
    assert json.loads(branch)["kind"] == "regenerate"
    assert json.loads(branch)["from"] == 1

    held = Known(first.generation, 2)  # a process that read the log before the regenerate
    warm = LoadReply.decode(
        run(client, "load", LoadArgs(keys, 10, held, most=50).encode()), Message.from_json
    )
    assert (warm.log.start, warm.log.warm) == (1, True)
    assert [m.text for m in warm.log.messages] == ["second answer"]


def test_an_archive_page_reads_positions_with_their_vectors(client: Any, keys: SessionKeys) -> None:
    texts = [f"message {i}" for i in range(1, 7)]
    first = append(keys, texts[:2])  # no vectors: an empty one stored for each
    run(client, "record", first.encode())
    later = append(keys, texts[2:], vectors=[b"v3", b"v4", b"v5", b"v6"])
    run(client, "record", later.encode())
    page = ArchivePage(keys, 1, 3, vectors=True)
    generation, count, messages, vectors = page.decode(
        run(client, "archive_page", page.encode()), Message.from_json
    )
    assert (generation, count) == (first.generation, 6)  # an append keeps the generation
    assert [m.text for m in messages] == ["message 2", "message 3", "message 4"]
    assert vectors == (None, b"v3", b"v4")


def test_the_key_registrys_version_never_repeats_across_a_loss_of_data(client: Any) -> None:
    # Before: a counter. One key made: version 1; Redis loses its data; another key
    # made: version 1 again, and a process that read the first kept it, refusing the
    # second, for as long as the versions matched.

    def change(key_id: str, data: str, epoch: str) -> None:
        names, argv = (AUTH_KEYS, AUTH_VERSION), [key_id, data, epoch]
        client.evalsha(scripts.sha("change_key"), 2, *names, *argv)

    client.delete(AUTH_KEYS, AUTH_VERSION)
    change("k1", '{"id": "k1"}', "epoch-a")
    change("k2", '{"id": "k2"}', "epoch-ignored")  # the epoch is made once
    assert client.get(AUTH_VERSION) == b"epoch-a:2"
    change("k9", "", "epoch-ignored")  # revoking nothing moves nothing
    assert client.get(AUTH_VERSION) == b"epoch-a:2"
    client.delete(AUTH_KEYS, AUTH_VERSION)  # the data lost
    change("k3", '{"id": "k3"}', "epoch-b")
    assert client.get(AUTH_VERSION) == b"epoch-b:1"
    client.set(AUTH_VERSION, b"5")  # written before epochs: kept, and given one
    change("k4", '{"id": "k4"}', "epoch-c")
    assert client.get(AUTH_VERSION) == b"epoch-c:6"
    client.delete(AUTH_KEYS, AUTH_VERSION)
