"""``server.cors``: the gateway answers browsers' cross-origin checks itself.

Starlette's ``CORSMiddleware`` (a kept library) does the protocol; the gateway adds two
things: its own policy is the only one on an answer (an upstream's Access-Control-*
headers are dropped: they describe the upstream's policy, not the gateway's), and a
refused preflight is an OpenAI-style error body like every other 4xx.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Send

from gateway.config import CorsConfig
from gateway.errors import error_body


def cors_middleware(config: CorsConfig) -> Middleware:
    return Middleware(
        GatewayCORS,
        allow_origins=config.allow_origins,
        allow_methods=config.allow_methods,
        allow_headers=config.allow_headers,
        allow_credentials=config.allow_credentials,
        expose_headers=config.expose_headers,
        max_age=config.max_age_s,
    )


class GatewayCORS(CORSMiddleware):
    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        # "Disallowed CORS origin, method": which part of the preflight was refused.
        refused = bytes(response.body).decode()
        headers = {
            name: value
            for name, value in response.headers.items()
            if name.lower().startswith("access-control-") or name.lower() == "vary"
        }
        body = error_body(refused, "invalid_request_error", code="cors_not_allowed")
        return JSONResponse(body, status_code=400, headers=headers)

    async def send(self, message: Message, send: Send, request_headers: Headers) -> None:
        if message["type"] == "http.response.start" and request_headers.get("origin"):
            message["headers"] = [
                (name, value)
                for name, value in message.get("headers", [])
                if not name.lower().startswith(b"access-control-")
            ]
        await super().send(message, send, request_headers)
