"""Fakes of the store that are real implementations of its Protocols (``service/ports.py``),
so a test hands one to the code under test as it is, its type checked like any other.

A test's fake subclasses the part it needs (``UnusedSessions``) and overrides the methods
it serves; mypy checks those against the Protocol. Every other method, and every part the
test did not give ``StoreOf``, fails the test when called: a fake cannot answer for what
the test never meant it to.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from gateway.service.ports import (
    CatalogStore,
    JobQueue,
    KeyStore,
    LimitStore,
    LoginStore,
    QuotaStore,
    ServerStore,
    SessionStore,
    UserStore,
)

Part = TypeVar("Part")


def unused(name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
    """A method that fails the test that calls it. Its loose signature fits the Protocol's,
    and lets a subclass override it with the Protocol's own."""

    async def fail(*_: Any, **__: Any) -> Any:
        raise AssertionError(f"{name}: not used by this test")

    return fail


class UnusedSessions:
    """A ``SessionStore`` none of whose methods the test expects to be called."""

    load = unused("sessions.load")
    load_turn = unused("sessions.load_turn")
    record = unused("sessions.record")
    archive_page = unused("sessions.archive_page")
    messages_at = unused("sessions.messages_at")
    messages = unused("sessions.messages")
    tail = unused("sessions.tail")
    save_vectors = unused("sessions.save_vectors")
    vectors = unused("sessions.vectors")
    media = unused("sessions.media")
    usage = unused("sessions.usage")
    branches = unused("sessions.branches")
    job_state = unused("sessions.job_state")
    tiers = unused("sessions.tiers")
    job_view = unused("sessions.job_view")
    write_tiers = unused("sessions.write_tiers")
    add_pin = unused("sessions.add_pin")
    delete_pin = unused("sessions.delete_pin")
    meta = unused("sessions.meta")
    end_session = unused("sessions.end_session")
    erase_session = unused("sessions.erase_session")
    erase_user = unused("sessions.erase_user")


class UnusedLimits:
    """A ``LimitStore`` none of whose methods the test expects to be called."""

    admit = unused("limits.admit")
    reserve = unused("limits.reserve")
    release = unused("limits.release")


# Each Unused part with the Protocol it stands for (tests/unit/service/test_ports.py checks
# that it lists all of the Protocol's methods).
UNUSED_PARTS: dict[type, type] = {UnusedSessions: SessionStore, UnusedLimits: LimitStore}


def _given(part: Part | None, name: str) -> Part:
    if part is None:
        raise AssertionError(f"store.{name}: not used by this test")
    return part


class StoreOf:
    """A ``Store`` of the parts a test gives; reading any other part fails the test."""

    def __init__(
        self,
        *,
        sessions: SessionStore | None = None,
        quotas: QuotaStore | None = None,
        users: UserStore | None = None,
        queue: JobQueue | None = None,
        server: ServerStore | None = None,
        catalog: CatalogStore | None = None,
        limits: LimitStore | None = None,
        ui: LoginStore | None = None,
        gateway_keys: KeyStore | None = None,
    ) -> None:
        self._sessions = sessions
        self._quotas = quotas
        self._users = users
        self._queue = queue
        self._server = server
        self._catalog = catalog
        self._limits = limits
        self._ui = ui
        self._gateway_keys = gateway_keys

    @property
    def sessions(self) -> SessionStore:
        return _given(self._sessions, "sessions")

    @property
    def quotas(self) -> QuotaStore:
        return _given(self._quotas, "quotas")

    @property
    def users(self) -> UserStore:
        return _given(self._users, "users")

    @property
    def queue(self) -> JobQueue:
        return _given(self._queue, "queue")

    @property
    def server(self) -> ServerStore:
        return _given(self._server, "server")

    @property
    def catalog(self) -> CatalogStore:
        return _given(self._catalog, "catalog")

    @property
    def limits(self) -> LimitStore:
        return _given(self._limits, "limits")

    @property
    def ui(self) -> LoginStore:
        return _given(self._ui, "ui")

    @property
    def gateway_keys(self) -> KeyStore:
        return _given(self._gateway_keys, "gateway_keys")
