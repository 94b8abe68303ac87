# tencache: profile a 10M-parameter GPT, then train it for a few steps on the Shakespeare corpus with budgets
# that put parameters on the (emulated) device, the CPU and NVMe, and spill optimizer states to NVMe;
# then resume from the checkpoint for two more steps. (scripts/demo --quick: gpt-small, 0.25M parameters, with
# budgets scaled to it that still put parameters on all three tiers and spill optimizer states to NVMe; 2 steps,
# then 1 more.)
set -euo pipefail
model=gpt-10m steps=4 more=2 budgets=(--device-mem 6MiB --cpu-mem 8MiB --opt-mem 100MiB)
if [ "${DEMO_QUICK:-0}" = 1 ]; then
  model=gpt-small steps=2 more=1 budgets=(--device-mem 96KiB --cpu-mem 128KiB --opt-mem 2MiB)
fi
dir="$DEMO_DIR/tencache"
rm -rf "$dir"
mkdir -p "$dir/nvme" "$dir/ckpt"
tencache profile --model "$model" --batch 2 --seq 64 --out "$dir/profile"
tencache train --profile "$dir/profile" --steps "$steps" \
  "${budgets[@]}" --nvme-dir "$dir/nvme" \
  --checkpoint-dir "$dir/ckpt" --out "$dir/run"
tencache train --profile "$dir/profile" --steps "$((steps + more))" \
  "${budgets[@]}" --nvme-dir "$dir/nvme" \
  --checkpoint-dir "$dir/ckpt" --resume --out "$dir/resumed"
