"""The suite's three layers, by directory, each with its marker:

- ``tests/unit/``: no Redis and no other process; HTTP, where a test needs it, to servers
  running in the test's own process (``-m unit``: ~40 s, ~30 s in two processes);
- ``tests/integration/``: a real redis-server and real gateways, served in the test's
  process on real sockets, driven over HTTP by real clients (``-m integration``);
- ``tests/system/``: the gateway as its users and operators run it, in its own
  processes: the CLI, ``serve``, Redis killed and restarted, a Redis Cluster failing
  over, the inspector in a browser (``-m system``).

The fixtures that start Redis, the fake upstream and gateways (and check, at the end,
that no key material or message content leaked) are in ``tests/support/fixtures.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.support.fixtures", "tests.support.local_model"]

LAYERS = ("unit", "integration", "system")
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        layer = Path(item.path).resolve().relative_to(HERE).parts[0]
        if layer not in LAYERS:
            raise pytest.UsageError(f"{item.nodeid}: a test outside {', '.join(LAYERS)}")
        item.add_marker(getattr(pytest.mark, layer))
    # Tests that need a real local model (llama-cpp-python, minutes to build) run only
    # when -m names them (scripts/test-local-model); any other run deselects them, so
    # the suite neither needs that package nor reports them as skipped.
    if "local_model" not in (config.option.markexpr or ""):
        deselected = [item for item in items if item.get_closest_marker("local_model")]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if not item.get_closest_marker("local_model")]
