"""Content parts chat completions do not take are forwarded as text (pure)."""

from __future__ import annotations

from gateway.dialects.chat.parts import chat_shaped

IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/shot.png"}}


def test_parts_chat_takes_are_left_alone() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "see"}, IMAGE]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
        {"role": "tool", "tool_call_id": "c1", "content": "plain"},
        {"role": "system", "content": "memory"},
    ]
    assert chat_shaped(messages) == messages


def test_parts_of_the_responses_api_become_text() -> None:
    by_file = {"type": "input_image", "file_id": "file-abc"}
    shaped = chat_shaped(
        [
            {"role": "user", "content": [{"type": "text", "text": "see"}, by_file]},
            {"role": "tool", "tool_call_id": "c9", "content": [IMAGE]},  # a function's image
            {"role": "assistant", "content": [{"type": "output_audio"}]},
        ]
    )
    assert shaped[0]["content"] == [
        {"type": "text", "text": "see"},
        {"type": "text", "text": "[input_image file-abc]"},
    ]
    assert shaped[1] == {
        "role": "tool",
        "tool_call_id": "c9",
        "content": [{"type": "text", "text": "[image https://example.com/shot.png]"}],
    }
    assert shaped[2]["content"] == [{"type": "text", "text": "[output_audio]"}]
