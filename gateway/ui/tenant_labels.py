"""What the inspector calls a tenant: something a person recognises, never a secret.

A tenant id is a keyed hash. In ``keys`` mode the gateway knows each tenant's name
(``team-a``) and its keys' names (``alice laptop``): the labels are those. In ``forward``
mode a tenant is a client's own key, of which the gateway keeps only that hash: the
label says so, and the id's first digits are what the log lines' ``tenant`` field starts
with."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.auth.authenticator import KeyRegistry, gateway_tenant_name
from gateway.auth.tenancy import Tenants

SHORT_ID = 12  # hex digits of a tenant id shown where its name is not known


@dataclass(frozen=True, slots=True)
class TenantLabel:
    name: str  # "team-a"; in forward mode "client key 3f2c9a1b0d4e…"
    keys: tuple[str, ...] = ()  # its gateway keys, by name (else the key id's start)


def unnamed(tenant: str) -> TenantLabel:
    return TenantLabel(f"client key {tenant[:SHORT_ID]}…")


class TenantLabels:
    def __init__(self, tenants: Tenants, registry: KeyRegistry | None) -> None:
        self.tenants = tenants
        self.registry = registry  # None: forward mode, no names to give

    async def labels(self) -> dict[str, TenantLabel]:
        """Every named tenant's label, by tenant id (a tenant not here is unnamed)."""
        if self.registry is None:
            return {}
        keys: dict[str, list[str]] = {}
        for record in self.registry.records():
            keys.setdefault(record.tenant, []).append(record.name or f"key {record.id[:8]}…")
        return {
            await self.tenants.tenant_for(gateway_tenant_name(name)): TenantLabel(
                name, tuple(sorted(names))
            )
            for name, names in keys.items()
        }

    async def label(self, tenant: str) -> TenantLabel:
        return (await self.labels()).get(tenant) or unnamed(tenant)
