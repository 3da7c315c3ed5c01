"""The inspector's pages and actions (``ui.enabled``).

Server-rendered HTML (Jinja2, autoescaped), plain forms posted back (POST, then a
redirect to the page: a reload never repeats an action). Ids travel in the query
string, not the path: a session id may hold any printable character, "/" included.
Everything it shows or changes goes through ``SessionOperations``, as the memory API does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.auth.identity import check_id
from gateway.config import UIConfig
from gateway.errors import GatewayError, InvalidRequest
from gateway.memory import durable
from gateway.routes.relay import read_body
from gateway.service.facts import FactEdits, fact_view
from gateway.service.operations import SessionOperations
from gateway.store.keys import SessionKeys
from gateway.store.redis_store import StoreUnavailable
from gateway.ui import present, views
from gateway.ui.login import AdminAuth
from gateway.ui.tenant_labels import TenantLabel, TenantLabels, unnamed

# What a form may post: a pin's content is the largest field.
MAX_FORM_BYTES = 64 * 1024
_TENANT = re.compile(r"[0-9a-f]{32}")

Handler = Callable[[Request], Awaitable[Response]]

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("gateway.ui", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,  # a template's typo fails its test, not silently
)
_templates.filters.update(
    human_bytes=present.human_bytes,
    iso=views.iso,
    index_range=views.index_range,
    message_text=present.message_text,
)


def _render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(_templates.get_template(name).render(**context), status_code=status)


def _tenant(value: str | None) -> str:
    if value is None or not _TENANT.fullmatch(value):
        raise InvalidRequest("tenant must be a tenant id (32 hex digits)", param="tenant")
    return value


def _session(params: Any) -> SessionKeys:
    sid = params.get("id")
    if sid is None:
        raise InvalidRequest("id (the session id) is required", param="id")
    return SessionKeys(_tenant(params.get("tenant")), check_id(sid, "session_id"))


def _session_url(keys: SessionKeys, **extra: str) -> str:
    return "/ui/session?" + urlencode({"tenant": keys.tenant, "id": keys.session_id, **extra})


def _importance(raw: str | None) -> float | None:
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise InvalidRequest("importance must be a number from 0 to 1", param="importance")
    return value


def _content(raw: str | None, required: bool = True) -> str | None:
    text = (raw or "").strip()
    if not text:
        if required:
            raise InvalidRequest("a pin needs some content", param="content")
        return None
    if len(text) > 4000:
        raise InvalidRequest("a pin holds at most 4,000 characters", param="content")
    return text


def _fact_text(raw: str | None) -> str:
    """A fact's new wording, refused as the memory API's PATCH refuses it."""
    text = (raw or "").strip()
    if not text:
        raise InvalidRequest("a fact needs some text", param="text")
    if len(text) > durable.MAX_FACT_CHARS:
        limit = durable.MAX_FACT_CHARS
        raise InvalidRequest(f"a fact holds at most {limit} characters", param="text")
    return text


# Sent with every page: no script at all, styles only its own, never in a frame.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def _same_origin(request: Request) -> bool:
    """A state-changing request must say where it comes from, and come from here (the
    same scheme and host): a form of another site, or a request that hides its origin,
    changes nothing."""
    origin = urlsplit(request.headers.get("origin", ""))
    return (origin.scheme, origin.netloc) == (request.url.scheme, request.headers.get("host"))


class Inspector:
    def __init__(
        self,
        operations: SessionOperations,
        config: UIConfig,
        clock: Callable[[], float] = time.time,
        labels: TenantLabels | None = None,
    ) -> None:
        assert config.admin_key is not None  # the config refuses /ui without one
        self.ops = operations
        self.facts = FactEdits(operations.store, operations.clock)
        self.labels = labels
        self.auth = AdminAuth(
            config.admin_key,
            operations.store.ui,
            session_s=config.session_s,
            secure_cookies=config.secure_cookies,
            attempts=config.login_attempts,
            window_s=config.login_window_s,
        )
        self.clock = clock

    def routes(self) -> list[Route]:
        page, action = self._page, self._action
        return [
            Route("/ui", page(self.tenants), methods=["GET"]),
            Route("/ui/login", self.login_form, methods=["GET"]),
            Route("/ui/login", self.login, methods=["POST"]),
            Route("/ui/logout", self.logout, methods=["POST"]),
            Route("/ui/sessions", page(self.sessions), methods=["GET"]),
            Route("/ui/session", page(self.session), methods=["GET"]),
            Route("/ui/session/export", page(self.export), methods=["GET"]),
            Route("/ui/session/erase", page(self.erase_form), methods=["GET"]),
            Route("/ui/session/erase", action(self.erase), methods=["POST"]),
            Route("/ui/session/end", action(self.end), methods=["POST"]),
            Route("/ui/session/pins", action(self.add_pin), methods=["POST"]),
            Route("/ui/session/pins/edit", action(self.edit_pin), methods=["POST"]),
            Route("/ui/session/pins/delete", action(self.delete_pin), methods=["POST"]),
            Route("/ui/session/facts/edit", action(self.correct_fact), methods=["POST"]),
            Route("/ui/session/facts/delete", action(self.delete_fact), methods=["POST"]),
        ]

    # --- access and errors ---

    def _page(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            async def page(request: Request) -> Response:
                if not await self.auth.allows(request):
                    query = f"?{request.url.query}" if request.url.query else ""
                    target = request.url.path + query
                    return RedirectResponse("/ui/login?" + urlencode({"next": target}), 303)
                return await handler(request)

            return await self._shown(page, request)

        return guarded

    def _action(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            async def action(request: Request) -> Response:
                if not self.auth.by_key(request) and not _same_origin(request):
                    # Beside the SameSite cookie: a form posted from elsewhere, or hiding
                    # where it comes from, changes nothing.
                    return _render("error.html", 403, message="cross-site form refused", back="/ui")
                if not await self.auth.allows(request):
                    return _render("error.html", 401, message="log in first", back="/ui/login")
                return await handler(request)

            return await self._shown(action, request)

        return guarded

    async def _shown(self, handler: Handler, request: Request) -> Response:
        try:
            response = await handler(request)
        except GatewayError as error:
            response = _render("error.html", error.status, message=str(error), back="/ui")
            response.headers.update(error.response_headers())  # a 429's Retry-After
        except StoreUnavailable:
            message = "the memory store is unavailable; try again shortly"
            response = _render("error.html", 503, message=message, back=str(request.url))
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _form(self, request: Request) -> dict[str, str]:
        body = await read_body(request, MAX_FORM_BYTES)
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        return {name: values[-1] for name, values in fields.items()}

    # --- log in and out ---

    async def login_form(self, request: Request) -> Response:
        async def form(request: Request) -> Response:
            target = request.query_params.get("next", "/ui")
            return _render("login.html", next=target, failed=False)

        return await self._shown(form, request)

    async def login(self, request: Request) -> Response:
        return await self._shown(self._login, request)

    async def _login(self, request: Request) -> Response:
        if not _same_origin(request):
            return _render("error.html", 403, message="cross-site form refused", back="/ui")
        form = await self._form(request)
        target = form.get("next", "/ui")
        if not target.startswith("/ui") or target.startswith("/ui/login"):
            target = "/ui"  # never an open redirect
        if not self.auth.is_key(form.get("key", "")):
            # Past the limit this raises: 429 with Retry-After. The right key, checked
            # first, always gets in (gateway.auth.attempts).
            await self.auth.wrong_key(request)
            return _render("login.html", 401, next=target, failed=True)
        response = RedirectResponse(target, 303)
        await self.auth.log_in(response, request)
        return response

    async def logout(self, request: Request) -> Response:
        return await self._shown(self._logout, request)

    async def _logout(self, request: Request) -> Response:
        if not _same_origin(request):
            return _render("error.html", 403, message="cross-site form refused", back="/ui")
        response = RedirectResponse("/ui/login", 303)
        await self.auth.log_out(response, request)
        return response

    async def _label(self, tenant: str) -> TenantLabel:
        return await self.labels.label(tenant) if self.labels is not None else unnamed(tenant)

    # --- pages ---

    async def tenants(self, request: Request) -> Response:
        now = self.clock()
        found = await self.ops.tenants()
        named = await self.labels.labels() if self.labels is not None else {}
        tenants = [
            {"id": t, "label": named.get(t) or unnamed(t), "ago": present.ago(now - ts),
             "updated": ts}
            for t, ts in found
        ]  # fmt: skip
        return _render("tenants.html", tenants=tenants)

    async def sessions(self, request: Request) -> Response:
        tenant = _tenant(request.query_params.get("tenant"))
        search = request.query_params.get("q", "").strip() or None
        if search is not None:
            check_id(search, "q")
        now = self.clock()
        listed = await self.ops.sessions(tenant, search=search, limit=200)
        rows = [{**s.to_data(), "ago": present.ago(now - s.updated)} for s in listed]
        label = await self._label(tenant)
        return _render(
            "sessions.html", tenant=tenant, label=label, search=search or "", sessions=rows,
            done=request.query_params.get("done"),
        )  # fmt: skip

    async def session(self, request: Request) -> Response:
        keys = _session(request.query_params)
        state = await self.ops.existing(keys)
        view = self.ops.view(keys, state)
        receipts = await self.ops.receipts(keys)
        last = receipts[0]["receipt"] if receipts else None
        used = {
            "summaries": {(s["start"], s["end"]) for s in last["summaries"]} if last else set(),
            "pins": set(last["pins"]) if last else set(),
        }
        cache = [views.cache_use(r) for r in receipts]
        return _render(
            "session.html",
            keys=keys,
            view=view,
            # With their ids, for the forms (the view is the memory API's, which has none).
            facts=[fact_view(keys.session_id, f) for f in state.tiers.facts],
            receipts=receipts,
            cache=cache,
            hit_rate=views.hit_rate(cache),
            last=last,
            bar=views.budget_bar(last) if last else [],
            recalled=await self.ops.recalled(keys, last) if last else [],
            used=used,
            window_tags=views.window_tags(view["window"], last) if last else {},
            label=await self._label(keys.tenant),
            done=request.query_params.get("done"),
            session_url=_session_url(keys),
            query=urlencode({"tenant": keys.tenant, "id": keys.session_id}),
        )

    async def export(self, request: Request) -> Response:
        keys = _session(request.query_params)
        fmt = request.query_params.get("format", "json")
        if fmt == "markdown":
            text, media, ext = await self.ops.export_markdown(keys), "text/markdown", "md"
        elif fmt == "json":
            text, media, ext = await self.ops.export_json(keys), "application/json", "json"
        else:
            raise InvalidRequest("format must be json or markdown", param="format")
        disposition = f'attachment; filename="session.{ext}"'
        return Response(
            text, media_type=f"{media}; charset=utf-8",
            headers={"content-disposition": disposition},
        )  # fmt: skip

    async def erase_form(self, request: Request) -> Response:
        keys = _session(request.query_params)
        view = self.ops.view(keys, await self.ops.existing(keys))
        return _render("erase.html", keys=keys, view=view, session_url=_session_url(keys),
                       mismatch=False)  # fmt: skip

    # --- actions ---

    async def erase(self, request: Request) -> Response:
        form = await self._form(request)
        keys = _session(form)
        if form.get("confirm") != keys.session_id:
            view = self.ops.view(keys, await self.ops.existing(keys))
            return _render("erase.html", 400, keys=keys, view=view,
                           session_url=_session_url(keys), mismatch=True)  # fmt: skip
        await self.ops.erase(keys)
        done = f"erased session {keys.session_id}"
        return RedirectResponse(
            "/ui/sessions?" + urlencode({"tenant": keys.tenant, "done": done}), 303
        )

    async def end(self, request: Request) -> Response:
        keys = _session(await self._form(request))
        ended = await self.ops.end(keys)
        done = f"session ended ({ended['flushed_jobs']} pending jobs run first)"
        return RedirectResponse(_session_url(keys, done=done), 303)

    async def add_pin(self, request: Request) -> Response:
        form = await self._form(request)
        keys = _session(form)
        content = _content(form.get("content"))
        assert content is not None
        pin = await self.ops.add_pin(keys, content, _importance(form.get("importance")))
        return RedirectResponse(_session_url(keys, done=f"pinned {pin.id}"), 303)

    async def edit_pin(self, request: Request) -> Response:
        form = await self._form(request)
        keys = _session(form)
        pin_id = form.get("pin", "")
        content = _content(form.get("content"), required=False)
        await self.ops.edit_pin(keys, pin_id, content, _importance(form.get("importance")))
        return RedirectResponse(_session_url(keys, done=f"edited {pin_id}"), 303)

    async def delete_pin(self, request: Request) -> Response:
        form = await self._form(request)
        keys = _session(form)
        pin_id = form.get("pin", "")
        await self.ops.delete_pin(keys, pin_id)
        return RedirectResponse(_session_url(keys, done=f"deleted {pin_id}"), 303)

    async def correct_fact(self, request: Request) -> Response:
        form = await self._form(request)
        keys = _session(form)
        fact_id = form.get("fact", "")
        fact = await self.facts.correct(keys, fact_id, _fact_text(form.get("text")))
        done = f"corrected {fact_id} (now {durable.fact_id(fact)})"
        return RedirectResponse(_session_url(keys, done=done), 303)

    async def delete_fact(self, request: Request) -> Response:
        form = await self._form(request)
        keys = _session(form)
        fact_id = form.get("fact", "")
        await self.facts.delete(keys, fact_id)
        return RedirectResponse(_session_url(keys, done=f"deleted {fact_id}"), 303)
