"""Benchmarks that print tables (not timed tests): ``python bench/recall.py --help``."""
