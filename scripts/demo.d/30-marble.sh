# marble: the fitted scalability model and its held-out error, one efficiency curve, six policies
# replaying a Pollux workload on a Summit-like 16x6 cluster (2 seeds, table + JSON + PNGs), then
# the scheduler daemon (local executor, 2 nodes x 4 logical GPUs) running real jobs: two torch DDP
# trainings over gloo and three shell jobs, sized and placed by the marble policy.
# (scripts/demo --quick: one seed, DDP trainings of 10 steps, the queue polled every 3 s instead of every second.)
set -euo pipefail
seeds=2 steps=30 poll_s=1
if [ "${DEMO_QUICK:-0}" = 1 ]; then seeds=1 steps=10 poll_s=3; fi
out="${DEMO_DIR:-$(mktemp -d -t marble-demo.XXXXXX)}/marble"
mkdir -p "$out"
marble model
marble curve --app yolov3 --batch 64 --max-gpus 6
marble sim --workload workload-2 --cluster 16x6 --seeds "$seeds" \
  --policies fifo,backfill,optimus,tiresias,marble,marble-elastic --out "$out"
ls -l "$out"

state="$out/daemon"
rm -rf "$state"
cat > "$out/cluster.toml" <<'TOML'
[[nodes]]
name = "node0"
gpus = 4
logical = true

[[nodes]]
name = "node1"
gpus = 4
logical = true
TOML
marble serve --cluster "$out/cluster.toml" --state-dir "$state" --poll-interval 0.2 -q &
daemon=$!
trap 'kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true' EXIT
deadline=$((SECONDS + 120))
until [ -s "$state/daemon.json" ]; do
  kill -0 "$daemon" || { echo "marble serve exited"; exit 1; }
  [ "$SECONDS" -lt "$deadline" ] || { echo "marble serve did not start within 120 s"; exit 1; }
  sleep 0.2
done
py="$(command -v python)"
marble submit --state-dir "$state" --name ddp-a --app cifar10 --gpus 2 --min-gpus 2 \
  --cmd "$py -m mlsyskit.tools.sched.examples.ddp_train --steps $steps"
marble submit --state-dir "$state" --name ddp-b --app cifar10 --gpus 2 --min-gpus 2 \
  --cmd "$py -m mlsyskit.tools.sched.examples.ddp_train --steps $steps --seed 1"
for i in 1 2 3; do
  marble submit --state-dir "$state" --name "shell-$i" --app ncf --gpus 4 \
    --cmd 'echo "on $MARBLE_PLACEMENT (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES)"; sleep 2'
done
marble queue --state-dir "$state"
deadline=$((SECONDS + 600))
while [ "$(marble queue --state-dir "$state" --json | python -c 'import json,sys; print(len(json.load(sys.stdin)))')" != 0 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "jobs still running after 600 s"; exit 1; }
  sleep "$poll_s"
done
marble status --state-dir "$state"
marble logs 1 --state-dir "$state"
marble status --state-dir "$state" --json | python -c '
import json, sys
jobs = json.load(sys.stdin)
bad = [(j["id"], j["state"], j["reason"]) for j in jobs if j["state"] != "done"]
if bad:
    sys.exit(f"{len(bad)} job(s) did not finish cleanly: {bad}")
print(f"all {len(jobs)} daemon jobs done")'
