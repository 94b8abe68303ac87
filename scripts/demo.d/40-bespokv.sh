# bespokv: a 2-shard x 3-replica chain-replicated cluster as processes; the Redis protocol
# through redis-py (no redis-cli needed); a short YCSB run; every replica of each shard holds
# the same data; then the consistency checker kills, pauses and partitions a 3-replica
# cluster under load and verifies linearizability and that no acknowledged write was lost.
# In between: kill -9 a chain head (the coordinator fails over; writes go on) and one live
# switch ms-ec -> ms-sc. Runs on its own too: `bash scripts/demo.d/40-bespokv.sh`.
# (scripts/demo --quick: YCSB on 500 keys, 2000 operations, 4 clients; the checker's 200 operations.)
set -euo pipefail
keys=2000 ops=10000 clients=16 check_ops=300
if [ "${DEMO_QUICK:-0}" = 1 ]; then keys=500 ops=2000 clients=4 check_ops=200; fi
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ -x "$root/.venv/bin/bespokv" ]; then export PATH="$root/.venv/bin:$PATH"; fi
dir="${DEMO_DIR:-$(mktemp -d)}/bespokv"
# the first base port from 7300 up whose 7 ports (proxy + 6 nodes) are all free
base="${BESPOKV_DEMO_PORT:-$(python - <<'PY'
import socket
def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
print(next(b for b in range(7300, 9000, 10) if all(free(b + i) for i in range(7))))
PY
)}"
stop_cluster() {
  if [ -f "$dir/cluster.json" ]; then bespokv down --data-dir "$dir" -q; fi
}
trap stop_cluster EXIT
bespokv up --shards 2 --replicas 3 --topology ms --consistency strong --datalet lmdb \
  --base-port "$base" --data-dir "$dir"
bespokv put greeting "hello from bespokv" --data-dir "$dir"
bespokv get greeting --data-dir "$dir"
python - "$base" <<'PY'
# Any Redis client works against the proxy: redis-py, with a pipeline.
import sys
import redis
r = redis.Redis(port=int(sys.argv[1]), protocol=2)
r.mset({"a": "1", "b": "2", "c": "3"})
pipe = r.pipeline(transaction=False)
pipe.mget("a", "b", "c", "greeting")
pipe.exists("a", "c", "nope")
values, present = pipe.execute()
deleted = r.delete("c")
print("redis-py MGET a b c greeting ->", [v.decode() if v else None for v in values])
print(f"redis-py EXISTS a c nope -> {present}; DEL c -> {deleted}; GET c -> {r.get('c')}")
assert values[:3] == [b"1", b"2", b"3"] and present == 2 and deleted == 1 and r.get("c") is None
PY
bespokv bench --workload ycsb-a --keys "$keys" --ops "$ops" --clients "$clients" --data-dir "$dir"
python - "$dir" <<'PY'
# Consistency check: every replica of a shard holds the same data (BKV.DIGEST hashes a node's
# own datalet); chain replication acknowledged each write only after the tail applied it.
import sys
from mlsyskit.tools.kv.client.call import call
from mlsyskit.tools.kv.ops.processes import load_record
record = load_record(sys.argv[1])
nodes = record["map"]["nodes"]
for shard in record["map"]["shards"]:
    digests = {n: call(nodes[n]["host"], nodes[n]["port"], "BKV.DIGEST") for n in shard}
    assert len({tuple(d) for d in digests.values()}) == 1, f"replicas disagree: {digests}"
    count, digest = next(iter(digests.values()))
    print(f"shard {'/'.join(shard)}: all {len(shard)} replicas hold {int(count)} keys, digest {digest.decode()}")
PY
bespokv status --data-dir "$dir"
python - "$dir" <<'PY'
# Failover: kill -9 the head of shard 0. The coordinator misses its heartbeats (3 x 0.5 s),
# makes its successor the head under the next epoch; writes through the proxy go on.
import os, signal, sys, time
import redis
from mlsyskit.tools.kv.ops.processes import load_record
from mlsyskit.tools.kv.shardmap import ShardMap
record = load_record(sys.argv[1])
old = ShardMap.from_dict(record["map"])
head = old.shards[0][0]
key = next(k for k in (f"after-failover-{i}".encode() for i in range(1000)) if old.shard_for(k) == 0)
r = redis.Redis(port=record["proxy"]["port"], protocol=2, socket_timeout=5)
os.kill(next(p["pid"] for p in record["processes"] if p["name"] == f"node:{head}"), signal.SIGKILL)
killed = time.monotonic()


def retrying(what, call, within_s=20.0):
    """Retriable errors (TRYAGAIN, CLUSTERDOWN, a timeout) until `call` succeeds: a client's duty.
    The supervisor also puts the killed node back meanwhile: it copies, joins as the new tail and
    answers TRYAGAIN until its first lease, so reads may need a retry too."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return call()
        except redis.RedisError as e:
            if time.monotonic() > deadline:
                raise SystemExit(f"{what}: no answer within {within_s:g} s of killing {head}: {e}")
            time.sleep(0.05)


assert retrying("write after the failover", lambda: r.set(key, b"written after the failover"))
took = time.monotonic() - killed
new = ShardMap.from_json(retrying("shard map", lambda: r.execute_command("BKV.SHARDMAP")))
assert head not in new.shards[0] and new.epoch > old.epoch, (old.shards[0], new.shards[0])
assert retrying("read back", lambda: r.get(key)) == b"written after the failover"
assert retrying("read back", lambda: r.get("greeting")) == b"hello from bespokv"
print(f"kill -9 head {head}: write acknowledged {took:.2f} s later by new head {new.shards[0][0]} "
      f"(epoch {old.epoch} -> {new.epoch}, chain {'/'.join(old.shards[0])} -> {'/'.join(new.shards[0])}); "
      f"earlier writes still readable")
PY
# Live switch: ms-sc -> ms-ec -> ms-sc on the same replicas and data (no restart, no migration).
bespokv switch --topology ms --consistency eventual --data-dir "$dir"
bespokv put during-ec "async replication" --data-dir "$dir"
bespokv switch --topology ms --consistency strong --data-dir "$dir"
bespokv put after-switch "chain replication again" --data-dir "$dir"
# assignments first: a failed `get` inside echo's arguments would not stop the section (set -e)
during=$(bespokv get during-ec --data-dir "$dir")
after=$(bespokv get after-switch --data-dir "$dir")
echo "after ms-ec -> ms-sc: during-ec=$during, after-switch=$after"
bespokv down --data-dir "$dir"
# The checker: its own 1x3 cluster, 4 clients, kill -9, SIGSTOP and a partition while they run.
bespokv check --mode ms-sc --nemesis kill,pause,partition --ops "$check_ops" --clients 4 --keys 4 --seed 1 \
  --out "$dir/check"
