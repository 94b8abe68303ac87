"""The Redis data model and wire format, as pure functions: RESP encoders and limits (resp, resp3),
how a value is stored (values), the typed read-modify-write commands (rmw, datatypes) and the
read commands over any key (queries).

Owns no sockets, tasks or clocks (time is an argument). May import only the standard library,
hiredis, msgpack, mlsyskit.core and kv.shardmap's hash; every other bespokv room may import it.
"""
