"""docs/architecture.md's module map and key table match the code (scripts/architecture_docs.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gateway.store.keys import SCHEMA

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "gateway"


def _docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "architecture_docs", ROOT / "scripts" / "architecture_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("architecture_docs", module)
    spec.loader.exec_module(module)
    return module


def test_every_module_has_a_docstring_and_a_layer() -> None:
    assert _docs().problems() == []


def test_the_page_is_up_to_date() -> None:
    docs = _docs()
    page = docs.PAGE.read_text(encoding="utf-8")
    assert docs.render_page(page) == page, (
        "docs/architecture.md is out of date: run "
        ".venv/bin/python scripts/architecture_docs.py --write"
    )


def _rows(page: str) -> list[str]:
    return [line for line in page.splitlines() if line.startswith("| ")]


def test_every_module_and_every_key_family_is_on_the_page() -> None:
    # Independent of the generator's own rendering: each module's path, and each key
    # family's pattern, is a cell of a row.
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    cells = {cell.strip() for row in _rows(page) for cell in row.split(" | ")}
    for path in GATEWAY.rglob("*.py"):
        if path.name != "__init__.py":
            assert f"`{path.relative_to(GATEWAY).as_posix()}`" in cells, path
    for shape in SCHEMA:
        assert f"| `{shape.pattern}` | {shape.redis_type.upper()} |" in page, shape.pattern


def test_the_map_follows_the_layers_top_first() -> None:
    docs = _docs()
    rows = docs.module_map().splitlines()[2:]
    first = {row.split(" | ")[1].strip("`"): i for i, row in enumerate(rows)}
    order = ["cli.py", "app.py", "routes/memory_proxy.py", "service/turn.py",
             "store/keys.py", "memory/assemble.py", "errors.py", "compat/versions.py"]  # fmt: skip
    assert [first[name] for name in order] == sorted(first[name] for name in order)


def test_a_stale_page_is_noticed() -> None:
    docs = _docs()
    page = docs.PAGE.read_text(encoding="utf-8")
    for stale in (
        page.replace("| `store/keys.py` |", "| `store/schema.py` |"),
        page.replace("| `mg:{<tenant>.u<user>}:active` | ZSET |", ""),
    ):
        assert stale != page
        assert docs.render_page(stale) == docs.render_page(page)
    with pytest.raises(SystemExit):
        docs.render_page(page.replace(docs.end("key table"), ""))


def test_a_module_without_a_docstring_or_a_layer_is_a_problem(tmp_path: Path) -> None:
    docs = _docs()
    root = tmp_path / "gateway"
    (root / "placed").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "placed" / "__init__.py").write_text("")  # a package may say nothing itself
    (root / "placed" / "said.py").write_text('"""Says what it is. More."""\n')
    (root / "placed" / "mute.py").write_text("x = 1\n")
    (root / "stray.py").write_text('"""In no layer."""\n')
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[tool.importlinter]\n[[tool.importlinter.contracts]]\ntype = "layers"\n'
        'layers = ["gateway.placed"]\n'
    )
    assert docs.problems(root, pyproject) == [
        "placed/mute.py: no docstring",
        "stray.py: in no layer of the import contract",
    ]
    assert docs.module_map(root, pyproject).splitlines()[2:] == [
        "| 1. `placed` | `placed/mute.py` |  |",
        "|  | `placed/said.py` | Says what it is. |",
    ]
