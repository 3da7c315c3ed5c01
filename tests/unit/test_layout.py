"""The layout stays readable: no module of ``gateway/`` grows past MAX_LINES, every module
sits in a layer of the import contract, and ``memory/`` holds no async code.

A module that long holds more than one concept; split it by concept (see
docs/architecture.md's module map) rather than raise the limit. The dependency rule
between the layers is checked by import-linter (``[tool.importlinter]``); these tests
keep that contract exhaustive, so a new module cannot sit outside it.
"""

from __future__ import annotations

import ast
import re
import tomllib
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


# --- every module in a layer --------------------------------------------------------------

PYPROJECT = GATEWAY.parent / "pyproject.toml"
# The app's wiring, and the pure helpers every layer stands on: all that may sit at the
# top of gateway/ rather than in a package that names its layer.
MAX_TOP_LEVEL_MODULES = 12


def layered(pyproject: Path) -> set[str]:
    """The modules and packages the layers contract names (``a | b`` split)."""
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return {name.strip() for layer in layers for name in re.split(r"[|:]", layer)}


def unplaced(root: Path, names: set[str]) -> list[str]:
    """Each module or package directly under ``root`` that no layer names."""
    children = [
        p.stem if p.suffix == ".py" else p.name
        for p in sorted(root.iterdir())
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    ]
    return [c for c in children if f"{root.name}.{c}" not in names]


def test_every_module_of_the_gateway_is_in_a_layer_of_the_import_contract() -> None:
    assert unplaced(GATEWAY, layered(PYPROJECT)) == []


def test_the_check_sees_a_module_no_layer_names(tmp_path: Path) -> None:
    root = tmp_path / "gateway"
    (root / "placed").mkdir(parents=True)
    (root / "placed" / "__init__.py").write_text("")
    (root / "stray").mkdir()
    (root / "stray" / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "app.py").write_text("")
    (root / "loose.py").write_text("")
    (root / "data").mkdir()  # not a package: no __init__.py
    assert unplaced(root, {"gateway.placed", "gateway.app"}) == ["loose", "stray"]


def test_the_top_level_holds_only_the_wiring_and_the_base() -> None:
    modules = [p for p in GATEWAY.glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, sorted(p.name for p in modules)


def async_functions(root: Path) -> list[str]:
    """Every ``async def`` under ``root``, as ``path:line``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.AsyncFunctionDef):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_memory_is_synchronous_policy() -> None:
    # Model-driving code (await) belongs in summarize/ or service/, behind a port.
    assert async_functions(GATEWAY / "memory") == []


def test_the_async_check_sees_an_async_function(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "m.py").write_text("def f():\n    pass\n\n\nasync def g():\n    pass\n")
    assert async_functions(tmp_path / "memory") == ["memory/m.py:5"]
