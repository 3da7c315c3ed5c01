"""The store's two channels (gateway/store/calls.py): the request path's client and link,
and the background's, shared by every ``with_deadline`` view and closed once."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.store.calls import create_client
from gateway.store.link import RedisLink
from gateway.store.redis_store import RedisStore

_URL = "redis://127.0.0.1:1/0"  # nothing is sent: no test here connects


def _counting_closes(monkeypatch: pytest.MonkeyPatch, closes: list[str], name: str, obj: Any,
                     method: str) -> None:  # fmt: skip
    original = getattr(obj, method)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        closes.append(name)
        return await original(*args, **kwargs)

    monkeypatch.setattr(obj, method, counted)


def _store(background: bool) -> tuple[RedisStore, Any, Any]:
    request = create_client(_URL, timeout_s=1, max_connections=4)
    other = create_client(_URL, timeout_s=6, max_connections=4) if background else None
    store = RedisStore(request, timeout_s=0.1, retention_s=3600, background=other)
    return store, request, other


def test_a_view_uses_the_background_client_and_every_view_the_same_link() -> None:
    store, request, background = _store(background=True)
    first, second = store.with_deadline(5), store.with_deadline(2).with_deadline(3)
    assert store.client is request
    assert first.client is background and second.client is background
    assert first._calls.link is second._calls.link
    assert first._calls.link is not store._calls.link


def test_one_client_gets_a_background_link_of_its_own() -> None:
    store, request, _ = _store(background=False)
    view = store.with_deadline(5)
    assert view.client is request  # the one client; other connections
    assert view._calls.link is not store._calls.link


@pytest.mark.parametrize("background", [True, False])
async def test_the_clients_and_links_are_closed_once_whoever_closes(
    monkeypatch: pytest.MonkeyPatch, background: bool
) -> None:
    store, request, other = _store(background)
    view = store.with_deadline(5)
    closes: list[str] = []
    _counting_closes(monkeypatch, closes, "request client", request, "aclose")
    if other is not None:
        _counting_closes(monkeypatch, closes, "background client", other, "aclose")
    _counting_closes(monkeypatch, closes, "request link", store._calls.link, "aclose")
    _counting_closes(monkeypatch, closes, "background link", view._calls.link, "aclose")
    await view.close()
    await store.close()
    await store.with_deadline(1).close()
    expected = ["request client", "request link", "background link"]
    if other is not None:
        expected.insert(1, "background client")
    assert closes == expected


def test_a_link_given_for_each_channel_is_the_one_used() -> None:
    request = create_client(_URL, timeout_s=1, max_connections=4)
    background = create_client(_URL, timeout_s=6, max_connections=4)
    links = RedisLink(request), RedisLink(background)
    store = RedisStore(
        request,
        timeout_s=0.1,
        retention_s=3600,
        link=links[0],
        background=background,
        background_link=links[1],
    )
    assert store._calls.link is links[0]
    assert store.with_deadline(5)._calls.link is links[1]
