"""Where a profiled fl process's time goes: py-spy's collapsed stacks summed by category
(bench_fl_transport.py --profile). Benchmark-only; shared by nothing in the product."""
from __future__ import annotations

import re
from pathlib import Path

# where a profiled process's samples go, first match wins (py-spy samples only running threads); regexes on a stack
CATEGORIES = (
    ("start-up (imports, data, local-only baseline)", r"_find_and_load|local_only_accuracy|load_client_data|"
                                                      r"load_server_data|write_partition"),
    ("local epochs (timed as training)", r"_train \([^)]*training\.py"),
    ("train_local outside the epochs (model build, weights in/out, test accuracy)", r"train_local \("),
    ("serialisation (msgpack / protobuf, ndarray <-> bytes)", r"msgpack|packb|unpackb|serde|ndarray_to_bytes|"
                                                              r"bytes_to_ndarray|_pack|_unpack|protobuf|_digest"),
    ("aggregation", r"aggregate"),
    ("evaluation", r"evaluate"),
    ("commit (SQLite checkpoint, events)", r"sqlite|storage|commit|telemetry|_checkpoint"),
    ("resource measurement (psutil)", r"psutil|Snapshot|heartbeat"),
    ("gRPC, asyncio, threads", r"grpc|asyncio|threading|_run_once|run_forever"),
)


def where_time_goes(raw: Path) -> dict:
    """py-spy's collapsed stacks ('frame;frame;... count') summed by CATEGORIES, in samples and shares."""
    counts: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        name = next((c for c, pattern in CATEGORIES if re.search(pattern, stack)), "other")
        counts[name] = counts.get(name, 0) + int(n)
    total = sum(counts.values()) or 1
    return {"samples": total, "share": {k: v / total for k, v in sorted(counts.items(), key=lambda kv: -kv[1])},
            "top_outside_training": _top(raw)}


def _top(raw: Path, count: int = 25) -> list[tuple[str, float]]:
    """Functions by inclusive share of the samples that are neither start-up nor the local epochs."""
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit() or re.search(CATEGORIES[0][1], stack) or re.search(CATEGORIES[1][1], stack):
            continue
        total += int(n)
        for frame in set(stack.split(";")):
            inclusive[frame] = inclusive.get(frame, 0) + int(n)
    ranked = sorted(inclusive.items(), key=lambda kv: -kv[1])[:count]
    return [(frame, n / max(total, 1)) for frame, n in ranked]
