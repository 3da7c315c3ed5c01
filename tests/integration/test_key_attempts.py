"""Wrong keys per client address, at the inspector's login and the admin API (issue 32).

Ten wrong guesses from one address used to lock the right key out too, for everyone behind
that address (a NAT, a company proxy), and the admin API counted nothing. Now a wrong key
past the limit is answered 429 with Retry-After, and the right key always gets in. Each
test's client binds its own loopback address (127.0.0.x), so no other test's guesses count
against it, and a second address shows the lockout is that address's alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from devsupport.servers import RedisProcess, ServerThread
from tests.support.clock import SteppedClock
from tests.support.fixtures import GatewayFactory

UI_KEY = "inspector-admin-key-0123456789"
ADMIN = "admin-key-for-the-tests-0123456789"
WRONG = "wrong-key-" * 3


def client(gateway: ServerThread, address: str, **headers: str) -> httpx.Client:
    """A client whose connections come from ``address`` (any 127.0.0.0/8 is loopback)."""
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=gateway.url, transport=transport, headers=headers, timeout=10)


@pytest.fixture
def clean_logins(redis_server: RedisProcess) -> Iterator[None]:
    def clean() -> None:
        with redis_server.client() as redis:
            for key in redis.scan_iter("mg:{ui}:login:*"):
                redis.delete(key)

    clean()
    yield
    clean()


def retry_after(response: httpx.Response, at_most: float) -> None:
    assert response.status_code == 429, response.text
    assert 1 <= int(response.headers["retry-after"]) <= at_most


@pytest.mark.usefixtures("clean_logins")
def test_ten_wrong_inspector_logins_stop_wrong_guesses_but_never_the_right_key(
    make_gateway: GatewayFactory,
) -> None:
    gateway = make_gateway(ui={"enabled": True, "admin_key": UI_KEY})  # 10 per 300 s
    wrong, right = {"key": WRONG}, {"key": UI_KEY, "next": "/ui"}
    with client(gateway, "127.0.0.21", Origin=gateway.url) as guesser:
        codes = [guesser.post("/ui/login", data=wrong).status_code for _ in range(10)]
        assert codes == [401] * 10
        # The 11th wrong guess is refused without a word on the key...
        refused = guesser.post("/ui/login", data=wrong)
        retry_after(refused, 300)
        assert "too many failed logins" in refused.text
        # ...a script's wrong key alike (not a redirect to a login it could not pass)...
        script = guesser.get("/ui", headers={"Authorization": f"Bearer {WRONG}"})
        retry_after(script, 300)
        # ...while the right key, from the same address, logs in at once: by the form,
        logged_in = guesser.post("/ui/login", data=right)
        assert logged_in.status_code == 303, logged_in.text
        assert guesser.get("/ui").status_code == 200
        # and by a script's Authorization.
        bearer = {"Authorization": f"Bearer {UI_KEY}"}
        assert guesser.get("/ui", headers=bearer).status_code == 200
        # A right login does not reopen the guessing.
        retry_after(guesser.post("/ui/login", data=wrong), 300)
    with client(gateway, "127.0.0.22", Origin=gateway.url) as neighbour:
        # Another address has its own count.
        assert neighbour.post("/ui/login", data=wrong).status_code == 401


def test_wrong_admin_keys_are_limited_per_address_and_the_right_one_always_works(
    make_gateway: GatewayFactory,
) -> None:
    clock = SteppedClock()
    # The defaults: auth.admin_attempts 10 per auth.admin_window_s 300.
    gateway = make_gateway(auth={"mode": "keys", "admin_key": ADMIN}, clock=clock)
    wrong, right = {"Authorization": f"Bearer {WRONG}"}, {"Authorization": f"Bearer {ADMIN}"}
    with client(gateway, "127.0.0.31") as guesser:
        for _ in range(10):
            refused = guesser.get("/admin/keys", headers=wrong)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "invalid_admin_key"
        # Past the limit, every method, in OpenAI's envelope with Retry-After.
        for method, path in [("GET", "/admin/keys"), ("POST", "/admin/keys"),
                             ("DELETE", "/admin/keys/" + "0" * 32)]:  # fmt: skip
            locked = guesser.request(method, path, headers=wrong, json={"tenant": "t"})
            retry_after(locked, 300)
            error = locked.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "rate_limit_exceeded"
            assert "wrong admin keys" in error["message"]
        # No key at all is a wrong key too.
        retry_after(guesser.get("/admin/keys"), 300)
        # The right key is never locked out, from the same address.
        assert guesser.get("/admin/keys", headers=right).status_code == 200
        made = guesser.post("/admin/keys", headers=right, json={"tenant": "team-z"})
        assert made.status_code == 201, made.text
    with client(gateway, "127.0.0.32") as neighbour:
        assert neighbour.get("/admin/keys", headers=wrong).status_code == 401
    clock.advance(301)  # the window is over: the address may guess again
    with client(gateway, "127.0.0.31") as guesser:
        assert guesser.get("/admin/keys", headers=wrong).status_code == 401
