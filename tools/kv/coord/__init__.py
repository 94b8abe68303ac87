"""bespokv control plane: the coordinator (embedded SQLite or ZooKeeper), failure detection and failover planning.

    detector.FailureDetector   pure heartbeat bookkeeping on an injected clock
    failover                   pure planners: the next shard map after a failure or a join; the fencing rule
    base.Coordinator           the one interface both backends implement
    embedded.EmbeddedCoordinator, zk.ZkCoordinator   the backends
    server                     the embedded coordinator as a process (line-JSON over TCP), with a standby
    spec.CoordinatorSpec       where a cluster's coordinator is, and its clients

May import kv.shardmap, kv.peerauth and mlsyskit.core (kazoo for ZooKeeper, loaded only when asked
for); node (the control agent), ops and check import it.
"""
