"""Who may use the inspector: the holder of ``ui.admin_key``.

A browser logs in once with the key and gets a cookie holding a keyed hash of it (not
the key): the cookie is HttpOnly, SameSite=Strict (no other site can make the browser
send it: the inspector's forms need no CSRF token) and limited to /ui. A script may send
the key as ``Authorization: Bearer <key>`` instead. Changing the key logs everyone out.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.requests import Request
from starlette.responses import Response

from gateway.identity import bearer_key

COOKIE = "mg_inspector"
PATH = "/ui"
_PURPOSE = b"memory-gateway inspector session"


class AdminAuth:
    def __init__(self, admin_key: str) -> None:
        self._key = admin_key.encode()
        self._token = hmac.new(self._key, _PURPOSE, hashlib.sha256).hexdigest()

    def is_key(self, candidate: str) -> bool:
        return hmac.compare_digest(candidate.encode(), self._key)

    def allows(self, request: Request) -> bool:
        cookie = request.cookies.get(COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self._token.encode()):
            return True
        return "authorization" in request.headers and self.is_key(bearer_key(request.headers))

    def log_in(self, response: Response, request: Request) -> None:
        response.set_cookie(
            COOKIE,
            self._token,
            path=PATH,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    @staticmethod
    def log_out(response: Response) -> None:
        response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict")
