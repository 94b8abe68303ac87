"""One BLAS/torch thread per FL process.

FL matrices are tiny (a 64x64 MLP): a multithreaded BLAS spends more time waking and
synchronising its threads than multiplying, and on a loaded machine a 50 us product can take
tens of milliseconds. Ten clients on two cores also want one thread each.
"""
from __future__ import annotations

import sys


def single_threaded() -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # ships with scikit-learn; without it we keep numpy's default
        pass
    else:
        threadpool_limits(1)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
