"""Compare marble variants on the shipped workloads only (bench_marble.TUNING, both clusters): mean
JCT over tiresias' and optimus', per cell and as geometric means. How the batch lever's constants
were chosen (docs/results/bench_marble_batch_tune.txt).

    .venv/bin/python scripts/marblebench/tune_batch.py '{"chosen": {}, "adm035": {"admit_threshold": 0.35}}' [SEEDS]

Each variant is PolicyOptions overrides; "_policy" runs another policy instead of marble.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_marble import CLUSTERS, RESTART_COST, TUNING  # noqa: E402

from mlsyskit.tools.sched.cluster import ClusterSpec  # noqa: E402
from mlsyskit.tools.sched.experiment import WorkloadSource, run_one  # noqa: E402
from mlsyskit.tools.sched.policies import PolicyOptions  # noqa: E402
from mlsyskit.tools.sched.throughput import ThroughputModel  # noqa: E402


def main() -> None:
    model = ThroughputModel()
    variants = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {"chosen": {}}
    seeds = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1]
    rows = {}
    for name in TUNING:
        for cluster in CLUSTERS:
            spec = ClusterSpec.parse(cluster)
            for seed in seeds:
                source = WorkloadSource(name)
                jobs = source.load(model, seed, spec)
                row = {p: run_one(source, spec, p, seed, model, PolicyOptions(), RESTART_COST, jobs=jobs)
                       .summary["avg_jct_s"] for p in ("tiresias", "optimus")}
                for label, opts in variants.items():
                    opts = dict(opts)
                    policy = opts.pop("_policy", "marble")
                    options = PolicyOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in opts.items()})
                    row[label] = run_one(source, spec, policy, seed, model, options, RESTART_COST,
                                         jobs=jobs).summary["avg_jct_s"]
                rows[(name, cluster, seed)] = row
                print(name, cluster, seed, " ".join(f"{v}: /t {row[v] / row['tiresias']:.3f} /o {row[v] / row['optimus']:.3f}"
                                                    for v in variants), flush=True)
    for label in variants:
        gt = math.exp(statistics.fmean(math.log(r[label] / r["tiresias"]) for r in rows.values()))
        go = math.exp(statistics.fmean(math.log(r[label] / r["optimus"]) for r in rows.values()))
        print(f"GEOMEAN {label}: /tiresias {gt:.3f} /optimus {go:.3f}")


if __name__ == "__main__":
    main()
