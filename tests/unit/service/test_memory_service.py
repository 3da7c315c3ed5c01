"""MemoryService: what one request costs in token counting (the store is faked in memory)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from gateway.auth.identity import Identity, MemoryMode
from gateway.config import MemoryConfig
from gateway.memory.block import MEMORY_HEADER, recalled_line
from gateway.memory.model import Message, Pin, SessionState, Summary, Tiers
from gateway.service.memory_service import MemoryService
from gateway.service.planning import Planner
from gateway.store.keys import SessionKeys
from gateway.store.redis_store import Loaded, LogSlice, Recorded, TailMoved
from gateway.text.tokens import TokenCounter
from tests.support.store_fakes import StoreOf, UnusedSessions


class CountingTokens(TokenCounter):
    def __init__(self) -> None:
        super().__init__()
        self.counted: list[str] = []

    def count_message(self, message: Message, model: str | None = None) -> int:
        self.counted.append(message.text)
        return super().count_message(message, model)


class FakeSessions(UnusedSessions):
    """The store's one part the service reads here: a session held in memory."""

    def __init__(self, state: SessionState) -> None:
        self.state = state

    async def load(self, keys: SessionKeys, tail: int, **_: object) -> SessionState:
        return replace(self.state, tail=self.state.tail[-tail:])

    async def load_turn(self, keys: SessionKeys, tail: int, **_: object) -> Loaded:
        state = await self.load(keys, tail)
        count = self.state.message_count
        start = count - len(state.tail)
        log = LogSlice(
            "g" if count else "", count, start, False, state.tail, (None,) * len(state.tail)
        )
        return Loaded(state, log, {})

    async def archive_page(
        self, keys: SessionKeys, start: int, stop: int, **_: object
    ) -> tuple[str, int, tuple[Message, ...], tuple[None, ...]]:
        """Older messages: the fake's state holds the whole log as its tail."""
        messages = self.state.tail[start : stop + 1]
        return "g", self.state.message_count, messages, (None,) * len(messages)


def history(n: int) -> list[Message]:
    return [
        Message(role="user" if i % 2 == 0 else "assistant", content=f"message {i + 1}")
        for i in range(n)
    ]


IDENTITY = Identity("tenant", "session", None, MemoryMode.ON)


async def test_a_resent_history_is_not_retokenized() -> None:
    stored = tuple(replace(m, index=i + 1, tokens=7) for i, m in enumerate(history(400)))
    tokens = CountingTokens()
    service = MemoryService(
        StoreOf(sessions=FakeSessions(SessionState(message_count=400, tail=stored))),
        tokens,
        MemoryConfig(),
    )
    request = (Message(role="system", content="be brief"), *history(400), Message("user", "new"))
    turn = await service.prepare(IDENTITY, request, "gpt-4o")
    assert sorted(tokens.counted) == ["be brief", "new"]
    assert [m.text for m in turn.plan.new] == ["new"]
    assert turn.context.receipt.window_indexes == tuple(range(393, 401))


async def test_imported_history_is_counted_once() -> None:
    tokens = CountingTokens()
    service = MemoryService(StoreOf(sessions=FakeSessions(SessionState())), tokens, MemoryConfig())
    request = (*history(6), Message("user", "new"))
    turn = await service.prepare(IDENTITY, request, "gpt-4o")
    assert len(tokens.counted) == 7  # six imported messages (in prior and to_record) + new
    assert all(m.tokens > 0 for m in turn.plan.to_record + turn.plan.prior + turn.plan.new)


async def test_the_configured_composition_and_the_stored_tiers_are_used() -> None:
    stored = tuple(replace(m, index=i + 1, tokens=7) for i, m in enumerate(history(40)))
    state = SessionState(
        message_count=40,
        tail=stored,
        tiers=Tiers(version=2, summaries=(Summary(2, 22, "the trip to Lisbon"),)),
        pins=(Pin("p1", "seat 14C", 0.95),),
    )
    config = MemoryConfig(preset="rolling-window", memory_role="developer", window_messages=5)
    service = MemoryService(StoreOf(sessions=FakeSessions(state)), TokenCounter(), config)
    turn = await service.prepare(IDENTITY, (Message("user", "new"),), "gpt-4o")
    messages = turn.context.messages
    assert messages[0].role == "developer"
    assert isinstance(messages[0].content, str)
    assert messages[0].content.startswith(MEMORY_HEADER)
    assert "the trip to Lisbon" in messages[0].content
    assert "seat 14C" not in messages[0].content  # rolling-window has no pins tier
    assert turn.context.receipt.window_indexes == (36, 37, 38, 39, 40)
    assert turn.context.receipt.summaries == ((2, 22),)
    assert [m.text for m in messages[1:]] == [f"message {i}" for i in range(36, 41)] + ["new"]


class CountingTexts(TokenCounter):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def count_text(self, text: str, model: str | None = None) -> int:
        self.texts.append(text)
        return super().count_text(text, model)


async def test_the_next_turn_of_a_session_does_not_count_its_unchanged_tiers_again() -> None:
    """The same stored tiers (one object while their bytes are unchanged) at the next
    turn: their summaries are not counted again (as an item: with the line break after
    it). Only the memory block is, by adding up its lines' counts: what is looked up is
    the lines whose count is not known, here the last, which no line break follows."""
    stored = tuple(replace(m, index=i + 1, tokens=7) for i, m in enumerate(history(40)))
    tiers = Tiers(version=2, summaries=(Summary(2, 22, "the trip to Lisbon"),))
    state = SessionState(message_count=40, tail=stored, tiers=tiers)
    tokens = CountingTexts()
    store = StoreOf(sessions=FakeSessions(state))
    service = MemoryService(store, tokens, MemoryConfig(preset="rolling-window"))
    first = await service.prepare(IDENTITY, (Message("user", "new"),), "gpt-4o")
    assert any(text.startswith("### Messages 2-22") for text in tokens.texts)
    tokens.texts.clear()
    second = await service.prepare(IDENTITY, (Message("user", "new"),), "gpt-4o")
    assert second.context == first.context
    summary = "### Messages 2-22\n> the trip to Lisbon"
    assert summary + "\n" not in tokens.texts
    assert tokens.texts.count(summary) == 1  # the block's last line
    block = second.context.messages[0].content
    assert isinstance(block, str) and block.endswith(summary)
    assert block not in tokens.texts


class RacingSessions(FakeSessions):
    """The first record loses the race: another request imported the same history first."""

    def __init__(self, state: SessionState, landed: SessionState) -> None:
        super().__init__(state)
        self.landed = landed
        self.records: list[tuple[list[str], int | None]] = []

    async def record(
        self, keys: SessionKeys, messages: Sequence[Message], **kwargs: object
    ) -> Recorded:
        expected = kwargs["expected_count"]
        assert expected is None or isinstance(expected, int)
        self.records.append(([m.text for m in messages], expected))
        if expected is not None and expected != self.state.message_count:
            raise TailMoved("moved")
        if len(self.records) == 1:
            self.state = self.landed  # the other request's import lands now
            raise TailMoved("moved")
        first = self.state.message_count + 1
        return Recorded(first, first + len(messages) - 1, 0, False)


async def test_a_record_whose_tail_moved_is_planned_again_and_imports_nothing_twice() -> None:
    earlier = history(4)
    landed = tuple(replace(m, index=i + 1, tokens=7) for i, m in enumerate(earlier))
    other = (
        replace(Message("user", "other"), index=5),
        replace(Message("assistant", "ok"), index=6),
    )
    sessions = RacingSessions(SessionState(), SessionState(message_count=6, tail=landed + other))
    service = MemoryService(StoreOf(sessions=sessions), TokenCounter(), MemoryConfig())
    turn = await service.prepare(IDENTITY, (*earlier, Message("user", "mine")), "gpt-4o")
    assert turn.plan.expected_count == 0  # an import relies on the empty log

    await service.recorder.record(turn, Message("assistant", "answer"), now=1.0)
    texts = [m.text for m in earlier]
    assert sessions.records == [
        ([*texts, "mine", "answer"], 0),  # refused: the log moved
        (["mine", "answer"], None),  # planned again: only this turn's own messages
    ]


async def test_a_long_session_s_recalled_lines_are_made_and_counted_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33: a turn of a long session sends a hundred recalled lines and more, most of
    them sent before. Each is made, and counted, once while the session's archive is held;
    the memory block is counted by adding up what its lines count, not whole again."""
    from gateway.memory import archive as archive_module

    made: list[str] = []
    make = archive_module.recalled_line

    def making(message: Message, *args: Any) -> Any:
        made.append(message.text)
        return make(message, *args)

    monkeypatch.setattr(archive_module, "recalled_line", making)
    said = [replace(m, content=f"{m.text}: the trip to Lisbon") for m in history(400)]
    stored = tuple(replace(m, index=i + 1, tokens=9) for i, m in enumerate(said))
    tokens = CountingTexts()
    state = SessionState(message_count=400, tail=stored)
    service = MemoryService(StoreOf(sessions=FakeSessions(state)), tokens, MemoryConfig())
    question = (Message("user", "what did we say about the trip to Lisbon?"),)
    first = await service.prepare(IDENTITY, question, "gpt-4o")
    recalled = first.context.receipt.recalled
    assert len(recalled) > 100 and len(made) == len(recalled)
    made.clear()
    tokens.texts.clear()
    second = await service.prepare(IDENTITY, question, "gpt-4o")
    assert second.context == first.context
    assert made == []  # every line found where the first turn made it
    block = second.context.messages[0].content
    assert isinstance(block, str) and block.count("the trip to Lisbon") == len(recalled)
    assert block not in tokens.texts
    # Looked up again (in the counter's memo): the question, and what the block's frame
    # and its lines that no item stands for count (its header, titles, dates, a day's
    # line, its last line), as many whatever the number of lines.
    assert len(tokens.texts) < 20, tokens.texts


async def test_lines_recorded_with_their_count_are_not_counted_when_first_recalled() -> None:
    """Issue 33: the first turn that recalls a stored message (the first after an import
    or a restart) takes its line's count as recorded (``Message.line_tokens``), and makes
    the very context that counting every line would."""
    said = [replace(m, content=f"{m.text}: the trip to Lisbon") for m in history(400)]
    plain = tuple(replace(m, index=i + 1, tokens=9) for i, m in enumerate(said))
    lined = Planner(TokenCounter()).lined(plain)
    assert all(m.line_tokens for m in lined)
    question = (Message("user", "what did we say about the trip to Lisbon?"),)
    contexts, counted = [], []
    for stored in (plain, lined):
        tokens = CountingTexts()
        state = SessionState(message_count=400, tail=stored)
        service = MemoryService(StoreOf(sessions=FakeSessions(state)), tokens, MemoryConfig())
        turn = await service.prepare(IDENTITY, question, "gpt-4")  # (cl100k_base)
        contexts.append(turn.context)
        counted.append([text for text in tokens.texts if text.endswith("the trip to Lisbon\n")])
    # (The same messages sent, and the same receipt: the window's carry their counts.)
    assert contexts[0].openai_messages() == contexts[1].openai_messages()
    assert contexts[0].receipt == contexts[1].receipt
    recalled = contexts[1].receipt.recalled
    assert len(recalled) > 100 and len(counted[0]) >= len(recalled)
    assert counted[1] == []


def test_a_counter_of_another_encoding_counts_a_line_itself() -> None:
    """A stored count is in ``LINE_ENCODING``: a model counted in another encoding (o200k
    where tiktoken has it) counts the line as it counts everything else."""
    message = Message("user", "the trip to Lisbon", index=3, tokens=9, line_tokens=7)

    class Other:
        encoding = "o200k_base"

        def __call__(self, text: str) -> int:
            return 1000 + len(text)

    same = TokenCounter().for_model("gpt-4")
    assert recalled_line(message, None, False, same).piece == 7
    assert recalled_line(message, None, False, Other()).piece == 1000 + len(
        "user: the trip to Lisbon\n"
    )
    assert recalled_line(message.but(line_tokens=0), None, False, same).piece == same(
        "user: the trip to Lisbon\n"
    )


async def test_recall_weighs_each_recorded_line_by_its_own_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message's token count is a token or so more than its recalled line, and less
    than a line of many line breaks (each indented under it): weighed by that, a block of
    pasted lists came out over budget and was rendered again and again, one item fewer
    each time. Weighed by the line's recorded count, it is rendered once, and fills the
    budget closer."""
    from gateway.memory import assemble as assemble_module

    renders: list[int] = []
    render = assemble_module.memory_lines

    def rendering(chosen: Any, *args: Any, **kwargs: Any) -> Any:
        renders.append(len(chosen))
        return render(chosen, *args, **kwargs)

    monkeypatch.setattr(assemble_module, "memory_lines", rendering)
    listed = "\n".join(f"- step {n} of the trip to Lisbon" for n in range(12))
    said = [replace(m, content=f"{m.text}:\n{listed}") for m in history(300)]
    counted = Planner(TokenCounter()).counted(
        tuple(replace(m, index=i + 1) for i, m in enumerate(said)), "gpt-4", {}
    )
    question = (Message("user", "what did we say about the trip to Lisbon?"),)
    sent = {}
    for name, stored in (
        ("estimated", counted),
        ("recorded", Planner(TokenCounter()).lined(counted)),
    ):
        renders.clear()
        state = SessionState(message_count=300, tail=stored)
        service = MemoryService(
            StoreOf(sessions=FakeSessions(state)), TokenCounter(), MemoryConfig()
        )
        turn = await service.prepare(IDENTITY, question, "gpt-4")  # (cl100k_base)
        sent[name] = (len(renders), turn.context.receipt.total_tokens)
        assert turn.context.receipt.total_tokens <= 3000
    assert sent["recorded"][0] == 1 < sent["estimated"][0]
    assert sent["recorded"][1] >= sent["estimated"][1]
