# fl: a real federation on one machine: `fl-server partition` writes each client's own folder
# (digits, Dirichlet(1.0) label skew), a real fl-server (TIFF, mutual TLS from `fl-server certs` + a
# shared token) holds only the validation/test sets, and 10 fl-client processes each load only their
# own folder (--data), 2 of them label-flippers, for 10 rounds; then the report: tokens per honest vs
# malicious provider, accuracy, consumer refunds (TRR/UIR), and the accuracy/token curves as PNGs.
# (scripts/demo --quick: 4 clients, 1 of them a label-flipper, 2 per round, 3 rounds.)
set -euo pipefail
nclients=10 flippers=2 per_round=4 rounds=10
if [ "${DEMO_QUICK:-0}" = 1 ]; then nclients=4 flippers=1 per_round=2 rounds=3; fi
out="${DEMO_DIR:-$(mktemp -d -t fl-demo.XXXXXX)}/fl"
rm -rf "$out"
mkdir -p "$out"
fl-server partition --dataset digits --clients "$nclients" --alpha 1.0 --out "$out/data" --quiet > /dev/null
fl-server certs "$out/certs" --clients "$nclients" --quiet > /dev/null
head -c 24 /dev/urandom | base64 > "$out/token"
port=$(python -c 'from mlsyskit.core.net import free_port; print(free_port())')
pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT
# --min-clients all: every round waits for all of them (a fault-free demo; the default 2 lets rounds go on
# while clients are away)
fl-server run --strategy tiff --validation "$out/data/server" --clients "$nclients" --per-round "$per_round" \
  --rounds "$rounds" --min-clients "$nclients" --address "127.0.0.1:$port" --run-dir "$out/run" --certs "$out/certs" \
  --token-file "$out/token" --registration-timeout 120 > "$out/server.txt" &
server=$!
pids+=("$server")
clients=()
for id in $(seq 0 $((nclients - 1))); do
  attack=none
  if [ "$id" -lt "$flippers" ]; then attack=label-flip; fi
  fl-client run --server "127.0.0.1:$port" --client-id "$id" --data "$out/data/client-$id" --attack "$attack" \
    --certs "$out/certs" --token-file "$out/token" --reconnect 120 2>> "$out/clients.log" &
  clients+=("$!")
  pids+=("$!")
done
wait "$server"
for pid in "${clients[@]}"; do
  wait "$pid"
done
fl-server report --run-dir "$out/run" --out "$out/plots"
ls -l "$out/plots"
