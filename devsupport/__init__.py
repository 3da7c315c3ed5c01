"""What the test suite and the benchmarks both run: Redis servers and clusters, a fake
upstream on a real socket, a TCP proxy, load and disconnect drivers, stored-log checks.

Development only: not part of the wheel (pyproject's package list is ``gateway*``), and
it imports nothing from ``tests/`` or ``bench/``.
"""
