"""A real local Redis Cluster for tests: six private redis-server nodes, three masters each
with one replica, created with ``redis-cli --cluster create``; tests may kill a master and
wait for its replica to take over.

Every node is a :class:`~devsupport.servers.RedisProcess` on free loopback ports (the
client port and, with ``--cluster-port``, the cluster bus port: the default bus port, the
client port + 10000, may be taken or past 65535 for a kernel-chosen port).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.cluster

from devsupport.servers import RedisProcess, free_port, redis_server_binary

HOST = "127.0.0.1"
SLOTS = 16384
# How many times a node is given fresh ports when the ones it was handed were taken.
PORT_ATTEMPTS = 5
# Flags of a node another node has given up on (or never reached): it serves nothing.
DOWN_FLAGS = frozenset({"fail", "fail?", "noaddr", "handshake"})

Address = tuple[str, int]


class ClusterError(RuntimeError):
    """The cluster did not do what a test needed in time; the message has the log tails."""


class ClusterStartError(ClusterError):
    """A node did not start, or the cluster did not become healthy in time."""


class FailoverTimeoutError(ClusterError):
    """A killed master's slots were not taken over in time."""


class PortTakenError(ClusterStartError):
    """A node's client or bus port was already in use: it is retried on fresh ports."""


@dataclass(frozen=True)
class NodeInfo:
    """One line of ``CLUSTER NODES``, as the node asked sees its peer."""

    node_id: str
    host: str
    port: int
    flags: frozenset[str]
    master_id: str | None  # of a replica; None for a master
    slots: tuple[tuple[int, int], ...]  # inclusive ranges served (masters only)

    @property
    def address(self) -> Address:
        return (self.host, self.port)

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def is_down(self) -> bool:
        return bool(self.flags & DOWN_FLAGS)


def parse_cluster_nodes(text: str) -> list[NodeInfo]:
    nodes = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        # ip:port@cport[,hostname]
        address = fields[1].split("@", 1)[0]
        host, _, port = address.rpartition(":")
        slots = []
        for item in fields[8:]:
            if item.startswith("["):  # a slot being migrated or imported
                continue
            first, _, last = item.partition("-")
            slots.append((int(first), int(last or first)))
        nodes.append(
            NodeInfo(
                node_id=fields[0],
                host=host,
                port=int(port) if port else 0,
                flags=frozenset(fields[2].split(",")),
                master_id=None if fields[3] == "-" else fields[3],
                slots=tuple(sorted(slots)),
            )
        )
    return nodes


def command(client: redis.Redis, *args: str | bytes | int) -> Any:
    """``client.execute_command`` (untyped in redis-py), with no reply parsing for
    ``CLUSTER ...``: decoded text or lists, as the node sent them."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def parse_info(text: str) -> dict[str, str]:
    """``CLUSTER INFO``'s ``field:value`` lines."""
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):  # TimeoutExpired keeps bytes even with text=True
        return output.decode(errors="replace")
    return output or ""


def redis_cli_binary() -> str:
    """redis-cli from PATH, else the one beside the redis-server in use."""
    found = shutil.which("redis-cli")
    if found:
        return found
    return os.path.join(os.path.dirname(redis_server_binary()), "redis-cli")


class ClusterNodeProcess(RedisProcess):
    """A cluster-enabled redis-server whose nodes.conf lives in its own temp dir."""

    def __init__(self, *, node_timeout_ms: int, settings: Sequence[str] = ()) -> None:
        super().__init__(appendonly=False)
        self.bus_port = free_port()
        self.extra_args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", os.path.join(self.dir, "nodes.conf"),
            "--cluster-node-timeout", str(node_timeout_ms),
            "--cluster-port", str(self.bus_port),
            "--cluster-announce-ip", HOST,
            # Replicas sync at once, not after the default 5 s wait for more replicas.
            "--repl-diskless-sync-delay", "0",
            *settings,
        ]  # fmt: skip

    @property
    def address(self) -> Address:
        return (HOST, self.port)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(os.path.join(self.dir, "redis.log"), errors="replace") as log:
                return "".join(log.readlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def admin(self) -> redis.Redis:
        """A short-lived plain connection to this one node, answers decoded."""
        return redis.Redis(
            host=HOST,
            port=self.port,
            decode_responses=True,
            socket_connect_timeout=0.5,
            socket_timeout=2,
        )

    def start(self) -> ClusterNodeProcess:
        """Starts and checks that the server answering PING is this process, not a
        stranger that already held the port."""
        try:
            super().start()
        except RuntimeError as exc:
            error = PortTakenError if "Address already in use" in self.log_tail() else None
            raise (error or ClusterStartError)(
                f"redis-server on port {self.port} (bus {self.bus_port}) did not start; "
                f"log tail:\n{self.log_tail()}"
            ) from exc
        assert self.process is not None
        with contextlib.closing(self.admin()) as client:
            pid = int(client.info("server")["process_id"])
        if pid != self.process.pid:
            raise PortTakenError(
                f"port {self.port} is answered by another process (pid {pid}); "
                f"log tail:\n{self.log_tail()}"
            )
        return self


class RedisCluster:
    """``masters`` masters with ``replicas_per_master`` replicas each, on loopback.

    ``RedisCluster().start()`` returns once every node reports ``cluster_state:ok`` with
    all 16384 slots assigned and every replica's link to its master is up; ``cleanup()``
    (or leaving the ``with`` block) kills every node and removes their directories.
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 1000,
        ready_timeout_s: float = 30.0,
        settings: Sequence[str] = (),  # more redis-server arguments for every node
    ) -> None:
        self.settings = tuple(settings)
        self.master_count = masters
        self.replicas_per_master = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        self.ready_timeout_s = ready_timeout_s
        self.nodes: list[ClusterNodeProcess] = []
        self.startup_seconds: float | None = None
        self._seed_port: int | None = None
        # Port of a killed master -> (monotonic time of the kill, slot ranges it served).
        self._killed: dict[int, tuple[float, tuple[tuple[int, int], ...]]] = {}

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> RedisCluster:
        """Starts the nodes, creates the cluster and waits for it to be healthy, all
        within ``ready_timeout_s``; on any failure kills what it started and raises
        :class:`ClusterStartError` with the nodes' log tails."""
        began = time.monotonic()
        deadline = began + self.ready_timeout_s
        try:
            for _ in range(self.master_count * (1 + self.replicas_per_master)):
                self.nodes.append(self._start_node())
            self._create(max(deadline - time.monotonic(), 1.0))
            self.wait_until_healthy(max(deadline - time.monotonic(), 0.0))
        except BaseException:
            self.cleanup()
            raise
        self._seed_port = min(port for _, port in self.masters())
        self.startup_seconds = time.monotonic() - began
        return self

    def _start_node(self) -> ClusterNodeProcess:
        for attempt in range(PORT_ATTEMPTS):
            node = ClusterNodeProcess(node_timeout_ms=self.node_timeout_ms, settings=self.settings)
            try:
                return node.start()
            except PortTakenError:
                node.cleanup()
                if attempt == PORT_ATTEMPTS - 1:
                    raise
            except BaseException:
                node.cleanup()
                raise
        raise AssertionError("unreachable")

    def _create(self, timeout_s: float) -> None:
        args = [
            redis_cli_binary(), "--cluster", "create",
            *(f"{HOST}:{node.port}" for node in self.nodes),
            "--cluster-replicas", str(self.replicas_per_master),
            "--cluster-yes",
        ]  # fmt: skip
        try:
            result = subprocess.run(
                args, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterStartError(
                f"redis-cli --cluster create timed out; output:\n{_text(exc.stdout)}\n"
                f"{_text(exc.stderr)}"
                f"\n{self._log_tails()}"
            ) from exc
        if result.returncode != 0:
            raise ClusterStartError(
                f"redis-cli --cluster create failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}\n{self._log_tails()}"
            )

    def cleanup(self) -> None:
        """Kills every node (SIGKILL) and removes its directory; safe to call again."""
        for node in self.nodes:
            node.cleanup()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # -- addresses and clients --------------------------------------------------------

    @property
    def url(self) -> str:
        """A seed: the lowest-port master when the cluster was created (it may since
        have been killed; ``client()`` seeds from every live node)."""
        if self._seed_port is None:
            raise RuntimeError("the cluster is not started")
        return f"redis://{HOST}:{self._seed_port}"

    @property
    def urls(self) -> list[str]:
        return [f"redis://{HOST}:{node.port}" for node in self.nodes]

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def live_nodes(self) -> list[ClusterNodeProcess]:
        return [node for node in self.nodes if node.alive]

    def node(self, port: int) -> ClusterNodeProcess:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no node of this cluster on port {port}")

    def client(self, **options: Any) -> redis.cluster.RedisCluster:
        """A fresh redis-py cluster client seeded with every live node."""
        startup = [
            redis.cluster.ClusterNode(HOST, node.port)  # type: ignore[no-untyped-call]
            for node in self.live_nodes()
        ]
        return redis.cluster.RedisCluster(startup_nodes=startup, **options)

    def node_client(self, port: int, **options: Any) -> redis.Redis:
        """A plain (non-cluster) client of one node."""
        return redis.Redis(host=HOST, port=self.node(port).port, **options)

    def cluster_info(self, port: int) -> dict[str, str]:
        """``CLUSTER INFO`` of the node on ``port``, asked directly."""
        with contextlib.closing(self.node(port).admin()) as client:
            return parse_info(command(client, "CLUSTER", "INFO"))

    # -- topology ---------------------------------------------------------------------

    def _ask(self, query: Callable[[redis.Redis], Any]) -> Any:
        """``query`` answered by the first live node that answers."""
        errors = []
        for node in self.live_nodes():
            try:
                with contextlib.closing(node.admin()) as client:
                    return query(client)
            except redis.RedisError as exc:
                errors.append(f"{node.port}: {exc}")
        raise RuntimeError(f"no node of the cluster answered: {errors}")

    def topology(self) -> list[NodeInfo]:
        """``CLUSTER NODES`` as a live node currently sees it."""
        text = self._ask(lambda client: command(client, "CLUSTER", "NODES"))
        return parse_cluster_nodes(text)

    def masters(self) -> list[Address]:
        """Masters not seen as failing, by port."""
        return sorted(n.address for n in self.topology() if n.is_master and not n.is_down)

    def replicas(self) -> list[Address]:
        """Replicas not seen as failing, by port."""
        return sorted(n.address for n in self.topology() if not n.is_master and not n.is_down)

    def keyslot(self, key: str | bytes) -> int:
        return int(self._ask(lambda client: command(client, "CLUSTER", "KEYSLOT", key)))

    def slot_owners(self) -> list[tuple[int, int, Address]]:
        """``CLUSTER SLOTS``: (first slot, last slot, master address) ranges."""
        ranges = self._ask(lambda client: command(client, "CLUSTER", "SLOTS"))
        return sorted((int(r[0]), int(r[1]), (str(r[2][0]), int(r[2][1]))) for r in ranges)

    def master_of(self, key: str | bytes) -> Address:
        """The master serving ``key``'s slot, as a live node currently sees it."""
        slot = self.keyslot(key)
        for first, last, master in self.slot_owners():
            if first <= slot <= last:
                return master
        raise LookupError(f"slot {slot} of {key!r} is served by no node")

    # -- health -----------------------------------------------------------------------

    def _problems(self, nodes: list[ClusterNodeProcess]) -> list[str]:
        """Why ``nodes`` are not yet a healthy cluster (empty once they are)."""
        problems = []
        views = set()
        for node in nodes:
            try:
                with contextlib.closing(node.admin()) as client:
                    fields = parse_info(command(client, "CLUSTER", "INFO"))
                    if fields.get("cluster_state") != "ok":
                        problems.append(f"{node.port}: cluster_state:{fields.get('cluster_state')}")
                    if fields.get("cluster_slots_assigned") != str(SLOTS):
                        problems.append(
                            f"{node.port}: {fields.get('cluster_slots_assigned')} slots assigned"
                        )
                    seen = parse_cluster_nodes(command(client, "CLUSTER", "NODES"))
                    views.add(frozenset((n.port, n.slots) for n in seen if n.is_master and n.slots))
                    replication = client.info("replication")
                    if replication.get("role") == "slave" and (
                        replication.get("master_link_status") != "up"
                    ):
                        problems.append(f"{node.port}: replica link is not up")
            except redis.RedisError as exc:
                problems.append(f"{node.port}: {exc}")
        if len(views) > 1:
            problems.append(f"nodes disagree on the slot map: {sorted(map(sorted, views))}")
        return problems

    def _wait(
        self,
        condition: Callable[[], list[str]],
        timeout_s: float,
        what: str,
        error: type[ClusterError] = ClusterStartError,
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            problems = condition()
            if not problems:
                return
            if time.monotonic() > deadline:
                raise error(
                    f"{what} not reached within {timeout_s:g} s: {problems}\n{self._log_tails()}"
                )
            time.sleep(0.05)

    def wait_until_healthy(self, timeout_s: float = 30.0) -> None:
        """Every live node: ``cluster_state:ok``, all slots assigned, the same slot map;
        every live replica's link to its master up; with all nodes alive, the expected
        number of masters and replicas."""

        def check() -> list[str]:
            live = self.live_nodes()
            problems = self._problems(live)
            if not problems and len(live) == len(self.nodes):
                topology = self.topology()
                masters = [n for n in topology if n.is_master and n.slots]
                replicas = [n for n in topology if not n.is_master]
                if len(masters) != self.master_count:
                    problems.append(f"{len(masters)} masters serve slots")
                if len(replicas) != self.master_count * self.replicas_per_master:
                    problems.append(f"{len(replicas)} replicas")
            return problems

        self._wait(check, timeout_s, "a healthy cluster")

    def _log_tails(self) -> str:
        return "\n".join(
            f"--- node {node.port} ({'alive' if node.alive else 'dead'}) log tail:\n"
            f"{node.log_tail(10)}"
            for node in self.nodes
        )

    # -- faults -----------------------------------------------------------------------

    def kill_master(self, port: int) -> None:
        """SIGKILLs the master on ``port``, remembering the slots it served."""
        node = self.node(port)
        me = [n for n in self.topology() if n.port == port]
        if not me or not me[0].is_master or not me[0].slots:
            raise ValueError(f"node {port} is not a master serving slots")
        killed_at = time.monotonic()
        node.stop(signal.SIGKILL)
        self._killed[port] = (killed_at, me[0].slots)

    def wait_for_failover(self, old_master_port: int, timeout_s: float = 30.0) -> float:
        """Waits until every slot the killed master served is served by another live
        master and the surviving nodes are healthy again; returns the seconds since the
        kill."""
        if old_master_port not in self._killed:
            raise ValueError(f"node {old_master_port} was not killed with kill_master()")
        killed_at, slots = self._killed[old_master_port]
        live_ports = {node.port for node in self.live_nodes()}

        def check() -> list[str]:
            problems = self._problems(self.live_nodes())
            if problems:
                return problems
            for first, last, (_, owner) in self.slot_owners():
                overlaps = any(first <= b and a <= last for a, b in slots)
                if overlaps and (owner == old_master_port or owner not in live_ports):
                    problems.append(f"slots {first}-{last} still served by {owner}")
            return problems

        self._wait(check, timeout_s, f"failover of {old_master_port}", FailoverTimeoutError)
        return time.monotonic() - killed_at
