"""gateway/compat/redis.py: the redis-py internals the link uses, checked at import."""

from __future__ import annotations

import pytest
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
