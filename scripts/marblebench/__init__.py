"""Parts of scripts/bench_marble.py (benchmark-only: not shipped in the package)."""

RESTART_COST = 30.0  # seconds a checkpoint-restart costs a job in every replay of the benchmark
