"""All schedulers on the harness's synthetic model, mean over seeds, as a markdown table on stdout.

    python -m mlsyskit.tools.fl.scheduling.compare [clients per_round rounds seeds]

A model, not training (see learning_model.py): the figures check directions, not the issue's
targets. Availability is synthetic (on 1800 s / off 600 s per client, seeded).
"""
from __future__ import annotations

import statistics
import sys
from typing import Any

from mlsyskit.tools.fl.scheduling.availability import SyntheticAvailability
from mlsyskit.tools.fl.scheduling.harness import HarnessConfig, run
from mlsyskit.tools.fl.selectors import SELECTORS, make_selector

ORDER = ["random", "tifl", "oort", "fast", "rfair", "afair", "perf", "adaptive"]
COLUMNS = [("mean_round_s", "mean round s", 2), ("time_to_target_s", "time to 0.8 s", 1),
           ("final_accuracy", "final acc", 3), ("participation_jain", "participation Jain", 3),
           ("cpu_jain", "CPU Jain", 3), ("wasted_fraction", "wasted CPU fraction", 3),
           ("client_accuracy_std", "client acc std", 4), ("client_accuracy_worst10_mean", "worst-10% acc", 3)]


def compare(config: HarnessConfig, seeds: range, target: float = 0.8) -> dict[str, dict[str, Any]]:
    out = {}
    for name in [n for n in ORDER if n in SELECTORS.names()]:
        rows = [run(make_selector(name), config, seed,
                    availability=SyntheticAvailability(seed, mean_on_s=1800, mean_off_s=600)).summary(target)
                for seed in seeds]
        means: dict[str, Any] = {}
        for key, _, _ in COLUMNS:
            values = [r[key] for r in rows]
            means[key] = None if any(v is None for v in values) else statistics.mean(values)
        out[name] = means
    return out


def main(argv: list[str]) -> None:
    clients, per_round, rounds, seeds = (int(a) for a in (argv + ["100", "10", "60", "5"][len(argv):]))
    results = compare(HarnessConfig(clients=clients, per_round=per_round, rounds=rounds), range(seeds))
    print("| scheduler | " + " | ".join(title for _, title, _ in COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for name, means in results.items():
        cells = ["never" if means[k] is None else f"{means[k]:.{d}f}" for k, _, d in COLUMNS]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
