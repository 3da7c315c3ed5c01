"""The operator surface (issue 23): /healthz and /readyz, ``--version``, ``check-config
--connect``, the summarizer's outcomes in /metrics, and ``server.cors`` — each against a
real gateway, a real Redis and real HTTP servers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devsupport.servers import RedisProcess, ServerThread, free_port, running_redis
from gateway.cli import main
from gateway.config import ConfigError, parse_settings
from gateway.observability import metrics
from tests.support.clients import say, sdk
from tests.support.fixtures import GatewayFactory
from tests.support.metrics import moved, scrape
from tests.support.waiting import reached

GATEWAY = [sys.executable, "-m", "gateway.cli"]
SUMMARIES = "memory_gateway_summaries_total"


# --- /healthz and /readyz ---------------------------------------------------------------


def test_readyz_says_503_while_redis_is_down_and_healthz_stays_200(
    make_gateway: GatewayFactory,
) -> None:
    with running_redis() as server:
        gateway = make_gateway(redis_url=server.url)
        ready = httpx.get(gateway.url + "/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready", "redis": "ok"}
        server.stop()
        ready = httpx.get(gateway.url + "/readyz")
        assert ready.status_code == 503
        assert ready.headers["retry-after"] == "1"
        error = ready.json()["error"]
        assert error["code"] == "redis_unavailable" and "redis" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}
        live = httpx.get(gateway.url + "/healthz")
        assert live.status_code == 200
        assert live.json() == {"status": "degraded", "redis": "unavailable"}


# --- --version ----------------------------------------------------------------------------


def test_version_prints_the_installed_package_version() -> None:
    from importlib.metadata import version

    result = subprocess.run([*GATEWAY, "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert result.stdout.strip() == f"memory-gateway {version('memory-gateway')}"


# --- check-config --connect --------------------------------------------------------------

GOOD_KEY = "sk-good-key-for-connect"


async def _models(request: Request) -> JSONResponse:
    if request.headers.get("authorization") != f"Bearer {GOOD_KEY}":
        return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
    # An upstream with its own (wide) CORS policy: the gateway must not relay it.
    cors = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Credentials": "true"}
    return JSONResponse({"object": "list", "data": []}, headers=cors)


@pytest.fixture(scope="module")
def model_server() -> Iterator[ServerThread]:
    thread = ServerThread(Starlette(routes=[Route("/v1/models", _models)])).start()
    yield thread
    thread.stop()


def _config(tmp_path: Path, redis_url: str, base_url: str, key: str | None) -> str:
    path = tmp_path / "gateway.yaml"
    upstream = f"upstream: {{base_url: '{base_url}'" + (f", api_key: '{key}'}}" if key else "}")
    # An upstream key is the gateway's only with its own keys (auth.mode: keys).
    auth = "auth: {mode: keys, admin_key: 'admin-key-for-connect-0123456789'}" if key else ""
    path.write_text(f"redis: {{url: '{redis_url}'}}\n{upstream}\n{auth}\n")
    return str(path)


def _check(capsys: pytest.CaptureFixture[str], path: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["check-config", path, "--connect"])
    return code, capsys.readouterr().out.splitlines()


def test_connect_passes_when_redis_and_upstream_answer(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    redis_server: RedisProcess,
    model_server: ServerThread,
) -> None:
    path = _config(tmp_path, redis_server.url, model_server.url + "/v1", GOOD_KEY)
    code, lines = _check(capsys, path)
    assert code == 0, lines
    assert lines[1].startswith(f"redis {redis_server.url}: OK (PING answered in")
    assert lines[2] == f"upstream {model_server.url}/v1: OK (reachable (GET /models: 200))"
    assert GOOD_KEY not in "\n".join(lines)


def test_connect_fails_on_an_unreachable_redis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model_server: ServerThread
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    code, lines = _check(capsys, _config(tmp_path, nowhere, model_server.url + "/v1", GOOD_KEY))
    assert code == 1
    assert lines[1].startswith(f"redis {nowhere}: FAILED (")
    assert ": OK (" in lines[2]  # each check is made and printed, whatever the others say


def test_connect_reports_a_refused_key_and_an_unreachable_upstream(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    redis_server: RedisProcess,
    model_server: ServerThread,
) -> None:
    base = model_server.url + "/v1"
    code, lines = _check(capsys, _config(tmp_path, redis_server.url, base, "sk-wrong"))
    assert code == 1
    assert lines[2] == f"upstream {base}: FAILED (reachable, key refused (GET /models: 401))"
    # No key configured: clients bring theirs, so the upstream's 401 is expected.
    code, lines = _check(capsys, _config(tmp_path, redis_server.url, base, None))
    assert code == 0 and "reachable; no key configured (GET /models: 401)" in lines[2]
    closed = f"http://127.0.0.1:{free_port()}/v1"
    code, lines = _check(capsys, _config(tmp_path, redis_server.url, closed, GOOD_KEY))
    assert code == 1 and lines[2].startswith(f"upstream {closed}: FAILED (not reachable: ")


def test_connect_warns_of_a_tenant_secret_kept_in_a_redis_without_persistence(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    redis_server: RedisProcess,
    model_server: ServerThread,
) -> None:
    """Issue 32, finding 6: with ``server.tenant_secret: null`` the secret lives in Redis;
    one without persistence (the suite's: no AOF, no snapshots) may lose it on a restart."""
    path = _config(tmp_path, redis_server.url, model_server.url + "/v1", GOOD_KEY)
    code, lines = _check(capsys, path)
    assert code == 0, lines  # a warning, not a failure
    assert lines[-1].startswith("tenant secret: WARNING (server.tenant_secret is not set")
    with open(path, "a") as config:
        config.write("server: {tenant_secret: 'a-long-random-secret-of-the-operator'}\n")
    code, lines = _check(capsys, path)
    assert code == 0 and not any(line.startswith("tenant secret") for line in lines)
    with running_redis(appendonly=True) as durable:
        path = _config(tmp_path, durable.url, model_server.url + "/v1", GOOD_KEY)
        code, lines = _check(capsys, path)
    assert code == 0 and lines[-1] == (
        "tenant secret: OK (kept in Redis (mg:tenant-secret), which persists it)"
    )


def test_without_connect_nothing_is_reached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    path = _config(tmp_path, nowhere, f"http://127.0.0.1:{free_port()}/v1", None)
    assert main(["check-config", path]) == 0
    assert capsys.readouterr().out.count("\n") == 1


# --- summarizer outcomes in /metrics ------------------------------------------------------


def _summarized(
    make_gateway: GatewayFactory, api_key: str, session_id: str, outcome: str, **summarizer: str
) -> float:
    """How many summarizer questions ended in ``outcome`` once a session passed its first
    chunk (the hybrid preset's jobs run in the gateway's own worker)."""
    gateway = make_gateway(summarizer=summarizer)
    before = scrape(gateway.url)
    client = sdk(gateway, api_key, session_id)
    for i in range(12):
        say(client, f"message number {i} about the summaries")
    counted = 0.0

    def moved_yet() -> float:
        nonlocal counted
        counted = moved(before, scrape(gateway.url), SUMMARIES, outcome=outcome)
        return counted

    reached(moved_yet, timeout=30)
    return counted


def test_every_outcome_is_exposed_from_the_start(gateway: ServerThread) -> None:
    samples = scrape(gateway.url)
    for outcome in metrics.SUMMARY_OUTCOMES:
        assert (SUMMARIES, frozenset({("outcome", outcome)})) in samples


@pytest.mark.parametrize(
    ("summarizer", "outcome"),
    [
        ({"model": "fake-summarizer"}, "ok"),
        ({"model": "broken-summarizer"}, "rejected"),
        ({"model": "fake-summarizer", "base_url": "http://127.0.0.1:9/v1", "timeout_s": "2"},
         "failed"),
    ],
)  # fmt: skip
def test_summarizer_outcomes_are_counted(
    make_gateway: GatewayFactory,
    api_key: str,
    session_id: str,
    summarizer: dict[str, str],
    outcome: str,
) -> None:
    assert _summarized(make_gateway, api_key, session_id, outcome, **summarizer) > 0


# --- server.cors --------------------------------------------------------------------------

APP = "https://app.example.com"


def test_without_origins_no_cors_headers_are_added(gateway: ServerThread) -> None:
    answer = httpx.get(gateway.url + "/healthz", headers={"Origin": APP})
    assert not [name for name in answer.headers if name.startswith("access-control-")]
    # A preflight is then an ordinary OPTIONS for the passthrough: without a key (a
    # browser's preflight never has one) it is refused, as before server.cors.
    preflight = httpx.options(
        gateway.url + "/v1/models", headers={"Origin": APP, "Access-Control-Request-Method": "GET"}
    )
    assert preflight.status_code == 401


def test_the_gateway_answers_preflight_for_an_allowed_origin(
    make_gateway: GatewayFactory,
) -> None:
    gateway = make_gateway(server={"cors": {"allow_origins": [APP]}})
    preflight = httpx.options(
        gateway.url + "/v1/chat/completions",
        headers={
            "Origin": APP,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-session-id",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == APP
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "x-session-id" in preflight.headers["access-control-allow-headers"]
    assert "access-control-allow-credentials" not in preflight.headers
    # An origin not listed: refused, with an error body like every other 4xx.
    refused = httpx.options(
        gateway.url + "/v1/models",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "cors_not_allowed"
    assert "origin" in refused.json()["error"]["message"]
    assert "access-control-allow-origin" not in refused.headers


def test_answers_to_an_allowed_origin_expose_the_memory_headers(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(server={"cors": {"allow_origins": [APP]}})
    answer = httpx.post(
        gateway.url + "/v1/chat/completions",
        headers={"Origin": APP, "Authorization": f"Bearer {api_key}", "X-Session-Id": session_id},
        json={"model": "fake-model", "messages": [{"role": "user", "content": "hello cors"}]},
        timeout=10,
    )
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == APP
    exposed = answer.headers["access-control-expose-headers"].lower()
    assert "x-memory-status" in exposed and "x-memory-receipt" in exposed
    assert "x-memory-status" in answer.headers
    other = httpx.get(gateway.url + "/healthz", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_an_upstream_cors_policy_is_not_relayed(
    make_gateway: GatewayFactory, model_server: ServerThread
) -> None:
    gateway = make_gateway(
        server={"cors": {"allow_origins": [APP]}},
        upstream={"base_url": model_server.url + "/v1"},
    )
    key = {"Authorization": f"Bearer {GOOD_KEY}"}  # forwarded: the upstream's to accept
    direct = httpx.get(model_server.url + "/v1/models", headers=key)
    assert direct.headers["access-control-allow-origin"] == "*"  # what there is to drop
    other = httpx.get(gateway.url + "/v1/models", headers={**key, "Origin": "https://evil.example"})
    assert other.status_code == 200
    assert "access-control-allow-origin" not in other.headers
    assert "access-control-allow-credentials" not in other.headers
    allowed = httpx.get(gateway.url + "/v1/models", headers={**key, "Origin": APP})
    assert allowed.headers.get_list("access-control-allow-origin") == [APP]


@pytest.mark.parametrize(
    ("cors", "problem"),
    [
        ({"allow_origins": ["*"], "allow_credentials": True}, "allow_credentials"),
        ({"allow_origins": ["app.example.com"]}, "is not an origin"),
        ({"allow_origins": ["https://app.example.com/"]}, "is not an origin"),
    ],
)
def test_a_dangerous_or_malformed_cors_policy_is_refused(
    cors: dict[str, object], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_settings({"server": {"cors": cors}}, environ={})
