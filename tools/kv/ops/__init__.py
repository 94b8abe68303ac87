"""Running clusters: the record of a cluster's processes (record), `bespokv up/down/status`
(processes), the coordinator process (coordproc), the supervisor and its pure restart policy
(supervisor, restartpolicy), live switches (switch), multi-host placement (placement), the node
and proxy processes (nodeproc) and the in-process cluster of tests (cluster).

May import every room below it (node, frontend, client, coord, controlets, datalets, redis) and
the kv root; only the CLI, check and tests import it.
"""
