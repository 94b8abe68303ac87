"""What the CLI's client operations retry (mapfollow.retrying): refusals that ran nothing always,
an unknown outcome only for operations whose repetition changes nothing; the rest fails at once."""
from __future__ import annotations

import asyncio

import pytest

from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.retry import Backoff
from mlsyskit.tools.kv.client.mapfollow import retriable, retrying
from mlsyskit.tools.kv.client.smart import KVError

FENCED = KVError("TRYAGAIN fenced: s0r0 has no current lease from the coordinator; retry")
FAST = Backoff(0.001, 0.001)
TIMED_OUT = KVError("TRYAGAIN write timed out waiting for the chain; it may still be applied")


@pytest.mark.parametrize(("error", "idempotent", "expected"), [
    (FENCED, False, True),
    (KVError("CLUSTERDOWN shard 0 has no reachable head"), False, True),
    (KVError("TRYAGAIN not serving yet: catching up"), False, True),
    (TIMED_OUT, True, True),
    (TIMED_OUT, False, False),  # a DEL repeated after an unknown outcome would report 0
    (KVError("ERR syntax error"), True, False),
    (KVError("WRONGTYPE Operation against a key holding the wrong kind of value"), True, False),
    (ConnectionRefusedError(111, "refused"), True, True),
    (ConnectionRefusedError(111, "refused"), False, False),
    (TimeoutError(), True, True),
])
def test_what_is_retriable(error: BaseException, idempotent: bool, expected: bool) -> None:
    assert retriable(error, idempotent) is expected


def test_retrying_repeats_transient_refusals_and_fails_at_once_on_the_rest() -> None:
    calls: list[int] = []

    def flaky(errors: list[BaseException], value: str):
        async def call():
            calls.append(1)
            if errors:
                raise errors.pop(0)
            return value
        return call

    assert asyncio.run(retrying(flaky([FENCED, TIMED_OUT], "v"), idempotent=True, backoff=FAST)) == "v"
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(KVError, match="TRYAGAIN write timed out"):  # not repeated for a DEL
        asyncio.run(retrying(flaky([TIMED_OUT], "v"), idempotent=False, backoff=FAST))
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(KVError, match="syntax error"):
        asyncio.run(retrying(flaky([KVError("ERR syntax error")], "v"), idempotent=True, backoff=FAST))
    assert len(calls) == 1


def test_retrying_gives_up_with_the_last_error_after_its_time() -> None:
    calls: list[int] = []
    clock = VirtualClock()

    async def always_fenced():
        calls.append(1)
        raise FENCED
    with pytest.raises(KVError, match="fenced"):
        asyncio.run(retrying(always_fenced, idempotent=False, within_s=0.2, backoff=Backoff(0.02, 0.02),
                             clock=clock))
    assert 2 <= len(calls) and clock.now() == pytest.approx(0.2)  # tried until within_s, not for ever
