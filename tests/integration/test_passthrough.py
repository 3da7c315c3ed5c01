"""Every other /v1 path is proxied untouched; cookies and redirects stay the client's business."""

from __future__ import annotations

import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import ServerThread


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
def test_method_query_body_and_status_pass_untouched(
    gateway: ServerThread, fake_upstream: FakeUpstream, method: str
) -> None:
    body = b'{"input": ["a", "b"],  "model": "emb"}' if method != "GET" else b""
    response = httpx.request(
        method,
        gateway.url + "/v1/echo/embeddings?status=201&b=%2F+x&a=1",
        content=body,
        headers={
            "Authorization": "Bearer sk-pass-client-key",
            "X-Stainless-Lang": "kept",
            "X-Custom": "not on the allowlist",
        },
    )
    assert response.status_code == 201
    echoed = response.json()
    assert echoed["method"] == method
    assert echoed["path"] == "/v1/echo/embeddings"
    assert echoed["query"] == "status=201&b=%2F+x&a=1"
    assert echoed["body"] == body.decode()
    assert echoed["headers"]["x-stainless-lang"] == "kept"
    assert "x-custom" not in echoed["headers"]
    assert echoed["headers"]["authorization"] == "Bearer sk-pass-client-key"
    assert response.headers["x-upstream"] == "echo"
    assert "keep-alive" not in response.headers  # hop-by-hop stays on its hop
    # A request without a body goes without one: no empty chunked body on a GET (an
    # upstream that reads none kept its terminator on the connection, failing the next).
    if method == "GET":
        assert "transfer-encoding" not in echoed["headers"]
        assert echoed["headers"].get("content-length") in (None, "0")


KEY = {"Authorization": "Bearer sk-pass-client-key"}


def test_models_list(gateway: ServerThread) -> None:
    response = httpx.get(gateway.url + "/v1/models", headers=KEY)
    assert response.status_code == 200
    assert response.json()["data"][0]["id"] == "fake-model"


def test_redirects_are_returned_not_followed(
    gateway: ServerThread, fake_upstream: FakeUpstream
) -> None:
    response = httpx.get(gateway.url + "/v1/redirect", headers=KEY)
    assert response.status_code == 302
    assert response.headers["location"] == "/v1/models"
    # (The upstream is the suite's: a late request of an earlier test's may land here.)
    paths = [r.path for r in fake_upstream.requests]
    assert paths.count("/v1/redirect") == 1
    assert "/v1/models" not in paths  # the redirect was not followed


def test_upstream_cookies_are_never_replayed_for_another_client(
    gateway: ServerThread, fake_upstream: FakeUpstream
) -> None:
    first = httpx.get(gateway.url + "/v1/echo/a", headers=KEY)
    assert "upstream-session" in first.headers["set-cookie"]  # the client that caused it sees it
    httpx.get(gateway.url + "/v1/echo/b", headers=KEY)
    assert "cookie" not in fake_upstream.requests[-1].headers


def test_unknown_path_outside_v1_is_an_openai_style_404(gateway: ServerThread) -> None:
    response = httpx.get(gateway.url + "/nope")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


def test_healthz(gateway: ServerThread) -> None:
    assert httpx.get(gateway.url + "/healthz").json() == {"status": "ok", "redis": "ok"}
