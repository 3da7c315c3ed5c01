"""Reading an export file for ``memory-gateway import --from``: its array walked one
conversation at a time, and a bad file named by its line or its conversation (no gateway)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.commands.import_exports import read_export_file
from gateway.commands.transcript import MalformedFile

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "exports"


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "conversations.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("fmt", ["chatgpt", "claude"])
def test_the_fixtures_read_whole_compact_or_indented(fmt: str, tmp_path: Path) -> None:
    source = FIXTURES / f"{fmt}-conversations.json"
    indented = read_export_file(source, fmt)
    compact = json.dumps(json.loads(source.read_text()), separators=(",", ":"))
    path = write(tmp_path, "\ufeff" + compact + "\n")  # a byte order mark is fine
    assert read_export_file(path, fmt).conversations == indented.conversations
    assert [c.number for c in indented.conversations] == [1, 2, 3]
    assert read_export_file(write(tmp_path, " [ ] "), fmt).conversations == ()


def refusal(tmp_path: Path, text: str | bytes, fmt: str = "claude") -> str:
    path = write(tmp_path, text)
    with pytest.raises(MalformedFile) as raised:
        read_export_file(path, fmt)
    return str(raised.value).replace(str(path), "FILE")


def test_bad_json_is_named_by_its_line_and_conversation(tmp_path: Path) -> None:
    good = json.dumps(json.loads((FIXTURES / "claude-conversations.json").read_text())[0])
    assert refusal(tmp_path, f'[\n{good},\n{{"uuid": }}]') == (
        "FILE:3: not valid JSON: Expecting value (column 10, in conversation 2)"
    )
    assert refusal(tmp_path, f"[{good} {good}]").startswith(
        "FILE:1: not valid JSON: expected ',' or ']'"
    )
    assert "extra data after the array" in refusal(tmp_path, f"[{good}] []")
    assert "NaN is not valid JSON" in refusal(tmp_path, '[{"x": NaN}]')
    assert refusal(tmp_path, b'[{"name": "\xff"}]') == "FILE:1: not UTF-8 text"


def test_not_an_export_is_said_so(tmp_path: Path) -> None:
    assert refusal(tmp_path, '{"messages": []}') == (
        "FILE: expected the array of conversations of an export, found an object"
    )
    assert refusal(tmp_path, "  ").endswith("found an empty file")
    chatgpt = (FIXTURES / "chatgpt-conversations.json").read_text()
    assert refusal(tmp_path, chatgpt, "claude") == (
        'FILE: conversation 1: "chat_messages" must be an array, not null: '
        "is this a ChatGPT export?"
    )
