"""The ``cl100k_base`` encoding built from its BPE file shipped in this package: token
counting that never needs the network (tiktoken downloads an encoding's file on first use).

The file is tiktoken's own ``cl100k_base.tiktoken`` (one "base64-token rank" per line),
checked against the SHA-256 tiktoken itself expects of it; the split pattern and special
tokens are those of tiktoken's ``cl100k_base`` constructor (``tiktoken_ext.openai_public``).
tests/unit/text/test_cl100k.py holds all three equal to tiktoken's.
"""

from __future__ import annotations

import base64
import hashlib
from importlib import resources

import tiktoken

from gateway.caching import memo

NAME = "cl100k_base"
FILE = "cl100k_base.tiktoken"
SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++"""
    r"""[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
SPECIAL_TOKENS = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}


def ranks(contents: bytes) -> dict[bytes, int]:
    """A ``.tiktoken`` file's mergeable ranks (the format ``tiktoken.load`` reads)."""
    found = {}
    for line in contents.splitlines():
        if line:
            token, rank = line.split()
            found[base64.b64decode(token)] = int(rank)
    return found


def shipped() -> bytes:
    """The shipped BPE file; a ``RuntimeError`` when it is not the one tiktoken expects."""
    contents = resources.files(__package__).joinpath(FILE).read_bytes()
    if hashlib.sha256(contents).hexdigest() != SHA256:
        raise RuntimeError(f"gateway/text/{FILE} is damaged (its SHA-256 is not {SHA256})")
    return contents


# One per process, as tiktoken keeps the encodings it makes (``tiktoken.get_encoding``):
# a constant made of a shipped file, ~0.2 s and ~100 MB to build.
@memo(maxsize=1)
def encoding() -> tiktoken.Encoding:
    """The ``cl100k_base`` encoding."""
    return tiktoken.Encoding(
        NAME,
        pat_str=PATTERN,
        mergeable_ranks=ranks(shipped()),
        special_tokens=SPECIAL_TOKENS,
    )
