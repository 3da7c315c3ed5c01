"""The operator commands' client of a running gateway's memory API.

A synchronous httpx client: the commands run one request at a time, in a terminal. (The
gateway itself talks to the upstream with aiohttp, in ``upstream/client.py``; this module
is the only other HTTP client, and it is never imported by the server.)

Where the gateway is, and which key to use, is resolved in this order:

* ``--url``; else ``$MEMORY_GATEWAY_URL``; else ``http://<server.host>:<server.port>`` of
  ``--config`` when that file exists; else ``http://127.0.0.1:8080``.
* ``--api-key``; else ``$MEMORY_GATEWAY_API_KEY``; else ``$OPENAI_API_KEY``. The gateway
  derives the tenant from it, as for the proxy. The key is never printed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import yaml

from gateway.commands.failures import CommandError, UsageError
from gateway.config import ConfigError, parse_settings

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "MEMORY_GATEWAY_URL"
KEY_ENVS = ("MEMORY_GATEWAY_API_KEY", "OPENAI_API_KEY")


class Unreachable(CommandError):
    """Nothing answered at the gateway's address."""

    def __init__(self, url: str) -> None:
        super().__init__(f"cannot reach the gateway at {url} — is `memory-gateway serve` running?")


class ApiError(CommandError):
    """The gateway answered with an error (OpenAI's envelope, when it sent one)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def __str__(self) -> str:
        return f"{self.message} ({self.type}, HTTP {self.status})"

    def for_command(self) -> ApiError:
        """The error as a command's user reads it: a refused key is given with ``--api-key``
        or the environment, not in the ``Authorization`` header the gateway's 401 speaks
        of (the command writes that header)."""
        if self.status != 401:
            return self
        where = f"pass --api-key KEY, or set {KEY_ENVS[0]} (or {KEY_ENVS[1]})"
        if self.code == "missing_api_key":
            message = f"the gateway needs an API key: {where}"
        else:
            message = f"{self.message}; {where}"
        return ApiError(self.status, message, self.type, self.param, self.code)

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        try:
            error = response.json()["error"]
            return cls(
                response.status_code,
                str(error.get("message") or response.reason_phrase),
                str(error.get("type") or "error"),
                error.get("param") if isinstance(error.get("param"), str) else None,
                error.get("code") if isinstance(error.get("code"), str) else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            text = response.text.strip()[:200] or response.reason_phrase
            return cls(response.status_code, text, "http_error")


def gateway_url(url: str | None, config: str, environ: dict[str, str] | None = None) -> str:
    """Where the gateway listens (see the module's docstring for the order)."""
    env = dict(os.environ) if environ is None else environ
    if url:
        return url.rstrip("/")
    if env.get(URL_ENV):
        return env[URL_ENV].rstrip("/")
    path = Path(config)
    if not path.is_file():
        return DEFAULT_URL
    # Only the server section is read: the rest may need variables or files that only
    # the gateway's own environment has.
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        server = data.get("server") if isinstance(data, dict) else None
        settings = parse_settings({"server": server} if server else {}, env)
    except (OSError, yaml.YAMLError, ConfigError) as error:
        raise UsageError(f"cannot read the gateway's address from {config}: {error}") from None
    host = settings.server.host
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: this machine reaches it locally
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.server.port}"


def api_key(given: str | None, environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    if given:
        return given
    return next((env[name] for name in KEY_ENVS if env.get(name)), None)


def session_path(session_id: str, *rest: str) -> str:
    return "/".join(["/memory/sessions", quote(session_id, safe=""), *rest])


class MemoryClient:
    """The memory API of one gateway, as one tenant (and, for an import, one user)."""

    def __init__(
        self, url: str, key: str | None, *, timeout: float = 60.0, user: str | None = None
    ) -> None:
        headers: dict[bytes, bytes] = {}
        if key:
            headers[b"Authorization"] = f"Bearer {key}".encode()
        if user:
            headers[b"X-User-Id"] = user.encode("utf-8")  # the gateway decodes UTF-8
        self.url = url
        self.timeout = timeout
        self.http = httpx.Client(base_url=url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.ConnectError:
            raise Unreachable(self.url) from None
        except httpx.TimeoutException:
            raise CommandError(
                f"the gateway at {self.url} did not answer within {self.timeout:g} s"
            ) from None
        except httpx.HTTPError as error:
            raise CommandError(f"request to the gateway at {self.url} failed: {error}") from None
        if not response.is_success:
            raise ApiError.from_response(response).for_command()
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self.request(method, path, **kwargs)
        try:
            data = response.json()
        except ValueError:
            raise CommandError(f"{self.url}{path} did not answer with JSON") from None
        if not isinstance(data, dict):
            raise CommandError(f"{self.url}{path} did not answer with a JSON object")
        return data

    def session(self, session_id: str) -> dict[str, Any]:
        return self._json("GET", session_path(session_id))

    def message_count(self, session_id: str) -> int:
        """The session's message count; 0 for a session that does not exist (yet)."""
        return self.held(session_id)[0]

    def held(self, session_id: str) -> tuple[int, str | None]:
        """The session's message count and its user; (0, None) for a session that does
        not exist (yet), or that this key may not see."""
        try:
            session = self.session(session_id)
        except ApiError as error:
            if error.status == 404 and error.param == "session_id":
                return 0, None
            raise
        user = session.get("user_id")
        return int(session["message_count"]), user if isinstance(user, str) else None

    def import_messages(self, session_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return self._json("POST", session_path(session_id, "messages"), json={"messages": messages})

    def export(self, session_id: str, fmt: str) -> bytes:
        path = session_path(session_id, "export")
        return self.request("GET", path, params={"format": fmt}).content

    def receipts(self, session_id: str) -> list[dict[str, Any]] | None:
        """The session's receipts, newest first; None from a gateway without the endpoint."""
        try:
            data = self._json("GET", session_path(session_id, "receipts"))
        except ApiError as error:
            if error.status in (404, 405):
                return None
            raise
        receipts = data.get("receipts")
        return receipts if isinstance(receipts, list) else []

    def facts(self, session_id: str) -> list[dict[str, Any]]:
        facts = self._json("GET", session_path(session_id, "facts")).get("facts")
        return facts if isinstance(facts, list) else []

    def correct_fact(self, session_id: str, fact_id: str, text: str) -> dict[str, Any]:
        path = session_path(session_id, "facts", quote(fact_id, safe=""))
        return self._json("PATCH", path, json={"text": text})

    def delete_fact(self, session_id: str, fact_id: str) -> None:
        self.request("DELETE", session_path(session_id, "facts", quote(fact_id, safe="")))

    def search(
        self, query: str, *, session: str | None, user: str | None, limit: int | None
    ) -> list[dict[str, Any]]:
        """A session's memories for ``query`` (``session``), or a user's (``user``)."""
        if session is not None:
            path = session_path(session, "search")
        else:
            path = "/memory/users/" + quote(user or "", safe="") + "/search"
        body: dict[str, Any] = {"query": query}
        if limit is not None:
            body["limit"] = limit
        results = self._json("POST", path, json=body).get("results")
        return results if isinstance(results, list) else []

    def sessions(self, search: str | None, limit: int | None) -> list[dict[str, Any]]:
        params: dict[str, str | int] = {}
        if search:
            params["search"] = search
        if limit is not None:
            params["limit"] = limit
        data = self._json("GET", "/memory/sessions", params=params)
        sessions = data.get("sessions")
        return sessions if isinstance(sessions, list) else []
