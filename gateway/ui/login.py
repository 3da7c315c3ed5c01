"""Who may use the inspector: the holder of ``ui.admin_key``, and how a browser stays in.

A browser logs in with the key and gets a cookie holding a random token; the server keeps
only its hash, in Redis (``store.ui``: every replica knows it), until it expires
(``ui.session_s``) or the browser logs out (the server forgets it: the cookie is worth
nothing after). The cookie is HttpOnly, SameSite=Strict, limited to /ui, and Secure
behind TLS (``ui.secure_cookies``). A script may send the key as ``Authorization: Bearer
<key>`` instead. Failed logins are limited per client address (``ui.login_attempts`` a
window, counted in Redis: every replica counts alike); the right key is never locked out
(``gateway.auth.attempts`` says why that is safe).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

from gateway.auth.attempts import Attempts
from gateway.auth.identity import bearer_key
from gateway.http.server import client_address
from gateway.service.ports import LoginStore

COOKIE = "mg_inspector"
PATH = "/ui"


class AdminAuth:
    """The inspector's gate: the admin key, or a browser's login cookie."""

    def __init__(
        self,
        admin_key: str,
        store: LoginStore,
        *,
        session_s: float,
        secure_cookies: bool | None,
        attempts: int,
        window_s: float,
    ) -> None:
        self._digest = _digest(admin_key)
        self.store = store
        self.session_s = session_s
        self.secure_cookies = secure_cookies
        self.attempts = Attempts(store, limit=attempts, window_s=window_s, what="failed logins")

    def is_key(self, candidate: str) -> bool:
        # Digests of equal length: compare_digest would tell the key's length by its time.
        return hmac.compare_digest(_digest(candidate), self._digest)

    def by_key(self, request: Request) -> bool:
        """A script's request, carrying the key itself (no cookie: nothing to forge)."""
        return "authorization" in request.headers and self.is_key(bearer_key(request.headers))

    async def allows(self, request: Request) -> bool:
        if "authorization" in request.headers:
            # A script's key is a login attempt like the form's: limited alike (past the
            # limit, a wrong one raises a 429).
            if self.by_key(request):
                return True
            await self.wrong_key(request)
            return False
        token = request.cookies.get(COOKIE, "")
        if not token:
            return False
        return await self.store.is_open(token)

    async def wrong_key(self, request: Request) -> None:
        """Count a failed login of this client address; past the limit, raise
        ``TooManyRequests`` (429, Retry-After)."""
        await self.attempts.wrong_key(_address(request))

    async def log_in(self, response: Response, request: Request) -> None:
        token = secrets.token_urlsafe(32)
        ttl = int(self.session_s)
        await self.store.open(token, ttl)
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
            await self.store.close(token)
        response.delete_cookie(
            COOKIE, path=PATH, httponly=True, samesite="strict", secure=self._secure(request)
        )

    def _secure(self, request: Request) -> bool:
        if self.secure_cookies is not None:
            return self.secure_cookies
        return request.url.scheme == "https"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _address(request: Request) -> str:
    return client_address(request.client.host) if request.client else "unknown"
