"""The inspector's logins in Redis (every replica knows them): a session by its cookie's
hash until it expires, and the failed logins of a client address in a window. Who may
log in, and the cookie, are ``gateway.ui.login``'s."""

from __future__ import annotations

import hashlib

from gateway.store.calls import StoreCalls
from gateway.store.keys import ui_login_attempts, ui_session


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class InspectorLogins:
    """Login sessions and failed attempts; only hashes of cookies and addresses are kept."""

    def __init__(self, calls: StoreCalls) -> None:
        self._calls = calls

    async def open(self, token: str, ttl_s: int) -> None:
        await self._calls.execute(
            [("SET", ui_session(_digest(token)), 1, "EX", ttl_s)], op="ui_login"
        )

    async def is_open(self, token: str) -> bool:
        (found,) = await self._calls.execute(
            [("EXISTS", ui_session(_digest(token)))], op="ui_session"
        )
        return bool(found)

    async def close(self, token: str) -> None:
        await self._calls.execute([("DEL", ui_session(_digest(token)))], op="ui_logout")

    async def failed(self, address: str, window_s: float) -> tuple[int, float]:
        """One more failed login of ``address``: its failures in its window (which starts
        at its first failure: INCR keeps the key's expiry), this one included, and the
        seconds left in it. Not EXPIRE ... NX: Redis 6.2, the embedded server's, refuses
        the NX."""
        key = ui_login_attempts(_digest(address)[:32])
        window_ms = max(1, int(window_s * 1000))
        commands = [("SET", key, 0, "PX", window_ms, "NX"), ("INCR", key), ("PTTL", key)]
        _, count, left_ms = await self._calls.execute(commands, op="ui_attempts")
        if left_ms == -1:
            # The window ended between the SET and the INCR, which made the key anew
            # without an expiry: it would have counted forever.
            await self._calls.execute([("PEXPIRE", key, window_ms)], op="ui_attempts")
            left_ms = window_ms
        return int(count), max(0, int(left_ms)) / 1000
