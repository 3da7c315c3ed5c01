"""docs/configuration.md's settings reference matches the models in gateway/config.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _config_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "config_docs", ROOT / "scripts" / "config_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("config_docs", module)
    spec.loader.exec_module(module)
    return module


def test_every_key_has_a_meaning() -> None:
    assert _config_docs().problems() == []


def test_the_page_is_up_to_date() -> None:
    docs = _config_docs()
    page = docs.PAGE.read_text(encoding="utf-8")
    assert docs.render_page(page) == page, (
        "docs/configuration.md is out of date: run .venv/bin/python scripts/config_docs.py --write"
    )


def test_every_key_and_default_is_on_the_page() -> None:
    # Independent of the generator's own rendering: every leaf key of the models appears
    # as a row, with its default where it has a plain one.
    from gateway.config import ServerConfig, Settings

    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip() for line in page.splitlines() if line.startswith("| `")}
    for section in Settings.model_fields:
        assert f"`{section}`" in rows
    for name in ServerConfig.model_fields:
        assert f"`{name}`" in rows, name
    assert "| `budget_tokens` | `3000` |" in page
    assert "| `preset` | `hybrid-recall` |" in page


def test_a_stale_page_is_noticed(tmp_path: Path) -> None:
    docs = _config_docs()
    page = docs.PAGE.read_text(encoding="utf-8")
    stale = page.replace("| `budget_tokens` | `3000` |", "| `budget_tokens` | `2000` |")
    assert stale != page
    assert docs.render_page(stale) == page
