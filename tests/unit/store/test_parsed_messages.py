"""A store's stored-message parses: kept by bytes and place, its own, shared by its views."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.memory.model import Message
from gateway.store.calls import create_client
from gateway.store.codecs import LoadReply
from gateway.store.keys import SessionKeys
from gateway.store.link import Command, RedisLink
from gateway.store.parsed_messages import ParsedMessages
from gateway.store.redis_store import RedisStore

KEYS = SessionKeys("t", "s")
_URL = "redis://127.0.0.1:1/0"  # nothing is sent: the link answers


def stored(text: str) -> bytes:
    return Message("user", text, tokens=4, ts=1.5).to_json()


def reply(*texts: str) -> list[object]:
    """load.lua's reply with a log of ``texts``, as fresh bytes (a new reply each time)."""
    raw = [bytearray(stored(text)) for text in texts]
    return [[], len(texts), 0, 0, [bytes(r) for r in raw], 0, [], None, [], 0]


def test_the_same_bytes_at_the_same_place_parse_once() -> None:
    parse = ParsedMessages().parse
    raw = stored("remember me")
    first = parse(raw, 1)
    assert first == Message.from_json(raw, 1)
    assert parse(bytes(bytearray(raw)), 1) is first  # equal bytes, another object
    assert parse(raw, 2) is not first and parse(raw, 2).index == 2
    # Other bytes are another message, however close.
    assert parse(stored("remember me!"), 1).content == "remember me!"


def test_a_long_message_is_parsed_every_time_not_kept() -> None:
    parse = ParsedMessages(kept_chars=100).parse
    raw = stored("x" * 200)
    first, second = parse(raw, 1), parse(raw, 1)
    assert first == second and first is not second


def test_a_warm_load_decodes_the_stored_tail_to_the_messages_it_parsed_before() -> None:
    parse = ParsedMessages().parse
    first = LoadReply.decode(reply("one", "two", "three"), parse).log.messages
    again = LoadReply.decode(reply("one", "two", "three"), parse).log.messages
    assert [m.text for m in again] == ["one", "two", "three"]
    assert all(a is b for a, b in zip(again, first, strict=True))


class StoredLog(RedisLink):
    """A link whose Redis holds one session's log: LINDEX answered with fresh bytes, as
    a new reply brings them; nothing is sent."""

    def __init__(self, log: list[bytes]) -> None:
        super().__init__(create_client(_URL, timeout_s=1, max_connections=1))
        self.log = log

    async def execute(
        self, commands: Sequence[Command], *, deadline: float | None, op: str
    ) -> list[Any]:
        return [bytes(bytearray(self.log[int(command[2])])) for command in commands]


def store_over(log: StoredLog) -> RedisStore:
    client = create_client(_URL, timeout_s=1, max_connections=1)
    return RedisStore(client, timeout_s=1, retention_s=60, link=log, background_link=log)


async def test_each_store_keeps_its_own_parses_and_its_views_share_them() -> None:
    log = StoredLog([stored("hello"), stored("the booking reference is 48213")])
    one, other = store_over(log), store_over(log)
    mine = await one.sessions.messages_at(KEYS, [2, 1])
    assert [(m.index, m.text) for m in mine] == [(2, "the booking reference is 48213"),
                                                (1, "hello")]  # fmt: skip
    again = await one.sessions.messages_at(KEYS, [2, 1])
    assert all(a is b for a, b in zip(again, mine, strict=True))  # reused, not parsed again
    viewed = await one.with_deadline(5).sessions.messages_at(KEYS, [2, 1])
    assert all(a is b for a, b in zip(viewed, mine, strict=True))  # the view's are the store's
    theirs = await other.sessions.messages_at(KEYS, [2, 1])
    assert theirs == mine
    assert not any(a is b for a, b in zip(theirs, mine, strict=True))  # another store's own
