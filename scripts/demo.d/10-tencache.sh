# tencache: profile a 10M-parameter GPT, then train it for a few steps on the Shakespeare corpus with budgets
# that put parameters on the (emulated) device, the CPU and NVMe, and spill optimizer states to NVMe;
# then resume from the checkpoint for two more steps.
set -euo pipefail
dir="$DEMO_DIR/tencache"
rm -rf "$dir"
mkdir -p "$dir/nvme" "$dir/ckpt"
tencache profile --model gpt-10m --batch 2 --seq 64 --out "$dir/profile"
tencache train --profile "$dir/profile" --steps 4 \
  --device-mem 6MiB --cpu-mem 8MiB --opt-mem 100MiB --nvme-dir "$dir/nvme" \
  --checkpoint-dir "$dir/ckpt" --out "$dir/run"
tencache train --profile "$dir/profile" --steps 6 \
  --device-mem 6MiB --cpu-mem 8MiB --opt-mem 100MiB --nvme-dir "$dir/nvme" \
  --checkpoint-dir "$dir/ckpt" --resume --out "$dir/resumed"
