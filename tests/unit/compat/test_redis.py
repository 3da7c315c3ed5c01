"""gateway/compat/redis.py: the redis-py internals the link uses, checked at import."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
from redis.asyncio.cluster import NodesManager
from redis.asyncio.connection import Connection
from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError

from gateway.compat import redis as compat_redis
from gateway.compat.versions import check

_INCOMPLETE = object()


@pytest.mark.parametrize("version", ["8.1.0", "8.1.3", "8.9.0rc1"])
def test_the_tested_versions_pass(version: str) -> None:
    check("redis", version, *compat_redis.TESTED, uses="internals")


@pytest.mark.parametrize("version", ["8.0.9", "7.4.0", "9.0.0"])
def test_a_version_outside_the_range_is_refused_naming_the_range(version: str) -> None:
    with pytest.raises(RuntimeError, match=r"redis >= 8\.1, < 9\.0.*" + version):
        check("redis", version, *compat_redis.TESTED, uses="internals")


def test_the_installed_version_is_in_the_range() -> None:
    low, high = compat_redis.TESTED
    installed = tuple(int(part) for part in compat_redis.VERSION.split(".")[:2])
    assert low <= installed < high  # and importing the module did not raise


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"-NOSCRIPT No matching script\r\n", NoScriptError),
        (b"-MOVED 3999 127.0.0.1:6381\r\n", MovedError),
        (b"-ASK 3999 127.0.0.1:6381\r\n", AskError),
        (b"-ERR unknown command\r\n", ResponseError),
    ],
)
def test_error_replies_are_redis_pys_exception_classes(reply: bytes, error: type) -> None:
    reader = compat_redis.reply_reader(Connection(), _INCOMPLETE)
    assert reader.gets() is _INCOMPLETE
    reader.feed(reply)
    parsed = reader.gets()
    assert type(parsed) is error


def test_a_reader_decodes_when_the_connection_does() -> None:
    reader = compat_redis.reply_reader(Connection(decode_responses=True), _INCOMPLETE)
    reader.feed(b"$2\r\nok\r\n")
    assert reader.gets() == "ok"


def test_the_installed_nodes_manager_has_every_part_the_slot_map_uses() -> None:
    assert compat_redis.missing_parts(NodesManager) == []


def test_a_nodes_manager_without_a_part_the_slot_map_uses_is_named() -> None:
    class Older:
        """A NodesManager of a redis-py that had no ``get_node`` nor ``connection_kwargs``."""

        __slots__ = ("nodes_cache",)

        def get_node_from_slot(self) -> None: ...
        def move_slot(self) -> None: ...
        def initialize(self) -> None: ...
        def get_nodes_by_server_type(self) -> None: ...

    assert compat_redis.missing_parts(Older) == ["get_node", "connection_kwargs"]


def test_the_check_covers_everything_the_slot_map_reads_of_the_nodes_manager() -> None:
    # Every ``self._nodes.<name>`` in SlotMap: a part used but not checked would fail on a
    # cluster's first redirection instead of at import.
    tree = ast.parse(textwrap.dedent(inspect.getsource(compat_redis.SlotMap)))
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "_nodes"
    }
    checked = {*compat_redis.NODES_MANAGER_METHODS, *compat_redis.NODES_MANAGER_ATTRIBUTES}
    assert used, "SlotMap reads nothing of the nodes manager: the scan is wrong"
    assert used <= checked, f"used but not checked at import: {sorted(used - checked)}"
