# fl: a real fl-server (TIFF, TLS + shared token) and 10 fl-client processes on loopback, 2 of them
# label-flippers, Dirichlet(1.0) label skew, for 10 rounds; then the report: tokens per honest vs malicious provider, accuracy,
# consumer refunds (TRR/UIR), and the accuracy/token curves as PNGs.
set -euo pipefail
out="${DEMO_DIR:-$(mktemp -d -t fl-demo.XXXXXX)}/fl"
rm -rf "$out" && mkdir -p "$out"
python - "$out/tls" <<'PY'
import sys
from mlsyskit.core.rpc_tls import make_self_signed
make_self_signed(sys.argv[1])
PY
head -c 24 /dev/urandom | base64 > "$out/token"
port=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
fl-server run --strategy tiff --dataset digits --clients 10 --per-round 4 --rounds 10 --alpha 1.0 \
  --address "127.0.0.1:$port" --run-dir "$out/run" --tls-cert "$out/tls/server.pem" \
  --tls-key "$out/tls/server.key" --token-file "$out/token" --registration-timeout 60 > "$out/server.txt" &
server=$!
pids+=("$server")
for id in 0 1 2 3 4 5 6 7 8 9; do
  attack=none; if [ "$id" -lt 2 ]; then attack=label-flip; fi
  fl-client run --server "127.0.0.1:$port" --client-id "$id" --malicious "$attack" \
    --tls-ca "$out/tls/ca.pem" --token-file "$out/token" --reconnect 60 2>> "$out/clients.log" &
  pids+=("$!")
done
wait "$server"
fl-server report "$out/run" --plots "$out/plots"
ls -l "$out/plots"
