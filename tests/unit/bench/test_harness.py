"""What a benchmark result records of where it was measured: the CPU model, redis-server's
version, and the libraries' (bench/_harness.py)."""

from __future__ import annotations

import pytest

from bench._harness import LIBRARIES, cpu_model, redis_server_version, versions

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13 64-Core Processor
flags\t\t: fpu vme

processor\t: 1
model name\t: AMD EPYC 7B13 64-Core Processor
"""


@pytest.mark.parametrize(
    ("text", "model"),
    [
        (CPUINFO, "AMD EPYC 7B13 64-Core Processor"),
        ("model name:Intel(R) Xeon(R) CPU @ 2.20GHz  \n", "Intel(R) Xeon(R) CPU @ 2.20GHz"),
        ("processor\t: 0\nCPU part\t: 0xd0c\n", "unknown"),  # an ARM board names no model
        ("", "unknown"),
    ],
)
def test_the_cpu_model_is_the_first_model_name(text: str, model: str) -> None:
    assert cpu_model(text) == model


@pytest.mark.parametrize(
    ("output", "version"),
    [
        ("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64", "7.0.15"),
        ("Redis server v=6.2.912183 sha=00000000:0 malloc=libc bits=64", "6.2.912183"),
        ("", "unknown"),
    ],
)
def test_redis_servers_version_is_read_from_its_banner(output: str, version: str) -> None:
    assert redis_server_version(output) == version


def test_every_library_the_results_name_has_a_version() -> None:
    found = versions(redis_binary="/nonexistent/redis-server")
    names = {"python", "redis-server", *LIBRARIES.values()}
    assert set(found) == names
    assert {"aiohttp", "uvicorn", "starlette", "redis-py", "orjson", "tiktoken"} <= names
    assert found["redis-server"] == "unknown"
    assert all(found[name] for name in names)
