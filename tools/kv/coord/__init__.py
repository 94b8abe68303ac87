"""bespokv control plane: the coordinator (embedded SQLite or ZooKeeper), failure detection and failover planning.

    detector.FailureDetector   pure heartbeat bookkeeping on an injected clock
    failover                   pure planners: the next shard map after a failure or a join; the fencing rule
    base.Coordinator           the one interface both backends implement
    embedded.EmbeddedCoordinator, zk.ZkCoordinator   the backends
    server                     the embedded coordinator as a process (line-JSON over TCP), with a standby
"""
