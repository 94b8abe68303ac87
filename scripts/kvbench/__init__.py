"""bespokv's benchmark-only helpers (scripts/bench_kv_faults.py): replacement, recovery and join
figures of process clusters. Not shipped in the package; they import mlsyskit.tools.kv, never the
other way round."""
