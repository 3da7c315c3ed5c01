"""Who may use the gateway, and as whom (``auth`` in the config).

Two modes, as LiteLLM's proxy users know them:

- ``forward`` (the default): each client's own key goes upstream, and names its tenant
  (a keyed hash of it). A missing or placeholder key ("EMPTY", "ollama", …) is refused,
  unless ``allow_anonymous``. The memory API, which never goes upstream itself, serves a
  key only once the upstream has accepted it (a ``GET /models`` with it, or a chat answer),
  and for ``verify_s`` after: a key revoked upstream loses its memory after that.
- ``keys``: the gateway issues keys (in the config, or made through ``/admin/keys`` and
  kept in Redis as hashes only). Each names its tenant, the user ids it may act for and
  the upstream key its requests use; the client never holds an upstream key.

Every check happens before any other work; failures are OpenAI-style 401/403 errors.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
import time
import unicodedata
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from starlette.datastructures import Headers

from gateway import offload
from gateway.auth.identity import bearer_key
from gateway.auth.periodic import every
from gateway.auth.tenancy import Tenants
from gateway.config import MIN_KEY_CHARS, PLACEHOLDER_KEYS, AuthConfig, is_placeholder
from gateway.errors import Forbidden, KeysUnavailable, Unauthorized, UpstreamUnreachable
from gateway.observability import metrics

log = logging.getLogger(__name__)

# How long an upstream's refusal of a key is remembered (a typo is retried soon).
REFUSED_S = 10.0
# Keys remembered as accepted or refused (a few MB at most).
REMEMBERED_KEYS = 100_000


def key_id(key: str) -> str:
    """What names a key in Redis, logs and the admin API: a hash, never the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def new_key() -> str:
    """A gateway key: 256 random bits, recognisable by its prefix."""
    return "mg-" + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A gateway key as the gateway knows it (never the key itself)."""

    id: str
    tenant: str
    users: frozenset[str] | None  # None: any user id
    upstream_key: str | None = None  # a name in auth.upstream_keys
    quota_mb: float | None = None
    name: str | None = None
    created: float = 0.0
    stored: bool = False  # made through the admin API (else listed in the config)

    def to_data(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "users": "*" if self.users is None else sorted(self.users),
            "upstream_key": self.upstream_key,
            "quota_mb": self.quota_mb,
            "name": self.name,
            "created": self.created,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any], *, stored: bool = True) -> KeyRecord:
        users = data.get("users", "*")
        return cls(
            str(data["id"]),
            str(data["tenant"]),
            None if users == "*" else frozenset(str(u) for u in users),
            data.get("upstream_key"),
            data.get("quota_mb"),
            data.get("name"),
            float(data.get("created", 0.0)),
            stored,
        )


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request is from, once authenticated. ``tenant`` is filled by
    ``Authenticator.resolve`` (it needs the tenant secret, from Redis): a request that
    only goes upstream needs none."""

    tenant: str  # the tenant id memory is keyed by ("" until resolved)
    key_id: str  # the key's hash (logs, quotas)
    # Sent upstream in place of the client's key (None: theirs; "": none at all).
    upstream_key: str | None
    users: frozenset[str] | None  # the user ids it may act for (None: any)
    trusts_user_header: bool = True
    quota_bytes: int | None = None
    tenant_name: str = ""  # what the tenant id is the keyed hash of

    def user_id(self, requested: str | None) -> str | None:
        """The user id a request names, if this caller may act for it (403 otherwise);
        None when the configuration does not trust the header. A key limited to some
        users must name one: its sessions are theirs."""
        if requested is None and self.users is not None:
            raise Forbidden(
                "this key acts only for its users: name one in X-User-Id",
                param="X-User-Id",
                code="user_required",
            )
        if requested is None or not self.trusts_user_header:
            return None
        if self.users is not None and requested not in self.users:
            raise Forbidden(
                "this key may not act for that user (X-User-Id)",
                param="X-User-Id",
                code="user_not_allowed",
            )
        return requested

    def may_see(self, owner: str | None) -> bool:
        """Whether this caller may see a session owned by ``owner`` (its user id, None:
        no user's): a key limited to some users sees only theirs."""
        return self.users is None or (owner is not None and owner in self.users)


class KeyRegistry:
    """The gateway's keys: the config's, and the admin API's as this process last read
    them (``refresh``, run every ``auth.refresh_s`` by ``watch``)."""

    def __init__(self, config: AuthConfig, clock: Callable[[], float] = time.time) -> None:
        self._configured = {
            key_id(k.key): KeyRecord(
                key_id(k.key),
                k.tenant,
                None if k.users == "*" else frozenset(k.users),
                k.upstream_key,
                k.quota_mb,
                k.name,
            )
            for k in config.keys
        }
        self._stored: dict[str, KeyRecord] = {}  # by key id
        self._raw: dict[str, bytes] = {}  # the JSON each stored record was parsed from
        self._version: str | None = None
        self.refresh_s = config.refresh_s
        self.stale_after_s = config.stale_after_s
        self.clock = clock
        # The last time the stored keys were read (or found unchanged); None: never (no
        # admin API watched, or not reached yet: none stored here to honour).
        self._read_at: float | None = None

    def lookup(self, key: str) -> KeyRecord | None:
        """The key's record; raises ``KeysUnavailable`` for a key not of the configuration
        while the stored keys have not been read for ``auth.stale_after_s`` (fail closed:
        a key revoked meanwhile must not go on working on a process cut off from Redis)."""
        found = key_id(key)
        configured = self._configured.get(found)
        if configured is not None:
            return configured
        if self._read_at is not None and self.clock() - self._read_at > self.stale_after_s:
            raise KeysUnavailable(
                "the gateway's keys could not be read recently; try again shortly"
            )
        return self._stored.get(found)

    def read(self) -> None:
        """The stored keys were read just now (found unchanged, or replaced)."""
        self._read_at = self.clock()

    def records(self) -> list[KeyRecord]:
        return [*self._configured.values(), *self._stored.values()]

    def replace(self, version: str, stored: Mapping[str, bytes]) -> None:
        """The keys made through the admin API are now ``stored``: each record's JSON as
        Redis holds it, by key id. Only the records whose JSON changed since the last
        replace are parsed again: an admin change costs every process what changed, not
        the whole registry (2,000 keys took 90-130 ms of each event loop per change)."""
        records = {
            found: known
            if (known := self._stored.get(found)) is not None and self._raw.get(found) == raw
            else KeyRecord.from_data(json.loads(raw))
            for found, raw in stored.items()
        }
        lost = [r for found, r in self._stored.items() if found not in records]
        if lost and _epoch(version) != _epoch(self._version):
            # A new epoch (or none): Redis lost the keys' data, not an admin revoking them.
            log.error(
                "the gateway keys made through the admin API were lost (their version went "
                "from %r to %r: Redis lost its data?): %d keys no longer work; make them again",
                self._version,
                version,
                len(lost),
            )
            metrics.keys_lost(len(lost))
        self._stored = records
        self._raw = dict(stored)
        self._version = version
        self.read()

    @property
    def version(self) -> str | None:
        return self._version


def _epoch(version: str | None) -> str:
    return (version or "").partition(":")[0]


class Authenticator:
    """Turns a request's ``Authorization`` into a ``Caller`` (or a 401)."""

    def __init__(
        self,
        config: AuthConfig,
        *,
        tenants: Tenants,
        registry: KeyRegistry,
        upstream_api_key: str | None,
        check_upstream: Callable[[str], Awaitable[bool | None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.tenants = tenants
        self.registry = registry
        self.upstream_api_key = upstream_api_key
        self.check_upstream = check_upstream
        self.clock = clock
        # forward mode: key id -> (accepted by the upstream?, until when)
        self._verdicts: dict[str, tuple[bool, float]] = {}
        self._checking: dict[str, asyncio.Task[bool | None]] = {}

    def identify(self, headers: Headers) -> Caller:
        """The caller of a request, its tenant not yet resolved; no IO (401 on a key that
        is not one). The request's heavy work is its tenant's from here (``offload``:
        the pool serves tenants in turn)."""
        caller = self._identify(headers)
        offload.work_for(key_id(caller.tenant_name))
        return caller

    def _identify(self, headers: Headers) -> Caller:
        key = bearer_key(headers)
        _refuse_other_schemes(headers)
        if self.config.mode == "keys":
            return self._gateway_key(key)
        if is_placeholder(key):
            if not self.config.allow_anonymous:
                raise _no_key(key)
            key = ""  # every anonymous client is the one anonymous tenant
        quota = quota_bytes(None, self.config.quota_mb)
        return Caller("", key_id(key), None, None, self.config.trust_user_header, quota, key)

    async def resolve(self, caller: Caller) -> Caller:
        """The caller with its tenant id (raises ``StoreUnavailable`` when the tenant
        secret cannot be read)."""
        tenant = await self.tenants.tenant_for(caller.tenant_name)
        return replace(caller, tenant=tenant)

    async def caller(self, headers: Headers) -> Caller:
        """The caller of a request, tenant resolved."""
        return await self.resolve(self.identify(headers))

    async def memory_caller(self, headers: Headers) -> Caller:
        """The caller of a memory API request: in forward mode, only with a key the
        upstream accepted (recently: ``auth.verify_s``)."""
        caller = await self.caller(headers)
        if self.config.mode == "keys" or (self.config.allow_anonymous and not _has_key(headers)):
            return caller
        key = bearer_key(headers)
        if not await self._accepted_upstream(key):
            raise Unauthorized("the upstream does not accept this API key", code="invalid_api_key")
        return caller

    def accepted(self, headers: Headers) -> None:
        """The upstream answered a request made with this key: it is accepted."""
        if self.config.mode == "forward":
            self._remember(key_id(bearer_key(headers)), True, self.config.verify_s)

    def refused(self, headers: Headers) -> None:
        """The upstream refused this key (401): the memory API does too, from now on."""
        if self.config.mode == "forward":
            self._remember(key_id(bearer_key(headers)), False, REFUSED_S)

    def _gateway_key(self, key: str) -> Caller:
        record = self.registry.lookup(key) if key else None
        if record is None:
            raise Unauthorized("invalid API key for this gateway", code="invalid_api_key")
        # A key the gateway issued never leaves it: with no upstream key configured the
        # request goes without one (a local server that needs none), not with the client's.
        upstream = self.upstream_api_key or ""
        if record.upstream_key is not None:
            upstream = self.config.upstream_keys[record.upstream_key]
        name = gateway_tenant_name(record.tenant)
        quota = quota_bytes(record.quota_mb, self.config.quota_mb)
        return Caller("", record.id, upstream, record.users, True, quota, name)

    async def _accepted_upstream(self, key: str) -> bool:
        found = key_id(key)
        verdict = self._verdicts.get(found)
        if verdict is not None and verdict[1] > self.clock():
            return verdict[0]
        if self.check_upstream is None:
            return True
        # One check at a time per key, however many requests wait for it.
        task = self._checking.get(found)
        if task is None:
            task = asyncio.ensure_future(self.check_upstream(key))
            self._checking[found] = task
            task.add_done_callback(lambda _: self._checking.pop(found, None))
        accepted = await asyncio.shield(task)
        if accepted is None:
            raise UpstreamUnreachable(
                "the upstream could not be reached to check this API key",
                code="upstream_unreachable",
            )
        self._remember(found, accepted, self.config.verify_s if accepted else REFUSED_S)
        return accepted

    def _remember(self, found: str, accepted: bool, for_s: float) -> None:
        if len(self._verdicts) >= REMEMBERED_KEYS:
            now = self.clock()
            self._verdicts = {k: v for k, v in self._verdicts.items() if v[1] > now}
            if len(self._verdicts) >= REMEMBERED_KEYS:
                self._verdicts.clear()
        self._verdicts[found] = (accepted, self.clock() + for_s)


def gateway_tenant_name(tenant: str) -> str:
    """What a gateway key's tenant is named as (its id is this name's keyed hash). A NUL
    can be in no Authorization header: no client key of forward mode can name the same
    tenant as a gateway key's tenant."""
    return "\x00gateway-tenant:" + tenant


def quota_bytes(own: float | None, default: float | None) -> int | None:
    """A caller's storage quota in bytes (None: no bound): its key's ``quota_mb``, else the
    default (``auth.quota_mb``); 0 (or a null default) is no bound."""
    megabytes = default if own is None else own
    return int(megabytes * 2**20) if megabytes else None


def _refuse_other_schemes(headers: Headers) -> None:
    """401 for credentials of a scheme other than Bearer (``Basic <base64>``, ...): taken
    as a key, they went upstream as ``Bearer Basic ...`` and named a tenant of their own.
    A value without a scheme (a bare key) is still taken as the key."""
    parts = (headers.get("authorization") or "").split(None, 1)
    if len(parts) == 2 and parts[0].lower() != "bearer":
        raise Unauthorized(
            "only Bearer keys are accepted: send 'Authorization: Bearer <key>'",
            code="invalid_api_key",
        )


def _no_key(key: str) -> Unauthorized:
    """The 401 for a key that is no key: a key merely too short is told so (it was sent,
    and a longer one is the fix), not that a key is required."""
    shown = unicodedata.normalize("NFKC", key).strip()
    if shown and shown.casefold() not in PLACEHOLDER_KEYS:
        return Unauthorized(
            f"this API key is too short: a key has {MIN_KEY_CHARS} characters or more "
            f"(this one has {len(shown)})",
            code="invalid_api_key",
        )
    return Unauthorized(
        "an API key is required: send it as 'Authorization: Bearer <key>' (or, to "
        "/v1/messages, as 'x-api-key: <key>'; placeholder keys such as EMPTY are not keys)",
        code="missing_api_key",
    )


def _has_key(headers: Headers) -> bool:
    return not is_placeholder(bearer_key(headers))


def is_admin(headers: Headers, admin_key: str | None) -> bool:
    """Whether a request carries the admin key (compared in constant time, as digests:
    comparing the keys themselves takes a time that tells their lengths apart)."""
    if admin_key is None:
        return False
    sent = hashlib.sha256(bearer_key(headers).encode()).digest()
    return hmac.compare_digest(sent, hashlib.sha256(admin_key.encode()).digest())


async def watch(
    registry: KeyRegistry, read: Callable[[str | None], Awaitable[Any]], stop: asyncio.Event
) -> None:
    """Keep the registry's stored keys current: ``read(version)`` returns None when the
    version is unchanged, else (version, records). A failed read keeps what was read
    last (logged once)."""

    async def refresh() -> None:
        found = await read(registry.version)
        if found is not None:
            version, records = found
            registry.replace(version, records)
        else:
            registry.read()

    await every(registry.refresh_s, refresh, stop, "gateway keys not refreshed")
