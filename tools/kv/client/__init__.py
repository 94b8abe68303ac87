"""Clients of a bespokv cluster: the pipelined RESP connection every room uses to talk RESP
(pipeline), the smart client that sends each key to its node (smart), the client that follows
map changes and retries (mapfollow), operation histories (history), and the load generators
(loadgen, ycsb).

May import controlets (the routing rules of each controlet), redis and the kv root; never node,
frontend, ops or check.
"""
