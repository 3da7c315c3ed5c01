"""The gateway's own commands as separate processes: ``serve`` and ``worker``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from devsupport.servers import free_port


class Served:
    """``memory-gateway serve`` in its own process (or processes, with --workers), up once
    its ``/healthz`` says Redis is reachable; ``env`` adds to the environment."""

    def __init__(
        self,
        config: Path,
        metrics_dir: Path | None = None,
        *args: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **(env or {})}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        if metrics_dir is not None:
            env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        self.log = config.parent / f"serve-{self.port}.log"
        command = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [*command, "--port", str(self.port), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group of its own: see ``interrupt``
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            try:
                if httpx.get(self.url + "/healthz", timeout=0.5).json()["redis"] == "ok":
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("serve did not start: " + self.log.read_text())

    def interrupt(self) -> None:
        """What Ctrl-C in a terminal does: SIGINT to every process of the group (while its
        leader, serve, runs: a pid once freed may soon be another's, pid_max being small)."""
        assert self.process.poll() is None, f"serve had already stopped: see {self.log}"
        os.killpg(self.process.pid, signal.SIGINT)

    def stop(self, sig: signal.Signals = signal.SIGINT) -> int:
        """SIGINT or ``sig`` to serve's own process; the exit status."""
        self.process.send_signal(sig)
        return self.wait(sig.name)

    def wait(self, what: str = "SIGINT") -> int:
        """The exit status, once serve has stopped (at most 20 s)."""
        try:
            return self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()  # not left running for the tests after this one
            self.process.wait(10)
            raise AssertionError(f"serve ignored {what} for 20 s: see {self.log}") from None


def worker_process(config: Path, log: Path | None = None) -> subprocess.Popen[bytes]:
    """``memory-gateway worker`` in its own process (output to ``log``, else dropped)."""
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "worker", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ},
        )
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
