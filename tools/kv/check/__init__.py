"""`bespokv check`: a Jepsen-style workload, a nemesis and a linearizability checker.

    workload.py       clients issuing unique-value reads/writes, every operation in a History
    nemesis.py        the fault schedule (pure, seeded): kill -9, pause, partition, restart
    faultproxy.py     a TCP proxy per directed replica link that a partition severs
    procs.py          the cluster under test as node processes (kill, pause, restart them)
    model.py          the register model an operation is checked against
    linearizability.py  Wing-Gong-Lowe search per key, as Porcupine does
    verify.py         lost acknowledged writes and replica convergence
    runner.py         one seeded run: start, load + faults, heal, quiesce, verify
    report.py         the verdict as a table or JSON, exit 1 when it failed
    simulate.py       one shard's controlets on a virtual network and clock (the node's interpreter)

May import every room (it starts clusters through ops and talks to them through client); only the
CLI and tests import it.
"""
