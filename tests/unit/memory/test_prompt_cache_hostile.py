"""The fingerprint of the last forwarded context is read back from the session's meta: a
corrupt or enormous value there costs no more than the current context's own length."""

from __future__ import annotations

import tracemalloc

from gateway.memory.prompt_cache import fingerprint, message_print, shared_tokens

CURRENT = fingerprint([message_print(f"message {n}".encode(), 10) for n in range(8)])


def test_an_enormous_previous_fingerprint_is_read_only_as_far_as_the_current_one() -> None:
    previous = CURRENT + " 0123456789ab:1" * 500_000  # 7.5 MB: half a million entries
    tracemalloc.start()
    try:
        assert shared_tokens(CURRENT, previous) == 80
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(previous)  # not a list of half a million strings (~30 MB)


def test_garbage_shares_nothing() -> None:
    for garbage in ("", "x", "\ufffd:12 ::: :-1", "9" * 10_000, CURRENT[:10]):
        assert shared_tokens(CURRENT, garbage) == 0
