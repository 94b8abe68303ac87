"""bespokv: a scale-out KV store from a single-server one (bespoKV, SC'18 / TPDS'20), in rooms.

    redis/       the Redis data model and wire format, pure
    controlets/  replication and consistency as pure state machines
    datalets/    the single-server stores behind a node
    coord/       the coordinator, failure detection and failover planning
    client/      RESP clients, the smart client, load generators, histories
    node/        the node runtime: the action interpreter, links, lease, control agent
    frontend/    the RESP server a client talks to
    ops/         running clusters: launcher, up/down/status, supervisor, switch
    check/       `bespokv check` and the controlet simulator

Lower rooms never import higher ones (the order above, roughly; each room's docstring says what
it may import). The kv root holds what every room shares: shardmap (consistent hashing and the
shard map) and peerauth (the cluster secret), plus the command line (cli, cli_client).
"""
