#!/usr/bin/env bash
# Telemetry throughput and PUBACK latency: ferrohub (durable: every PUBACK after a synced
# write) against Mosquitto 2.0 (Debian package) without and with persistence, all driven by the
# same load generator with the same settings, in one session. Results: JSON per run in
# $OUT (default ./bench-results) and a summary table on stdout. Bounded: fixed message counts
# and a time limit per run. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_build_deps
ensure_apt mosquitto
cargo build --release --workspace --all-targets

OUT="${OUT:-./bench-results}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
LOADGEN="$CARGO_TARGET_DIR/release/loadgen"

# ferrohub on its own ports; its CA and server certificate also serve Mosquitto's TLS listener.
"$FERROHUB_BIN" serve --data-dir "$WORK/hub" --https-addr 127.0.0.1:18443 --mqtt-addr 127.0.0.1:18883 >"$WORK/hub.out" 2>"$WORK/hub.err" &
for _ in $(seq 1 100); do grep -q "listening https" "$WORK/hub.out" 2>/dev/null && break; sleep 0.2; done
OWNER="$(grep -m1 'SharedAccessKeyName=iothubowner' "$WORK/hub.out")"
TLS="$WORK/hub/tls"

start_mosquitto() { # $1 = persistence true|false, $2 = port
    local conf="$WORK/mosquitto-$1.conf"
    mkdir -p "$WORK/mosq-$1"
    cat >"$conf" <<CONF
listener $2 127.0.0.1
cafile $TLS/ca.pem
certfile $TLS/server.pem
keyfile $TLS/server-key.pem
tls_version tlsv1.2
allow_anonymous true
persistence $1
persistence_location $WORK/mosq-$1/
max_queued_messages 100000
CONF
    mosquitto -c "$conf" >"$WORK/mosq-$1.log" 2>&1 &
    sleep 1
}
start_mosquitto false 28883
start_mosquitto true 28884

run() { # name devices messages-per-device target port
    local name="$1" devices="$2" per="$3" target="$4" port="$5"
    "$LOADGEN" --target "$target" --host localhost --mqtt-port "$port" --https-port 18443 --ca "$TLS/ca.pem" \
        ${OWNER:+--owner "$OWNER"} --devices "$devices" --messages-per-device "$per" --payload-bytes 256 \
        --inflight 10 --prefix "b$devices-" --time-limit 300 >"$OUT/$name-$devices.json"
    python3 - "$OUT/$name-$devices.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:<22} {r['devices']:>6} {r['acknowledged']:>8} {r['throughput_msgs_per_s']:>12.0f} "
      f"{r['puback_latency']['p50_ms']:>9.2f} {r['puback_latency']['p99_ms']:>9.2f} {r['errors']:>6}")
PY
}

printf "%-22s %6s %8s %12s %9s %9s %6s\n" target devices acked "msgs/s" "p50 ms" "p99 ms" errors
for spec in "1 5000" "100 200" "1000 20"; do
    set -- $spec
    run ferrohub "$1" "$2" ferrohub 18883
    run mosquitto "$1" "$2" plain 28883
    run mosquitto-persistent "$1" "$2" plain 28884
done
