"""Generate docs/architecture.md's module map and Redis key table from the code.

The module map lists every module of gateway/ by the first sentence of its docstring,
package by package, in the layer order of the import contract in pyproject.toml (the
one `lint-imports` checks). The key table lists every family of ``SCHEMA`` in
gateway/store/keys.py. Each is written between its two markers in the page, so the page
cannot silently fall behind the code (tests/unit/test_architecture_docs.py).

    .venv/bin/python scripts/architecture_docs.py           # print both sections
    .venv/bin/python scripts/architecture_docs.py --write   # rewrite them in the page
    .venv/bin/python scripts/architecture_docs.py --check   # exit 1 when the page is stale
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.store import keys  # noqa: E402

PAGE = ROOT / "docs" / "architecture.md"
GATEWAY = ROOT / "gateway"
PYPROJECT = ROOT / "pyproject.toml"


def begin(name: str) -> str:
    return f"<!-- generated: {name} (scripts/architecture_docs.py --write); do not edit -->"


def end(name: str) -> str:
    return f"<!-- end generated: {name} -->"


# --- the module map -------------------------------------------------------------------------


def layers(pyproject: Path = PYPROJECT) -> list[list[str]]:
    """The layers contract's layers, top first, each as its names (``gateway.`` dropped)."""
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    (found,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [[n.strip().removeprefix("gateway.") for n in layer.split("|")] for layer in found]


_HEAD = re.compile(r'\s*"""(?:[^"\\]|\\.|"(?!""))*"""')


def summary(path: Path) -> str | None:
    """The first sentence of a module's docstring, on one line, as Markdown (None: none)."""
    text = path.read_text(encoding="utf-8")
    # Only the docstring at the head is read (parsing every module whole is ~10x slower).
    head = _HEAD.match(text)
    doc = inspect.cleandoc(ast.literal_eval(head[0].strip())) if head else None
    doc = doc or ast.get_docstring(ast.parse(text))
    if not doc:
        return None
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", paragraph, maxsplit=1)[0]
    return sentence.replace("``", "`").replace("|", "\\|")


def modules_of(name: str, root: Path = GATEWAY) -> Iterator[Path]:
    """A layer name's module, or its package's modules: each package's ``__init__`` first,
    then its modules, then its subpackages."""
    single = root / f"{name}.py"
    if single.is_file():
        yield single
        return
    package = root / name
    yield from _package(package)


def _package(package: Path) -> Iterator[Path]:
    yield package / "__init__.py"
    yield from sorted(p for p in package.glob("*.py") if p.name != "__init__.py")
    for sub in sorted(p for p in package.iterdir() if (p / "__init__.py").is_file()):
        yield from _package(sub)


def shown(path: Path, root: Path = GATEWAY) -> str:
    relative = path.relative_to(root).as_posix()
    return relative.removesuffix("__init__.py") if path.name == "__init__.py" else relative


def module_map(root: Path = GATEWAY, pyproject: Path = PYPROJECT) -> str:
    rows = ["| layer | module | what it is |", "|---|---|---|"]
    for number, layer in enumerate(layers(pyproject), 1):
        label = f"{number}. " + " \\| ".join(f"`{name}`" for name in layer)
        for name in layer:
            for path in modules_of(name, root):
                if path.name == "__init__.py" and summary(path) is None:
                    continue  # a package that says nothing of itself: its modules do
                rows.append(f"| {label} | `{shown(path, root)}` | {summary(path) or ''} |")
                label = ""
    return "\n".join(rows)


def problems(root: Path = GATEWAY, pyproject: Path = PYPROJECT) -> list[str]:
    """Modules the map cannot describe: no docstring (a package's may say nothing), or in
    no layer."""
    found = []
    mapped = {p for layer in layers(pyproject) for n in layer for p in modules_of(n, root)}
    for path in sorted(root.rglob("*.py")):
        if path == root / "__init__.py":
            continue
        if path not in mapped:
            found.append(f"{shown(path, root)}: in no layer of the import contract")
        elif summary(path) is None and path.name != "__init__.py":
            found.append(f"{shown(path, root)}: no docstring")
    return found


# --- the key table --------------------------------------------------------------------------


def key_table() -> str:
    legend = ", ".join(f"`<{name}>` {what}" for name, (_, what) in keys.PLACEHOLDERS.items())
    rows = [
        f"In a pattern, {legend}. `retention` is `redis.retention_days` after the key's last "
        "write.",
        "",
        "| key | type | expires | holds |",
        "|---|---|---|---|",
    ]
    for shape in keys.SCHEMA:
        rows.append(
            f"| `{shape.pattern}` | {shape.redis_type.upper()} | {shape.ttl} | {shape.what} |"
        )
    return "\n".join(rows)


SECTIONS: dict[str, Callable[[], str]] = {"module map": module_map, "key table": key_table}


def render_page(page: str) -> str:
    """The page with every generated section made anew from the code."""
    for name, render in SECTIONS.items():
        start, stop = begin(name), end(name)
        if start not in page or stop not in page:
            raise SystemExit(f"{PAGE}: the markers of the {name} are missing")
        head, rest = page.split(start, 1)
        _, tail = rest.split(stop, 1)
        page = f"{head}{start}\n{render()}\n{stop}{tail}"
    return page


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the sections in the page")
    mode.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = parser.parse_args()
    found = problems()
    if found:
        print("\n".join(found), file=sys.stderr)
        return 1
    if not (args.check or args.write):
        print("\n\n".join(f"{name}:\n{render()}" for name, render in SECTIONS.items()))
        return 0
    page = PAGE.read_text(encoding="utf-8")
    rendered = render_page(page)
    if args.check:
        if rendered != page:
            print(f"{PAGE} is out of date: run {Path(__file__).name} --write", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(rendered, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
