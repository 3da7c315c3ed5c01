"""The store's raw calls stay inside it: above ``gateway/store/`` a caller holds a part
(``store.sessions``, ``store.limits``…) through its Protocol, never ``StoreCalls.execute``
or the link, whose commands and keys would then be built outside ``store/``."""

from __future__ import annotations

import ast
from pathlib import Path

import gateway

GATEWAY = Path(gateway.__file__).parent
PRIVATE = {"gateway.store.calls", "gateway.store.link"}
# The wiring makes the store's one link (a test passes a counting one); it sends nothing.
ALLOWED = {("gateway/wiring.py", "gateway.store.link")}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def private_imports(root: Path) -> list[tuple[str, str]]:
    """(module file, private module) for each import of the store's calls or link from
    outside ``store/``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root.parent).as_posix()
        if name.startswith("gateway/store/"):
            continue
        for module in sorted(_imports(path) & PRIVATE):
            if (name, module) not in ALLOWED:
                found.append((name, module))
    return found


def test_no_module_above_the_store_imports_its_calls_or_its_link() -> None:
    assert private_imports(GATEWAY) == []


def test_the_check_finds_such_an_import(tmp_path: Path) -> None:
    package = tmp_path / "gateway"
    (package / "routes").mkdir(parents=True)
    (package / "routes" / "raw.py").write_text("from gateway.store.calls import StoreCalls\n")
    (package / "store").mkdir()
    (package / "store" / "part.py").write_text("from gateway.store.calls import StoreCalls\n")
    assert private_imports(package) == [("gateway/routes/raw.py", "gateway.store.calls")]
