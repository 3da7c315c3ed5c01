"""What the gateway assumes of wordllama beyond its documented API, in one place.

Recall's word vectors (``gateway/text/embedder.py``) are two data files shipped inside
the ``wordllama`` wheel: its ``l2_supercat`` tokenizer and token-vector table. The package
itself is never imported (importing it configures the root logger and, were its files
missing, would download them), so the gateway relies on where the files lie inside it,
which is no API: the installed version is checked against the range this was tested with,
and a file that is not where it was is named. Unlike the other ``compat`` modules this one
does not refuse to import outside that range: the vectors are an optional part of recall,
so ``files`` refuses instead, and the embedder falls back to words only (logged), as it
does without the package (``VERSION`` None).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from gateway.compat.versions import check, shown

TESTED = ((0, 3), (0, 5))

try:
    VERSION: str | None = importlib.metadata.version("wordllama")
except importlib.metadata.PackageNotFoundError:
    VERSION = None

TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"
WEIGHTS = "weights/l2_supercat_256.safetensors"
# The name of the token-vector table inside the weights file.
TABLE = "embedding.weight"


@dataclass(frozen=True, slots=True)
class Files:
    """The installed package's tokenizer and weights files."""

    tokenizer: Path
    weights: Path


def package_dir() -> Path | None:
    """Where the installed ``wordllama`` package lies, found without importing it."""
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def files(directory: Path) -> Files:
    """The two files in the package at ``directory``; a ``RuntimeError`` when the installed
    version is outside ``TESTED``, a ``FileNotFoundError`` naming the one that is not there
    (a wordllama whose layout changed)."""
    if VERSION is not None:
        uses = "the paths of its l2_supercat tokenizer and weights inside the package"
        check("wordllama", VERSION, *TESTED, uses=uses)
    found = Files(directory / TOKENIZER, directory / WEIGHTS)
    for path in (found.tokenizer, found.weights):
        if not path.is_file():
            low, high = TESTED
            raise FileNotFoundError(
                f"wordllama {VERSION} has no {path.relative_to(directory)} (memory-gateway "
                f"reads that file of wordllama >= {shown(low)}, < {shown(high)})"
            )
    return found
