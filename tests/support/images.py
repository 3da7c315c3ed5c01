"""Images the tests send: small, valid, and the same everywhere."""

from __future__ import annotations

# A one-pixel PNG, base64.
PNG_1PX = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAC"
    "hwGA60e6kgAAAABJRU5ErkJggg=="
)
