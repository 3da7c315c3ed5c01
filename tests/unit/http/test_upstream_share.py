"""A tenant's share of the upstream pool (``http.upstream_share.UpstreamShares``)."""

from __future__ import annotations

from gateway.http.upstream_share import UpstreamShares, upstream_shares


def fill(shares: UpstreamShares, tenant: str, most: int) -> int:
    """Requests of ``tenant`` taken before the first refusal (at most ``most``)."""
    for taken in range(most):
        if not shares.take(tenant):
            return taken
    return most


def test_a_tenant_alone_takes_all_but_a_share() -> None:
    shares = UpstreamShares(pool=8, tenant_share=0.25)  # a share: 2
    assert fill(shares, "a", 100) == 6
    assert shares.total == 6


def test_a_tenant_under_its_share_gets_in_when_others_hold_theirs() -> None:
    shares = UpstreamShares(pool=8, tenant_share=0.25)
    assert fill(shares, "a", 100) == 6
    assert fill(shares, "b", 100) == 2  # its share, from the room left free
    assert shares.total == 8
    assert not shares.take("a") and not shares.take("b")
    # A tenant under its share is never refused here: past the pool it waits for a
    # connection like any request (upstream.timeouts.pool_s).
    assert shares.take("c")


def test_a_greedy_tenant_leaves_a_share_of_the_pool_free() -> None:
    shares = UpstreamShares(pool=512, tenant_share=0.25)
    assert fill(shares, "attacker", 1000) == 384  # its streams from any number of addresses
    assert shares.pool - shares.total == 128  # the room every other tenant finds
    assert fill(shares, "victim", 1000) == 128
    # Tenants that each hold no more than a share are never refused here (so several can
    # fill the pool: limits.tenant.concurrent or limits.address bound them).
    assert shares.take("third")


def test_giving_back_frees_the_slot_and_forgets_idle_tenants() -> None:
    shares = UpstreamShares(pool=4, tenant_share=0.5)
    assert fill(shares, "a", 100) == 2
    shares.give_back("a")
    assert shares.take("a")
    for _ in range(2):
        shares.give_back("a")
    assert shares.held == {} and shares.total == 0


def test_a_whole_share_turns_it_off() -> None:
    assert upstream_shares(512, 1.0) is None
    assert upstream_shares(512, 0.25) is not None
