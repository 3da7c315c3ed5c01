"""A tiny conversation in REALTALK's format (bench/realtalk.py reads it): two people, two
days, eight messages, three questions, for the tests of bench/answers.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONVERSATION = {
    "name": {"speaker_1": "Ann", "speaker_2": "Bob"},
    "session_1": [
        ("Ann", "Hi Bob! I finally adopted a cat, her name is Pixel.", "13.01.2024, 09:00:00"),
        ("Bob", "Congrats! I spent the afternoon practising the cello.", "13.01.2024, 09:05:00"),
        ("Ann", "Nice. How long have you played it?", "13.01.2024, 09:06:00"),
        ("Bob", "Since school, about ten years now.", "13.01.2024, 09:10:00"),
    ],
    "session_2": [
        ("Ann", "I moved into my new flat in Porto this week.", "20.01.2024, 18:00:00"),
        ("Bob", "Exciting, send me photos of it!", "20.01.2024, 18:02:00"),
        ("Ann", "The cat loves the balcony already.", "20.01.2024, 18:03:00"),
        ("Bob", "Of course she does.", "20.01.2024, 18:04:00"),
    ],
    # (question, gold answer, category): the third answer is said nowhere.
    "qa": [
        ("What is the name of Ann's cat?", "Pixel", 1),
        ("Which instrument does Bob play?", "cello", 3),
        ("How many times has Ann moved this year?", "twice", 2),
    ],
}  # fmt: skip
# What a judge that looks for the gold answer says of an answer quoting the whole chat.
VERDICTS = ["CORRECT", "CORRECT", "WRONG"]


def write_dataset(directory: Path) -> Path:
    """The conversation as ``directory/Chat_1_Ann_Bob.json`` (``--data directory``)."""
    data: dict[str, Any] = {"name": CONVERSATION["name"]}
    for session in ("session_1", "session_2"):
        number = session.split("_")[1]
        data[session] = [
            {"speaker": who, "clean_text": text, "date_time": when, "dia_id": f"D{number}:{i}"}
            for i, (who, text, when) in enumerate(CONVERSATION[session], 1)
        ]
    data["qa"] = [
        {"question": q, "answer": a, "category": c, "evidence": ["D1:1"]}
        for q, a, c in CONVERSATION["qa"]
    ]
    directory.mkdir()
    (directory / "Chat_1_Ann_Bob.json").write_text(json.dumps(data))
    return directory
