"""Who may use the gateway: keys, placeholders, the admin API, users, and the passthrough.

Each finding of the red team's probe has its test here: an empty or placeholder key is
not a tenant, a key the upstream refuses reads no memory, an anonymous client is never
served on the operator's key, a gateway key names its tenant and its users, a revoked key
stops working everywhere within a second, and the passthrough never leaves its prefix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread, running_redis
from tests.support.clients import Memory, say, sdk
from tests.support.clock import SteppedClock
from tests.support.fixtures import GatewayFactory
from tests.support.waiting import wait_for

ADMIN = "admin-key-for-the-tests-0123456789"
UPSTREAM_KEY = "sk-operator-upstream-key"
PLACEHOLDERS = ["", "EMPTY", "ollama", "sk-no-key-required", "none", "lm-studio"]


def envelope(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code


def chat(gateway: ServerThread, headers: dict[str, str], **extra: str) -> httpx.Response:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}
    return httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers={**headers, **extra}, timeout=10
    )


@pytest.mark.parametrize("key", PLACEHOLDERS)
def test_a_missing_or_placeholder_key_is_refused_everywhere(
    gateway: ServerThread, fake_upstream: FakeUpstream, key: str
) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    envelope(chat(gateway, headers, **{"X-Session-Id": "s1"}), 401, "missing_api_key")
    envelope(chat(gateway, headers), 401, "missing_api_key")  # no session: the passthrough
    envelope(httpx.get(gateway.url + "/v1/models", headers=headers), 401, "missing_api_key")
    memory = httpx.get(gateway.url + "/memory/sessions", headers=headers)
    envelope(memory, 401, "missing_api_key")
    assert fake_upstream.proxied_requests() == []  # nothing reached the upstream


def test_anonymous_clients_are_served_only_when_the_operator_says_so(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, session_id: str
) -> None:
    gateway = make_gateway(auth={"allow_anonymous": True})
    answer = chat(gateway, {"Authorization": "Bearer EMPTY"}, **{"X-Session-Id": session_id})
    assert answer.status_code == 200
    # Every anonymous client is the one anonymous tenant, and knows it.
    listed = httpx.get(gateway.url + "/memory/sessions").json()["sessions"]
    assert session_id in [s["session_id"] for s in listed]


def test_the_operator_key_needs_gateway_keys() -> None:
    from gateway.config import ConfigError, parse_settings

    with pytest.raises(ConfigError, match=r"upstream.api_key is used only with auth.mode: keys"):
        parse_settings({"upstream": {"api_key": UPSTREAM_KEY}}, environ={})


def test_the_memory_api_serves_a_key_only_once_the_upstream_took_it(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    clock = SteppedClock()
    gateway = make_gateway(auth={"verify_s": 60}, clock=clock)
    memory = Memory(gateway, api_key, session_id)
    memory.add(2)  # accepted: the upstream answered GET /models with this key
    assert [r.path for r in fake_upstream.requests] == ["/v1/models"]
    fake_upstream.rejected_keys.add(api_key)  # revoked by the provider
    assert memory.http.get(memory.base).status_code == 200  # taken for auth.verify_s
    clock.advance(60)
    envelope(memory.http.get(memory.base), 401, "invalid_api_key")
    envelope(memory.http.post(memory.base + "/messages", json={"messages": []}), 401,
             "invalid_api_key")  # fmt: skip
    envelope(memory.http.post(memory.base + "/pins", json={"content": "x"}), 401, "invalid_api_key")
    memory.http.close()


def test_a_key_the_upstream_never_took_imports_nothing(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    fake_upstream.rejected_keys.add(api_key)
    memory = Memory(gateway, api_key, session_id)
    body = {"messages": [{"role": "user", "content": "my passport number is X1234567"}]}
    with redis_server.client() as client:
        before = sorted(client.keys("mg:*"))
        envelope(memory.http.post(memory.base + "/messages", json=body), 401, "invalid_api_key")
        envelope(memory.http.post(memory.base + "/pins", json={"content": "x"}), 401,
                 "invalid_api_key")  # fmt: skip
        assert sorted(client.keys("mg:*")) == before  # nothing was stored
    memory.http.close()


@pytest.fixture
def keyed(make_gateway: GatewayFactory) -> Iterator[GatewayFactory]:
    def make(**auth: Any) -> ServerThread:
        settings: dict[str, Any] = {
            "mode": "keys",
            "admin_key": ADMIN,
            "keys": [
                {"key": "gw-key-alice-0123456789", "tenant": "team-a", "users": ["alice"]},
                {"key": "gw-key-any-user-0123456", "tenant": "team-a"},
                {"key": "gw-key-another-01234567", "tenant": "team-a"},
                {"key": "gw-key-team-b-012345678", "tenant": "team-b"},
            ],
            **auth,
        }
        # The passthrough's default list, which keys mode narrows.
        upstream = {"api_key": UPSTREAM_KEY, "passthrough": None}
        return make_gateway(upstream=upstream, auth=settings)

    yield make


def test_a_gateway_key_names_its_tenant_and_the_upstream_gets_the_operator_key(
    keyed: GatewayFactory, fake_upstream: FakeUpstream, session_id: str
) -> None:
    gateway = keyed()
    say(sdk(gateway, "gw-key-any-user-0123456", session_id), "my locker code is 8841")
    assert fake_upstream.proxied_requests()[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    # The same tenant, through another of its keys; another tenant's key sees nothing.
    same = Memory(gateway, "gw-key-another-01234567", session_id)
    assert same.state()["message_count"] == 2
    other = Memory(gateway, "gw-key-team-b-012345678", session_id)
    assert other.http.get(other.base).status_code == 404
    with pytest.raises(openai.AuthenticationError):
        say(sdk(gateway, "sk-some-random-key-123456", session_id), "hi")
    same.http.close()
    other.http.close()


def test_a_key_the_gateway_issued_never_goes_upstream(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, session_id: str
) -> None:
    # Keys mode, and neither upstream.api_key nor the key's upstream_key: a local server
    # that needs no key. The issued key is the gateway's alone: the upstream gets none
    # (before, it got the client's, "mg-…" or not, sent to a third party).
    key = "gw-key-local-0123456789"
    auth = {"mode": "keys", "keys": [{"key": key, "tenant": "team-l"}]}
    gateway = make_gateway(auth=auth, upstream={"passthrough": None})
    extra = {"api-key": key, "x-api-key": key, "cookie": f"k={key}"}
    say(sdk(gateway, key, session_id, **extra), "hello")
    models = httpx.get(gateway.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert models.status_code == 200
    seen = fake_upstream.proxied_requests()[-2:]
    assert [r.path for r in seen] == ["/v1/chat/completions", "/v1/models"]
    for request in seen:
        assert "authorization" not in request.headers
        assert all(key not in value for value in request.headers.values())


def test_a_gateway_key_acts_only_for_its_users(
    keyed: GatewayFactory, fake_upstream: FakeUpstream, session_id: str
) -> None:
    gateway = keyed()
    key = {"Authorization": "Bearer gw-key-alice-0123456789"}
    ok = chat(gateway, key, **{"X-Session-Id": session_id, "X-User-Id": "alice"})
    assert ok.status_code == 200
    refused = chat(gateway, key, **{"X-Session-Id": session_id + "-b", "X-User-Id": "bob"})
    envelope(refused, 403, "user_not_allowed")
    profile = httpx.get(gateway.url + "/memory/users/bob", headers=key)
    envelope(profile, 403, "user_not_allowed")
    assert httpx.get(gateway.url + "/memory/users/alice", headers=key).status_code == 200


def test_a_key_for_any_user_cannot_move_a_session_to_another_user(
    keyed: GatewayFactory, fake_upstream: FakeUpstream, session_id: str
) -> None:
    gateway = keyed()
    key = {"Authorization": "Bearer gw-key-any-user-0123456"}
    alice = {"X-Session-Id": session_id, "X-User-Id": "alice"}
    assert chat(gateway, key, **alice).status_code == 200
    # bob's turn on alice's session: as if it did not exist (before: 200, and bob owned it).
    envelope(chat(gateway, key, **{**alice, "X-User-Id": "bob"}), 404, "not_found")
    forwarded = len(fake_upstream.proxied_requests())
    body = {"messages": [{"role": "user", "content": "bob was here"}]}
    imported = httpx.post(
        f"{gateway.url}/memory/sessions/{session_id}/messages",
        json=body,
        headers={**key, "X-User-Id": "bob"},
    )
    envelope(imported, 404, "not_found")
    assert len(fake_upstream.proxied_requests()) == forwarded  # nothing went upstream
    # alice's session is still hers, whole.
    say(sdk(gateway, "gw-key-any-user-0123456", session_id, **{"X-User-Id": "alice"}), "more")
    state = httpx.get(f"{gateway.url}/memory/sessions/{session_id}", headers=key).json()
    assert state["user_id"] == "alice" and state["message_count"] == 4


def test_a_replica_cut_off_from_the_keys_stops_taking_admin_made_ones(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Before: a key revoked during a partition kept working on the cut-off replica.
    with running_redis() as redis_server:
        configured = "gw-key-in-the-file-012345"
        auth = {
            "mode": "keys",
            "admin_key": ADMIN,
            "keys": [{"key": configured, "tenant": "team-f"}],
            "refresh_s": 0.1,
            "stale_after_s": 0.5,
        }
        gateway = make_gateway(redis_url=redis_server.url, auth=auth)
        made = httpx.post(
            gateway.url + "/admin/keys",
            json={"tenant": "team-m"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        bearer = {"Authorization": f"Bearer {made.json()['key']}"}
        wait_for(lambda: chat(gateway, bearer).status_code == 200, 2, "the key made")
        redis_server.stop()
        wait_for(lambda: chat(gateway, bearer).status_code == 503, 5, "the key refused")
        envelope(chat(gateway, bearer), 503, "keys_unavailable")
        # A key of the configuration file is no one's to revoke: still served.
        assert chat(gateway, {"Authorization": f"Bearer {configured}"}).status_code == 200


def test_keys_made_through_the_admin_api_work_and_revoked_ones_stop_on_every_replica(
    keyed: GatewayFactory, fake_upstream: FakeUpstream, session_id: str
) -> None:
    first, second = keyed(), keyed()  # two replicas on one Redis
    admin = {"Authorization": f"Bearer {ADMIN}"}
    envelope(httpx.post(first.url + "/admin/keys", json={"tenant": "team-c"}), 401,
             "invalid_admin_key")  # fmt: skip
    made = httpx.post(first.url + "/admin/keys", json={"tenant": "team-c"}, headers=admin)
    assert made.status_code == 201, made.text
    key, key_id = made.json()["key"], made.json()["id"]
    assert key.startswith("mg-") and key not in key_id
    listed = httpx.get(first.url + "/admin/keys", headers=admin).json()["keys"]
    assert {"id": key_id, "tenant": "team-c"}.items() <= next(
        k for k in listed if k["id"] == key_id
    ).items()
    assert key not in str(listed)  # never shown again
    bearer = {"Authorization": f"Bearer {key}"}
    wait_for(lambda: chat(second, bearer).status_code == 200, 2, "the second replica's new key")
    say(sdk(first, key, session_id), "hello from team c")

    assert httpx.delete(f"{first.url}/admin/keys/{key_id}", headers=admin).status_code == 204
    envelope(chat(first, bearer), 401, "invalid_api_key")
    wait_for(lambda: chat(second, bearer).status_code == 401, 1.0, "the key revoked everywhere")
    assert httpx.delete(f"{first.url}/admin/keys/{key_id}", headers=admin).status_code == 404


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"tenant": "t", "quota_mb": 1e400}', "quota_mb"),  # JSON has no Infinity to list
        (b'{"tenant": "t", "quota_mb": NaN}', None),  # not JSON at all
        (b'{"tenant": "a\\u0000b"}', "tenant"),
        (b'{"tenant": "t", "users": ["ok", "\\u001b[31m"]}', "users"),
        (b'{"tenant": "t", "name": "line\\nbreak"}', "name"),
    ],
)
def test_the_admin_api_refuses_what_it_could_not_list_or_show(
    keyed: GatewayFactory, raw: bytes, param: str | None
) -> None:
    gateway = keyed()
    admin = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
    refused = httpx.post(gateway.url + "/admin/keys", content=raw, headers=admin)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param
    listed = httpx.get(gateway.url + "/admin/keys", headers=admin)
    assert listed.status_code == 200 and all(k["tenant"] != "t" for k in listed.json()["keys"])


def test_without_an_admin_key_there_is_no_admin_api(gateway: ServerThread) -> None:
    response = httpx.get(gateway.url + "/admin/keys", headers={"Authorization": f"Bearer {ADMIN}"})
    assert response.status_code == 404


def test_an_untrusted_user_header_is_ignored(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(auth={"trust_user_header": False})
    say(sdk(gateway, api_key, session_id, **{"X-User-Id": "victim"}), "hello")
    memory = Memory(gateway, api_key, session_id)
    assert memory.state()["user_id"] is None
    envelope(memory.http.get("/memory/users/victim"), 403, "user_not_allowed")
    memory.http.close()


# --- The passthrough stays inside the upstream's prefix -----------------------------------

ESCAPES = [
    "/v1/%2e%2e/%2e%2e/%2e%2e/admin/delete-all",
    "/v1/..%2f..%2f..%2fteam-b/openai/v1/files",
    "/v1/models%3Fapi-version=evil",
    "/v1/models%23fragment",
    "/v1/files/%2E%2E/secrets",
    "/v1/files/%252e%252e/secrets",
    "/v1/files\\..\\secrets",
]


@pytest.mark.parametrize("path", ESCAPES)
@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_path_that_could_leave_the_prefix_is_refused_before_the_upstream(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, path: str, method: str
) -> None:
    # Sent as written: httpx would otherwise normalise the dots away before sending.
    request = httpx.Request(
        method, gateway.url + "/", headers={"Authorization": f"Bearer {api_key}"}
    )
    request.url = request.url.copy_with(raw_path=path.encode())
    with httpx.Client() as client:
        response = client.send(request)
    envelope(response, 400, "invalid_path")
    assert fake_upstream.proxied_requests() == []


def test_only_the_allowlisted_paths_pass_and_gateway_headers_stay_behind(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str
) -> None:
    auth = {"Authorization": f"Bearer {api_key}"}
    refused = httpx.get(gateway.url + "/v1/admin/delete-all", headers=auth)
    envelope(refused, 405, "path_not_allowed")
    gateway_headers = {"X-Session-Id": "s", "X-User-Id": "u", "X-Memory-Mode": "on"}
    echoed = httpx.get(gateway.url + "/v1/echo/files", headers={**auth, **gateway_headers})
    assert echoed.status_code == 200
    assert not {"x-session-id", "x-user-id", "x-memory-mode"} & set(echoed.json()["headers"])
    assert [r.path for r in fake_upstream.requests] == ["/v1/echo/files"]


def test_an_id_the_memory_api_could_not_reach_is_refused_by_the_proxy(
    gateway: ServerThread, api_key: str
) -> None:
    response = chat(gateway, {"Authorization": f"Bearer {api_key}"}, **{"X-Session-Id": "a/b"})
    envelope(response, 400, "invalid_header")


def test_a_tenant_at_its_quota_stores_no_more_until_it_erases(
    keyed: GatewayFactory, redis_server: RedisProcess, session_id: str
) -> None:
    quota_mb = 0.003  # about 3 KB
    gateway = keyed(
        keys=[{"key": "gw-key-quota-012345678", "tenant": "team-q", "quota_mb": quota_mb}],
    )
    key = {"Authorization": "Bearer gw-key-quota-012345678"}
    memory = Memory(gateway, "gw-key-quota-012345678", session_id)
    big = [{"role": "user", "content": "x" * 1500}, {"role": "assistant", "content": "y" * 900}]
    assert memory.http.post(memory.base + "/messages", json={"messages": big}).status_code == 200
    refused = memory.http.post(memory.base + "/messages", json={"messages": big})
    envelope(refused, 429, "insufficient_quota")
    # A turn whose new message does not fit in what is left (~600 bytes) is refused too.
    long_turn = {"model": "fake-model", "messages": [{"role": "user", "content": "z" * 1000}]}
    turn = httpx.post(
        gateway.url + "/v1/chat/completions",
        json=long_turn,
        headers={**key, "X-Session-Id": session_id},
    )
    envelope(turn, 429, "insufficient_quota")
    # Reading is still allowed; erasing frees the room.
    assert (
        chat(gateway, key, **{"X-Session-Id": session_id, "X-Memory-Mode": "read"}).status_code
        == 200
    )
    assert memory.http.delete(memory.base).status_code == 204
    assert chat(gateway, key, **{"X-Session-Id": session_id}).status_code == 200
    memory.http.close()


def test_a_key_limited_to_its_users_sees_no_other_users_sessions(
    keyed: GatewayFactory, session_id: str
) -> None:
    gateway = keyed(
        keys=[
            {"key": "gw-key-alice-0123456789", "tenant": "team-a", "users": ["alice"]},
            {"key": "gw-key-bob-01234567890", "tenant": "team-a", "users": ["bob"]},
        ]
    )
    alice = {"Authorization": "Bearer gw-key-alice-0123456789"}
    bob = {"Authorization": "Bearer gw-key-bob-01234567890"}
    said = chat(gateway, alice, **{"X-Session-Id": session_id, "X-User-Id": "alice"})
    assert said.status_code == 200
    base = f"{gateway.url}/memory/sessions/{session_id}"
    for method, path in [("GET", ""), ("GET", "/export"), ("GET", "/pins"), ("DELETE", "")]:
        envelope(httpx.request(method, base + path, headers=bob), 404, "not_found")
    preview = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    envelope(
        httpx.post(base + "/context", json=preview, headers={**bob, "X-User-Id": "bob"}),
        404,
        "not_found",
    )
    taken = chat(gateway, bob, **{"X-Session-Id": session_id, "X-User-Id": "bob"})
    envelope(taken, 404, "not_found")  # and the session stays alice's
    listed = httpx.get(gateway.url + "/memory/sessions", headers=bob).json()["sessions"]
    assert session_id not in [s["session_id"] for s in listed]
    envelope(chat(gateway, bob, **{"X-Session-Id": session_id + "-b"}), 403, "user_required")
    mine = httpx.get(base, headers=alice).json()
    assert mine["user_id"] == "alice" and mine["message_count"] == 2


def test_gateway_keys_reach_only_the_stateless_endpoints_of_the_operator_account(
    keyed: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    gateway = keyed()
    key = {"Authorization": "Bearer gw-key-any-user-0123456", "OpenAI-Organization": "org-x"}
    for method, path in [("GET", "/v1/files"), ("GET", "/v1/chat/completions"),
                         ("GET", "/v1/batches"), ("POST", "/v1/fine_tuning/jobs")]:  # fmt: skip
        envelope(httpx.request(method, gateway.url + path, headers=key), 405, "path_not_allowed")
    assert fake_upstream.proxied_requests() == []
    models = httpx.get(gateway.url + "/v1/models", headers=key)
    assert models.status_code == 200
    seen = fake_upstream.requests[-1].headers
    assert seen["authorization"] == f"Bearer {UPSTREAM_KEY}" and "openai-organization" not in seen


def test_two_authorization_headers_are_refused(gateway: ServerThread, api_key: str) -> None:
    headers = [("Authorization", f"Bearer {api_key}"), ("Authorization", "Bearer sk-other-key")]
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        headers=headers,
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    envelope(response, 400, "invalid_header")


@pytest.mark.parametrize(
    "authorization",
    ["Basic eDpzZWNyZXQtcGFzc3dvcmQ=", "basic eDpzZWNyZXQtcGFzc3dvcmQ=",
     "Digest username=x, realm=y", "Token sk-a-real-looking-key", "Basic\teDpzZWNyZXQ="],
)  # fmt: skip
@pytest.mark.parametrize("anonymous", [False, True])
def test_credentials_of_another_scheme_than_bearer_are_refused_everywhere(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, authorization: str, anonymous: bool
) -> None:
    """They were taken as a key: sent upstream as "Bearer Basic ..." and a new tenant."""
    gateway = make_gateway(auth={"allow_anonymous": anonymous})
    headers = {"Authorization": authorization}
    envelope(chat(gateway, headers, **{"X-Session-Id": "s1"}), 401, "invalid_api_key")
    envelope(chat(gateway, headers), 401, "invalid_api_key")  # no session: the passthrough
    envelope(httpx.get(gateway.url + "/v1/models", headers=headers), 401, "invalid_api_key")
    memory = httpx.get(gateway.url + "/memory/sessions", headers=headers)
    envelope(memory, 401, "invalid_api_key")
    assert memory.json()["error"]["type"] == "invalid_request_error"
    assert fake_upstream.proxied_requests() == []  # nothing reached the upstream


def test_a_key_the_upstream_refuses_in_a_chat_loses_the_memory_api_at_once(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    memory = Memory(gateway, api_key, session_id)
    memory.add(2)  # accepted, and remembered as such for auth.verify_s
    fake_upstream.rejected_keys.add(api_key)
    assert chat(gateway, {"Authorization": f"Bearer {api_key}"}).status_code == 401
    envelope(memory.http.get(memory.base), 401, "invalid_api_key")
    memory.http.close()


def test_a_session_holds_a_bounded_number_of_pins(
    gateway: ServerThread, api_key: str, session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.service import operations

    monkeypatch.setattr(operations, "MAX_PINS", 3)
    memory = Memory(gateway, api_key, session_id)
    memory.add(2)
    for n in range(3):
        assert memory.http.post(memory.base + "/pins", json={"content": f"p{n}"}).status_code == 201
    refused = memory.http.post(memory.base + "/pins", json={"content": "one more"})
    envelope(refused, 400, "too_many_pins")
    memory.http.close()
