"""Reading import files: which format, which line each message starts on (no gateway)."""

from __future__ import annotations

import json

import pytest

from gateway.commands.transcript import MalformedFile, parse_transcript

USER = '{"role": "user", "content": "hi"}'
ASSISTANT = '{"role": "assistant", "content": "hello"}'

FORMATS = [
    # (text, format, the line of each message)
    (f"{USER}\n{ASSISTANT}\n", "jsonl", [1, 2]),
    (f"\n\n{USER}\n   \n{ASSISTANT}", "jsonl", [3, 5]),
    (f"{USER}\r\n{ASSISTANT}\r\n", "jsonl", [1, 2]),
    (USER, "jsonl", [1]),  # one message on one line
    (f'{{"model": "m", "messages": [{USER}, {ASSISTANT}]}}', "document", [1, 1]),
    (f"[{USER},\n{ASSISTANT}]", "document", [1, 2]),
    (json.dumps({"messages": [json.loads(USER), json.loads(ASSISTANT)]}, indent=2), "document",
     [3, 7]),
    # A later "messages" wins, as in any JSON parser; other keys are skipped whole.
    ('{"messages": [],\n "x": {"messages": [1]},\n "messages": [\n' + USER + "]}", "document",
     [4]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "kind", "lines"), FORMATS)
def test_format_and_lines(text: str, kind: str, lines: list[int]) -> None:
    found_kind, entries = parse_transcript(text, "f")
    assert found_kind == kind
    assert [entry.line for entry in entries] == lines


def test_a_broken_first_line_of_jsonl_is_named() -> None:
    # Still JSONL, not a broken document: its second line is a whole object.
    with pytest.raises(MalformedFile, match=r"^f:1: not valid JSON"):
        parse_transcript('{"role": "user", "content": "hi"\n' + ASSISTANT, "f")


def test_the_export_index_is_dropped_and_unknown_fields_kept() -> None:
    _, entries = parse_transcript('[{"index": 7, "role": "user", "content": "x", "k": 1}]', "f")
    assert entries[0].message == {"role": "user", "content": "x", "k": 1}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[1, 2]", "f:1: expected a message object, found a number"),
        (f"[{USER},]", "f:1: not valid JSON: Expecting value (column 36)"),
        (f"[{USER}] x", "f:1: not valid JSON: extra data after the document (column 37)"),
        (f"[{USER}", "f:1: not valid JSON: expected ',' or ']' after a message, found the end"),
        ('{"messages": [], "model"}', "f:1: not valid JSON: expected ':' after a property name"),
        ('[{"role": "tool", "content": "x", "tool_call_id": 5}]', "f:1: tool_call_id: Input"),
        ('[{"role": "user", "content": "\\ud800"}]', "f:1: a string is not valid Unicode"),
        (f'{USER}\n{{"role": "user", "content": Infinity}}', "f:2: not valid JSON: Infinity"),
    ],
)
def test_problems_are_named_by_line(text: str, problem: str) -> None:
    with pytest.raises(MalformedFile) as raised:
        parse_transcript(text, "f")
    assert str(raised.value).startswith(problem), str(raised.value)


@pytest.mark.parametrize("document", [False, True])
def test_a_message_nested_past_the_stack_is_named_not_a_crash(document: bool) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    line = f'{{"role": "user", "content": {deep}}}'
    text = f"[{line}]" if document else line
    with pytest.raises(MalformedFile) as raised:
        parse_transcript(text, "chat.json")
    assert "nested too deeply" in str(raised.value) and raised.value.line == 1
