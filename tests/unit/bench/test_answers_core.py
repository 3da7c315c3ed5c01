"""bench/answers_core.py: the prompts, the judge's verdict, the baseline's dated and cut
history, which conversations are chosen, the resumable --out file, and the table."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from bench import answers_core as core
from bench.realtalk import RealConversation, RealMessage


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def conversation(cid: str = "Chat_1_Ann_Bob", messages: tuple[RealMessage, ...] = ()) -> Any:
    return RealConversation(cid, ("Ann", "Bob"), messages, ())


def test_the_question_goes_with_a_system_line_naming_who_is_who() -> None:
    system, question = core.ask_messages(conversation(), "Where does Ann live?")
    assert question == {"role": "user", "content": "Where does Ann live?"}
    assert system["role"] == "system"
    assert "the user's messages are Ann's" in system["content"]
    assert "the assistant's messages are Bob's" in system["content"]


def test_the_judge_gets_mem0s_prompt_filled_in() -> None:
    (message,) = core.judge_messages("Where?", "Porto", "She lives in Porto.")
    assert message["role"] == "user"
    text = message["content"]
    assert "Question: Where?\nGold answer: Porto\nGenerated answer: She lives in Porto.\n" in text
    assert "you should be generous with your grading" in text
    assert 'in a json format with the key as "label"' in text
    assert "{" not in text.replace('"label"', "")  # every placeholder was filled


def test_braces_in_an_answer_are_not_taken_for_placeholders() -> None:
    (message,) = core.judge_messages("Q {x}?", "{gold}", "an answer with {braces}")
    assert "Generated answer: an answer with {braces}" in message["content"]


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ('{"label": "CORRECT"}', "CORRECT"),
        ('{"label": "WRONG"}', "WRONG"),
        ('The answer names the city. ```json\n{"label": "correct"}\n```', "CORRECT"),
        ("{'label': 'WRONG'}", "WRONG"),
        ("It names the same place, so: CORRECT", "CORRECT"),
        ("The dates differ.\nWRONG", "WRONG"),
        ("INCORRECT", None),  # neither label: the boundary is a letter
        ("the answer is correct", None),  # lower case is a word of the reasoning
        ("It is not CORRECT: WRONG", "WRONG"),  # the last one, as the prompt ends with it
        ('CORRECT, the label: {"label": "WRONG"}', "WRONG"),  # the JSON label wins
        ("", None),
        ("I cannot judge this.", None),
    ],
)
def test_the_verdict_is_the_json_label_else_the_last_capital_word(
    reply: str, verdict: str | None
) -> None:
    assert core.parse_verdict(reply) == verdict


def message(dia: str, role: str, text: str, when: str) -> RealMessage:
    return RealMessage(dia, role, "Ann" if role == "user" else "Bob", text, at(when))


def test_the_baseline_history_marks_the_first_message_of_each_day_and_names_speakers() -> None:
    history = core.dated_history(
        (
            message("D1:1", "user", "Hi!", "2024-01-13T09:00:00"),
            message("D1:2", "assistant", "Hello", "2024-01-13T23:59:00"),
            message("D2:1", "user", "Morning", "2024-01-14T00:01:00"),
            message("D2:2", "assistant", "Hey", "2024-01-14T08:00:00"),
        )
    )
    assert history == [
        {"role": "user", "content": "[Sat 2024-01-13] Hi!", "name": "Ann"},
        {"role": "assistant", "content": "Hello", "name": "Bob"},
        {"role": "user", "content": "[Sun 2024-01-14] Morning", "name": "Ann"},
        {"role": "assistant", "content": "Hey", "name": "Bob"},
    ]


@pytest.mark.parametrize(
    ("limit", "start"),
    [(100, 0), (60, 0), (59, 1), (50, 1), (30, 2), (29, 3), (20, 3), (19, 4), (0, 4), (-5, 4)],
)
def test_the_history_is_cut_from_the_front_to_fit(limit: int, start: int) -> None:
    assert core.keep_from([10, 20, 10, 20], limit) == start


def test_a_cut_never_skips_a_message_to_keep_an_older_one() -> None:
    # The newest is too big: nothing older may stand in for it.
    assert core.keep_from([1, 1, 50], 10) == 3


CONVERSATIONS = [conversation(cid) for cid in ("Chat_1_Emi_Elise", "Chat_2_Kevin_Elise",
                                               "Chat_10_Fahim_Muhhamed")]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "ids"),
    [
        ("all", ["Chat_1_Emi_Elise", "Chat_2_Kevin_Elise", "Chat_10_Fahim_Muhhamed"]),
        ("2", ["Chat_1_Emi_Elise", "Chat_2_Kevin_Elise"]),
        ("Chat_1", ["Chat_1_Emi_Elise"]),  # not Chat_10 too: a part ends at an underscore
        ("kevin_elise, Chat_10", ["Chat_2_Kevin_Elise", "Chat_10_Fahim_Muhhamed"]),
        ("Chat_2_Kevin_Elise,Chat_2", ["Chat_2_Kevin_Elise"]),
    ],
)
def test_conversations_are_chosen_by_count_or_name(spec: str, ids: list[str]) -> None:
    assert [c.id for c in core.select(CONVERSATIONS, spec)] == ids


@pytest.mark.parametrize(
    ("spec", "error"),
    [("Elise", "more than one conversation matches 'Elise'"),
     ("Chat_3", "no conversation matches 'Chat_3'"), ("0", "a count of at least 1")],
)  # fmt: skip
def test_a_name_must_mean_one_conversation(spec: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        core.select(CONVERSATIONS, spec)


def record(**fields: Any) -> dict[str, Any]:
    base = {"row": "gateway hybrid-recall @ 3000", "conversation": "c", "number": 0,
            "category": "temporal", "question": "When?", "gold": "May"}  # fmt: skip
    return base | fields


@pytest.mark.parametrize(
    ("state", "step"),
    [
        (None, "answer"),
        (record(answer=None, error="ConnectError: refused", final=False), "answer"),
        (record(answer=None, error="503: busy", final=False), "answer"),
        (record(answer=None, error="400: too long", final=True), "judge"),
        (record(answer="In May", error=None, final=False), "judge"),
        (record(answer="In May", verdict=None, judge_error="ReadTimeout"), "judge"),
        (record(answer="In May", verdict="CORRECT"), None),
        (record(answer="In May", verdict="WRONG", unparsed=True), None),
        (record(answer=None, error="400: too long", final=True, verdict="WRONG"), None),
    ],
)
def test_a_rerun_does_what_a_question_still_needs(
    state: dict[str, Any] | None, step: str | None
) -> None:
    assert core.next_step(state) == step


def test_the_out_file_keeps_each_questions_last_state_and_every_run() -> None:
    lines = [
        json.dumps({"run": {"model": "m", "commit": "abc"}}),
        json.dumps(record(answer="In May")),
        json.dumps(record(number=1, answer=None, error="refused", final=False)),
        json.dumps(record(answer="In May", verdict="CORRECT")),
        json.dumps({"summary": {"rows": []}}),
        json.dumps({"run": {"model": "m", "commit": "def"}}),
        '{"row": "gateway hybrid-recall @ 3000", "conversation": "c", "numb',  # killed mid-line
        "",
        "[1, 2]",
    ]
    runs, records = core.parse_out(lines)
    assert [r["commit"] for r in runs] == ["abc", "def"]
    assert set(records) == {("gateway hybrid-recall @ 3000", "c", 0),
                            ("gateway hybrid-recall @ 3000", "c", 1)}  # fmt: skip
    assert records[("gateway hybrid-recall @ 3000", "c", 0)]["verdict"] == "CORRECT"


def test_records_of_another_model_judge_preset_or_prompt_are_not_mixed_in() -> None:
    setup = {"model": "m", "judge_model": "j", "preset": "hybrid", "prompts": core.prompts_digest()}
    assert core.setup_conflict([], setup) is None
    assert core.setup_conflict([{**setup, "commit": "x"}], setup) is None
    conflict = core.setup_conflict([{**setup, "judge_model": "other"}], setup)
    assert conflict is not None
    assert "judge_model 'other' -> 'j'" in conflict
    assert "use another --out" in conflict
    # The last run is the one compared: an older, different one was already refused.
    assert core.setup_conflict([{**setup, "model": "old"}, setup], setup) is None


@pytest.mark.parametrize(
    ("status", "text", "refused"),
    [
        (400, "This model's maximum context length is 2048 tokens. However, you requested", True),
        (400, "Requested tokens (2400) exceed context window of 2048", True),
        (400, "the request exceeds the available context size", True),
        (400, '{"error": {"code": "context_length_exceeded"}}', True),
        (400, "unknown field: temperature", False),
        (500, "maximum context length", False),
        (None, "ConnectError", False),
    ],
)
def test_a_prompt_too_long_is_told_from_other_refusals(
    status: int | None, text: str, refused: bool
) -> None:
    assert core.context_refused(status, text) is refused


@pytest.mark.parametrize(
    ("models", "props", "window"),
    [
        ({"data": [{"id": "qwen", "max_model_len": 32768}]}, None, 32768),  # vLLM
        ({"data": [{"id": "other", "max_model_len": 4096}]}, None, None),
        ({"data": [{"id": "qwen"}]}, {"default_generation_settings": {"n_ctx": 8192}}, 8192),
        (None, {"n_ctx": 4096}, 4096),  # llama.cpp's /props, older
        ({"data": "nonsense"}, {"n_ctx": "big"}, None),
        (None, None, None),
    ],
)
def test_the_context_window_is_read_where_servers_tell_it(
    models: Any, props: Any, window: int | None
) -> None:
    assert core.context_from(models, props, "qwen") == window


def test_cost_is_the_models_usage_else_the_forwarded_tokens() -> None:
    billed = record(prompt_tokens=1000, completion_tokens=10, forwarded_tokens=900)
    assert core.cost(billed, 0.15, 0.60) == pytest.approx((1000 * 0.15 + 10 * 0.60) / 1e6)
    assert core.cost(record(forwarded_tokens=900), 0.15, 0.6) == pytest.approx(900 * 0.15 / 1e6)
    assert core.cost(record(), 0.15, 0.6) is None


def graded(row: str, category: str, verdict: str, tokens: int, **more: Any) -> dict[str, Any]:
    return record(row=row, category=category, answer="a", verdict=verdict,
                  forwarded_tokens=tokens, prompt_tokens=tokens, completion_tokens=0,
                  **more)  # fmt: skip


def test_j_is_the_share_judged_correct_per_category_and_overall() -> None:
    gw, full = "gateway hybrid-recall @ 3000", core.FULL_HISTORY
    records = [
        graded(gw, "temporal", "CORRECT", 1000),
        graded(gw, "temporal", "WRONG", 3000, unparsed=True),
        graded(gw, "multi-hop", "CORRECT", 2000),
        record(row=gw, category="multi-hop", answer="a"),  # not graded yet
        record(row=gw, category="commonsense", answer=None, final=True, verdict="WRONG"),
        graded(full, "temporal", "CORRECT", 20000, truncated=0),
        graded(full, "temporal", "CORRECT", 30000, truncated=12),
        graded("another row", "temporal", "CORRECT", 5),
    ]
    summary = {(s["row"], s["category"]): s for s in core.summarize(records, [gw, full], 1, 0)}
    assert len(summary) == 8  # two rows, three categories and all
    temporal = summary[(gw, "temporal")]
    assert (temporal["n"], temporal["correct"], temporal["j"]) == (2, 1, 0.5)
    assert temporal["unparsed"] == 1
    assert temporal["mean_forwarded_tokens"] == 2000
    assert temporal["mean_cost"] == pytest.approx(2000 / 1e6)
    everything = summary[(gw, core.ALL)]
    assert (everything["n"], everything["correct"], everything["pending"]) == (4, 2, 1)
    assert everything["no_answer"] == 1
    assert summary[(gw, "commonsense")]["mean_forwarded_tokens"] is None
    assert summary[(full, core.ALL)]["truncated"] == 1
    assert summary[(full, "multi-hop")]["j"] is None


def test_the_table_shows_j_and_says_when_the_baseline_was_cut() -> None:
    gw, full = "gateway hybrid-recall @ 3000", core.FULL_HISTORY
    records = [
        graded(gw, "temporal", "CORRECT", 1200),
        graded(gw, "temporal", "WRONG", 1300),
        graded(full, "temporal", "CORRECT", 2000, truncated=7),
        graded(full, "temporal", "CORRECT", 2000, truncated=0),
    ]
    summary = core.summarize(records, [gw, full], 0.15, 0.6)
    table = core.format_table(summary)
    assert "| gateway hybrid-recall @ 3000 | temporal | 50.0% | 2 | 0 | 0 | 0 | 1,250 |" in table
    assert "| gateway hybrid-recall @ 3000 | multi-hop | - | 0 |" in table
    assert "| full history (front-cut for 1 of 2) | all | 100.0% | 2 |" in table
    assert "$0.000300 |" in table  # 2,000 tokens at $0.15 per million
    note = core.truncation_note(summary, 2048)
    assert note.startswith("full history: the oldest messages dropped to fit the model's 2,048")
    assert "for 1 of 2 questions" in note


def test_an_uncut_baseline_says_so() -> None:
    summary = core.summarize([graded(core.FULL_HISTORY, "temporal", "WRONG", 9)],
                             [core.FULL_HISTORY], 0.15, 0.6)  # fmt: skip
    assert "| full history | temporal | 0.0% |" in core.format_table(summary)
    assert core.truncation_note(summary, None) == (
        "full history: sent whole for every question (none cut to the model's context)"
    )
    assert core.truncation_note(core.summarize([], ["gateway"], 0.15, 0.6), None) == ""


@pytest.mark.parametrize(
    ("status", "final"),
    [(400, True), (404, True), (422, True), (408, False), (429, False), (500, False),
     (503, False), (None, False)],
)  # fmt: skip
def test_only_a_refusal_of_the_request_itself_is_not_asked_again(
    status: int | None, final: bool
) -> None:
    reply = core.Reply(None, "refused", status)
    assert reply.final is final
    assert core.answer_fields(reply)["final"] is final
    assert core.Reply("Porto", None, 200).final is False


def test_an_answer_keeps_the_models_usage() -> None:
    usage = {"prompt_tokens": 812, "completion_tokens": 9, "total_tokens": 821}
    fields = core.answer_fields(core.Reply("Porto", None, 200, usage))
    assert fields == {"answer": "Porto", "error": None, "final": False,
                      "prompt_tokens": 812, "completion_tokens": 9}  # fmt: skip
