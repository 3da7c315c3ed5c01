"""The local Redis Cluster of devsupport/cluster.py: healthy, sharding, failing over.

The cluster starts once for the file; the failover test kills a master, so it runs last.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
from collections.abc import Iterator

import pytest
from redis.crc import key_slot

from devsupport.cluster import SLOTS, ClusterNodeProcess, PortTakenError, RedisCluster
from devsupport.servers import running_redis


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as started:
        print(f"\nRedis Cluster ready in {started.startup_seconds:.2f} s")
        yield started


def test_the_cluster_is_ok_with_three_masters_each_with_one_replica(
    cluster: RedisCluster,
) -> None:
    masters = cluster.masters()
    replicas = cluster.replicas()
    assert len(masters) == 3
    assert len(replicas) == 3
    assert sorted(masters + replicas) == sorted(("127.0.0.1", port) for port in cluster.ports)
    assert cluster.url == f"redis://127.0.0.1:{min(port for _, port in masters)}"
    assert len(cluster.urls) == 6

    # Every node, asked directly, says ok with all slots assigned.
    for port in cluster.ports:
        info = cluster.cluster_info(port)
        assert info["cluster_state"] == "ok", (port, info)
        assert info["cluster_slots_assigned"] == str(SLOTS), (port, info)
        assert info["cluster_known_nodes"] == "6", (port, info)

    # The three masters split the slots with no gap; each has exactly one replica.
    owners = cluster.slot_owners()
    assert sum(last - first + 1 for first, last, _ in owners) == SLOTS
    assert {owner for _, _, owner in owners} == set(masters)
    topology = {node.node_id: node for node in cluster.topology()}
    masters_of_replicas = [
        topology[node.master_id].address
        for node in topology.values()
        if not node.is_master and node.master_id is not None
    ]
    assert sorted(masters_of_replicas) == masters


def test_a_hash_tag_pins_keys_to_one_slot_and_job_keys_spread_over_masters(
    cluster: RedisCluster,
) -> None:
    tagged = ["{t.s}", "mg:log:{t.s}", "mg:tiers:{t.s}:summary", "other{t.s}x"]
    slots = {cluster.keyslot(key) for key in tagged}
    assert slots == {key_slot(b"t.s")}
    assert len({cluster.master_of(key) for key in tagged}) == 1

    jobs = [f"mg:jobs:{{{i}}}" for i in range(8)]
    assert len({cluster.keyslot(key) for key in jobs}) == 8
    assert len({cluster.master_of(key) for key in jobs}) > 1


def test_a_value_set_through_the_cluster_client_reads_back(cluster: RedisCluster) -> None:
    value = secrets.token_hex(8)
    with contextlib.closing(cluster.client()) as client:
        for key in [f"mg:jobs:{{{i}}}" for i in range(8)]:
            assert client.set(key, value)
        for key in [f"mg:jobs:{{{i}}}" for i in range(8)]:
            assert client.get(key) == value.encode()
    # And it really is on the master the cluster says serves it.
    _, port = cluster.master_of("mg:jobs:{0}")
    with contextlib.closing(cluster.node_client(port)) as node:
        assert node.get("mg:jobs:{0}") == value.encode()


def test_a_replicated_key_survives_its_master_being_killed(cluster: RedisCluster) -> None:
    key = "mg:failover:{t.s}"
    value = secrets.token_hex(8)
    _, old_port = cluster.master_of(key)
    topology = cluster.topology()
    old_id = next(node.node_id for node in topology if node.port == old_port)
    replica_ports = {node.port for node in topology if node.master_id == old_id}
    assert len(replica_ports) == 1

    # SET then WAIT on one connection: WAIT counts replicas that have that write.
    with contextlib.closing(cluster.node_client(old_port, single_connection_client=True)) as node:
        assert node.set(key, value)
        assert node.wait(1, 1000) >= 1

    cluster.kill_master(old_port)
    seconds = cluster.wait_for_failover(old_port, timeout_s=30)
    print(f"\nfailover of master {old_port} took {seconds:.2f} s")
    assert seconds < 30

    _, new_port = cluster.master_of(key)
    assert new_port in replica_ports
    assert ("127.0.0.1", old_port) not in cluster.masters() + cluster.replicas()
    assert len(cluster.masters()) == 3
    with contextlib.closing(cluster.client()) as client:
        assert client.get(key) == value.encode()
        assert client.set(key + ":after", "1")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", old_port), timeout=0.5).close()


def test_a_node_does_not_mistake_a_stranger_on_its_port_for_itself() -> None:
    with running_redis() as stranger:
        node = ClusterNodeProcess(node_timeout_ms=1000)
        node.port = stranger.port
        try:
            with pytest.raises(PortTakenError, match="another process"):
                node.start()
        finally:
            node.cleanup()
        assert not node.alive
        with contextlib.closing(stranger.client()) as client:
            assert client.ping()
