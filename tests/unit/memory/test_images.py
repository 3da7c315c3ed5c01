"""Image parts: the OpenAI API's token formula, decoding, references, placeholders."""

from __future__ import annotations

import base64
import hashlib
import io
import tracemalloc
import zlib

import pytest
from PIL import Image

from bench.abuse_clients import text_bomb_png
from gateway.memory import images as media
from gateway.memory.model import Message, content_text
from gateway.text.tokens import TOKENS_PER_MESSAGE, TokenCounter


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (0, 90, 200)).save(out, format="JPEG")
    return out.getvalue()


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def part(url: str, detail: str | None = None) -> dict[str, object]:
    inner: dict[str, object] = {"url": url}
    if detail is not None:
        inner["detail"] = detail
    return {"type": "image_url", "image_url": inner}


# (width, height, detail, tokens): OpenAI's published examples and the edges around them.
FORMULA = [
    (1024, 1024, "high", 765),  # short side to 768: 2x2 tiles
    (1024, 1024, "auto", 765),  # auto is counted as high
    (1024, 1024, None, 765),  # no detail: auto
    (2048, 4096, "high", 1105),  # fit 2048 (1024x2048), short side 768 (768x1536): 2x3
    (4096, 8192, "low", 85),  # low: 85 whatever the size
    (512, 512, "high", 255),  # one tile
    (100, 100, "high", 255),  # never scaled up
    (513, 512, "high", 425),  # two tiles
    (768, 768, "high", 765),
    (769, 769, "high", 765),  # scaled down to 768: still 2x2
    (1920, 1080, "high", 1105),  # 1365x768: 3x2 tiles
    (10000, 100, "high", 765),  # fit 2048: 2048x20: 4x1 tiles
    (1, 1, "high", 255),
]


@pytest.mark.parametrize(("width", "height", "detail", "tokens"), FORMULA)
def test_image_tokens(width: int, height: int, detail: str | None, tokens: int) -> None:
    assert media.image_tokens(width, height, detail) == tokens


def test_decode_reads_size_type_and_hash() -> None:
    raw = png(300, 200)
    decoded = media.decode(data_url(raw))
    assert (decoded.width, decoded.height) == (300, 200)
    assert decoded.blob == media.Blob(hashlib.sha256(raw).hexdigest(), "image/png", raw)
    # The type is the image's own, whatever the URL declared.
    assert media.decode(data_url(jpeg(40, 30), "image/png")).blob.mime == "image/jpeg"


@pytest.mark.parametrize(
    "url",
    [
        "data:image/png;base64,@@@@",  # not base64
        "data:image/png;base64,aGVsbG8gd29ybGQ=",  # base64, not an image
        "data:image/png,raw",  # not base64-encoded
        "data:;base64,",  # nothing at all
        data_url(b"GIF89a" + b"\x00" * 4),  # a truncated header
    ],
)
def test_decode_refuses_what_is_not_an_image(url: str) -> None:
    with pytest.raises(media.MediaError):
        media.decode(url)


def test_a_reference_keeps_detail_size_and_tokens() -> None:
    raw = png(2048, 4096)
    decoded = media.decode(data_url(raw))
    ref = media.to_reference(part(data_url(raw), "high"), decoded)
    sha = hashlib.sha256(raw).hexdigest()
    assert ref["image_url"] == {"url": media.REF_PREFIX + sha, "detail": "high"}
    assert ref["media"]["tokens"] == 1105
    assert media.reference(ref) == ref["media"]
    assert media.part_tokens(ref) == 1105
    assert media.placeholder(ref) == f"[image 2048x4096, sha256 {sha[:8]}…]"
    assert media.forwarded(ref, "data:x") == {
        "type": "image_url",
        "image_url": {"url": "data:x", "detail": "high"},
    }
    # What it takes in a body once sent: about its base64.
    assert abs(media.sent_size(ref["media"]) - len(data_url(raw))) < 100


def test_part_tokens_of_the_other_forms() -> None:
    # A data URL not taken in yet: its size from its first bytes.
    assert media.part_tokens(part(data_url(png(512, 512)))) == 255
    assert media.part_tokens(part(data_url(png(512, 512)), "low")) == 85
    # A URL is never fetched: counted as URL_IMAGE_SIZE.
    assert media.part_tokens(part("https://example.com/a.png")) == 765
    assert media.part_tokens(part("https://example.com/a.png", "low")) == 85
    # Data that tells nothing: the same default, not an error (refused when ingested).
    assert media.part_tokens(part("data:image/png;base64,@@")) == 765


def test_placeholders_never_hold_the_bytes() -> None:
    url = data_url(png(10, 10))
    assert media.placeholder(part(url)) == "[image]"
    assert media.placeholder(part("https://example.com/cat.png")) == (
        "[image https://example.com/cat.png]"
    )
    content = [{"type": "text", "text": "look"}, part(url)]
    assert content_text(content) == "look\n[image]"


def test_a_message_counts_its_images_not_their_text() -> None:
    counter = TokenCounter()
    raw = png(1024, 1024)
    ref = media.to_reference(part(data_url(raw)), media.decode(data_url(raw)))
    message = Message("user", [{"type": "text", "text": "what is this?"}, ref, ref])
    expected = TOKENS_PER_MESSAGE + counter.count_text("what is this?") + 2 * 765
    assert counter.count_message(message) == expected
    url_only = Message("user", [part("https://example.com/a.png", "low")])
    assert counter.count_message(url_only) == TOKENS_PER_MESSAGE + 85


def test_one_image_is_capped_apart_from_the_text() -> None:
    import json

    from gateway.dialects.chat.request import Limits, parse_chat_request
    from gateway.errors import PayloadTooLarge

    raw = png(200, 200)
    body = json.dumps(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}, part(data_url(raw))]}
            ],
        }
    ).encode()
    # The image's bytes are not text: a message cap smaller than the image is no matter.
    parse_chat_request(body, Limits(max_message_bytes=100, max_media_bytes=len(raw)))
    with pytest.raises(PayloadTooLarge) as raised:
        parse_chat_request(body, Limits(max_media_bytes=len(raw) - 10))
    assert raised.value.param == "messages.0.content.1.image_url.url"


def test_reading_an_images_size_inflates_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = text_bomb_png()
    assert len(raw) < 32 * 1024  # small enough to be read on the event loop
    inflations: list[str] = []
    real_obj, real_decompress = zlib.decompressobj, zlib.decompress

    def spy_obj(*args: object, **kwargs: object) -> object:
        inflations.append("decompressobj")
        return real_obj(*args, **kwargs)  # type: ignore[arg-type]

    def spy(*args: object, **kwargs: object) -> bytes:
        inflations.append("decompress")
        return real_decompress(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(zlib, "decompressobj", spy_obj)
    monkeypatch.setattr(zlib, "decompress", spy)
    tracemalloc.start()
    try:
        decoded = media.decode(data_url(raw))
        tokens = media.part_tokens(part(data_url(raw)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (decoded.width, decoded.height) == (1, 1)
    assert tokens == media.image_tokens(1, 1, None)
    assert inflations == []
    assert peak < 1 << 20  # the image's own bytes, a few times: not its inflated text


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 8, "not a PNG, JPEG, WEBP or GIF"),  # no IHDR
        (b"BM" + b"\x00" * 60, "not a PNG, JPEG, WEBP or GIF"),  # a BMP: not taken
        (b"<svg width='10' height='10'/>", "not a PNG, JPEG, WEBP or GIF"),
        (b"GIF89a\x00\x00\x05\x00" + b"\x00" * 8, "no pixels"),
    ],
)
def test_only_the_four_formats_by_their_headers(raw: bytes, error: str) -> None:
    with pytest.raises(media.MediaError, match=error):
        media.decode(data_url(raw))


def test_a_lossy_webps_size_is_its_fourteen_bits() -> None:
    image = Image.new("RGB", (300, 200))
    out = io.BytesIO()
    image.save(out, format="WEBP", lossless=False)
    decoded = media.decode(data_url(out.getvalue(), "image/webp"))
    assert (decoded.width, decoded.height, decoded.blob.mime) == (300, 200, "image/webp")


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 4000])
@pytest.mark.parametrize("after", ["", "  \n"])
def test_the_size_a_data_url_decodes_to_is_told_without_decoding(size: int, after: str) -> None:
    url = "data:image/png;base64," + base64.b64encode(bytes(size)).decode() + after
    assert media.encoded_size(url) == size
    assert media.encoded_size("data:image/png;base64") == 0  # (no data at all)
