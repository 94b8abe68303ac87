"""Pool sizing formula and profile-order placement."""
from __future__ import annotations

import pytest

from mlsyskit.tools.offload.pools import BudgetError, class_slots, first_use_order, place, pool_bytes


def test_formula_shares_budget_by_bytes_in_class():
    # classes: 8 KiB x 10 (80 KiB), 32 KiB x 10 (320 KiB); budget 200 KiB
    slots = class_slots({8192: 10, 32768: 10}, 200 * 1024, tier="device")
    # share_8K = 0.2 -> round(0.2*200K/8K) = 5; share_32K = 0.8 -> round(0.8*200K/32K) = 5
    assert slots == {8192: 5, 32768: 5}
    assert pool_bytes(slots) <= 200 * 1024


def test_slots_capped_by_count_and_small_classes_exact():
    slots = class_slots({4096: 2, 8192: 1, 65536: 4}, 10 << 20, tier="cpu")
    assert slots == {4096: 2, 8192: 1, 65536: 4}  # everything fits: never more slots than tensors
    slots = class_slots({4096: 1, 65536: 40}, 300 * 1024, tier="cpu")
    assert slots[4096] == 1  # a class with one tensor gets exactly one slot
    assert 1 <= slots[65536] <= 4


def test_every_class_gets_a_slot_and_too_small_budget_is_a_clear_error():
    slots = class_slots({128: 100, 1 << 20: 2}, (1 << 20) + 8192, tier="device")
    assert slots[128] >= 1 and slots[1 << 20] == 1
    with pytest.raises(BudgetError, match=r"device budget 512.00 KiB is too small: one tensor of each size class needs .*\(the largest tensor is 1.00 MiB\)"):
        class_slots({128: 10, 1 << 20: 3}, 512 * 1024, tier="device")


def test_with_nvme_the_cpu_tier_needs_no_slot_per_class():
    """Tensors move NVMe -> device directly, so the CPU tier (min_one=False) takes a budget smaller than one
    tensor of a class and simply gives that class no slot."""
    slots = class_slots({128: 10, 1 << 20: 3}, 512 * 1024, tier="CPU", min_one=False, small_first=True)
    assert slots[1 << 20] == 0 and slots[128] >= 1 and pool_bytes(slots) <= 512 * 1024
    assert class_slots({1 << 20: 3}, 0, tier="CPU", min_one=False) == {1 << 20: 0}


def test_min_slots_cover_the_tensors_one_module_uses_at_once():
    dist = {128: 40, 8192: 16}
    assert class_slots(dist, 12 * 1024, tier="device") == {128: 1, 8192: 1}
    slots = class_slots(dist, 64 * 1024, tier="device", min_slots={128: 2, 8192: 4})
    assert slots[128] >= 2 and slots[8192] >= 4 and pool_bytes(slots) <= 64 * 1024
    with pytest.raises(BudgetError, match=r"the tensors one module uses at once \(per size class\) need 40.00 KiB"):
        class_slots(dist, 36 * 1024, tier="device", min_slots={128: 2, 8192: 4})


def test_rounding_never_overshoots_the_budget():
    dist = {5000: 7, 12000: 9, 70000: 3}
    for budget in (100_000, 150_000, 333_333):
        assert pool_bytes(class_slots(dist, budget, tier="x")) <= budget


def test_first_use_order_and_placement_fill_device_then_cpu_then_nvme():
    uses = [(3,), (1, 2), (3,), (0,)]
    order = first_use_order(uses, 5)
    assert order == [3, 1, 2, 0, 4]
    sizes = {0: 10, 1: 10, 2: 20, 3: 10, 4: 20}
    p = place(order, sizes, device_slots={10: 1, 20: 1}, cpu_slots={10: 1, 20: 0})
    assert p.device == {3, 2} and p.cpu == {1} and p.nvme == {0, 4}
    assert p.tier_of(3) == "device" and p.tier_of(0) == "nvme"
