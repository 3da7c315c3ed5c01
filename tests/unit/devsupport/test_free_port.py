"""Ports for the tests: each pytest-xdist worker has a range of its own, so two workers
are never handed the same port (devsupport/servers.py)."""

from __future__ import annotations

import socket

import pytest

from devsupport import servers


def ports(monkeypatch: pytest.MonkeyPatch, worker: str, count: int) -> list[int]:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    return [servers.free_port() for _ in range(count)]


def test_two_workers_are_never_handed_the_same_port(monkeypatch: pytest.MonkeyPatch) -> None:
    first = ports(monkeypatch, "gw0", 50)
    second = ports(monkeypatch, "gw1", 50)
    assert not set(first) & set(second)
    assert all(servers.FIRST_WORKER_PORT <= p < 32_768 for p in first + second)


def test_a_worker_hands_out_each_port_once_per_round(monkeypatch: pytest.MonkeyPatch) -> None:
    handed = ports(monkeypatch, "gw2", 100)
    assert len(set(handed)) == len(handed)


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setitem(servers._next_port, 3, 0)
    taken = servers.FIRST_WORKER_PORT + 3 * servers.WORKER_PORTS
    with socket.socket() as held:
        held.bind(("127.0.0.1", taken))
        held.listen()
        assert servers.free_port() != taken


def test_outside_a_worker_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ephemeral:
        low, high = (int(n) for n in ephemeral.read().split())
    assert low <= servers.free_port() <= high
