"""The slow-reader rule (``http.slow_readers``): pure, and the socket's own counts."""

from __future__ import annotations

import socket

from gateway.http.slow_readers import Sample, too_slow


def test_a_client_that_takes_nothing_of_what_waits_is_too_slow() -> None:
    before, now = Sample(0.0, 1000, 50_000), Sample(30.0, 1000, 60_000)
    assert too_slow(before, now, 1024)


def test_a_trickle_under_the_rate_is_too_slow_and_one_at_it_is_not() -> None:
    before = Sample(0.0, 0, 1 << 20)
    assert too_slow(before, Sample(30.0, 30 * 500, 1 << 20), 1024)  # 500 B/s
    assert not too_slow(before, Sample(30.0, 30 * 1024, 1 << 20), 1024)


def test_a_client_that_took_all_that_waited_is_not_too_slow() -> None:
    # 2 KB waited; it took them all, far under the rate: the stream is slow, not it.
    assert not too_slow(Sample(0.0, 0, 2048), Sample(30.0, 2048, 0), 1024)


def test_nothing_waiting_is_never_too_slow() -> None:
    assert not too_slow(Sample(0.0, 0, 0), Sample(30.0, 0, 4096), 1024)


def test_a_real_socket_tells_what_its_peer_took_and_what_waits() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            peer.setblocking(False)
            sent = 0
            try:
                while sent < 4 << 20:  # until the client's window and our buffer are full
                    sent += peer.send(b"x" * 65536)
            except BlockingIOError:
                pass
            seen = Sample.of(peer, buffered=0, at=1.0)
            assert seen is not None
            assert seen.taken + seen.waiting == sent
            assert seen.waiting > 0
    assert Sample.of(None, 0, 0.0) is None
