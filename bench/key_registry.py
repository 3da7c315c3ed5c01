"""What an admin change costs every process: the keys' watch reading the registry again.

Each process re-reads the admin API's keys when their version moves (``auth.refresh_s``):
the read (``GatewayKeys.changed_since``: the version, then every record's JSON) and the
registry's update (``KeyRegistry.replace``), both on the event loop. Per registry size,
a private redis-server is filled with that many keys made as the admin API makes them,
one registry reads them all once, then ``--changes`` admin changes follow (a key made,
then revoked, in turn), each read by the registry as its watch would. The table gives the
median and worst time of the read and of the update per change, and how many records
were parsed again per change (records not reused from the previous update).

    .venv/bin/python bench/key_registry.py                       # 100, 2,000, 10,000 keys
    .venv/bin/python bench/key_registry.py --sizes 2000 --changes 50

Before issue 32's change (every record parsed again, and each known record looked up in a
set rebuilt per record) one change at 2,000 keys took 10-18 ms to read and 90-135 ms to
update, on every process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._harness import ms, table  # noqa: E402
from devsupport.servers import running_redis  # noqa: E402
from gateway.auth.authenticator import KeyRecord, KeyRegistry, key_id, new_key  # noqa: E402
from gateway.config import AuthConfig  # noqa: E402
from gateway.store.redis_store import RedisStore, create_client  # noqa: E402


def record(i: int) -> KeyRecord:
    """A key as the admin API stores it: a tenant, a user, a quota and a name."""
    users = frozenset({f"user-{i}"})
    return KeyRecord(key_id(new_key()), f"tenant-{i % 50}", users, None, 10.0, f"key {i}", 1e9)


async def measure(url: str, size: int, changes: int) -> list[object]:
    client = create_client(url, timeout_s=5, max_connections=2)
    store = RedisStore(client, timeout_s=5, retention_s=3600)
    keys = store.gateway_keys
    try:
        for made_before in map(record, range(size)):
            await keys.save(made_before.id, made_before.to_data())
        registry = KeyRegistry(AuthConfig(mode="keys", admin_key="a" * 32))
        found = await keys.changed_since(None)
        assert found is not None
        registry.replace(*found)
        reads, updates, parsed = [], [], []
        made: KeyRecord | None = None
        for _ in range(changes):
            if made is None:
                made = record(size)
                await keys.save(made.id, made.to_data())
            else:
                await keys.revoke(made.id)
                made = None
            before = {id(r) for r in registry.records()}
            started = time.perf_counter()
            found = await keys.changed_since(registry.version)
            read = time.perf_counter()
            assert found is not None
            registry.replace(*found)
            reads.append(read - started)
            updates.append(time.perf_counter() - read)
            parsed.append(sum(1 for r in registry.records() if id(r) not in before))
        return [
            f"{size:,}",
            ms(statistics.median(reads)),
            ms(max(reads)),
            ms(statistics.median(updates)),
            ms(max(updates)),
            max(parsed),
        ]
    finally:
        await store.close()


async def main(sizes: list[int], changes: int) -> None:
    rows = []
    for size in sizes:
        with running_redis() as server:  # each size on an empty Redis
            rows.append(await measure(server.url, size, changes))
    header = ["keys", "read p50", "read max", "update p50", "update max", "parsed per change"]
    print(table(header, rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,2000,10000", help="registry sizes, comma-separated")
    parser.add_argument("--changes", type=int, default=20, help="admin changes per size")
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes.split(",")], args.changes))
