"""Who may use the inspector: the holder of ``ui.admin_key``, and how a browser stays in.

A browser logs in with the key and gets a cookie holding a random token; the server keeps
only its hash, in Redis (so every replica knows it), until it expires (``ui.session_s``)
or the browser logs out (the server forgets it: the cookie is worth nothing after). The
cookie is HttpOnly, SameSite=Strict, limited to /ui, and Secure behind TLS
(``ui.secure_cookies``). A script may send the key as ``Authorization: Bearer <key>``
instead. Failed logins are limited per client address (``ui.login_attempts`` a window).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

from gateway.auth.identity import bearer_key
from gateway.store.redis_store import RedisStore

COOKIE = "mg_inspector"
PATH = "/ui"
_SESSION = "mg:{ui}:session:"
_ATTEMPTS = "mg:{ui}:login:"


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class AdminAuth:
    def __init__(
        self,
        admin_key: str,
        store: RedisStore,
        *,
        session_s: float,
        secure_cookies: bool | None,
        attempts: int,
        window_s: float,
    ) -> None:
        self._key = admin_key.encode()
        self.store = store
        self.session_s = session_s
        self.secure_cookies = secure_cookies
        self.attempts = attempts
        self.window_s = window_s

    def is_key(self, candidate: str) -> bool:
        return hmac.compare_digest(candidate.encode(), self._key)

    def by_key(self, request: Request) -> bool:
        """A script's request, carrying the key itself (no cookie: nothing to forge)."""
        return "authorization" in request.headers and self.is_key(bearer_key(request.headers))

    async def allows(self, request: Request) -> bool:
        if "authorization" in request.headers:
            # A script's key is a login attempt like the form's: limited alike.
            if await self.too_many_attempts(request):
                return False
            if self.by_key(request):
                return True
            await self.failed(request)
            return False
        token = request.cookies.get(COOKIE, "")
        if not token:
            return False
        (found,) = await self.store.execute(
            [("EXISTS", _SESSION + _digest(token))], op="ui_session"
        )
        return bool(found)

    async def too_many_attempts(self, request: Request) -> bool:
        (raw,) = await self.store.execute([("GET", self._attempts_key(request))], op="ui_attempts")
        return int(raw or 0) >= self.attempts

    async def failed(self, request: Request) -> None:
        """Count a failed login of this client address (for ``window_s``)."""
        key = self._attempts_key(request)
        # The window starts at the first failure (INCR keeps the key's expiry). Not
        # EXPIRE ... NX: Redis 6.2, the embedded server's, refuses the NX.
        window_ms = max(1, int(self.window_s * 1000))
        commands = [("SET", key, 0, "PX", window_ms, "NX"), ("INCR", key)]
        await self.store.execute(commands, op="ui_attempts")

    async def log_in(self, response: Response, request: Request) -> None:
        token = secrets.token_urlsafe(32)
        ttl = int(self.session_s)
        await self.store.execute([("SET", _SESSION + _digest(token), 1, "EX", ttl)], op="ui_login")
        response.set_cookie(
            COOKIE,
            token,
            max_age=ttl,
            path=PATH,
            httponly=True,
            samesite="strict",
            secure=self._secure(request),
        )

    async def log_out(self, response: Response, request: Request) -> None:
        token = request.cookies.get(COOKIE, "")
        if token:
            await self.store.execute([("DEL", _SESSION + _digest(token))], op="ui_logout")
        response.delete_cookie(
            COOKIE, path=PATH, httponly=True, samesite="strict", secure=self._secure(request)
        )

    def _secure(self, request: Request) -> bool:
        if self.secure_cookies is not None:
            return self.secure_cookies
        return request.url.scheme == "https"

    @staticmethod
    def _attempts_key(request: Request) -> str:
        address = request.client.host if request.client else "unknown"
        return _ATTEMPTS + _digest(address)[:32]
