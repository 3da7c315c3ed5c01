"""bench/live_sessions.py and the sessions section of bench/overhead.py: what the timings
say (each quantile minus direct's, the ratio of the long sessions to the short), the
targets they are held to, and the requests the load generator makes."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from bench import overhead
from bench.live_sessions import SessionTarget, new_messages, pool, ratio, summary


def timed(first: float, last: float, error: str = "") -> dict[str, Any]:
    return {"headers": first / 2, "first": first, "last": last, "error": error}


def runs(*values: float, failed: int = 0) -> list[dict[str, Any]]:
    """One request per value (its first event at the value, its end 1 s later), then
    ``failed`` failed ones whose times would dwarf the others'."""
    return [timed(v, v + 1) for v in values] + [timed(99, 99, "timeout")] * failed


def test_added_is_each_quantile_minus_directs_of_the_same_mode() -> None:
    stats = summary(
        {
            "direct/json": runs(0.1, 0.2, 0.3),
            "direct/sse": runs(0.01, 0.02, 0.03),
            "400/json": runs(0.5, 0.6, 0.7, failed=2),
            "400/sse": runs(0.05, 0.06, 0.07),
        }
    )
    json, sse = stats["400"]["json"], stats["400"]["sse"]
    # Non-streamed: the whole answer (last byte); streamed: the first event.
    assert json["p50"] == pytest.approx(1.6)
    assert json["direct_p50"] == pytest.approx(1.2)
    assert json["added_p50"] == pytest.approx(0.4)
    assert json["added_p99"] == pytest.approx(1.7 - 1.3)  # the failed ones left out
    assert sse["added_p50"] == pytest.approx(0.04)
    assert set(stats) == {"400"}  # direct is the baseline, not a row


def test_a_short_session_that_adds_nothing_makes_the_ratio_infinite() -> None:
    assert ratio(0.003, 0.002) == pytest.approx(1.5)
    assert ratio(0.003, 0.0) == math.inf
    assert ratio(0.003, -0.0001) == math.inf  # direct's noise


@pytest.mark.parametrize(
    ("turns", "per_session", "sessions"), [(130, 5, 26), (131, 5, 27), (3, 5, 1), (0, 5, 1)]
)
def test_enough_sessions_that_none_grows_by_more_than_its_share(
    turns: int, per_session: int, sessions: int
) -> None:
    assert pool(turns, per_session) == sessions


def test_each_request_goes_to_the_next_session_with_a_message_never_sent() -> None:
    texts = new_messages(13)
    spec = {"name": "400", "url": "http://gw/v1/", "sessions": ["a", "b", "c"]}
    short, long = SessionTarget(spec, texts), SessionTarget(spec | {"name": "10"}, texts)
    sent = [target.request("m", stream=n % 2 == 0) for n in range(300) for target in (short, long)]
    assert short.url == "http://gw/v1/chat/completions"
    assert [h["X-Session-Id"] for h, _ in sent[:8:2]] == ["a", "b", "c", "a"]
    contents = [body["messages"][0]["content"] for _, body in sent]
    assert len(set(contents)) == len(contents) == 600
    assert [body["stream"] for _, body in sent[:4]] == [True, True, False, False]


def test_a_target_without_sessions_sends_no_session_header() -> None:
    headers, _ = SessionTarget({"name": "direct", "url": "http://up/v1"}, new_messages(1)).request(
        "m", stream=False
    )
    assert "X-Session-Id" not in headers


def section(added_400: float, added_10: float) -> dict[str, Any]:
    """The sessions section's raw numbers with these added p50s (both modes alike)."""
    row = {"direct_p50": 0.0005, "direct_p99": 0.001, "added_p99": 0.01}
    stats = {
        size: {mode: row | {"added_p50": added} for mode in ("json", "sse")}
        for size, added in (("10", added_10), ("400", added_400))
    }
    state = {"pending_jobs": 3, "messages_mean": 10.0}
    return {
        "sessions_per_size": 2,
        "gateway_cpu_percent": 40.0,
        "before": {10: state, 400: state},
        "after": {10: state, 400: state},
        "summaries": {"ok": 3.0, "rejected": 0.0},
        "errors": {"10/json": 0},
        "quantiles_s": stats,
    }


@pytest.mark.parametrize(
    ("added_400", "added_10", "under_2_ms", "under_ratio"),
    [
        (0.0019, 0.0016, "yes", "yes"),  # 1.19x
        (0.0021, 0.0020, "no", "yes"),  # over 2 ms
        (0.0019, 0.0014, "yes", "no"),  # 1.36x
        (0.0010, 0.0, "yes", "no"),  # the short sessions add nothing: any ratio is too much
    ],
)
def test_the_400_message_sessions_are_held_to_2_ms_and_1_3x_the_10s(
    added_400: float, added_10: float, under_2_ms: str, under_ratio: str
) -> None:
    report = overhead.Report({})
    overhead.live_rows(report, "working summarizer", section(added_400, added_10))
    targets = [(row.measure, row.met) for row in report.rows if row.target]
    assert targets == [
        ("400 messages: non-streamed, whole answer p50 / p99 (added)", under_2_ms),
        ("400 / 10 messages: non-streamed, whole answer, added p50", under_ratio),
        ("400 messages: first SSE event p50 / p99 (added)", under_2_ms),
        ("400 / 10 messages: first SSE event, added p50", under_ratio),
    ]
    assert report.rows[0].memory == "summarizer: ok 3"


def test_summarizer_outcomes_are_read_from_the_metrics() -> None:
    text = (
        "# HELP memory_gateway_summaries_total Summarizer model questions by outcome\n"
        'memory_gateway_summaries_total{outcome="ok"} 12.0\n'
        'memory_gateway_summaries_total{outcome="rejected"} 3.0\n'
        'memory_gateway_summaries_created{outcome="ok"} 1.7e9\n'
    )
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
    with httpx.Client(transport=transport, base_url="http://gw") as client:
        assert overhead.summary_outcomes(client) == {"ok": 12.0, "rejected": 3.0}
