"""Model-aware budgets: a model's window bounds a request's budget, and an upstream's
refusal of a context too long is read, and answered with a budget that fits."""

from __future__ import annotations

import json

import pytest

from gateway.config import ConfigError, ModelLimits, parse_settings
from gateway.memory.model_budget import (
    Ceilings,
    Overflow,
    context_overflow,
    entry_for,
    model_budget,
    requested_output,
    retry_budget,
)

SMOL = ModelLimits(match="*SmolLM*", context_tokens=2048, output_reserve_tokens=512)
ANY = ModelLimits(match="*", context_tokens=128_000)


def test_first_matching_entry_wins_in_any_case() -> None:
    assert entry_for("HuggingFaceTB/smollm2-1.7b-instruct", [SMOL, ANY]) is SMOL
    assert entry_for("gpt-4o", [SMOL, ANY]) is ANY
    assert entry_for("gpt-4o", [SMOL]) is None


def test_budget_is_the_smaller_of_the_setting_and_the_window_less_the_reserve() -> None:
    assert model_budget(3000, SMOL) == 2048 - 512
    assert model_budget(1000, SMOL) == 1000
    assert model_budget(3000, None) == 3000  # an unknown model: today's behaviour


def test_the_reserve_is_the_requests_max_tokens_when_it_asks() -> None:
    assert model_budget(3000, SMOL, requested=1000) == 2048 - 1000
    no_reserve = ModelLimits(match="m", context_tokens=2048)
    assert model_budget(3000, no_reserve) == 2048 - 512  # min(512, a quarter)
    tiny = ModelLimits(match="m", context_tokens=1000)
    assert model_budget(3000, tiny) == 750
    assert model_budget(3000, SMOL, requested=5000) == 1  # never under 1


def test_requested_output_reads_either_name() -> None:
    assert requested_output({"max_completion_tokens": 300, "max_tokens": 10}) == 300
    assert requested_output({"max_tokens": 10}) == 10
    assert requested_output({"max_tokens": True}) is None
    assert requested_output({"max_tokens": "10"}) is None
    assert requested_output({}) is None


def test_config_reads_models_and_refuses_a_reserve_over_the_window() -> None:
    settings = parse_settings({"models": [{"match": "*smol*", "context_tokens": 2048}]})
    assert settings.models[0].context_tokens == 2048
    assert parse_settings({}).models == []
    with pytest.raises(ConfigError, match="output_reserve_tokens"):
        parse_settings(
            {"models": [{"match": "m", "context_tokens": 100, "output_reserve_tokens": 100}]}
        )


def _body(error: object) -> bytes:
    return json.dumps({"error": error}).encode()


LLAMACPP = _body(
    {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 3100,
        "n_ctx": 2048,
    }
)
OPENAI = _body(
    {
        "message": "This model's maximum context length is 8,192 tokens. However, your "
        "messages resulted in 9,000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
)
VLLM = _body(
    {
        "message": "This model's maximum context length is 2048 tokens. However, you "
        "requested 3000 tokens (2500 in the messages, 500 in the completion).",
        "type": "BadRequestError",
        "code": 400,
    }
)
BARE = _body({"code": 400, "message": "the request exceeds the available context size."})


def test_refusals_are_read_with_the_numbers_given() -> None:
    assert context_overflow(400, LLAMACPP) == Overflow(limit=2048, counted=3100)
    assert context_overflow(400, OPENAI) == Overflow(limit=8192, counted=9000)
    assert context_overflow(400, VLLM) == Overflow(limit=2048, counted=3000)
    assert context_overflow(400, BARE) == Overflow()


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, LLAMACPP),  # only a 400 is a refusal of the request as sent
        (429, OPENAI),
        (400, _body({"message": "Invalid 'messages[0].role'", "code": "invalid_value"})),
        (400, _body({"message": "max_tokens is too large", "code": None})),
        (400, b"<html>Bad Request</html>"),
        (400, b"[1, 2]"),
        (400, b'{"error": 7}'),
        (400, b""),
    ],
)
def test_no_other_answer_is_a_refusal(status: int, body: bytes) -> None:
    assert context_overflow(status, body) is None


def test_a_retry_fits_the_stated_window_in_the_gateways_count() -> None:
    # The upstream counted 3100 for the gateway's 2400: the same context fits 2048 - 512
    # of its tokens at 2400 * 1536 / 3100 of the gateway's, less a margin.
    budget = retry_budget(2400, Overflow(limit=2048, counted=3100))
    assert budget == int(1536 * 2400 / 3100 * 0.9)
    assert budget < 2400 * 1536 / 3100
    # A request's max_tokens is the room kept for its answer.
    assert retry_budget(2400, Overflow(limit=2048, counted=3100), requested=1000) < budget


def test_a_retry_without_numbers_halves_and_always_shrinks() -> None:
    assert retry_budget(3000, Overflow()) == 1024  # as a 2,048-token model would take
    assert retry_budget(1500, Overflow()) == 750
    assert retry_budget(3000, Overflow(limit=2048)) == int(0.9 * 1536)  # under half
    assert retry_budget(2000, Overflow(limit=2048)) == 1000  # half: the counts may differ
    assert retry_budget(1000, Overflow(limit=100_000, counted=1100)) == 999  # never larger
    assert retry_budget(1, Overflow()) == 1


def test_a_fitted_budget_bounds_the_models_next_requests_for_a_while() -> None:
    ceilings = Ceilings(ttl_s=60, entries=2)
    assert ceilings.bound("small", 3000, now=0) == 3000
    ceilings.fitted("small", 900, now=0)
    assert ceilings.bound("small", 3000, now=59) == 900
    assert ceilings.bound("small", 500, now=59) == 500  # never raises a budget
    assert ceilings.bound("other", 3000, now=59) == 3000
    assert ceilings.bound("small", 3000, now=60) == 3000  # expired: the whole budget again
    for n, model in enumerate(["a", "b", "c"]):
        ceilings.fitted(model, 100 + n, now=0)
    assert ceilings.bound("a", 3000, now=1) == 3000  # the oldest of more than 2 went
    assert ceilings.bound("c", 3000, now=1) == 102
