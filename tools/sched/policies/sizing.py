"""How many GPUs a job uses well, read off its throughput curve (MARBLE's size rule), and on which
layout: the helpers every marble policy shares."""
from __future__ import annotations

from mlsyskit.tools.sched.profiles import Shape
from mlsyskit.tools.sched.throughput import ThroughputModel, compact_shape


def best_shape(model: ThroughputModel, app: str, batch: int, gpus: int, gpus_per_node: int) -> Shape:
    """The faster of the compact layout and the even split over the same number of nodes."""
    compact = compact_shape(gpus, gpus_per_node)
    nodes = len(compact)
    base, rest = divmod(gpus, nodes)
    even = tuple(sorted([base + 1] * rest + [base] * (nodes - rest), reverse=True))
    if even == compact:
        return compact
    return max((compact, even), key=lambda s: (model.rate(app, s, batch), s))


def layouts(model: ThroughputModel, app: str, batch: int, most: int, gpus_per_node: int
            ) -> tuple[list[Shape], list[float]]:
    """Best shapes for 1..most GPUs (index p-1) and their rates (rates[p] = T(p), rates[0] = 0)."""
    shapes = [best_shape(model, app, batch, p, gpus_per_node) for p in range(1, most + 1)]
    return shapes, [0.0] + [model.rate(app, s, batch) for s in shapes]


def efficient_size(rates: list[float], request: int, threshold: float) -> int:
    """p* <= request: where the marginal gain of one more GPU drops below `threshold` single-GPU
    throughputs, read off the upper concave envelope of rates[0..request] (see sized_shapes)."""
    accepted = 0
    while accepted < request:
        gain, vertex = -float("inf"), accepted
        for q in range(accepted + 1, request + 1):
            slope = (rates[q] - rates[accepted]) / (q - accepted)
            if slope >= gain - 1e-12:
                gain, vertex = slope, q
        if gain < threshold * rates[1]:
            break
        accepted = vertex
    return max(accepted, 1)


def ladder(rates: list[float], start: int, threshold: float) -> list[int]:
    """Sizes above `start` on the upper concave envelope of rates[start..], in order, each adding
    at least `threshold` single-GPU throughputs per GPU over the one before (the sizes worth
    growing a job of `start` GPUs to, one step at a time)."""
    out, at = [], start
    while at < len(rates) - 1:
        gain, vertex = -float("inf"), at
        for q in range(at + 1, len(rates)):
            slope = (rates[q] - rates[at]) / (q - at)
            if slope >= gain - 1e-12:
                gain, vertex = slope, q
        if gain < threshold * rates[1]:
            break
        out.append(vertex)
        at = vertex
    return out


def sized_shapes(model: ThroughputModel, app: str, batch: int, request: int, gpus_per_node: int,
                 threshold: float) -> list[Shape]:
    """Best shapes for 1..p* GPUs (index p-1), p* <= request: where the marginal gain of one more
    GPU drops below `threshold` single-GPU throughputs.

    Marginal gains are read off the upper concave envelope of the measured curve T(0)=0, T(1),
    ..., T(request): from the last accepted size a, the next envelope vertex q is the size with
    the steepest slope (T(q) - T(a)) / (q - a), the farthest on ties. That slope is the marginal
    gain of each GPU from a to q; q is accepted while it is >= threshold. On the envelope the
    gains only fall, so "where the gain drops below the threshold" is one well-defined point, and
    a dip in the measurements (yolov3 runs slower on 3 GPUs than on 2, then faster on 4) is
    bridged instead of ending the walk. p* is always a measured point of the curve."""
    shapes, rates = layouts(model, app, batch, request, gpus_per_node)
    return shapes[: efficient_size(rates, request, threshold)]
