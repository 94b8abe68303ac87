# bespokv: a 2-shard x 3-replica chain-replicated cluster as processes, a short YCSB run,
# a consistency check (every replica of each shard holds the same data), then down.
set -euo pipefail
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
trap 'bespokv down --data-dir "$dir" >/dev/null 2>&1 || true' EXIT
bespokv up --shards 2 --replicas 3 --topology ms --consistency strong --datalet lmdb \
  --base-port "$base" --data-dir "$dir"
bespokv put greeting "hello from bespokv" --data-dir "$dir"
bespokv get greeting --data-dir "$dir"
redis-cli -p "$base" MSET a 1 b 2 c 3 >/dev/null && redis-cli -p "$base" MGET a b c greeting | tr '\n' ' ' && echo
bespokv bench --workload ycsb-a --keys 2000 --ops 10000 --clients 16 --data-dir "$dir"
python - "$dir" <<'PY'
# Consistency check: every replica of a shard holds the same data (BKV.DIGEST hashes a node's
# own datalet); chain replication acknowledged each write only after the tail applied it.
import sys
from mlsyskit.tools.kv.processes import load_record, sync_call
record = load_record(sys.argv[1])
nodes = record["map"]["nodes"]
for shard in record["map"]["shards"]:
    digests = {n: sync_call(nodes[n]["host"], nodes[n]["port"], "BKV.DIGEST") for n in shard}
    assert len({tuple(d) for d in digests.values()}) == 1, f"replicas disagree: {digests}"
    count, digest = next(iter(digests.values()))
    print(f"shard {'/'.join(shard)}: all {len(shard)} replicas hold {int(count)} keys, digest {digest.decode()}")
PY
bespokv status --data-dir "$dir"
bespokv down --data-dir "$dir"
