# tencache: profile a 10M-parameter GPT, then train it for a few steps on the Shakespeare corpus with budgets
# that put parameters on the (emulated) device, the CPU and NVMe, and spill optimizer states to NVMe.
set -euo pipefail
dir="$DEMO_DIR/tencache"
rm -rf "$dir" && mkdir -p "$dir/nvme" "$dir/ckpt"
tencache profile --model gpt-10m --batch 2 --seq 64 --out "$dir/profile.json"
tencache train --model gpt-10m --profile "$dir/profile.json" --batch 2 --seq 64 --steps 4 \
  --device-mem 6MiB --cpu-mem 8MiB --opt-mem 100MiB --nvme-dir "$dir/nvme" \
  --checkpoint-dir "$dir/ckpt" --log "$dir/steps.jsonl"
