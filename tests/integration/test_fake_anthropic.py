"""The fake upstream's Anthropic Messages API (``devsupport/fake_anthropic.py``), driven
directly (no gateway) by the real ``anthropic`` SDK, by plain HTTP where a test needs
headers or bodies the SDK would not send, and by Claude Code itself
(``tests/support/claude_code.py``): its answers, its event stream, its refusals in
Anthropic's envelope, its recording of requests and its prompt cache."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from devsupport.fake_anthropic_cache import MIN_CACHEABLE_TOKENS, block_tokens
from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import ServerThread
from tests.support.claude_code import ask_claude, run_claude

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
# A system prompt long enough to cache at a small minimum (SMALL_MINIMUM tokens).
LONG_SYSTEM = "You are a helpful assistant who answers briefly. " * 20
SMALL_MINIMUM = 100
GOOD = {"model": "claude-fake", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    fake = FakeUpstream()
    with ServerThread(fake.app()) as thread:
        yield fake, thread


@pytest.fixture
def fake(served: tuple[FakeUpstream, ServerThread]) -> FakeUpstream:
    upstream, _ = served
    upstream.requests.clear()
    upstream.anthropic.cache.clear()
    upstream.anthropic.cache.min_tokens = MIN_CACHEABLE_TOKENS
    return upstream


@pytest.fixture
def url(served: tuple[FakeUpstream, ServerThread]) -> str:
    return served[1].url


@pytest.fixture
def client(fake: FakeUpstream, url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=url, api_key="sk-ant-one", max_retries=0) as sdk:
        yield sdk


def post(url: str, body: Any, **headers: str) -> httpx.Response:
    """A raw ``POST /v1/messages`` with Claude Code's headers, less any given as ""."""
    given = {name.replace("_", "-"): value for name, value in headers.items()}
    sent = {"x-api-key": "sk-ant-raw", "anthropic-version": "2023-06-01", **given}
    sent = {name: value for name, value in sent.items() if value}
    return httpx.post(f"{url}/v1/messages", json=body, headers=sent, timeout=10)


def events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events of a streamed answer: (the ``event:`` line, the data)."""
    found = []
    for chunk in response.text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.split("\n"))
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        found.append((lines["event"], data))
    return found


def ask(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def refusal(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()
    assert body["type"] == "error" and response.headers["request-id"] == body["request_id"]
    return response.status_code, body["error"]["type"], body["error"]["message"]


# --- Answers ----------------------------------------------------------------------------


def test_it_answers_from_the_system_prompt_and_earlier_messages(
    client: anthropic.Anthropic,
) -> None:
    raw = client.messages.with_raw_response.create(
        model="claude-fake",
        max_tokens=100,
        system="my city is Lyon",
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "my dog is Rex"}]},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "what is my city? and what is my dog?"},
        ],
    )
    message = raw.parse()
    assert raw.headers["request-id"].startswith("req_")
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == "claude-fake"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Your city is Lyon."  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_what_it_does_not_know_it_says_so(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="claude-opus-4-8", max_tokens=50, messages=ask("what is my city?")
    )
    assert message.content[0].text == "I don't know your city."  # type: ignore[union-attr]


def test_each_request_is_recorded_with_its_body_and_headers(fake: FakeUpstream, url: str) -> None:
    body = {"model": "claude-fake", "max_tokens": 20, "messages": ask("hello")}
    assert post(url, body, x_api_key="sk-ant-recorded").status_code == 200
    (seen,) = fake.messages_requests()
    assert seen.json() == body and seen.method == "POST"
    assert seen.headers["x-api-key"] == "sk-ant-recorded"
    assert seen.headers["anthropic-version"] == "2023-06-01"


def test_the_sdk_bearer_key_and_api_version_are_taken(
    client: anthropic.Anthropic, fake: FakeUpstream
) -> None:
    client.messages.create(model="claude-fake", max_tokens=20, messages=ask("hello"))
    (seen,) = fake.messages_requests()
    assert seen.headers["authorization"] == "Bearer sk-ant-one"
    assert seen.headers["anthropic-version"] == "2026-10-21"


def test_a_stream_sends_anthropics_events_in_order(url: str) -> None:
    body = {"model": "claude-fake", "max_tokens": 50, "stream": True,
            "system": "my colour is teal", "messages": ask("what is my colour?")}  # fmt: skip
    response = post(url, body)
    assert response.headers["content-type"].startswith("text/event-stream")
    sequence = events(response)
    names = [name for name, _ in sequence]
    deltas = names.count("content_block_delta")
    assert names == (
        ["message_start", "content_block_start", "ping"]
        + ["content_block_delta"] * deltas
        + ["content_block_stop", "message_delta", "message_stop"]
    )
    start = sequence[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0
    assert sequence[1][1]["content_block"] == {"type": "text", "text": ""}
    text = "".join(data["delta"]["text"] for name, data in sequence if name.endswith("delta")
                   and data["delta"].get("type") == "text_delta")  # fmt: skip
    assert deltas > 1 and text == "Your colour is teal."
    final = sequence[-2][1]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"]["output_tokens"] > 0


def test_the_sdk_reads_the_stream_into_the_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="claude-fake",
        max_tokens=50,
        system="my town is Ely",
        messages=ask("what is my town?"),
    ) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text == "Your town is Ely."
    assert message.content[0].text == text  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"


@pytest.mark.parametrize("streamed", [False, True])
def test_a_tool_call_round_trip(client: anthropic.Anthropic, streamed: bool) -> None:
    def create(messages: list[Any]) -> Any:
        options: Any = {"model": "tool-caller", "max_tokens": 100, "tools": [WEATHER]}
        if not streamed:
            return client.messages.create(messages=messages, **options)
        with client.messages.stream(messages=messages, **options) as stream:
            return stream.get_final_message()

    asked = ask("what is the weather in Paris?")
    called = create(asked)
    assert called.stop_reason == "tool_use"
    (use,) = called.content
    assert use.type == "tool_use" and use.name == "get_weather"
    assert use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}
    turn = [{"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
            {"role": "user", "content": [result]}]  # fmt: skip
    answered = create(asked + turn)
    assert answered.stop_reason == "end_turn"
    assert answered.content[0].text == "The tool said: sunny, 21 C"


def test_consecutive_messages_of_one_role_are_read_as_one(client: anthropic.Anthropic) -> None:
    messages: Any = [{"role": "user", "content": "my bike is red"}, *ask("what is my bike?")]
    message = client.messages.create(model="claude-fake", max_tokens=50, messages=messages)
    assert message.content[0].text == "Your bike is red."  # type: ignore[union-attr]


def test_a_document_with_a_text_source_is_read_as_context(client: anthropic.Anthropic) -> None:
    text = {"type": "text", "media_type": "text/plain", "data": "my boat is Wave"}
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    shown = [{"type": "document", "source": text}, {"type": "image", "source": png}]
    messages: Any = [
        {"role": "user", "content": shown},
        {"role": "assistant", "content": "Read."},
        *ask("what is my boat?"),
    ]
    message = client.messages.create(model="claude-fake", max_tokens=50, messages=messages)
    assert message.content[0].text == "Your boat is Wave."  # type: ignore[union-attr]


def test_a_mid_conversation_system_message_is_context_not_the_question(
    fake: FakeUpstream, url: str
) -> None:
    """Claude Code ends its first request with a system message after the user's."""
    system = {"role": "system", "content": [{"type": "text", "text": "Tools: none"}]}
    body = {**GOOD, "messages": [*ask("my lamp is blue"), system]}
    response = post(url, body)
    assert response.json()["content"][0]["text"] == "ack: my lamp is blue"


def test_cut_short_stops_at_max_tokens(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="cut-short", max_tokens=50, messages=ask("hi"))
    assert message.stop_reason == "max_tokens"


def test_fail_stream_ends_on_an_error_event_without_message_stop(
    client: anthropic.Anthropic, url: str
) -> None:
    body = {"model": "fail-stream", "max_tokens": 50, "stream": True, "messages": ask("a b c")}
    names = [name for name, _ in events(post(url, body))]
    assert names[-1] == "error" and "message_stop" not in names
    assert "content_block_delta" in names
    stream = client.messages.stream(model="fail-stream", max_tokens=50, messages=ask("a b"))
    with pytest.raises(anthropic.APIStatusError) as raised, stream as events_read:
        events_read.get_final_message()
    assert raised.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


def test_a_thinking_block_comes_back_signed_and_is_checked(
    client: anthropic.Anthropic, url: str
) -> None:
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    message = client.messages.create(
        model="thinker", max_tokens=2048, thinking=thinking, messages=ask("my hat is green")
    )
    assert [block.type for block in message.content] == ["thinking", "text"]
    said = [block.model_dump(exclude_none=True) for block in message.content]
    later = [*ask("my hat is green"), {"role": "assistant", "content": said},
             *ask("what is my hat?")]  # fmt: skip
    body = {"model": "thinker", "max_tokens": 2048, "thinking": thinking, "messages": later}
    assert post(url, body).status_code == 200
    said[0]["thinking"] += " (changed)"
    status, kind, text = refusal(post(url, body))
    assert (status, kind) == (400, "invalid_request_error")
    assert text == "messages.1.content.0: Invalid `signature` in `thinking` block"


def test_max_tokens_zero_only_fills_the_cache(fake: FakeUpstream, url: str) -> None:
    fake.anthropic.cache.min_tokens = SMALL_MINIMUM
    system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    body = {"model": "claude-fake", "max_tokens": 0, "system": system, "messages": ask("hi")}
    warmed = post(url, body).json()
    assert warmed["content"] == [] and warmed["stop_reason"] == "max_tokens"
    assert warmed["usage"]["cache_creation_input_tokens"] > 0
    body["max_tokens"] = 50
    used = post(url, body).json()["usage"]
    assert used["cache_read_input_tokens"] == warmed["usage"]["cache_creation_input_tokens"]


# --- Refusals ---------------------------------------------------------------------------


def test_a_request_without_a_key_is_refused_as_anthropic_does(url: str) -> None:
    assert refusal(post(url, GOOD, x_api_key="")) == (
        401, "authentication_error", "x-api-key header is required"
    )  # fmt: skip


def test_a_request_without_a_version_is_refused_as_anthropic_does(url: str) -> None:
    assert refusal(post(url, GOOD, anthropic_version="")) == (
        400, "invalid_request_error", "anthropic-version: header is required"
    )  # fmt: skip
    assert refusal(post(url, GOOD, anthropic_version="latest"))[2] == (
        'anthropic-version: "latest" is not a valid version'
    )


def test_a_key_the_upstream_rejects_is_refused(fake: FakeUpstream, url: str) -> None:
    fake.rejected_keys.add("sk-ant-revoked")
    try:
        status, kind, _ = refusal(post(url, GOOD, x_api_key="sk-ant-revoked"))
    finally:
        fake.rejected_keys.discard("sk-ant-revoked")
    assert (status, kind) == (401, "authentication_error")


def _without(name: str) -> dict[str, Any]:
    return {k: v for k, v in GOOD.items() if k != name}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_without("max_tokens"), "max_tokens: Field required"),
        (_without("model"), "model: Field required"),
        ({**GOOD, "messages": []}, "messages: at least one message is required"),
        ({**GOOD, "messages": [{"role": "tool", "content": "x"}]},
         "messages.0.role: Input should be 'user' or 'assistant' or 'system'"),
        ({**GOOD, "messages": [{"role": "assistant", "content": "x"}]},
         'messages: first message must use the "user" role'),
        ({**GOOD, "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
         "messages.0.content.0.text: text content blocks must be non-empty"),
        ({**GOOD, "messages": [{"role": "user", "content": [TOOL_USE]}]},
         "messages.0.content.0.type: `tool_use` blocks are not allowed in `user` messages"),
        ({**GOOD, "system": [{"type": "image"}]}, "system.0.type: Input should be 'text'"),
        ({**GOOD, "tools": [{**WEATHER, "name": "weather.get"}]},
         "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'"),
        ({**GOOD, "messages": [{"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/bmp", "data": "x"}}]}]},
         "messages.0.content.0.source.base64.media_type: Input should be 'image/jpeg', "
         "'image/png', 'image/gif' or 'image/webp'"),
        ({**GOOD, "thinking": {"type": "enabled", "budget_tokens": 1024}},
         "`max_tokens` must be greater than `thinking.budget_tokens`."),
    ],
)  # fmt: skip
def test_a_malformed_request_is_refused_with_anthropics_message(
    url: str, body: dict[str, Any], message: str
) -> None:
    assert refusal(post(url, body)) == (400, "invalid_request_error", message)


def test_version_2026_10_21_refuses_the_sampling_parameters_it_removed(url: str) -> None:
    body = {**GOOD, "temperature": 0.5}
    assert post(url, body).status_code == 200  # 2023-06-01, as Claude Code sends
    assert refusal(post(url, body, anthropic_version="2026-10-21"))[2] == (
        "temperature: Extra inputs are not permitted"
    )


def test_a_tool_use_without_its_result_in_the_next_message_is_refused(url: str) -> None:
    body = {**GOOD, "messages": [*ask("weather?"), {"role": "assistant", "content": [TOOL_USE]},
                                 *ask("never mind")]}  # fmt: skip
    assert refusal(post(url, body))[2] == (
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
        "after: toolu_1. Each `tool_use` block must have a corresponding `tool_result` block "
        "in the next message."
    )


def test_a_tool_result_without_its_tool_use_is_refused(url: str) -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_9", "content": "sunny"}
    body = {**GOOD, "messages": [*ask("weather?"), {"role": "assistant", "content": "ok"},
                                 {"role": "user", "content": [result]}]}  # fmt: skip
    assert refusal(post(url, body))[2] == (
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: "
        "toolu_9. Each `tool_result` block must have a corresponding `tool_use` block in "
        "the previous message."
    )


def test_a_tool_result_in_a_second_user_message_still_answers(url: str) -> None:
    """The API merges consecutive messages of one role: the result is in "the next"."""
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
    body = {**GOOD, "messages": [*ask("weather?"), {"role": "assistant", "content": [TOOL_USE]},
                                 *ask("and"), {"role": "user", "content": [result]}]}  # fmt: skip
    assert post(url, body).status_code == 200


def test_more_than_four_cache_breakpoints_are_refused(url: str) -> None:
    marked = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    body = {**GOOD, "system": [marked] * 3, "messages": [{"role": "user", "content": [marked] * 2}]}
    assert refusal(post(url, body)) == (
        400, "invalid_request_error",
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    )  # fmt: skip
    body["system"] = [marked] * 2
    assert post(url, body).status_code == 200


@pytest.mark.parametrize(
    ("model", "error", "status", "kind"),
    [
        ("error-500", anthropic.InternalServerError, 500, "api_error"),
        ("overloaded", anthropic.OverloadedError, 529, "overloaded_error"),
        ("rate-limit", anthropic.RateLimitError, 429, "rate_limit_error"),
    ],
)
def test_a_failing_model_raises_the_sdks_matching_error(
    client: anthropic.Anthropic, model: str, error: type[Exception], status: int, kind: str
) -> None:
    with pytest.raises(error) as raised:
        client.messages.create(model=model, max_tokens=20, messages=ask("hi"))
    failure: Any = raised.value
    assert failure.status_code == status and failure.body["error"]["type"] == kind
    if model == "rate-limit":
        assert failure.response.headers["retry-after"] == "7"


def test_a_bad_request_raises_the_sdks_bad_request_error(client: anthropic.Anthropic) -> None:
    messages: Any = [{"role": "assistant", "content": "first"}]
    with pytest.raises(anthropic.BadRequestError, match="first message must use"):
        client.messages.create(model="claude-fake", max_tokens=20, messages=messages)


# --- The prompt cache -------------------------------------------------------------------


def cached_call(
    client: anthropic.Anthropic, system: str = LONG_SYSTEM, question: str = "hi"
) -> Any:  # anthropic.types.Usage, its counts read as ints
    marked: Any = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
    return client.messages.create(
        model="claude-fake", max_tokens=50, system=marked, messages=ask(question)
    ).usage


def test_a_second_call_with_the_same_prefix_reads_it_from_the_cache(
    client: anthropic.Anthropic, fake: FakeUpstream
) -> None:
    fake.anthropic.cache.min_tokens = SMALL_MINIMUM
    first = cached_call(client)
    prefix = block_tokens({"type": "text", "text": LONG_SYSTEM})
    assert prefix >= SMALL_MINIMUM
    assert (first.cache_creation_input_tokens, first.cache_read_input_tokens) == (prefix, 0)
    assert first.cache_creation is not None
    assert first.cache_creation.ephemeral_5m_input_tokens == prefix
    second = cached_call(client, question="hello again")
    assert (second.cache_creation_input_tokens, second.cache_read_input_tokens) == (0, prefix)
    assert second.input_tokens == block_tokens({"type": "text", "text": "hello again"})


def test_a_changed_prefix_misses_the_cache(client: anthropic.Anthropic, fake: FakeUpstream) -> None:
    fake.anthropic.cache.min_tokens = SMALL_MINIMUM
    cached_call(client)
    changed = cached_call(client, system=LONG_SYSTEM + "Be kind.")
    assert changed.cache_read_input_tokens == 0 and changed.cache_creation_input_tokens > 0


def test_a_prefix_below_the_minimum_is_not_cached(client: anthropic.Anthropic) -> None:
    for _ in range(2):
        usage = cached_call(client)  # ~250 tokens: below the default 1,024
        assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (0, 0)


def test_caches_are_per_api_key(client: anthropic.Anthropic, fake: FakeUpstream, url: str) -> None:
    fake.anthropic.cache.min_tokens = SMALL_MINIMUM
    cached_call(client)
    with anthropic.Anthropic(base_url=url, api_key="sk-ant-two", max_retries=0) as other:
        usage = cached_call(other)
    assert usage.cache_read_input_tokens == 0 and usage.cache_creation_input_tokens > 0


def test_a_conversation_reads_what_its_previous_turn_wrote(
    client: anthropic.Anthropic, fake: FakeUpstream
) -> None:
    """The marker moves to the newest message each turn; the 20-block lookback finds
    the prefix the previous turn's marker wrote."""
    fake.anthropic.cache.min_tokens = SMALL_MINIMUM

    def turn(messages: list[Any]) -> Any:
        last = messages[-1]
        marked = {**last, "content": [{"type": "text", "text": last["content"],
                                       "cache_control": {"type": "ephemeral"}}]}  # fmt: skip
        sent: Any = [*messages[:-1], marked]
        return client.messages.create(
            model="claude-fake", max_tokens=50, system=LONG_SYSTEM, messages=sent
        ).usage

    first = turn(ask("my name is Ann"))
    second = turn([*ask("my name is Ann"), {"role": "assistant", "content": "ack"},
                   *ask("what is my name?")])  # fmt: skip
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens > 0
    assert second.cache_creation_input_tokens > 0  # the new turn, written for the next


def test_a_top_level_cache_control_marks_the_last_block(fake: FakeUpstream, url: str) -> None:
    fake.anthropic.cache.min_tokens = SMALL_MINIMUM
    body = {**GOOD, "system": LONG_SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    usage = post(url, body).json()["usage"]
    assert usage["input_tokens"] == 0 and usage["cache_creation_input_tokens"] > 0
    assert usage["cache_creation"]["ephemeral_1h_input_tokens"] > 0


def test_claude_codes_billing_header_line_is_no_part_of_the_cached_prefix(
    fake: FakeUpstream, url: str
) -> None:
    """Its hash changes with every prompt: read as part of the prompt, it would make
    every Claude Code call miss the cache."""
    fake.anthropic.cache.min_tokens = SMALL_MINIMUM

    def usage(line: str) -> dict[str, Any]:
        header = {"type": "text", "text": f"x-anthropic-billing-header: cc_version={line};"}
        marked = {"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}
        system = [header, marked]
        return dict(post(url, {**GOOD, "system": system}).json()["usage"])

    written = usage("2.1.332.e77")["cache_creation_input_tokens"]
    assert usage("2.1.332.00d")["cache_read_input_tokens"] == written > 0


def test_count_tokens_counts_the_whole_input_and_writes_nothing(
    client: anthropic.Anthropic, fake: FakeUpstream
) -> None:
    fake.anthropic.cache.min_tokens = SMALL_MINIMUM
    marked: Any = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    counted = client.messages.count_tokens(model="claude-fake", system=marked, messages=ask("hi"))
    usage = cached_call(client)
    assert usage.cache_read_input_tokens == 0  # the count wrote no cache
    whole = usage.input_tokens + (usage.cache_creation_input_tokens or 0)
    assert counted.input_tokens == whole
    assert fake.requests[0].path == "/v1/messages/count_tokens"


# --- Claude Code ------------------------------------------------------------------------


def test_claude_code_answers_through_the_fake_and_resends_its_history(
    fake: FakeUpstream, url: str, tmp_path: Path
) -> None:
    session = f"cc-{uuid.uuid4().hex[:8]}"
    said = ask_claude("my city is Oslo", base_url=url, home=tmp_path, session_id=session)
    assert said.endswith("my city is Oslo")  # the fake's "ack: …" of the whole message
    answer = ask_claude("what is my city?", base_url=url, home=tmp_path, resume=True)
    assert answer == "Your city is Oslo."
    first, second = fake.messages_requests()
    assert first.query == b"beta=true" and first.json()["stream"] is True
    assert first.headers["x-api-key"] == "sk-ant-test"
    assert first.headers["x-session-id"] == session
    assert "x-session-id" not in second.headers  # given to the first call only
    assert first.headers["x-claude-code-session-id"] == second.headers["x-claude-code-session-id"]
    roles = [m["role"] for m in second.json()["messages"]]
    assert roles == ["user", "system", "assistant", "user"]


def test_claude_code_reports_an_upstream_failure(url: str, tmp_path: Path) -> None:
    done = run_claude("hi", base_url=url, home=tmp_path, model="overloaded")
    assert done.returncode == 1
    assert done.stdout.startswith("API Error: 529 Overloaded")
