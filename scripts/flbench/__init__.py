"""Benchmark-only helpers of the fl benchmarks (scripts/bench_fl_*.py)."""
