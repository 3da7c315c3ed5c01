"""What the benchmarks share: child processes that die with the bench, ports, a
gateway's health, CPU and memory of a process, quantiles and markdown tables, and what a
result records of where it was measured (commit, machine, library versions).

Servers the test suite uses too (Redis, a Redis Cluster, the fake upstream) are in
``devsupport/``; nothing here imports ``tests/``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import math
import os
import platform
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx

from devsupport.servers import DIE_WITH_PARENT, free_port, redis_server_binary

__all__ = [
    "DIE_WITH_PARENT",
    "ROOT",
    "SUMMARIZER_SERVER",
    "commit",
    "cpu_model",
    "cpu_seconds",
    "free_port",
    "machine",
    "ms",
    "quantile",
    "rss_kib",
    "stop",
    "table",
    "versions",
    "wait_healthy",
]

ROOT = Path(__file__).resolve().parent.parent

# The test suite's fake upstream, for its summarizer models (valid summaries and facts;
# ``slow-summarizer``: each after argv[2] seconds): ``python -c SUMMARIZER_SERVER PORT S``.
SUMMARIZER_SERVER = """
import sys, uvicorn
from devsupport import fake_upstream
fake_upstream.SLOW_SUMMARIZER_S = float(sys.argv[2])
uvicorn.run(fake_upstream.FakeUpstream().app(), host="127.0.0.1", port=int(sys.argv[1]),
            log_level="warning")
"""


def wait_healthy(base: str, process: subprocess.Popen[bytes], logfile: Path) -> None:
    """Poll /healthz until Redis is reachable; fail with the gateway's log if it died."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited:\n{logfile.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/healthz", timeout=2).json().get("status") == "ok":
                return
        time.sleep(0.2)
    raise RuntimeError(f"gateway not healthy after 60 s:\n{logfile.read_text()[-3000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, the gateway's normal stop (it stops its embedded Redis too); then kill."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def cpu_seconds(pid: int) -> float:
    """On-CPU time of all of a process's threads, in ns resolution (not 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (q in 0..1)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def ms(seconds: float, digits: int = 2) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.{digits}f} ms"


def table(header: Sequence[str], rows: Iterable[Iterable[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines)


def commit() -> str:
    """The checkout's commit, and whether it had uncommitted changes (results record it)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    return done.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def cpu_model(cpuinfo: str) -> str:
    """The first ``model name`` of /proc/cpuinfo's text ("unknown" on other systems)."""
    found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    return found.group(1).strip() if found else "unknown"


def machine() -> dict[str, Any]:
    """Cores and CPU model: a throughput target (req/s) means something on one machine."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    model = cpu_model(cpuinfo)
    if model == "unknown":
        model = platform.processor() or model
    return {"cores": os.cpu_count(), "cpu": model}


# What the gateway's request path runs on (and the load generator's aiohttp), by
# distribution name and the name a result gives it: a result measured with other
# versions is another result.
LIBRARIES = {
    "aiohttp": "aiohttp", "uvicorn": "uvicorn", "uvloop": "uvloop", "httptools": "httptools",
    "starlette": "starlette", "redis": "redis-py", "hiredis": "hiredis", "orjson": "orjson",
    "tiktoken": "tiktoken",
}  # fmt: skip


def redis_server_version(output: str) -> str:
    """ "7.0.15" from ``redis-server --version``'s "Redis server v=7.0.15 sha=…"."""
    found = re.search(r"\bv=(\S+)", output)
    return found.group(1) if found else "unknown"


def versions(redis_binary: str | None = None) -> dict[str, str]:
    """Python's, the libraries' (``redis``: redis-py) and redis-server's versions."""
    found = {"python": platform.python_version()}
    for distribution, name in LIBRARIES.items():
        try:
            found[name] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    binary = redis_binary or redis_server_binary()
    try:
        output = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, check=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        output = ""
    found["redis-server"] = redis_server_version(output)
    return found
