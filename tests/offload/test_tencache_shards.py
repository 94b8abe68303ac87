"""ZeRO-3 style ownership (shards.py): a byte-balanced, deterministic partition of the tensors, and each rank's view
of the profile (the same uses in the same order, only its own tensors)."""
from __future__ import annotations

import pytest

from mlsyskit.tools.offload.profiler import Profile, Use, named_tensors
from mlsyskit.tools.offload.shards import Shards, own_profile, partition, tensor_cost
from mlsyskit.tools.offload.sources import build


def gpt_costs(name: str) -> dict[int, int]:
    model, _ = build(name, 0, lazy=True)  # meta device: shapes only
    return {i: tensor_cost(2 * p.numel(), p.numel(), p.requires_grad) for i, (_, p) in enumerate(named_tensors(model))}


def test_tensor_cost_counts_the_compute_copy_and_fp32_state_of_trainable_tensors():
    assert tensor_cost(2 * 10, 10, True) == 20 + 160
    assert tensor_cost(2 * 10, 10, False) == 20


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_tensor_has_one_owner_and_shares_are_balanced(world):
    costs = gpt_costs("gpt-10m")
    owner = partition(costs, world)
    assert set(owner) == set(costs) and set(owner.values()) == set(range(world))
    shards = [Shards.of(costs, r, world) for r in range(world)]
    assert sum(s.load() for s in shards) == sum(costs.values())
    assert all(s.owner == shards[0].owner for s in shards)  # every rank computes the same partition
    assert shards[0].imbalance < 1.02
    # greedy onto the least-loaded rank: no share exceeds 1/N by more than the largest tensor
    assert max(s.load() for s in shards) <= sum(costs.values()) / world + max(costs.values())


def test_a_tensor_larger_than_the_even_share_is_not_split_and_the_imbalance_says_so():
    shards = Shards.of({0: 90, 1: 5, 2: 5}, 0, 2)
    assert shards.owner == {0: 0, 1: 1, 2: 1}
    assert shards.imbalance == pytest.approx(1.8)


def test_partition_refuses_an_empty_world():
    with pytest.raises(ValueError, match="world size"):
        partition({0: 1}, 0)


def test_each_rank_sees_the_same_uses_with_only_its_own_tensors():
    prof = Profile(model="m", signature="s", batch=1, seq=2, tensors=[], optimizer_order=[3, 2, 1, 0],
                   uses=[Use("a", "forward", (0, 1)), Use("b", "forward", (2,)), Use("b", "backward", (2, 3))])
    shards = [Shards.of({0: 10, 1: 10, 2: 10, 3: 10}, r, 2) for r in (0, 1)]
    views = [own_profile(prof, s) for s in shards]
    for view, s in zip(views, shards, strict=True):
        assert [(u.module, u.phase) for u in view.uses] == [(u.module, u.phase) for u in prof.uses]
        assert all(s.owns(t) for u in view.uses for t in u.tensors)
        assert view.optimizer_order == [t for t in prof.optimizer_order if s.owns(t)]
    assert sorted(t for v in views for u in v.uses for t in u.tensors) == [0, 1, 2, 2, 3]
