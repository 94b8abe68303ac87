"""Clusters whose nodes differ in GPU count: the spec, the free map, placement, and the daemon."""
import pytest
from sched_toy import LINEAR, SUB, job, state_with, toy_model

from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.config import ConfigError
from mlsyskit.tools.sched.cluster import ClusterSpec, FreeMap
from mlsyskit.tools.sched.daemon.jobstore import JobStore
from mlsyskit.tools.sched.daemon.scheduler import Scheduler
from mlsyskit.tools.sched.daemon.specs import JobRequest, load_cluster
from mlsyskit.tools.sched.policies import create_policy
from mlsyskit.tools.sched.state import Start
from mlsyskit.tools.sched.throughput import ThroughputModel

MODEL = toy_model({"lin": LINEAR, "sub": SUB}, gpus_per_node=6)


def test_mixed_spec_parses_prints_and_bounds_every_node():
    spec = ClusterSpec.parse("2x2+1x6")
    assert (spec.nodes, spec.gpus_per_node, spec.total_gpus, str(spec)) == (3, 6, 10, "2x2+1x6")
    assert [spec.capacity(n) for n in range(3)] == [2, 2, 6]
    assert ClusterSpec.parse("4x6") == ClusterSpec(4, 6) and ClusterSpec.of_nodes([6, 6]) == ClusterSpec(2, 6)
    with pytest.raises(ValueError, match="8x4\\+4x8"):
        ClusterSpec.parse("2x2+x6")
    free = FreeMap(spec)
    assert free.fit((6,)) == ((2, 6),) and free.fit((3,)) == ((2, 3),) and free.fit((2, 2, 2)) is not None
    assert free.fit((3, 3)) is None            # only one node has 3 GPUs
    with pytest.raises(ValueError, match="2 free GPUs, 3 requested"):
        free.take(((0, 3),))                   # a 2-GPU node never holds 3
    free.take(((0, 2),))
    with pytest.raises(ValueError, match="of 2"):
        free.give(((0, 3),))                   # nor has 3 free


def test_marble_places_each_shape_on_a_node_big_enough_best_fit_first():
    # sub is efficient on 4 GPUs of one node (gains 0.9, 0.7, 0.6, then 0.3 < 0.5); lin on 2 x 1.
    # On 2x2+1x6 the 4-GPU shape can only go to the 6-GPU node; the 2-GPU job fills a 2-GPU node
    # (best fit) instead of the big node's remaining 2.
    spec = ClusterSpec.parse("2x2+1x6")
    state = state_with(spec, [job(1, "sub", 6, 1e4), job(2, "lin", 2, 1e4)])
    starts = {a.job_id: a for a in create_policy("marble-fifo", MODEL).decide(state).actions if isinstance(a, Start)}
    assert starts[1].placement == ((2, 4),)
    assert starts[2].placement == ((0, 2),)


def test_daemon_on_mixed_nodes_keeps_device_ids_distinct_and_within_each_node(tmp_path):
    cluster_toml = tmp_path / "cluster.toml"
    cluster_toml.write_text('[[nodes]]\nname="big"\ngpus=4\nlogical=true\n[[nodes]]\nname="small"\ngpus=2\nlogical=true\n')
    cluster = load_cluster(cluster_toml)
    assert cluster.total_gpus == 6 and cluster.devices(0, True) == (0, 1, 2, 3) and cluster.devices(1, True) == (4, 5)
    truth = ThroughputModel()

    from test_daemon_scheduler import FakeExecutor

    executor = FakeExecutor()
    sched = Scheduler(cluster, JobStore(tmp_path / "jobs.db"), executor, create_policy("fifo", truth), truth,
                      VirtualClock(0.0), tmp_path)
    a = sched.submit(JobRequest(cmd="true", app="ncf", gpus=4)).id
    b = sched.submit(JobRequest(cmd="true", app="ncf", gpus=2)).id
    sched.step()
    # fifo takes whole nodes of any size, the smallest that is big enough: "big" for the 4-GPU job,
    # "small" for the 2-GPU one (it waited for "big" when only nodes of the largest size counted)
    assert sched.store.get(a).gpus == {0: (0, 1, 2, 3)} and sched.store.get(b).gpus == {1: (4, 5)}
    c = sched.submit(JobRequest(cmd="true", app="ncf", gpus=2)).id
    sched = Scheduler(cluster, sched.store, executor, create_policy("marble", truth), truth,
                      VirtualClock(0.0), tmp_path)
    sched.step()
    assert sched.store.get(c).state == "queued"   # every GPU is held: nothing to place it on
    with pytest.raises(Exception, match="more GPUs than the cluster has"):
        sched.submit(JobRequest(cmd="true", app="ncf", gpus=7))
    bad = tmp_path / "bad.toml"
    bad.write_text('[[nodes]]\nname="a"\ngpus=4\n[[nodes]]\nname="b"\ngpus=0\n')
    with pytest.raises(ConfigError, match="gpus"):
        load_cluster(bad)
