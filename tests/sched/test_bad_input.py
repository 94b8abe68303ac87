"""Bad input is refused with a clear usage error, and no input makes a policy spin."""
import json
import math

import pytest
from sched_toy import FLAT, LINEAR, job, toy_model

from mlsyskit.core.config import ConfigError
from mlsyskit.core.errors import UsageError
from mlsyskit.core.telemetry import Telemetry
from mlsyskit.tools.sched.cluster import MAX_NODES, ClusterSpec
from mlsyskit.tools.sched.experiment import parse_policies
from mlsyskit.tools.sched.policies import POLICIES, PolicyOptions, create_policy
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.throughput import ThroughputModel
from mlsyskit.tools.sched.workloads import WorkloadError, load_philly, load_pollux, parse_timestamp

MODEL = toy_model({"lin": LINEAR, "flat": FLAT})
TRUTH = ThroughputModel()


def test_philly_date_time_stamps_are_accepted(tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                    "2017-10-03 14:05:00,600,1,600,c1\n"
                    "2017-10-03 14:06:40,3600,4,,c1\n"
                    "2017-10-04T14:05:00,3600,2,,c1\n")
    jobs = load_philly(path, TRUTH, seed=0, gpus_per_node=6)
    assert [j.arrival for j in jobs] == [0.0, 100.0, 86400.0]
    assert parse_timestamp("1507039500") == 1507039500.0
    assert parse_timestamp("2017-10-03 14:05:00") == 1507039500.0   # UTC when no zone is given
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\nyesterday,600,1,600,c1\n")
    with pytest.raises(WorkloadError, match="line 2: timestamp 'yesterday' is neither seconds nor YYYY-MM-DD"):
        load_philly(path, TRUTH, 0, 6)


def test_duplicate_job_names_are_refused(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size\n"
                    "a,0,bert,1,384\nb,10,bert,1,384\na,20,ncf,1,32768\n")
    with pytest.raises(WorkloadError, match="line 4: job name 'a' repeats line 2") as err:
        load_pollux(path, TRUTH, 0, 6)
    assert isinstance(err.value, UsageError)
    with pytest.raises(ValueError, match="duplicate job name"):
        Simulator(ClusterSpec(1, 6), create_policy("fifo", MODEL), MODEL,
                  [job(1, "lin", 1, 10.0), job(1, "lin", 1, 20.0)])


def test_absurd_arrival_times_are_refused(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size\na,1e300,bert,1,384\n")
    with pytest.raises(WorkloadError, match=r"time must be in \[0, 1e\+09\] seconds"):
        load_pollux(path, TRUTH, 0, 6)
    path = tmp_path / "p.csv"
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n0,600,1,600,c1\n1e300,600,1,600,c1\n")
    with pytest.raises(WorkloadError, match="the limit is 1e\\+09 s"):
        load_philly(path, TRUTH, 0, 6)


@pytest.mark.parametrize("cost", [math.inf, math.nan, -1.0])
def test_non_finite_or_negative_restart_cost_is_refused(cost):
    with pytest.raises(ValueError, match="restart cost must be a finite number"):
        Simulator(ClusterSpec(1, 6), create_policy("fifo", MODEL), MODEL, [job(1, "lin", 1, 10.0)], restart_cost=cost)


def test_absurd_node_counts_say_the_limit():
    with pytest.raises(ConfigError, match=f"1..{MAX_NODES:,} nodes, got 1,000,000,000"):
        ClusterSpec.parse("1000000000x6")
    assert ClusterSpec.parse(f"{MAX_NODES}x8").total_gpus == 8 * MAX_NODES


def test_duplicate_and_unknown_policies_are_usage_errors():
    assert parse_policies("fifo, marble") == ["fifo", "marble"]
    with pytest.raises(UsageError, match="policy marble given more than once"):
        parse_policies("marble,fifo,marble")
    with pytest.raises(UsageError, match="unknown policy lsf"):
        parse_policies("fifo,lsf")


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_no_policy_spins_on_a_very_long_job(name):
    # One job of 1e12 seconds next to short ones: optimus used to wake every 600 s (1.7e9 times).
    jobs = [job(1, "lin", 6, 60.0 * 1e12), *(job(i, "flat", 2, 1e4, arrival=10.0 * i) for i in range(2, 8))]
    opts = PolicyOptions(optimus_interval=600.0)
    result = Simulator(ClusterSpec(2, 6), create_policy(name, MODEL, opts), MODEL, jobs, restart_cost=30.0).run()
    assert len(result.finish) == 7
    assert result.counters["decisions"] < 100, result.counters


def test_resize_events_log_the_gpus_they_release(tmp_path):
    # optimus re-allocates: job 1 holds all 6 GPUs, job 2 arrives after the interval and takes some.
    jobs = [job(1, "lin", 6, 60.0 * 5000), job(2, "lin", 6, 60.0 * 100, arrival=700.0)]
    log = tmp_path / "events.jsonl"
    sim = Simulator(ClusterSpec(1, 6), create_policy("optimus", MODEL, PolicyOptions(optimus_interval=600.0)),
                    MODEL, jobs, restart_cost=30.0)
    sim.telemetry = Telemetry(clock=sim.loop.clock, log_path=log, run_id="t")
    sim.run()
    sim.telemetry.close()
    resizes = [e for e in map(json.loads, log.read_text().splitlines()) if e["kind"] == "resize"]
    assert resizes, "the scenario must resize"
    for e in resizes:
        held = sum(g for _, g in e["placement"])
        released = sum(g for _, g in e["released"])
        assert released == 6 and held < 6   # it gave back its 6 GPUs and got fewer


def _submit(tmp_path, *args: str):
    """`marble submit` in-process, no daemon there: every field error is said in the job file's words."""
    from conftest import invoke_cli

    from mlsyskit.tools.sched.cli import app

    res = invoke_cli(app, ["submit", *args, "--state-dir", str(tmp_path / "no-daemon")])
    return res.exit_code, " ".join(res.output.split())


@pytest.mark.parametrize("content, message", [
    (b'cmd = "true"\napp = "ncf"\ngpus = 1\nname = "caf\xe9"\n', "not a UTF-8 text file (byte 45: b'\\xe9')"),
    (b"\xff\xfe\x00g\x00p\x00u\x00s", "not a UTF-8 text file (byte 0"),
    (b'cmd = "true"\ngpus = [1\n', "invalid TOML"),
    (b'cmd = "true"\napp = "ncf"\ngpus = 1.5\n', "gpus: GPUs and nodes are whole numbers, got 1.5 "
                                                 "(fractional GPUs are not supported)"),
    (b'cmd = "true"\napp = "ncf"\ngpus = 1\nbatch_size = 1e12\n', "batch_size: a whole number of samples"),
    (b'cmd = "true"\napp = "ncf"\ngpus = 1\ntime = "1000000000"\n', "time: '1000000000' is 694,444 days"),
    (b'cmd = "true"\napp = "ncf"\ngpus = 1\narray = "0-99999"\n', "array: '0-99999' has more than 1000 tasks"),
])
def test_bad_job_files_are_one_line_usage_errors(tmp_path, content, message):
    path = tmp_path / "job.toml"
    path.write_bytes(content)
    code, output = _submit(tmp_path, str(path))
    assert code == 2 and message in output and "Traceback" not in output, output
    assert output.count("error:") == 1


@pytest.mark.parametrize("args, message", [
    (["--gpus", "1.5"], "--gpus 1.5: GPUs and nodes are whole numbers (fractional GPUs are not supported)"),
    (["--gpus", "2", "--min-gpus", "0.5"], "--min-gpus 0.5: GPUs and nodes are whole numbers"),
    (["--gpus", "1", "--batch-size", "1000000000000"], "batch_size: must be in 1..10,000,000 samples"),
    (["--gpus", "1", "--time", "99999999"], "time: '99999999' is 69,444 days; the limit is 365 days"),
    (["--gpus", "1", "--dependency", "after:3"], "dependency: 'after:3': use afterok"),
    (["--gpus", "1", "--array", "5-1"], "array: '5-1' is an empty range"),
    (["--gpus", "four"], "--gpus 'four': expected a whole number"),
])
def test_absurd_submit_flags_are_refused_naming_the_field(tmp_path, args, message):
    code, output = _submit(tmp_path, "--cmd", "true", "--app", "ncf", *args)
    assert code == 2 and message in output and "Traceback" not in output, output
