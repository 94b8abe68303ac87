"""What the real server tracks per client between rounds (tools/fl/activity.py, pure, the clock given):
heartbeats mask a silent (stopped) client, a busy client is not offered, the server's clock times each
update and forged timing fields are overwritten, late answers are wasted work, counted once."""
from __future__ import annotations

from mlsyskit.tools.fl.activity import ClientActivity


def test_a_client_silent_for_three_heartbeats_is_masked_until_heard_again():
    activity = ClientActivity(every_s=2.0, misses=3)
    activity.heartbeat(1, 0.0, {"host_cpu_percent": 40.0, "load1": 1.5, "cpu_count": 2})
    activity.heartbeat(2, 0.0, {"host_cpu_percent": float("nan"), "junk": "x"})
    assert activity.available([0, 1, 2], 5.9) == [0, 1, 2]  # 0 never sent one: judged by its connection
    assert activity.available([0, 1, 2], 6.1) == [0]  # SIGSTOP-like silence: 1 and 2 drop out of selection
    activity.heartbeat(1, 7.0, {})
    assert activity.available([0, 1, 2], 7.5) == [0, 1]
    assert activity.resources[2] == {}  # non-finite and unknown fields are not kept
    assert activity.resources[1] == {}  # the latest heartbeat replaces the previous one
    activity.task_sent(1, 3, 7.5)  # a long training sends no heartbeats, but its update shows it alive
    activity.message(1, 20.0)
    activity.timed(1, 3, {"local_s": 12.0}, 20.0)
    assert activity.available([1], 20.5) == [1]
    activity.message(0, 20.0)  # a client that never sent heartbeats is not made to need them
    assert 0 not in activity.heard


def test_busy_clients_are_not_offered_and_the_server_clock_times_the_update():
    activity = ClientActivity(every_s=0)
    activity.task_sent(3, round_num=4, now=10.0)
    assert activity.available([2, 3], 11.0) == [2]
    forged = {"local_s": 0.5, "received_s": 0.001, "comm_time_s": 0.0, "train_time_s": 0.4}
    timed = activity.timed(3, 4, forged, now=12.0)
    assert timed["received_s"] == 2.0 and timed["comm_time_s"] == 1.5  # the client's own claims overwritten
    assert activity.available([2, 3], 12.0) == [2, 3]
    assert activity.timed(3, 4, {"local_s": 0.1}, now=13.0) == {"local_s": 0.1}  # a second copy is not re-timed
    activity.task_sent(3, 5, 20.0)
    assert activity.timed(3, 5, {"local_s": "garbage"}, now=21.0)["comm_time_s"] == 1.0


def test_an_answer_after_the_deadline_is_wasted_work_counted_once():
    activity = ClientActivity(every_s=1.0)
    activity.task_sent(1, 7, 0.0)
    activity.task_sent(2, 7, 0.0)
    activity.timed(2, 7, {"local_s": 0.1}, 0.5)
    activity.round_closed(7, failed=[1, 2])  # 2 answered (and was rejected, say): only 1 is still computing
    assert activity.missed == {1: 7}
    assert activity.late(2, 7, {"cpu_time_s": 9.0}, 1.0) is None
    assert activity.late(1, 6, {"cpu_time_s": 9.0}, 1.0) is None  # another round's answer is not this one
    assert activity.late(1, 7, {"cpu_time_s": 1.25, "train_time_s": -3.0}, 4.5) == 4.5  # its true round trip
    assert activity.wasted == {"updates": 1, "cpu_s": 1.25, "train_s": 0.0}
    assert activity.late(1, 7, {"cpu_time_s": 1.25}, 5.0) is None  # replayed: counted once
    assert activity.available([1], 1.0) == [1]


def test_a_late_client_stays_busy_through_heartbeats_until_it_answers_or_rejoins():
    activity = ClientActivity(every_s=1.0)
    activity.task_sent(4, 2, 0.0)
    activity.round_closed(2, failed=[4])
    activity.heartbeat(4, 3.0, {"cpu_percent": 1.0})  # sent before the task arrived, read after the deadline
    assert activity.available([4], 3.0) == []
    assert activity.late(4, 2, {}, 3.5) == 3.5 and activity.wasted["updates"] == 1
    assert activity.available([4], 3.5) == [4]
    activity.task_sent(4, 3, 4.0)
    activity.joined(4)  # a new stream: the old task is gone
    assert activity.available([4], 4.0) == [4] and activity.missed == {}
