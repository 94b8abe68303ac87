import math

import pytest

from mlsyskit.tools.sched.profiles import canonical, load_profiles, shape_from_placement
from mlsyskit.tools.sched.scaling_model import held_out_error
from mlsyskit.tools.sched.throughput import ThroughputModel, compact_shape


@pytest.fixture(scope="module")
def model():
    return ThroughputModel()


def test_shapes_are_canonical():
    assert shape_from_placement("1212") == (2, 2, 1, 1)
    assert canonical([0, 3, 0, 5]) == (5, 3)
    assert compact_shape(13, 6) == (6, 6, 1)
    assert compact_shape(6, 6) == (6,)


def test_all_six_pollux_apps_load():
    profiles = load_profiles()
    assert sorted(profiles) == ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]
    assert all(p.max_gpus_per_node == 4 for p in profiles.values())


def test_measured_placement_reproduces_the_csv(model):
    # cifar10 placements.csv: "1,32,0.0427886962890625,..." -> 32 samples in 0.04279 s on one GPU
    step, _ = model.step_and_sync("cifar10", (1,), 32)
    assert step == pytest.approx(0.0427886962890625)
    assert model.rate("cifar10", (1,), 32) == pytest.approx(32 / 0.0427886962890625)


def test_large_batch_accumulates_gradients(model):
    # bert's largest measured local batch is 12: batch 24 on one GPU is two micro-steps of 12
    step, sync = model.step_and_sync("bert", (1,), 12)
    assert model.rate("bert", (1,), 24) == pytest.approx(24 / (sync + 2 * (step - sync)))


def test_unmeasured_six_gpu_node_is_anchored_to_the_measured_four(model):
    for app in model.apps:
        r4, r6 = model.rate(app, (4,), 3072), model.rate(app, (6,), 3072)
        assert math.isfinite(r6) and r6 > 0
        assert 0.5 * r4 < r6 < 2.0 * r4


def test_efficiency_is_one_on_one_gpu_and_ncf_scales_badly(model):
    assert model.efficiency("imagenet", (1,), 3200) == pytest.approx(1.0)
    assert model.efficiency("ncf", (6,), 32768) < 0.5  # tiny model: all-reduce dominates


def test_fitted_model_predicts_held_out_placements():
    for profile in load_profiles().values():
        err = held_out_error(profile, holdout=0.2, seed=0)
        assert err["test_rows"] > 50
        assert err["mape"] < 0.2, err


def test_unknown_app_is_reported(model):
    with pytest.raises(KeyError, match="unknown application"):
        model.check_app("gpt5")


def test_extrapolated_throughput_is_monotone_and_efficiency_never_rises(model):
    # Property over every application and every batch the workloads use, on 4-, 6- and 8-GPU nodes:
    # where the shape of K GPUs (compact layout) is extrapolated, T(K) >= T(K-1) and E(K) <= E(K-1).
    from mlsyskit.tools.sched.workloads import APP_BATCHES

    checked = 0
    for app, batches in APP_BATCHES.items():
        for batch in batches:
            for gpn in (4, 6, 8):
                for k in range(2, 65):
                    shape, prev = compact_shape(k, gpn), compact_shape(k - 1, gpn)
                    if model.is_measured(app, shape):
                        continue
                    t, t_prev = model.rate(app, shape, batch), model.rate(app, prev, batch)
                    assert t >= t_prev * (1 - 1e-12), (app, batch, gpn, k)
                    assert t / k <= t_prev / (k - 1) * (1 + 1e-12), (app, batch, gpn, k)
                    checked += 1
    assert checked > 1000


def test_the_jumps_of_the_issue_are_gone(model):
    # imagenet at batch 3200 on 6-GPU nodes: 26 GPUs were slower than 25; 6+6+1 more efficient than 6+6.
    assert model.rate("imagenet", compact_shape(26, 6), 3200) >= model.rate("imagenet", compact_shape(25, 6), 3200)
    assert model.efficiency("imagenet", (6, 6, 1), 3200) <= model.efficiency("imagenet", (6, 6), 3200)


def test_measured_points_are_marked_and_unchanged(model):
    rows = model.efficiency_curve("cifar10", 2048, 8, 6)
    assert [r["measured"] for r in rows] == [True] * 4 + [False] * 4   # 5 and 6 GPUs on one node: never run
    step, sync = model.step_and_sync("cifar10", (2, 2), 512)
    assert model.rate("cifar10", (2, 2), 2048) == pytest.approx(2048 / step)   # measured rows are not clamped
    assert model.is_measured("cifar10", (4, 4)) and not model.is_measured("cifar10", (6,))
