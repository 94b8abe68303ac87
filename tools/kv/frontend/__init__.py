"""The client-facing RESP server of a node or proxy: one connection object per client
(connection, with its GET/SET fast path), the command handlers (commands, admin, keyspace),
active key expiry (expiry) and the listener that joins a node runtime to it (server).

May import redis (the data model), node (the runtime it serves from), controlets.base (the
operation names) and the kv root modules (shardmap, peerauth); nothing imports it but ops
(which starts servers) and tests.
"""
