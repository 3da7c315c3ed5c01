"""TurnService: the outcomes of opening a turn, the one retry after a refusal of a context
too long, and a record that outlives its request (memory faked; no Redis, no upstream)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gateway import codec
from gateway.auth.authenticator import Authenticator, Caller, KeyRegistry, key_id
from gateway.auth.identity import Identity, MemoryMode
from gateway.auth.tenancy import Tenants
from gateway.config import AuthConfig, Settings
from gateway.dialects.chat.request import check_turn_tool_results
from gateway.errors import MemoryUnavailable
from gateway.memory.assemble import Context, Receipt
from gateway.memory.model import Message, SessionState
from gateway.memory.reconcile import reconcile
from gateway.service.turn import Turn
from gateway.service.turn_service import DEGRADED, NOTHING_NEW, TurnService
from gateway.service.usage import UNKNOWN, Usage
from gateway.store.keys import SessionKeys
from gateway.store.redis_store import Held, StoreUnavailable
from gateway.text.tokens import TokenCounter

CALLER = Caller("", key_id("sk-client"), None, None, tenant_name="sk-client")
QUESTION = (Message("user", "what did I say?"),)
# The tokens a session's whole history would take, were the budget large enough.
HISTORY_TOKENS = 5_000


class NoSecretStore:
    async def tenant_secret(self, timeout_s: float | None = None) -> bytes:
        raise AssertionError("the secret is configured")


class FakeRecorder:
    def __init__(self) -> None:
        self.recorded: list[tuple[Turn, Message]] = []
        self.usages: list[Usage] = []
        self.failing = False
        self.gate: asyncio.Event | None = None  # set: the record waits for it
        self.started = asyncio.Event()

    async def record(
        self,
        turn: Turn,
        answer: Message,
        *,
        now: float,
        retry_s: float = 0.0,
        request_id: str | None = None,
        usage: Usage = UNKNOWN,
    ) -> None:
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.failing:
            raise StoreUnavailable("redis went away")
        self.recorded.append((turn, answer))
        self.usages.append(usage)


class FakeMemory:
    """Plans a context of the history's tokens, as many as the budget takes."""

    def __init__(self) -> None:
        self.clock: Callable[[], float] = lambda: 1_000.0
        self.counter = TokenCounter()
        self.recorder = FakeRecorder()
        self.budgets: list[int | None] = []
        self.unavailable = False
        self.held: list[Held | None] = []  # what each prepare was given as held
        self.given_back: list[Held] = []

    def budget_for(self, model: str, requested_output: int | None = None) -> int:
        return 8_000

    async def prepare(
        self,
        identity: Identity,
        messages: tuple[Message, ...],
        model: str,
        *,
        requested_output: int | None = None,
        budget_tokens: int | None = None,
        held: Held | None = None,
    ) -> Turn:
        self.budgets.append(budget_tokens)
        self.held.append(held)
        if self.unavailable:
            raise StoreUnavailable("redis went away")
        plan = reconcile(messages, SessionState())
        budget = budget_tokens or 8_000
        receipt = Receipt({"window": min(budget, HISTORY_TOKENS)}, (), budget)
        context = Context(messages, receipt)
        keys = SessionKeys(identity.tenant, identity.session_id)
        return Turn(
            keys,
            identity,
            SessionState(),
            plan,
            context,
            model,
            messages,
            requested_output=requested_output,
            held=held or Held(100, "hold:100"),
        )

    def give_back(self, tenant: str, held: Held) -> None:
        self.given_back.append(held)


class FakeReply:
    def __init__(self, status_code: int, body: dict[str, Any] | None = None) -> None:
        self.status_code = status_code
        self.body = codec.dumps(body or {})
        self.closed = False

    async def read(self) -> bytes:
        return self.body

    async def aclose(self) -> None:
        self.closed = True


TOO_LONG = {
    "error": {
        "message": "This model's maximum context length is 2048 tokens. However, your "
        "messages resulted in 5100 tokens.",
        "code": "context_length_exceeded",
    }
}


def service(memory: FakeMemory, on_failure: str = "open") -> TurnService:
    settings = Settings.model_validate({"redis": {"on_failure": on_failure}})
    auth = Authenticator(
        AuthConfig(),
        tenants=Tenants(NoSecretStore(), "a-configured-secret"),
        registry=KeyRegistry(AuthConfig()),
        upstream_api_key=None,
    )
    return TurnService(memory, auth, settings, check_turn_tool_results)


async def open_turn(turns: TurnService, messages: tuple[Message, ...] = QUESTION) -> Turn:
    turn = await turns.open(CALLER, "s1", None, MemoryMode.ON, messages, "small", None)
    assert isinstance(turn, Turn)
    return turn


async def test_a_store_unavailable_fails_open_as_a_degraded_outcome() -> None:
    memory = FakeMemory()
    memory.unavailable = True
    opened = await service(memory).open(CALLER, "s1", None, MemoryMode.ON, QUESTION, "m", None)
    assert opened is DEGRADED and opened.status == "degraded"


async def test_a_store_unavailable_fails_closed_when_configured_so() -> None:
    memory = FakeMemory()
    memory.unavailable = True
    with pytest.raises(MemoryUnavailable):
        await service(memory, "closed").open(CALLER, "s1", None, MemoryMode.ON, QUESTION, "m", None)


async def test_a_request_with_nothing_new_goes_as_sent_and_gives_its_hold_back() -> None:
    memory = FakeMemory()
    prefill = (*QUESTION, Message("assistant", "You said"))
    opened = await service(memory).open(CALLER, "s1", None, MemoryMode.ON, prefill, "m", None)
    assert opened is NOTHING_NEW and opened.status == "off"
    # Nothing will be recorded: what its admission reserved of the quota goes back.
    assert memory.given_back == [Held(100, "hold:100")]


async def test_a_refused_context_is_planned_again_smaller_once_and_its_budget_kept() -> None:
    memory = FakeMemory()
    turns = service(memory)
    turn = await open_turn(turns)
    sent: list[int] = []
    replies = [FakeReply(400, TOO_LONG), FakeReply(200)]

    async def send(turn: Turn) -> FakeReply:
        sent.append(turn.context.receipt.total_tokens)
        return replies.pop(0)

    forwarded = await turns.forward(turn, send)
    assert forwarded.reply.status_code == 200 and forwarded.refusal is None
    assert len(sent) == 2 and sent[1] < sent[0] <= 2 * HISTORY_TOKENS
    assert forwarded.turn.context.receipt.total_tokens == sent[1]
    assert forwarded.headers["x-memory-context-tokens"] == str(sent[1])
    # The next turn to that model is planned within the budget that fitted, at once.
    retry_budget = memory.budgets[1]
    assert retry_budget is not None and retry_budget < 8_000
    await open_turn(turns)
    assert memory.budgets[2] == retry_budget
    # The quota was reserved once, at admission: the smaller plan keeps that hold.
    assert memory.held == [None, turn.held, None] and forwarded.turn.held == turn.held


async def test_another_refusal_is_not_retried_and_comes_back_read() -> None:
    turns = service(FakeMemory())
    turn = await open_turn(turns)
    refusal = FakeReply(400, {"error": {"message": "temperature is out of range"}})
    calls = 0

    async def send(turn: Turn) -> FakeReply:
        nonlocal calls
        calls += 1
        return refusal

    forwarded = await turns.forward(turn, send)
    assert calls == 1 and refusal.closed
    assert forwarded.refusal == refusal.body and forwarded.turn is turn


async def test_a_read_only_turn_records_nothing() -> None:
    memory = FakeMemory()
    turns = service(memory)
    turn = await turns.open(CALLER, "s1", None, MemoryMode.READ, QUESTION, "m", None)
    assert isinstance(turn, Turn) and not turn.records
    assert await turns.record(turn, Message("assistant", "answer"))
    assert memory.recorder.recorded == []


async def test_a_record_the_store_refuses_is_reported_not_raised() -> None:
    memory = FakeMemory()
    memory.recorder.failing = True
    turns = service(memory)
    assert not await turns.record(await open_turn(turns), Message("assistant", "answer"))


async def test_a_record_completes_when_its_request_is_cancelled() -> None:
    memory = FakeMemory()
    gate = memory.recorder.gate = asyncio.Event()
    turns = service(memory)
    turn = await open_turn(turns)
    request = asyncio.ensure_future(turns.record(turn, Message("assistant", "answer")))
    await memory.recorder.started.wait()
    request.cancel()  # the client left
    with pytest.raises(asyncio.CancelledError):
        await request
    settling = asyncio.ensure_future(turns.settle())  # the server stopping meanwhile
    await asyncio.sleep(0)
    assert not settling.done() and memory.recorder.recorded == []
    gate.set()
    await asyncio.wait_for(settling, 2)  # returns once the record is done
    assert [answer.text for _, answer in memory.recorder.recorded] == ["answer"]
    await turns.settle()  # nothing left: at once


async def test_an_answer_is_accounted_with_the_upstreams_usage_or_counted() -> None:
    turns = service(FakeMemory())
    turn = await open_turn(turns)
    answer = Message("assistant", "four words of answer")
    given = turns.completed(turn, answer, {"prompt_tokens": 300, "completion_tokens": 7})
    assert (given.prompt_tokens, given.completion_tokens) == (300, 7)
    counted = turns.completed(turn, answer, None)
    assert counted.prompt_tokens is None and counted.completion_tokens is None
    assert counted.context_tokens == turn.context.receipt.total_tokens
    assert counted.count(answer.to_openai()) == TokenCounter().count_payload(
        answer.to_openai(), "small"
    )


async def test_the_upstreams_cached_tokens_go_with_the_record_and_the_outcome() -> None:
    memory = FakeMemory()
    turns = service(memory)
    turn = await open_turn(turns)
    usage = {"prompt_tokens": 300, "completion_tokens": 7,
             "prompt_tokens_details": {"cached_tokens": 256}}  # fmt: skip
    assert await turns.record(turn, Message("assistant", "answer"), usage)
    assert await turns.record(turn, Message("assistant", "again"))  # no usage given
    assert memory.recorder.usages == [Usage(300, 256, 7), UNKNOWN]
    answered = turns.completed(turn, Message("assistant", "answer"), usage)
    assert (answered.prompt_tokens, answered.cached_tokens) == (300, 256)
    assert turns.completed(turn, None, {"prompt_tokens": 300}).cached_tokens is None
