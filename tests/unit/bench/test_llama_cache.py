"""bench/llama_cache.py's pure helpers: what it reads of a stream (time to first token is
the first line with content) and of llama-cpp-python's log (the prefix it reused), and
the conversation it replays."""

from __future__ import annotations

import json

import pytest

from bench import realtalk
from bench.llama_cache import (
    PromptEval,
    StreamError,
    build_script,
    chat_template,
    content_piece,
    parse_server_log,
)


def chunk(delta: dict[str, object]) -> str:
    event = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    return "data: " + json.dumps(event)


@pytest.mark.parametrize(
    ("line", "piece"),
    [
        (chunk({"content": "Hello"}), "Hello"),
        ("data:" + chunk({"content": " there"})[5:], " there"),  # no space after the colon
        (chunk({"role": "assistant"}), ""),  # the role comes first, with no content
        (chunk({"content": ""}), ""),
        (chunk({"content": None}), ""),
        (chunk({}), ""),
        ("data: [DONE]", ""),
        (": keep-alive", ""),
        ("", ""),
        ("event: message", ""),
        ("data: not json", ""),
        ('data: {"choices": "no list"}', ""),
        ('data: {"choices": [{"index": 0}]}', ""),
        ("data: [1, 2]", ""),
    ],
)
def test_a_line_carries_content_only_in_a_data_events_delta(line: str, piece: str) -> None:
    assert content_piece(line) == piece


def test_an_error_event_is_raised_not_taken_for_an_empty_piece() -> None:
    error = {"error": {"message": "the upstream closed the stream", "code": "upstream_error"}}
    with pytest.raises(StreamError, match="the upstream closed the stream"):
        content_piece("data: " + json.dumps(error))


def timings(ms: float, tokens: int) -> str:
    """llama.cpp's perf lines after an answer, as it prints them."""
    return (
        f"llama_perf_context_print: prompt eval time = {ms:10.2f} ms / {tokens:5d} tokens "
        "(   21.82 ms per token,    45.83 tokens per second)\n"
        "llama_perf_context_print:        eval time =     351.59 ms /    15 runs   "
        "(   23.44 ms per token,    42.66 tokens per second)\n"
    )


PREFIX_HIT = (
    """\
INFO:     127.0.0.1:41332 - "POST /v1/chat/completions HTTP/1.1" 200 OK
Llama.generate: 1231 prefix-match hit, remaining 415 prompt tokens to eval
llama_perf_context_print:        load time =       0.25 ms
"""
    + timings(9055.09, 415)
    + """\
Llama._create_completion: cache save
Llama._create_completion: cache saved
"""
)
STARTED_OVER = """\
Llama._create_completion: cache miss
""" + timings(3202.96, 1116)
RESTORED = """\
Llama._create_completion: cache hit
Llama.generate: 138 prefix-match hit, remaining 1790 prompt tokens to eval
""" + timings(32918.42, 1790)
REFUSED = """\
    | ValueError: Requested tokens (2112) exceed context window of 2048
    +------------------------------------
ValueError: Requested tokens (2112) exceed context window of 2048
INFO:     127.0.0.1:60376 - "POST /v1/chat/completions HTTP/1.1" 200 OK
"""


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (PREFIX_HIT, PromptEval(1231, 415, 9055.09, restored=False, refused=0)),
        (STARTED_OVER, PromptEval(0, 1116, 3202.96, restored=False, refused=0)),
        (RESTORED, PromptEval(138, 1790, 32918.42, restored=True, refused=0)),
        # A refused prompt, then the gateway's retry: the retry's numbers, one refusal.
        (REFUSED + PREFIX_HIT, PromptEval(1231, 415, 9055.09, restored=False, refused=1)),
        # Two completions (a summary between turns): only the last one's prefix counts.
        (RESTORED + STARTED_OVER, PromptEval(0, 1116, 3202.96, restored=False, refused=0)),
        (PREFIX_HIT + RESTORED, PromptEval(138, 1790, 32918.42, restored=True, refused=0)),
    ],
)
def test_the_log_gives_the_last_completions_prefix_and_prompt_eval(
    log: str, expected: PromptEval
) -> None:
    assert parse_server_log(log) == expected


@pytest.mark.parametrize(
    "log", ["", REFUSED, "Llama.generate: 5 prefix-match hit, remaining 3 prompt tokens to eval\n"]
)
def test_a_log_without_a_finished_prompt_gives_nothing(log: str) -> None:
    assert parse_server_log(log) is None


def test_prompt_tokens_are_the_reused_and_the_evaluated() -> None:
    assert PromptEval(1231, 415, 1.0, restored=False, refused=0).prompt_tokens == 1646


def test_the_chat_template_is_chatml_with_the_replys_opening() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi\nthere"},
    ]
    assert chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi\nthere<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def message(number: int, role: str, text: str) -> realtalk.RealMessage:
    speaker = "Ann" if role == "user" else "Ben"
    return realtalk.RealMessage(f"D1:{number}", role, speaker, text, 1_700_000_000.0 + number)


def conversation(*messages: tuple[str, str]) -> realtalk.RealConversation:
    return realtalk.RealConversation(
        "Chat_0_Ann_Ben",
        ("Ann", "Ben"),
        tuple(message(n, role, text) for n, (role, text) in enumerate(messages, 1)),
        (),
    )


def test_the_import_ends_before_a_user_message_once_it_has_the_tokens() -> None:
    chat = conversation(
        ("user", "a b"), ("assistant", "c"), ("assistant", "d"),
        ("user", "e"), ("user", "f"), ("assistant", "g"),
        ("user", "h"), ("assistant", "i"), ("user", "j"),
    )  # fmt: skip
    words = lambda text: len(text.split())  # noqa: E731
    # 3 + 2 tokens reach 5 after the first message; the cut moves on past the answers.
    script = build_script(chat, 5, turns=5, count=words)
    assert [m.text for m in script.imported] == ["a b", "c", "d"]
    # A user's run is one turn, its lines joined; a last run without an answer is left.
    assert script.turns == ("e\nf", "h")
    assert script.conversation == "Chat_0_Ann_Ben"
    assert build_script(chat, 5, turns=1, count=words).turns == ("e\nf",)
    # 17 tokens after "e": the cut moves on to the next run, not between "e" and "f".
    later = build_script(chat, 14, turns=5, count=words)
    assert [m.text for m in later.imported] == ["a b", "c", "d", "e", "f", "g"]
    assert later.turns == ("h",)
