"""Which master a request-path command goes to on a cluster: its key's slot."""

from __future__ import annotations

from redis.crc import key_slot

from gateway.store.cluster import slot_of
from gateway.store.keys import SessionKeys, job_stream


def test_a_script_call_goes_to_its_first_keys_slot() -> None:
    keys = SessionKeys("tenant", "session")
    command = ("EVALSHA", "0" * 40, 3, keys.meta, keys.log, keys.tiers, "arg")
    assert slot_of(command) == key_slot(keys.meta.encode())
    # Every key of a session shares the slot: the script never spans two.
    assert {slot_of(("GET", key)) for key in keys.all()} == {slot_of(command)}


def test_a_plain_command_goes_to_its_keys_slot_whatever_its_case_or_type() -> None:
    assert slot_of(("xadd", job_stream(2), "*", "job", "x")) == key_slot(b"2")
    assert slot_of(("LRANGE", b"mg:{abc}:history", 0, -1)) == key_slot(b"abc")


def test_commands_without_a_key_go_anywhere() -> None:
    assert slot_of(("PING",)) is None
    assert slot_of(("EVALSHA", "0" * 40, 0)) is None
    assert slot_of(("SCRIPT",)) is None
