"""The layout stays readable: no module of ``gateway/`` grows past MAX_LINES.

A module that long holds more than one concept; split it by concept (see
docs/architecture.md's module map) rather than raise the limit. The dependency rule
between the packages is checked by import-linter (``[tool.importlinter]``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
MAX_LINES = 600


def too_long(root: Path, limit: int) -> dict[str, int]:
    """Every Python module under ``root`` longer than ``limit`` lines, with its length."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        with path.open("rb") as lines:
            count = sum(1 for _ in lines)
        if count > limit:
            found[str(path.relative_to(root.parent))] = count
    return found


def test_no_module_in_gateway_is_over_the_limit() -> None:
    assert too_long(GATEWAY, MAX_LINES) == {}


@pytest.mark.parametrize("extra", [0, 1])
def test_the_check_sees_a_module_one_line_past_the_limit(tmp_path: Path, extra: int) -> None:
    package = tmp_path / "pkg" / "sub"
    package.mkdir(parents=True)
    (package / "big.py").write_text("x = 1\n" * (MAX_LINES + extra))
    (package / "small.py").write_text("y = 2\n")
    expected = {"pkg/sub/big.py": MAX_LINES + 1} if extra else {}
    assert too_long(tmp_path / "pkg", MAX_LINES) == expected
