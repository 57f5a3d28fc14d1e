"""Benchmarks: `make bench` runs every bench/bench_*.py and writes ratios against a baseline measured in the same run."""
