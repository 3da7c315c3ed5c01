"""Reading ChatGPT's and Claude's data exports into conversations to import (no gateway):
the branch the user kept, what is dropped, the times, and the errors that name the
conversation at fault."""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.dialects.exports import Conversation, ExportError, read_conversation, read_export

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "exports"


def fixture(fmt: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads((FIXTURES / f"{fmt}-conversations.json").read_text())
    return data


def read(fmt: str, data: Any) -> list[Conversation]:
    return list(read_export(fmt, data))


def utc(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp()


def said(conversation: Conversation) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in conversation.messages]


# --- ChatGPT ---------------------------------------------------------------------------


def test_chatgpt_keeps_the_branch_to_the_current_node_and_drops_the_rest() -> None:
    lisbon, sourdough, empty = read("chatgpt", fixture("chatgpt"))
    assert lisbon.session_id == "chatgpt-0c6f3a52-1b7e-4d0a-9a11-5f2e8c3d4a01"
    assert lisbon.title == "Lisbon trip planning"
    assert said(lisbon) == [
        ("user", "I'm flying to Lisbon on the 14th of May. My seat on the flight is 14C, "
                 "by the window."),
        ("assistant", "Noted: Lisbon on 14 May, seat 14C by the window. Anything else to plan?"),
        # The edited question, not the one first asked (nor its answer).
        ("user", "Which neighbourhood is quiet at night but close to the trams?"),
        ("assistant", "Campo de Ourique: quiet streets at night, and the 28 tram starts there."),
    ]  # fmt: skip
    assert lisbon.dropped == 1  # the hidden system message
    # An image part is a placeholder; the tool call and its result are dropped; of the
    # two answers, the regenerated one the user kept.
    assert said(sourdough)[0] == (
        "user",
        "[image]\nThis is my rye starter on day 4. Its name is Bubbles. Is it ready to bake with?",
    )
    assert said(sourdough)[1][1].startswith("Not yet: wait until Bubbles doubles")
    assert "It looks ready." not in str(said(sourdough))
    assert sourdough.dropped == 2
    assert empty.messages == () and empty.dropped == 1


def test_chatgpt_times_are_each_message_s_else_the_conversation_s() -> None:
    data = fixture("chatgpt")
    lisbon = read("chatgpt", data)[0]
    assert [m["timestamp"] for m in lisbon.messages] == [
        utc("2024-05-02T09:15:00"), utc("2024-05-02T09:15:20"),
        utc("2024-05-03T18:39:00"), utc("2024-05-03T18:40:00"),
    ]  # fmt: skip
    data[0]["mapping"]["aaa3-u"]["message"]["create_time"] = None
    data[0]["mapping"]["aaa4-a"]["message"]["create_time"] = "yesterday"
    lisbon = read("chatgpt", data)[0]
    assert [m["timestamp"] for m in lisbon.messages[:2]] == [utc("2024-05-02T09:14:00")] * 2
    del data[0]["create_time"]
    assert "timestamp" not in read("chatgpt", data)[0].messages[0]  # the time of the import


def test_chatgpt_without_a_current_node_follows_the_newest_children() -> None:
    data = fixture("chatgpt")
    data[0]["current_node"] = None
    assert said(read("chatgpt", data)[0])[2][1].startswith("Which neighbourhood is quiet")


def test_an_assistant_message_to_a_tool_and_reasoning_are_dropped() -> None:
    data = fixture("chatgpt")
    answer = data[0]["mapping"]["aaa6-a-new"]["message"]
    answer["content"] = {"content_type": "thoughts", "thoughts": [{"content": "hmm"}]}
    assert len(read("chatgpt", data)[0].messages) == 3
    answer["content"] = {"content_type": "text", "parts": ["print(1)"]}
    answer["recipient"] = "python"
    assert len(read("chatgpt", data)[0].messages) == 3


def chatgpt_error(change: Any) -> str:
    data = fixture("chatgpt")
    change(data[1])
    with pytest.raises(ExportError) as raised:
        read("chatgpt", data)
    return str(raised.value)


def test_chatgpt_errors_name_the_conversation() -> None:
    sid = "7d2b9e40-58c1-4f3e-b0d2-2a9c6e1f7b02"

    def orphan(c: dict[str, Any]) -> None:
        c["mapping"]["bbb6-u"]["parent"] = "gone"

    assert chatgpt_error(orphan) == f"conversation 2 ({sid}): node 'gone' is not in its \"mapping\""

    def cycle(c: dict[str, Any]) -> None:
        c["mapping"]["bbb1-root"]["parent"] = "bbb7-a"

    assert chatgpt_error(cycle) == f"conversation 2 ({sid}): its nodes' parents make a cycle"

    def no_id(c: dict[str, Any]) -> None:
        del c["id"], c["conversation_id"]

    assert "conversation 2: it has no id" in chatgpt_error(no_id)

    def slash(c: dict[str, Any]) -> None:
        c["id"] = c["conversation_id"] = "a/b"

    assert chatgpt_error(slash) == "conversation 2 (a/b): its session id must not contain '/'"

    def claude_like(c: dict[str, Any]) -> None:
        del c["mapping"]
        c["chat_messages"] = []

    assert chatgpt_error(claude_like).endswith(
        '"mapping" must be an object, not null: is this a Claude export?'
    )

    def surrogate(c: dict[str, Any]) -> None:
        c["mapping"]["bbb6-u"]["message"]["content"]["parts"] = ["\ud800"]

    assert "message 3 is not valid Unicode" in chatgpt_error(surrogate)


def test_not_an_array_of_conversation_objects() -> None:
    with pytest.raises(ExportError, match=r"^expected an array of conversations, found an object"):
        read("chatgpt", {"conversations": []})
    with pytest.raises(ExportError, match=r"^conversation 2: expected a conversation object"):
        read("claude", [fixture("claude")[0], "x"])


# --- Claude ----------------------------------------------------------------------------


def test_claude_keeps_human_and_assistant_text_with_their_times() -> None:
    garden, bike, untitled = read("claude", fixture("claude"))
    assert garden.session_id == "claude-3f9a1c2e-6b4d-4e8f-a0b1-c2d3e4f5a601"
    assert garden.title == "Tomato beds"
    assert [m["role"] for m in garden.messages] == ["user", "assistant"] * 2
    # The text blocks, not the thinking ones.
    assert garden.messages[3]["content"] == (
        "Probably early blight: remove the spotted leaves and mulch the soil."
    )
    assert [m["timestamp"] for m in garden.messages] == [
        utc("2024-06-03T17:02:12"), utc("2024-06-03T17:02:30.512"),
        utc("2024-06-05T07:45:00"), utc("2024-06-05T07:45:30.118842"),
    ]  # fmt: skip
    # An attached file by its name (once, though listed twice); an empty message dropped.
    assert bike.messages[0]["content"].endswith("Receipt attached.\n[attachment: receipt.txt]")
    assert len(bike.messages) == 2 and bike.dropped == 1
    assert untitled.messages == () and untitled.title == ""


def test_claude_text_field_when_there_are_no_content_blocks() -> None:
    data = fixture("claude")
    del data[0]["chat_messages"][0]["content"]
    assert read("claude", data)[0].messages[0]["content"].startswith("I planted three")


def test_claude_errors_name_the_conversation() -> None:
    data = fixture("claude")
    bad = copy.deepcopy(data)
    bad[1]["chat_messages"][1]["created_at"] = "10/06/2024"
    sid = "8c7b6a59-4d3e-4f21-9a8b-7c6d5e4f3a02"
    with pytest.raises(ExportError) as raised:
        read("claude", bad)
    assert str(raised.value) == (
        f"conversation 2 ({sid}): '10/06/2024' is not an ISO 8601 date and time"
    )
    with pytest.raises(ExportError, match="is this a ChatGPT export"):
        read("claude", fixture("chatgpt"))
    with pytest.raises(ExportError, match="conversation 1: it has no id"):
        read_conversation("claude", 1, {"chat_messages": []})
