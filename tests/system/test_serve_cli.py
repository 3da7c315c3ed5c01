"""`memory-gateway serve` as a newcomer runs it: embedded Redis, a YAML file, the real SDK."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.processes import Served

GATEWAY = [sys.executable, "-m", "gateway.cli"]


def write_config(tmp_path: Path, upstream_url: str) -> Path:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "upstream:\n"
        "  base_url: ${FAKE_UPSTREAM}\n"
        "redis:\n"
        f"  data_dir: {tmp_path / 'data'}\n"
        "memory:\n"
        "  preset: hybrid\n"
    )
    return config


@pytest.fixture
def served(tmp_path: Path, upstream_url: str) -> Iterator[tuple[Path, str]]:
    yield write_config(tmp_path, upstream_url), upstream_url


def ask(url: str, text: str) -> str:
    with openai.OpenAI(
        base_url=url + "/v1",
        api_key="sk-cli-test",
        default_headers={"X-Session-Id": "cli"},
        max_retries=0,
    ) as client:
        answer = client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": text}]
        )
    return answer.choices[0].message.content or ""


def test_serve_with_embedded_redis_remembers_across_restarts(served: tuple[Path, str]) -> None:
    config, upstream_url = served
    first = Served(config, env={"FAKE_UPSTREAM": upstream_url})
    try:
        assert ask(first.url, "my island is Crete") == "ack: my island is Crete"
    finally:
        assert first.stop() == 0
    data = config.parent / "data"
    assert (data / "redis.sock").exists() is False  # the private server went away with us
    assert any(data.rglob("*.aof")) or (data / "appendonly.aof").exists()

    second = Served(config, env={"FAKE_UPSTREAM": upstream_url})
    try:
        assert ask(second.url, "what is my island?") == "Your island is Crete."
    finally:
        second.stop()


def test_ctrl_c_lets_the_turn_in_flight_be_recorded(served: tuple[Path, str]) -> None:
    """Ctrl-C in a terminal signals the whole process group, the private redis-server
    too: it must outlive the streamed answer in flight, whose turn is then remembered."""
    config, upstream_url = served
    first = Served(config, env={"FAKE_UPSTREAM": upstream_url})
    body = {"model": "slow-stream", "stream": True, "messages": [
        {"role": "user", "content": "my island is Crete"},
    ]}  # fmt: skip
    headers = {"Authorization": "Bearer sk-cli-test", "X-Session-Id": "cli"}
    try:
        with httpx.stream(
            "POST", first.url + "/v1/chat/completions", json=body, headers=headers, timeout=20
        ) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")  # streaming (five chunks 0.3 s apart)
            first.interrupt()
            rest = list(lines)
        assert "data: [DONE]" in rest
    finally:
        status = first.wait()
    second = Served(config, env={"FAKE_UPSTREAM": upstream_url})
    try:
        assert ask(second.url, "what is my island?") == "Your island is Crete."
    finally:
        second.stop()
    log = first.log.read_text()
    assert status == 0, log
    assert "redis-server exited" not in log and "redis unavailable" not in log, log


def test_check_config_names_the_bad_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("memory:\n  budget_tokens: lots\n  windw: 3\n")
    result = subprocess.run([*GATEWAY, "check-config", str(bad)], capture_output=True, text=True)
    assert result.returncode == 2
    assert "memory.budget_tokens" in result.stderr and "memory.windw: unknown key" in result.stderr
    good = subprocess.run(
        [*GATEWAY, "check-config", "config/gateway.yaml"], capture_output=True, text=True
    )
    assert good.returncode == 0, good.stderr


def test_serve_refuses_to_start_on_a_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstream:\n  base_url: ${NOT_SET_ANYWHERE}\n")
    env = {k: v for k, v in os.environ.items() if k != "NOT_SET_ANYWHERE"}
    result = subprocess.run(
        [*GATEWAY, "serve", "--config", str(bad)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 2
    assert "upstream.base_url: environment variable NOT_SET_ANYWHERE is not set" in result.stderr


def test_a_separate_worker_refuses_the_embedded_redis() -> None:
    result = subprocess.run(
        [*GATEWAY, "worker", "--config", "config/gateway.yaml"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "redis.url: a separate worker needs an external Redis" in result.stderr


def _send_raw(url: str, head: bytes) -> bytes:
    """Send a request head; what came back before the gateway closed (b"" if reset)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        received = b""
        try:
            sock.sendall(head)
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionResetError, BrokenPipeError):  # dropped mid-send: as expected
            pass
        return received


def test_serve_drops_a_request_whose_headers_are_too_large(served: tuple[Path, str]) -> None:
    config, upstream_url = served
    gateway = Served(config, env={"FAKE_UPSTREAM": upstream_url})
    try:
        start = b"GET /memory/sessions/s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Session-Id: "
        # 8 MiB of header: never buffered whole, never answered as a request.
        answer = _send_raw(gateway.url, start + b"a" * (8 * 1024 * 1024) + b"\r\n\r\n")
        # The parser drops it (a reset, or its own plain 400): the app never answered.
        assert b'{"error":' not in answer, answer[:200]
        assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer[:200]
        # Under server.max_header_bytes (64 KiB): the gateway's own answer, in its envelope.
        answer = _send_raw(gateway.url, start + b"a" * 32 * 1024 + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]  # no key: refused
        assert b'{"error":' in answer
        assert httpx.get(gateway.url + "/healthz", timeout=5).status_code == 200
    finally:
        gateway.stop()


def test_serve_with_gateway_keys_made_and_revoked_through_the_admin_api(
    tmp_path: Path, upstream_url: str
) -> None:
    """`auth.mode: keys` as an operator runs it: a key made through the admin API works
    with the OpenAI SDK (the upstream gets the operator's key), and once revoked, no more."""
    config = tmp_path / "keys.yaml"
    config.write_text(
        "upstream:\n  base_url: ${FAKE_UPSTREAM}\n  api_key: ${OPERATOR_KEY}\n"
        f"redis:\n  data_dir: {tmp_path / 'data'}\n"
        "auth:\n  mode: keys\n  admin_key: ${ADMIN_KEY}\n"
    )
    admin = {"Authorization": "Bearer admin-key-0123456789abcdef"}
    env = {
        "FAKE_UPSTREAM": upstream_url,
        "OPERATOR_KEY": "sk-operator-0123456789",
        "ADMIN_KEY": "admin-key-0123456789abcdef",
    }
    served = Served(config, env=env)
    try:
        made = httpx.post(served.url + "/admin/keys", json={"tenant": "acme"}, headers=admin)
        assert made.status_code == 201, made.text
        key, key_id = made.json()["key"], made.json()["id"]
        with openai.OpenAI(
            base_url=served.url + "/v1",
            api_key=key,
            default_headers={"X-Session-Id": "keys"},
            max_retries=0,
        ) as client:
            answer = client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hello"}]
            )
            assert answer.choices[0].message.content == "ack: hello"
            gone = httpx.delete(f"{served.url}/admin/keys/{key_id}", headers=admin)
            assert gone.status_code == 204
            with pytest.raises(openai.AuthenticationError):
                client.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": "again"}]
                )
    finally:
        assert served.stop() == 0
    output = served.log.read_text()
    assert "sk-operator-0123456789" not in output and key not in output


def test_serve_stops_at_sigterm_without_waiting_out_the_workers_read(
    served: tuple[Path, str],
) -> None:
    """Idle, as a service manager or ``docker stop`` finds it: the in-process worker's
    blocked read of the job stream is cancelled, not waited out (here a 5 s one)."""
    config, upstream_url = served
    config.write_text(config.read_text() + "worker:\n  block_ms: 5000\n")
    gateway = Served(config, env={"FAKE_UPSTREAM": upstream_url})
    try:
        assert ask(gateway.url, "my island is Crete") == "ack: my island is Crete"
    finally:
        started = time.monotonic()
        status = gateway.stop(signal.SIGTERM)
        elapsed = time.monotonic() - started
    # Well under a second when the read is cancelled; waiting the 5 s block out fails. The
    # bar is half the block, not a timing target: a loaded CI machine adds its own pauses.
    assert elapsed < 2.5, f"serve took {elapsed:.2f} s to stop: see {gateway.log}"
    # A shutdown, not a kill: uvicorn ends by re-raising the signal once the app has
    # stopped, and the app stopped its private Redis (whose socket it removes).
    assert status == -signal.SIGTERM
    assert "Application shutdown complete" in gateway.log.read_text()
    assert (config.parent / "data" / "redis.sock").exists() is False
