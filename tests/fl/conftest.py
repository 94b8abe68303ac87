"""FL code makes its process single-threaded (tools/fl/threads.py: right for an FL process, whose
models are tiny). In-process tests would leave that setting to every later test in the same pytest
run, other tools' included, so each module here restores the thread counts it found."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _restore_thread_settings():
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    torch_threads = torch.get_num_threads()
    blas = {lib["prefix"]: lib["num_threads"] for lib in threadpool_info()}
    yield
    torch.set_num_threads(torch_threads)
    threadpool_limits(limits=blas)
