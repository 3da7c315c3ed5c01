"""bench/recall.py --workdir: an import is kept for the next run only while the run would
import the same: the same conversations, their messages, batches, times, names and summarizer
(the end-to-end run: tests/system/test_bench_recall_workdir.py)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from bench import realtalk, recall
from tests.support.tiny_realtalk import write_dataset

CHAT = "Chat_1_Ann_Bob.json"


def test_an_import_is_asked_again_only_of_the_same_conversations_imported_alike(
    tmp_path: Path,
) -> None:
    conversation = realtalk.load_conversation(write_dataset(tmp_path / "data") / CHAT)
    asked = {
        "no_timestamps": False, "no_names": False, "batch": 500, "summarizer_url": None,
        "summarizer_model": "summarizer",
    }  # fmt: skip
    args = argparse.Namespace(**asked)
    same = recall.what_is_imported([conversation], args)

    assert recall.what_is_imported([conversation], args) == same
    changes = [
        {"no_timestamps": True},
        {"no_names": True},
        {"batch": 40},
        {"summarizer_url": "http://127.0.0.1:9/v1"},
        {"summarizer_model": "m"},
    ]
    for changed in changes:
        other = argparse.Namespace(**{**asked, **changed})
        assert recall.what_is_imported([conversation], other) != same, changed
    message = conversation.messages[0]
    edited = dataclasses.replace(
        conversation,
        messages=(dataclasses.replace(message, text=message.text + "!"),
                  *conversation.messages[1:]),
    )  # fmt: skip
    assert recall.what_is_imported([edited], args) != same
