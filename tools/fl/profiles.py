"""Simulated client speeds seeded from FLASH's measured phone data (see data/PROVENANCE.md).

Each client draws one phone (its CPU float AI score sets its compute rate relative to the
median phone) and one bandwidth trace (per-round up/down speeds drawn from that device's
measured normal distribution, floored at 10% of the mean). A round's simulated time is
    download(model) + samples * epochs / rate + upload(model).
The mapping from AI score to samples/s (`median_rate`) is ours: FLASH measured scores, not
our MLP.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from mlsyskit.core.sim import Seeds

DATA = Path(__file__).parent / "data"


@lru_cache(maxsize=1)
def _flash() -> tuple[np.ndarray, list[dict[str, float]]]:
    devices = json.loads((DATA / "flash-device-benchmarks.json").read_text())
    scores = np.array([float(d["CPU_F_AI_Score"]) for d in devices
                       if str(d.get("CPU_F_AI_Score", "")).replace(".", "", 1).isdigit()])
    links = list(json.loads((DATA / "flash-speed-distribution.json").read_text()).values())
    return scores, links


@dataclass(frozen=True)
class ClientProfile:
    client_id: int
    compute_rate: float  # samples per second
    down_kbps: float
    down_sigma: float
    up_kbps: float
    up_sigma: float

    def round_time(self, model_bytes: int, samples: int, epochs: int, rng: np.random.Generator) -> float:
        down = max(rng.normal(self.down_kbps, self.down_sigma), 0.1 * self.down_kbps)
        up = max(rng.normal(self.up_kbps, self.up_sigma), 0.1 * self.up_kbps)
        bits = model_bytes * 8 / 1000.0
        return bits / down + samples * epochs / self.compute_rate + bits / up


def flash_profiles(num_clients: int, seed: int, median_rate: float = 200.0) -> list[ClientProfile]:
    scores, links = _flash()
    rng = Seeds(seed).numpy("flash-profiles")
    median = float(np.median(scores))
    out = []
    for cid in range(num_clients):
        score = float(scores[rng.integers(len(scores))])
        link = links[int(rng.integers(len(links)))]
        out.append(ClientProfile(cid, median_rate * score / median, link["down_u"], link["down_sigma"],
                                 link["up_u"], link["up_sigma"]))
    return out
