"""Images of messages: taken in as references, fitted into the body's room, sent back."""

from __future__ import annotations

import base64
import hashlib
import io
from typing import Any

import pytest
from PIL import Image

from gateway.memory import images as media
from gateway.memory.image_refs import (
    MediaRejected,
    Ref,
    data_url_chars,
    fit,
    hydrate,
    ingest,
    named,
    references,
)
from gateway.memory.model import Message


def png(width: int, shade: int = 0) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, width), (shade, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def data_url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def image(url: str, detail: str | None = None) -> dict[str, Any]:
    inner: dict[str, Any] = {"url": url}
    if detail:
        inner["detail"] = detail
    return {"type": "image_url", "image_url": inner}


def asking(raw: bytes, text: str = "what is this?") -> Message:
    return Message("user", [{"type": "text", "text": text}, image(data_url(raw), "low")])


def test_ingest_turns_data_urls_into_references_once_each() -> None:
    red, blue = png(64, 200), png(32, 10)
    messages = (
        Message("system", "be brief"),
        asking(red),
        Message("assistant", "a red square"),
        asking(red, "and again?"),
        Message("user", [image("https://example.com/x.png"), image(data_url(blue))]),
    )
    assert data_url_chars(messages) == 2 * len(data_url(red)) + len(data_url(blue))
    out, blobs = ingest(messages)
    assert set(blobs) == {hashlib.sha256(red).hexdigest(), hashlib.sha256(blue).hexdigest()}
    assert blobs[hashlib.sha256(red).hexdigest()].data == red
    assert out[0] is messages[0] and out[2] is messages[2]  # untouched: same objects
    ref = out[1].content[1]
    assert ref["image_url"] == {
        "url": media.REF_PREFIX + hashlib.sha256(red).hexdigest(),
        "detail": "low",
    }
    assert ref["media"]["tokens"] == 85
    assert out[4].content[0] == image("https://example.com/x.png")  # never fetched
    parts = [p for m in out if isinstance(m.content, list) for p in m.content]
    assert not any(media.is_data_url(media.image_url(p)) for p in parts if media.is_image(p))
    # The same image resent is the same text: a resent history lines up with the stored.
    again, _ = ingest((asking(red),))
    assert again[0].same_turn_as(out[1])
    assert not again[0].same_turn_as(ingest((asking(png(64, 201)),))[0][0])
    assert named(out) == frozenset(blobs)


def test_ingest_names_the_bad_part() -> None:
    messages = (
        Message("user", "hi"),
        Message("user", [{"type": "text", "text": "x"}, image("data:image/png;base64,AAAA")]),
    )
    with pytest.raises(MediaRejected) as raised:
        ingest(messages)
    assert raised.value.param == "messages.1.content.1.image_url.url"


def ref(message: int, size: int, part: int = 0) -> Ref:
    return Ref(message, part, f"h{message}.{part}", "image/png", size)


@pytest.mark.parametrize(
    ("sizes", "room", "protected_from", "sent", "fits"),
    [
        ([10, 10, 10], 30, 2, {0, 1, 2}, True),  # all fit
        ([10, 10, 10], 29, 2, {1, 2}, True),  # the oldest gives way
        ([10, 10, 10], 10, 2, {2}, True),  # all but this turn's
        ([10, 10, 10], 5, 2, set(), False),  # not even this turn's own
        ([10, 30, 10], 25, 2, {2}, True),  # one by one, oldest first: 0, then 1
        ([], 0, 0, set(), True),
    ],
)
def test_fit(sizes: list[int], room: int, protected_from: int, sent: set[int], fits: bool) -> None:
    refs = [ref(i, size) for i, size in enumerate(sizes)]
    fitted = fit(refs, room, protected_from)
    assert fitted.sent == {(i, 0) for i in sent}
    assert fitted.fits is fits


def test_hydrate_sends_bytes_or_placeholders() -> None:
    old, new = png(20, 1), png(20, 2)
    taken, _ = ingest((asking(old), Message("assistant", "ok"), asking(new)))
    counted = tuple(m.but(tokens=100 + i) for i, m in enumerate(taken))
    refs = references(counted)
    assert [(r.message, r.part) for r in refs] == [(0, 1), (2, 1)]
    urls = {r.sha256: data_url(raw) for r, raw in zip(refs, (old, new), strict=True)}
    sent = hydrate(counted, frozenset({(2, 1)}), urls)
    assert sent[1] is counted[1]
    assert sent[2].content[1] == image(data_url(new), "low")
    placeholder = sent[0].content[1]
    assert placeholder["type"] == "text" and placeholder["text"].startswith("[image 20x20")
    assert [m.tokens for m in sent] == [100, 101, 102]  # as planned
    # Sent, but its bytes are not at hand (dropped, expired): a placeholder too.
    missing = hydrate(counted, frozenset({(0, 1), (2, 1)}), {refs[1].sha256: "data:x"})
    assert missing[0].content[1]["type"] == "text"
    assert "media" not in str(sent[2].to_openai())


def test_a_reference_a_client_sends_is_only_a_placeholder() -> None:
    stored, _ = ingest((asking(png(16, 3)),))
    forged = dict(stored[0].content[1])
    forged["media"] = {**forged["media"], "tokens": "lots"}
    again, blobs = ingest(
        (Message("user", [stored[0].content[1], forged, image(media.REF_PREFIX + "x")]),)
    )
    assert not blobs
    texts = [part["text"] for part in again[0].content]
    assert texts[0].startswith("[image 16x16, sha256 ")
    assert texts[1:] == ["[image]", "[image]"]  # not a reference as the gateway makes them
    assert references(again) == []


def test_one_data_url_sent_many_times_is_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "data:image/png;base64," + base64.b64encode(png(8)).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}} for _ in range(50)]
    decoded: list[str] = []
    real = media.decode

    def counting(data_url: str) -> media.Decoded:
        decoded.append(data_url)
        return real(data_url)

    monkeypatch.setattr(media, "decode", counting)
    out, blobs = ingest((Message(role="user", content=parts),))
    assert len(decoded) == 1 and len(blobs) == 1
    content = out[0].content
    assert isinstance(content, list) and len(content) == 50
    assert all(media.is_reference_url(part) for part in content)


def test_recall_matches_a_stored_image_by_the_word_not_its_size_and_hash() -> None:
    from gateway.memory.archive import index_messages

    message = Message("user", [{"type": "text", "text": "my cat"}, image(data_url(png(16)))])
    stored, _ = ingest((message,))
    assert "sha256" in stored[0].text  # what is shown of it (recalled lines, summaries)
    assert stored[0].recall_text == "my cat\n[image]"
    (indexed,) = index_messages(stored)
    assert {"cat", "imag"} <= set(indexed.terms) <= {"my", "cat", "imag"}  # no "16x16", no hex


def test_images_alike_in_length_and_tail_are_each_taken_in() -> None:
    # (found by length and tail, told apart by the whole URL)
    first = data_url(png(16))
    at = len(first) - 60  # a character of the pixel data, past the header
    second = first[:at] + ("A" if first[at] != "A" else "B") + first[at + 1 :]
    assert len(first) == len(second) and first[-32:] == second[-32:]
    message = Message("user", [image(first), image(second), image(first)])
    stored, blobs = ingest((message,))
    refs = [part["image_url"]["url"] for part in stored[0].content]
    assert refs[0] == refs[2] != refs[1]
    assert {blob.url for blob in blobs.values()} == {first, second}
