"""What a process holds of a session's log for recall, kept true against a real Redis.

Each test drives ``MemoryService`` over the suite's redis-server; two services over one
Redis stand for two replicas (each with its own archives in memory).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

from devsupport.servers import RedisProcess
from gateway.auth.identity import Identity, MemoryMode
from gateway.config import MemoryConfig
from gateway.memory import vectors
from gateway.memory.block import recalled_text
from gateway.memory.model import Message
from gateway.presets import PRESETS
from gateway.service.memory_service import MemoryService
from gateway.service.turn import session_keys
from gateway.store.redis_store import Known, RedisStore
from gateway.text.embedder import StaticEmbedder
from gateway.text.tokens import TokenCounter
from tests.support.jobs import notices_withdrawn


@pytest.fixture(autouse=True)
def _withdraw_notices(redis_server: RedisProcess) -> Iterator[None]:
    with notices_withdrawn(redis_server.client):
        yield


IDENTITY = Identity("tenant-archive", "session", None, MemoryMode.ON)
EMBEDDER = StaticEmbedder.load()


def identity() -> Identity:
    return replace(IDENTITY, session_id=f"archive-{uuid.uuid4().hex[:8]}")


def service(store: RedisStore, config: MemoryConfig | None = None) -> MemoryService:
    return MemoryService(store, TokenCounter(), config or MemoryConfig(), vectors=EMBEDDER)


def conversation(n: int, planted: dict[int, str] | None = None) -> tuple[Message, ...]:
    planted = planted or {}
    return tuple(
        Message(
            "user" if i % 2 else "assistant",
            planted.get(i, f"Message {i} about the weekly planning of topic {i % 7}."),
            ts=1_700_000_000.0 + 60 * i,
        )
        for i in range(1, n + 1)
    )


async def ask(memory: MemoryService, who: Identity, question: str) -> str:
    """Everything that would be forwarded for the question, but the question."""
    turn = await memory.prepare(who, (Message("user", question),), "gpt-4o")
    return "\n".join(str(m["content"]) for m in turn.context.openai_messages()[:-1])


def test_the_embedder_loads_from_the_installed_package() -> None:
    assert EMBEDDER is not None
    near = EMBEDDER.query("I love skiing and hiking in the mountains")
    far = EMBEDDER.query("The invoice is due on Friday")
    hobby = EMBEDDER.query("What are her hobbies and sports?")
    assert near is not None and far is not None and hobby is not None
    assert near.shape == (vectors.DIM,)
    assert float(near @ hobby) > float(far @ hobby)


async def test_a_warm_load_reads_only_what_was_appended_since(store: RedisStore) -> None:
    who = identity()
    keys = session_keys(who)
    api = service(store)
    await api.recorder.import_messages(
        keys, None, conversation(300, {5: "My locker code is 8841."}), now=1.0
    )
    replica = service(store)
    assert "My locker code is 8841." in await ask(replica, who, "What is my locker code?")
    held = replica.archives.get(keys)
    assert held is not None and held.count == 300 and held.first == 1

    known = Known(held.generation, held.count)
    loaded = await store.sessions.load_turn(keys, 64, known=known, vectors=True, most=512)
    assert loaded.log.warm and loaded.log.messages == ()  # nothing new: nothing read
    other = service(store)  # another replica records a turn
    turn = await other.prepare(who, (Message("user", "A new turn about my bike."),), "m")
    await other.recorder.record(turn, Message("assistant", "Noted, the bike."), now=2.0)
    loaded = await store.sessions.load_turn(keys, 64, known=known, vectors=True, most=512)
    assert loaded.log.warm
    assert [m.text for m in loaded.log.messages] == [
        "A new turn about my bike.",
        "Noted, the bike.",
    ]
    assert all(v is not None and len(v) == vectors.DIM for v in loaded.log.vectors)
    assert "Noted, the bike." in await ask(replica, who, "What about my bike?")
    assert replica.archives.get(keys) is held and held.count == 302


async def test_vectors_are_stored_aligned_with_the_log(
    store: RedisStore, redis_server: RedisProcess
) -> None:
    who = identity()
    keys = session_keys(who)
    await service(store).recorder.import_messages(keys, None, conversation(7), now=1.0)
    client = redis_server.client()
    try:
        log, stored = client.lrange(keys.log, 0, -1), client.lrange(keys.vec, 0, -1)
    finally:
        client.close()
    assert len(log) == len(stored) == 7
    assert all(len(v) == vectors.DIM for v in stored)


async def test_imported_messages_keep_their_times_and_turns_get_the_time_they_land(
    store: RedisStore,
) -> None:
    who = identity()
    keys = session_keys(who)
    memory = service(store)
    await memory.recorder.import_messages(keys, None, conversation(4), now=5.0)
    turn = await memory.prepare(who, (Message("user", "now"),), "m")
    await memory.recorder.record(turn, Message("assistant", "then"), now=1_800_000_000.0)
    _, messages = await store.sessions.tail(keys, 10)
    assert [m.ts for m in messages] == [1_700_000_060.0 + 60 * i for i in range(4)] + [
        1_800_000_000.0
    ] * 2


async def test_a_regenerated_answer_is_forgotten_where_it_was_held(store: RedisStore) -> None:
    """The regenerate replaces the stored answer (a new generation); a replica holding
    the old one drops what was replaced, and recall never brings the old answer back."""
    who = identity()
    keys = session_keys(who)
    memory, replica = service(store), service(store)
    history = conversation(40)
    await memory.recorder.import_messages(keys, None, history, now=1.0)
    question = Message("user", "Which flight did you book for me?")
    turn = await memory.prepare(who, (question,), "m")
    await memory.recorder.record(
        turn, Message("assistant", "I booked the aurora flight AF-1."), now=2.0
    )
    await ask(replica, who, "Anything new?")
    held = replica.archives.get(keys)
    assert held is not None and held.message(42) is not None
    assert held.message(42).text == "I booked the aurora flight AF-1."

    stored = tuple(m.but(ts=0.0) for m in history)
    regenerate = (*stored, question)  # the same history, without the stored answer
    turn = await memory.prepare(who, regenerate, "m")
    assert turn.plan.truncate_to == 41
    await memory.recorder.record(
        turn, Message("assistant", "I booked the nimbus flight NB-2."), now=3.0
    )
    for n in range(5):  # the answer leaves the window
        turn = await memory.prepare(who, (Message("user", f"and the hotel {n}?"),), "m")
        await memory.recorder.record(
            turn, Message("assistant", f"Hotel {n} is booked."), now=4.0 + n
        )

    context = await ask(replica, who, "Which flight: aurora AF-1 or nimbus NB-2?")
    assert "nimbus flight NB-2" in context and "AF-1" not in context
    assert replica.archives.get(keys) is held  # the same archive, its end replaced
    assert held.count == 52 and held.message(42).text == "I booked the nimbus flight NB-2."


async def test_an_erased_session_started_again_is_read_again(store: RedisStore) -> None:
    who = identity()
    keys = session_keys(who)
    memory, replica = service(store), service(store)
    await memory.recorder.import_messages(
        keys, None, conversation(100, {3: "The vault code is 1234."}), now=1
    )
    assert "vault code is 1234" in await ask(replica, who, "What is the vault code?")
    assert await store.sessions.erase_session(keys)
    await memory.recorder.import_messages(
        keys, None, conversation(100, {3: "The gate code is 9876."}), now=2
    )
    context = await ask(replica, who, "What is the vault code? Or the gate code?")
    assert "gate code is 9876" in context and "vault code is 1234" not in context


async def test_a_long_session_is_read_by_pages_up_to_the_archive_limit(store: RedisStore) -> None:
    who = identity()
    keys = session_keys(who)
    composition = PRESETS["hybrid-recall"]
    assert composition.recall is not None
    tier = composition.recall.model_copy(update={"archive_messages": 3_000})
    config = MemoryConfig(tiers=composition.model_copy(update={"recall": tier}))
    planted = {2: "The oldest secret is teal.", 2_500: "The middle secret is amber."}
    await service(store, config).recorder.import_messages(
        keys, None, conversation(5_000, planted), now=1
    )
    reader = service(store, config)
    context = await ask(reader, who, "Which secret: teal or amber?")
    assert "middle secret is amber" in context and "oldest secret is teal" not in context
    held = reader.archives.get(keys)
    assert held is not None and (held.first, held.count) == (2_001, 5_000)


async def test_a_session_recorded_without_vectors_gets_them_where_it_is_read(
    store: RedisStore,
) -> None:
    who = identity()
    keys = session_keys(who)
    words_only = MemoryService(store, TokenCounter(), MemoryConfig())  # no vectors
    await words_only.recorder.import_messages(keys, None, conversation(120), now=1.0)
    _, _, _, raw = await store.sessions.archive_page(keys, 0, 119, vectors=True)
    assert raw == (None,) * 120
    reader = service(store)
    await ask(reader, who, "What was the planning about?")
    held = reader.archives.get(keys)
    assert held is not None and held.codes.shape == (120, vectors.DIM)
    assert (held.codes.any(axis=1)).all()


async def test_messages_are_stored_with_their_recalled_lines_tokens(
    store: RedisStore, redis_server: RedisProcess
) -> None:
    """Issue 33: a message's line as recall shows it is counted once, when it is recorded
    (imported, or a turn's), and kept with it: a process that reads the session again
    (another replica, a restart) recalls it without counting it."""
    who = identity()
    keys = session_keys(who)
    memory = service(store)
    long = "a pasted document. " * 300  # longer than a chat message: counted if recalled
    await memory.recorder.import_messages(
        keys, None, (*conversation(6), Message("user", long)), now=1.0
    )
    turn = await memory.prepare(who, (Message("user", "Line one.\nLine two"),), "gpt-4o")
    await memory.recorder.record(turn, Message("assistant", "Noted."), now=2.0)
    client = redis_server.client()
    try:
        log = [json.loads(raw) for raw in client.lrange(keys.log, 0, -1)]
    finally:
        client.close()
    count = TokenCounter().for_model("gpt-4")  # (cl100k_base, as LINE_ENCODING)
    assert len(log) == 9 and "line_tokens" not in log[6]
    for index, data in enumerate(log, 1):
        if index == 7:
            continue
        message = Message.from_data(data, index)
        assert message.line_tokens == count(recalled_text(message) + "\n") > 0, data
