# tencache: profile a 10M-parameter GPT, then train it for a few steps on the Shakespeare corpus with budgets
# that put parameters on the (emulated) device, the CPU and NVMe, and spill optimizer states to NVMe;
# then resume from the checkpoint for two more steps. (scripts/demo --quick: 2 steps, then 1 more.)
set -euo pipefail
steps=4 more=2
if [ "${DEMO_QUICK:-0}" = 1 ]; then steps=2 more=1; fi
dir="$DEMO_DIR/tencache"
rm -rf "$dir"
mkdir -p "$dir/nvme" "$dir/ckpt"
tencache profile --model gpt-10m --batch 2 --seq 64 --out "$dir/profile"
tencache train --profile "$dir/profile" --steps "$steps" \
  --device-mem 6MiB --cpu-mem 8MiB --opt-mem 100MiB --nvme-dir "$dir/nvme" \
  --checkpoint-dir "$dir/ckpt" --out "$dir/run"
tencache train --profile "$dir/profile" --steps "$((steps + more))" \
  --device-mem 6MiB --cpu-mem 8MiB --opt-mem 100MiB --nvme-dir "$dir/nvme" \
  --checkpoint-dir "$dir/ckpt" --resume --out "$dir/resumed"
