"""FL code tunes its process: one torch/BLAS thread (tools/fl/threads.py: its models are tiny) and,
in the CLIs, the cyclic GC paused during start-up and then frozen. In-process tests would leave
those settings to every later test of the same pytest run, other tools' included, so each module
here restores what it found."""
from __future__ import annotations

import gc

import pytest


@pytest.fixture(autouse=True, scope="module")
def _restore_process_settings():
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    torch_threads = torch.get_num_threads()
    blas = {lib["prefix"]: lib["num_threads"] for lib in threadpool_info()}
    gc_enabled, frozen = gc.isenabled(), gc.get_freeze_count()
    yield
    torch.set_num_threads(torch_threads)
    threadpool_limits(limits=blas)
    if gc.get_freeze_count() > frozen:
        gc.unfreeze()
    if gc_enabled:
        gc.enable()
