"""Images in messages: their cost in tokens, their stored form, their placeholder (pure).

An image part (``{"type": "image_url", "image_url": {"url": ..., "detail": ...}}``)
reaches memory in one of three forms:

- a data URL (``data:image/png;base64,...``): the bytes themselves, as a client sends
  them. On its way into memory it becomes a reference (``ingest`` in
  ``memory/image_refs.py``): its bytes are kept apart, once per session, by their SHA-256;
- a reference: the same part with ``memory-gateway:media/<sha256>`` as its URL and a
  ``media`` object (hash, type, size in bytes and pixels, tokens). Never sent as it is:
  the service puts the bytes back (a data URL) while its message is in the window, and
  a placeholder text otherwise;
- any other URL (http/https): forwarded as it is, never fetched (no download, no
  request the gateway would make on a client's behalf), and counted as an image of
  ``URL_IMAGE_SIZE``.

Notes: the token cost is the OpenAI API's: ``low`` detail 85; ``high`` and ``auto``: the
image scaled to fit 2048x2048, then its shortest side down to 768, and 170 per 512-px
tile plus 85. ``auto`` is counted as ``high`` (the larger, so a budget is never
overrun). The dimensions come from the image's header, read by ``imagesize`` (PNG's IHDR,
GIF's screen descriptor, WEBP's first chunk, JPEG's frame marker): nothing is inflated or
decoded, so a small image cannot cost much (Pillow inflated a PNG's every text chunk).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import ipaddress
import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import imagesize

REF_PREFIX = "memory-gateway:media/"
LOW_DETAIL_TOKENS = 85
TILE_TOKENS = 170
TILE_PX = 512
FIT_PX = 2048
SHORT_SIDE_PX = 768
# What an image behind a URL is counted as: the gateway never fetches it. A square
# 1024x1024 at high detail: 765 tokens.
URL_IMAGE_SIZE = (1024, 1024)
# The formats the OpenAI API takes, by their first bytes: no other is parsed.
_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
# Pillow's limit for a decompression bomb (twice its warning's): an image this large is
# refused, as it was before.
MAX_PIXELS = 2 * 89_478_485
# Of a data URL not taken in yet (counted where it was never ingested): the base64
# characters decoded to find its size (a JPEG's size may come after its EXIF block).
_HEAD_CHARS = 64 * 1024


_HASH = re.compile(r"[0-9a-f]{64}")


class MediaError(ValueError):
    """An image part whose data is not a usable image (not base64, not an image)."""


@dataclass(frozen=True, slots=True)
class Blob:
    """An image's bytes, named by their SHA-256 (hex)."""

    sha256: str
    mime: str
    data: bytes
    # The data URL it came in, when it came in one: sent again as it is, not re-encoded.
    url: str = field(default="", compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Decoded:
    """A data-URL image taken apart: its bytes and what its header says."""

    blob: Blob
    width: int
    height: int


def image_tokens(width: int, height: int, detail: str | None) -> int:
    """The tokens the OpenAI API bills for an image of this size at this detail."""
    if detail == "low":
        return LOW_DETAIL_TOKENS
    w, h = float(max(width, 1)), float(max(height, 1))
    if w > FIT_PX or h > FIT_PX:
        scale = FIT_PX / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > SHORT_SIDE_PX:
        scale = SHORT_SIDE_PX / min(w, h)
        w, h = w * scale, h * scale
    tiles = math.ceil(w / TILE_PX) * math.ceil(h / TILE_PX)
    return TILE_TOKENS * tiles + LOW_DETAIL_TOKENS


def is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def image_url(part: dict[str, Any]) -> str:
    inner = part.get("image_url")
    url = inner.get("url") if isinstance(inner, dict) else None
    return url if isinstance(url, str) else ""


def detail(part: dict[str, Any]) -> str | None:
    inner = part.get("image_url")
    value = inner.get("detail") if isinstance(inner, dict) else None
    return value if isinstance(value, str) else None


def is_data_url(url: str) -> bool:
    return url[:5].lower() == "data:"


_WEB_URL = re.compile(r"https?://[^\s/?#]+\S*", re.IGNORECASE)


def is_acceptable_url(url: str) -> bool:
    """An image URL a client may send: a data URL, an http(s) URL with a host, or a
    stored reference (which becomes its placeholder)."""
    return is_data_url(url) or url.startswith(REF_PREFIX) or bool(_WEB_URL.fullmatch(url))


def names_private_host(url: str) -> bool:
    """Whether an http(s) image URL names this machine or a private network by its
    address or a local name (an upstream that fetches image URLs would fetch from
    inside its own network on every turn the image is resent). Names are not resolved."""
    try:
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
    except ValueError:
        return True
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        return True
    try:
        # A whole number is an IPv4 address to most resolvers ("2130706433": 127.0.0.1).
        address = ipaddress.ip_address(int(host) if host.isdigit() else host)
    except ValueError:
        return False  # a name: the upstream resolves it
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_global


def is_reference_url(part: Any) -> bool:
    return is_image(part) and image_url(part).startswith(REF_PREFIX)


def reference(part: Any) -> dict[str, Any] | None:
    """A reference part's ``media`` object; None for any other part (and for one whose
    ``media`` is not as ``to_reference`` makes it)."""
    if not is_reference_url(part):
        return None
    media = part.get("media")
    if not isinstance(media, dict) or not _HASH.fullmatch(str(media.get("sha256", ""))):
        return None
    for name in ("bytes", "width", "height", "tokens"):
        value = media.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return None
    return media


def data_url_payload(url: str) -> tuple[str, str]:
    """A data URL's declared type (lower-case) and base64 text (``MediaError``: not a
    base64 data URL)."""
    head, comma, payload = url.partition(",")
    if not comma or not head.lower().endswith(";base64"):
        raise MediaError("an image data URL must be data:<type>;base64,<data>")
    return head[5:].split(";", 1)[0].strip().lower(), payload


def encoded_size(url: str) -> int:
    """About the bytes a data URL's base64 decodes to (without decoding it)."""
    # Lengths only: a copy of each of a body's 100 data URLs was ~0.3 ms of the GIL.
    comma = url.find(",")
    if comma < 0:
        return 0
    end = len(url.rstrip())  # (the string itself, not a copy, when nothing is stripped)
    length = max(0, end - comma - 1)
    padding = 2 if url.endswith("==", comma + 1, end) else int(url.endswith("=", comma + 1, end))
    return length * 3 // 4 - padding


def _mime(raw: bytes) -> str | None:
    for signature, mime in _SIGNATURES:
        if raw.startswith(signature):
            return mime
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "image/webp"
    return None


def _open(raw: bytes) -> tuple[str, int, int]:
    """The format's MIME type and the size of an image, from its header alone."""
    mime = _mime(raw)
    if mime is None:
        raise MediaError("the data is not a PNG, JPEG, WEBP or GIF image")
    width, height = imagesize.get(io.BytesIO(raw), exif_rotation=False)
    if mime == "image/webp" and raw[12:16] == b"VP8 " and len(raw) >= 30:
        # A lossy WEBP's 14-bit sizes (the two bits above them are a scale).
        width, height = (v & 0x3FFF for v in struct.unpack("<HH", raw[26:30]))
    if width < 0 or height < 0:
        raise MediaError("the data is not a PNG, JPEG, WEBP or GIF image")
    if width == 0 or height == 0:
        raise MediaError("the image has no pixels")
    if width * height > MAX_PIXELS:
        raise MediaError("the image has too many pixels")
    return mime, width, height


def decode(url: str) -> Decoded:
    """A data URL's image: its bytes, hash and size (raises ``MediaError``)."""
    _, payload = data_url_payload(url)
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("the image data is not valid base64") from None
    mime, width, height = _open(raw)
    return Decoded(Blob(hashlib.sha256(raw).hexdigest(), mime, raw, url), width, height)


def to_reference(part: dict[str, Any], decoded: Decoded) -> dict[str, Any]:
    """The stored form of an image part whose data URL was ``decoded``."""
    blob = decoded.blob
    inner: dict[str, Any] = {"url": REF_PREFIX + blob.sha256}
    level = detail(part)
    if level is not None:
        inner["detail"] = level
    media = {
        "sha256": blob.sha256,
        "mime": blob.mime,
        "bytes": len(blob.data),
        "width": decoded.width,
        "height": decoded.height,
        "tokens": image_tokens(decoded.width, decoded.height, level),
    }
    return {"type": "image_url", "image_url": inner, "media": media}


def data_url(mime: str, raw: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"


def sent_size(media: dict[str, Any]) -> int:
    """The characters a reference takes in a forwarded body once its bytes are back."""
    return 4 * math.ceil(int(media.get("bytes", 0)) / 3) + len(str(media.get("mime", ""))) + 40


def forwarded(part: dict[str, Any], url: str) -> dict[str, Any]:
    """A reference part as the upstream takes it: the bytes as a data URL, the detail."""
    inner: dict[str, Any] = {"url": url}
    level = detail(part)
    if level is not None:
        inner["detail"] = level
    return {"type": "image_url", "image_url": inner}


def _head_size(url: str) -> tuple[int, int]:
    """A data URL's image size from its first bytes; ``URL_IMAGE_SIZE`` when they do not
    tell (such a part is refused when it is taken in: this is only an estimate)."""
    try:
        _, payload = data_url_payload(url)
        head = payload[:_HEAD_CHARS]
        raw = base64.b64decode(head[: len(head) - len(head) % 4], validate=True)
        _, width, height = _open(raw)
    except (MediaError, binascii.Error, ValueError):
        return URL_IMAGE_SIZE
    return width, height


def part_tokens(part: dict[str, Any]) -> int:
    """The tokens of one image part, in any of its forms."""
    media = reference(part)
    if media is not None:
        return int(media["tokens"])
    url = image_url(part)
    size = _head_size(url) if is_data_url(url) else URL_IMAGE_SIZE
    return image_tokens(*size, detail(part))


def placeholder(part: dict[str, Any]) -> str:
    """An image as text, where its bytes are not sent (recall, summaries, exports, and
    images beyond the window): ``[image 1024x768, sha256 3f2c9a1b…]``."""
    media = reference(part)
    if media is not None:
        return f"[image {media.get('width')}x{media.get('height')}, sha256 {media['sha256'][:8]}…]"
    url = image_url(part)
    if is_data_url(url) or url.startswith(REF_PREFIX):
        return "[image]"
    return f"[image {url[:64]}]"
