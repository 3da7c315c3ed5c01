"""The Lua scripts the gateway runs in Redis, read from ``scripts/*.lua`` (package data).

Each file documents its KEYS, ARGV and reply; where a script's arguments are many, a
typed codec in ``codecs.py`` builds them and reads the reply. The one substitution: a
line ``--#include <name>.lua`` is replaced by that file's text (a helper shared by two
scripts, ``slice.lua``); it is done here and nowhere else, and an included file may not
include another.
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import resources

_INCLUDE = re.compile(r"^--#include (\w+)\.lua$", re.MULTILINE)


def _read(name: str) -> str:
    return resources.files("gateway.store").joinpath("scripts", f"{name}.lua").read_text("utf-8")


@functools.cache
def source(name: str) -> str:
    """The script ``<name>.lua`` as Redis runs it: its includes substituted."""

    def included(match: re.Match[str]) -> str:
        text = _read(match.group(1))
        if _INCLUDE.search(text):
            raise ValueError(f"{match.group(1)}.lua: an included file includes another")
        return text.rstrip("\n")

    return _INCLUDE.sub(included, _read(name))


def sha(name: str) -> str:
    """What ``EVALSHA`` calls the script by."""
    return hashlib.sha1(source(name).encode()).hexdigest()


def names() -> list[str]:
    """Every script file's name (included helpers too), sorted."""
    folder = resources.files("gateway.store").joinpath("scripts")
    return sorted(
        entry.name.removesuffix(".lua") for entry in folder.iterdir() if entry.name.endswith(".lua")
    )
