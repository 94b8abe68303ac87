"""The node runtime: one controlet and one datalet wired to sockets (runtime), its links to peer
nodes (links), the requests that flow between the front end and the runtime (requests), the
control half of a node -- lease, fencing, reconfiguration (control) -- its control agent that
registers, heartbeats and rejoins through the coordinator (agent), and snapshot streaming to a
catching-up replica (snapshot).

May import controlets, datalets, coord (the coordinator clients), client.pipeline (its RESP
connections), redis (the data model) and the kv root; never frontend, ops or check.
"""
