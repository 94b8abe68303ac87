# marble: the fitted scalability model and its held-out error, one efficiency curve, then six
# policies replaying a Pollux workload on a Summit-like 16x6 cluster (2 seeds, table + JSON + PNGs).
set -euo pipefail
out="${DEMO_DIR:-$(mktemp -d -t marble-demo.XXXXXX)}/marble"
mkdir -p "$out"
marble model
marble curve --app yolov3 --batch 64 --max-gpus 6
marble sim --workload workload-2 --cluster 16x6 --seeds 2 \
  --policies fifo,backfill,optimus,tiresias,marble,marble-elastic --out "$out"
ls -l "$out"
