"""How fast the upstream hears that a client left, and whether any upstream call is orphaned.

Starts a private redis-server, the fake upstream and a gateway (all on loopback, the
fake and the gateway in this process so both clocks agree), then lets ``--runs`` clients
leave at random points: while the gateway waits for the upstream's headers, after the
headers but before the first chunk, or mid-stream. Prints the p50/p99 of (upstream
noticed the disconnect minus client left) and the upstream calls still open ``--settle`` s
after their client left (target 0).

    python bench/disconnects.py [--runs 200] [--concurrency 20] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.config import parse_settings  # noqa: E402
from gateway.wiring import build_clients  # noqa: E402
from tests.support.disconnects import measure_disconnects  # noqa: E402
from tests.support.fake_upstream import FakeUpstream  # noqa: E402
from tests.support.servers import ServerThread, running_redis  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()

    fake = FakeUpstream()
    with running_redis() as redis_server, ServerThread(fake.app()) as upstream:
        settings = parse_settings(
            {
                "upstream": {
                    "base_url": upstream.url + "/v1",
                    "timeouts": {"first_byte_s": 10, "idle_s": 10},
                },
                "redis": {"url": redis_server.url},
            },
            environ={},
        )
        clients = build_clients(settings, settings.redis.url)
        with ServerThread(clients.create_app(settings), on_stop=clients.aclose) as gateway:
            report = measure_disconnects(
                gateway.url,
                fake,
                api_key="sk-bench-" + secrets.token_urlsafe(16),
                runs=args.runs,
                concurrency=args.concurrency,
                settle_s=args.settle,
                seed=args.seed,
            )
    print(report.summary())
    if args.json:
        summary = {
            "runs": report.runs,
            "measured": len(report.latencies_s),
            "p50_ms": report.p50 * 1000,
            "p99_ms": report.p99 * 1000,
            "max_ms": max(report.latencies_s, default=0.0) * 1000,
            "orphans": report.orphans,
            "not_reached": report.not_reached,
            "finished_anyway": report.finished,
        }
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
