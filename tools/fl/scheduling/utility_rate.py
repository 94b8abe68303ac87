"""Ours: the round latency that buys the most statistical utility per second.

A round lasts as long as its slowest client and teaches about the sum of its clients' statistical utility
(Oort's |B_i| sqrt(mean loss^2)). For each latency L among the profiled clients, the k most useful clients no
slower than L would teach S(L) in a round of L: the cut-off is the L with the largest S(L) / L. Clients
whose utility is not known yet count as the median known one. Used by HeteroConfig(fast_cutoff="utility-rate"):
clients within the cut-off are all equally "fast", so `util` picks among them.
"""
from __future__ import annotations

import heapq
import statistics


def utility_rate_cutoff(latency: dict[int, float], utility: dict[int, float], k: int) -> float | None:
    """The latency cut-off with the most utility per second of round (None: nobody profiled)."""
    if not latency:
        return None
    typical = statistics.median(utility.values()) if utility else 1.0
    best_rate, best_latency = -1.0, None
    top: list[float] = []  # min-heap of the k largest utilities so far
    total = 0.0
    for cid, lat in sorted(latency.items(), key=lambda item: item[1]):
        u = utility.get(cid, typical)
        if len(top) < k:
            heapq.heappush(top, u)
            total += u
        elif u > top[0]:
            total += u - heapq.heapreplace(top, u)
        rate = total / max(lat, 1e-9)
        if rate > best_rate:
            best_rate, best_latency = rate, lat
    return best_latency
