"""One client command against an in-process keyspace, as a shard runs it: reads through
`queries` (refused like the front end, else answered from the key's value), writes through
`rmw` (parsed, then applied at the write point). The store maps keys to their stored bytes, or
with `as_live` to the live form the memory datalet keeps. Shared by the tests that compare
these answers with Redis's."""
from __future__ import annotations

from mlsyskit.tools.kv.redis import live, queries, rmw


def execute(command: list[bytes], store: dict, now_ms: int, as_live: bool = True) -> bytes:
    """The command's RESP answer; `store` changes as the shard's datalet would."""
    name = command[0].upper()
    if name in queries.READS:
        cmd = rmw.Command([name, *command[1:]])
        return queries.check(cmd) or queries.answer(cmd, store.get(command[1]), now_ms)
    try:
        cmd = rmw.parse(command, now_ms=now_ms)
    except rmw.RmwSyntaxError as e:
        return b"-ERR %b\r\n" % str(e).encode()
    after, answer = rmw.apply(cmd, store.get(command[1]))
    if after is None:
        store.pop(command[1], None)
    elif as_live:
        store[command[1]] = live.promote(after) if after.__class__ is bytes else after
    else:
        store[command[1]] = bytes(after)
    return answer
