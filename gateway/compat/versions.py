"""The version check each ``compat`` module runs at import: the installed distribution's
version (``importlib.metadata``) against the range its private APIs were tested with."""

from __future__ import annotations

import importlib.metadata
import re

Version = tuple[int, ...]

_RELEASE = re.compile(r"\d+(?:\.\d+)*")


def parse(text: str) -> Version:
    """ "3.14.5" as (3, 14, 5); a pre-release or local part is ignored ("0.30.0rc1": (0, 30, 0))."""
    found = _RELEASE.match(text.strip())
    if found is None:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(part) for part in found.group().split("."))


def shown(version: Version) -> str:
    return ".".join(str(part) for part in version)


def require(distribution: str, low: Version, high: Version, *, uses: str) -> str:
    """The installed version of ``distribution``; a ``RuntimeError`` naming the tested
    range [``low``, ``high``) when it is outside it. ``uses``: what the gateway relies on."""
    installed = importlib.metadata.version(distribution)
    check(distribution, installed, low, high, uses=uses)
    return installed


def check(distribution: str, installed: str, low: Version, high: Version, *, uses: str) -> None:
    if not low <= parse(installed) < high:
        raise RuntimeError(
            f"memory-gateway is tested with {distribution} >= {shown(low)}, < {shown(high)} "
            f"(it relies on {uses}, which are private and may change in any release); "
            f"{distribution} {installed} is installed: install a version in that range"
        )
