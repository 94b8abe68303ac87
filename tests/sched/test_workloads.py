import pytest

from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource
from mlsyskit.tools.sched.throughput import ThroughputModel, compact_shape
from mlsyskit.tools.sched.workloads import (
    APP_CLASS,
    SIZE_CLASSES,
    SyntheticSpec,
    WorkloadError,
    builtin_workload,
    load_philly,
    load_pollux,
    synthetic,
)

MODEL = ThroughputModel()
SPEC = ClusterSpec(16, 6)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_pollux_workloads_load_with_work_in_their_size_class(n):
    jobs = load_pollux(builtin_workload(f"workload-{n}"), MODEL, seed=0, gpus_per_node=6)
    assert len(jobs) == 160
    for j in jobs:
        lo, hi = SIZE_CLASSES[APP_CLASS[j.app]]
        gpu_hours = j.work / MODEL.rate(j.app, compact_shape(j.gpus, 6), j.batch_size) * j.gpus / 3600
        assert lo <= gpu_hours <= hi
    assert load_pollux(builtin_workload(f"workload-{n}"), MODEL, 0, 6) == jobs
    assert load_pollux(builtin_workload(f"workload-{n}"), MODEL, 1, 6) != jobs


def test_philly_mapping_is_seeded_and_follows_the_size_class(tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                    "1000,600,1,600,c1\n"          # 0.17 GPU-h: S -> cifar10 or ncf
                    "1100,3600,4,14400,c1\n"        # 4 GPU-h: M -> bert or deepspeech2
                    "1200,36000,8,288000,c2\n"      # 80 GPU-h: L -> yolov3
                    "1300,36000,16,,c2\n"           # gpu_time missing: 160 GPU-h: XL -> imagenet
                    "1400,0,2,0,c2\n")              # failed at launch: dropped
    jobs = load_philly(path, MODEL, seed=7, gpus_per_node=6)
    assert [j.arrival for j in jobs] == [0.0, 100.0, 200.0, 300.0]
    assert jobs[0].app in ("cifar10", "ncf") and jobs[1].app in ("bert", "deepspeech2")
    assert (jobs[2].app, jobs[3].app) == ("yolov3", "imagenet")
    assert jobs[1].work == pytest.approx(3600 * MODEL.rate(jobs[1].app, (4,), jobs[1].batch_size))
    assert load_philly(path, MODEL, seed=7, gpus_per_node=6) == jobs
    assert WorkloadSource(str(path)).load(MODEL, 7, SPEC) == jobs


def test_synthetic_poisson_hits_the_offered_load():
    jobs = synthetic(SyntheticSpec(jobs=3000, load=0.8), MODEL, seed=1, total_gpus=96, gpus_per_node=6)
    assert len(jobs) == 3000 and jobs == synthetic(SyntheticSpec(3000, 0.8), MODEL, 1, 96, 6)
    gpu_seconds = sum(j.work / MODEL.rate(j.app, compact_shape(j.gpus, 6), j.batch_size) * j.gpus for j in jobs)
    span = jobs[-1].arrival - jobs[0].arrival
    assert 0.6 < gpu_seconds / (96 * span) < 1.0
    mixed = synthetic(SyntheticSpec(jobs=500, load=0.5, size_mix=((1, 1.0), (12, 1.0))), MODEL, 1, 96, 6)
    assert {j.gpus for j in mixed} == {1, 12}


def test_synthetic_size_mix_from_the_workload_text():
    jobs = WorkloadSource("synthetic:400@0.5/1:3,12:1").load(MODEL, 2, SPEC)
    counts = {g: sum(j.gpus == g for j in jobs) for g in (1, 12)}
    assert counts[1] + counts[12] == 400 and 2 * counts[12] < counts[1] < 4.5 * counts[12]
    assert jobs == WorkloadSource("synthetic:400@0.5/1:3,12:1").load(MODEL, 2, SPEC)


@pytest.mark.parametrize("text, message", [
    ("missing.csv", "not found"),
    ("synthetic:abc", "synthetic workloads look like"),
    ("synthetic:10/1:x", "synthetic workloads look like"),
    ("synthetic:10/0:1", "size mix needs GPUs >= 1"),
    ("synthetic:10/1:0,2:0", "not all 0"),
    ("synthetic:10@1e-9", "load must be in \\[0.001, 10\\].*got 1e-09"),
    ("synthetic:10@11", "load must be in"),
])
def test_bad_workloads_are_clear_errors(text, message):
    with pytest.raises(WorkloadError, match=message):
        WorkloadSource(text).load(MODEL, 0, SPEC)


def test_wrong_columns_and_bad_values(tmp_path):
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b\n1,2\n")
    with pytest.raises(WorkloadError, match="neither Pollux"):
        WorkloadSource(str(odd)).load(MODEL, 0, SPEC)
    bad = tmp_path / "bad.csv"
    bad.write_text("name,time,application,num_replicas,batch_size\nj,0,gpt,1,32\n")
    with pytest.raises(WorkloadError, match="unknown application 'gpt'"):
        load_pollux(bad, MODEL, 0, 6)


POLLUX_HEADER = "name,time,application,num_replicas,batch_size\n"
PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


@pytest.mark.parametrize("body, message", [
    (POLLUX_HEADER + "a,nan,bert,2,384\n", "time must be in"),   # NaN arrivals used to hang the replay
    (POLLUX_HEADER + "a,inf,bert,2,384\n", "time must be in"),
    # the field is named; fractional GPUs say so; absurd sizes are refused, not replayed
    (POLLUX_HEADER + "a,0,bert,1.5,384\n", "num_replicas must be a whole number, got '1.5' .fractional"),
    (POLLUX_HEADER + "a,0,bert,2,1e12\n", "batch_size must be in \\[1, 10,000,000\\], got '1e12'"),
    (POLLUX_HEADER + "a,0,bert,two,384\n", "num_replicas must be a whole number, got 'two'"),
    (PHILLY_HEADER + "0,1e12,1,,c\n", "duration must be at most"),
    (PHILLY_HEADER + "0,100,0.5,,c\n", "num_gpus must be a whole number"),
    (POLLUX_HEADER + "a,0,bert,2,384\nb,0,bert,2\n", "line 3: fewer fields"),
    (PHILLY_HEADER + "0,nan,2,,c\n", "must be finite"),
    (PHILLY_HEADER + "0,100,2,-5,c\n", "gpu_time >= 0"),
])
def test_malformed_rows_are_clear_errors(tmp_path, body, message):
    path = tmp_path / "w.csv"
    path.write_text(body)
    with pytest.raises(WorkloadError, match=message):
        WorkloadSource(str(path)).load(MODEL, 0, SPEC)


def test_binary_file_is_a_clear_error(tmp_path):
    path = tmp_path / "w.csv"
    path.write_bytes(bytes(range(128, 256)))
    with pytest.raises(WorkloadError, match="not a text CSV"):
        WorkloadSource(str(path)).load(MODEL, 0, SPEC)
