#!/usr/bin/env bash
# Telemetry throughput and PUBACK latency: ferrohub (durable: every PUBACK after a synced
# write) against Mosquitto 2.0 (Debian package) without and with persistence, all driven by the
# same load generator with the same settings, in one session. Results: JSON per run in
# $OUT (default ./bench-results) and a summary table on stdout. Bounded: fixed message counts
# and a time limit per run. Not part of the test suite.
#
# To compare two builds of ferrohub in the same session, set FERROHUB_BASELINE_BIN to another
# build's binary (e.g. one built from an older commit with its own CARGO_TARGET_DIR): it runs
# as "baseline" beside the current build, interleaved. DEVICES limits the device counts
# (default "1 100 1000").
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_build_deps
ensure_apt mosquitto
cargo build --release --workspace --all-targets

bench_setup

# ferrohub on its own ports; its CA and server certificate also serve Mosquitto's TLS listener.
"$FERROHUB_BIN" serve --data-dir "$WORK/hub" --https-addr 127.0.0.1:18443 --mqtt-addr 127.0.0.1:18883 --amqp-addr 127.0.0.1:18671 --mqtt-quic-addr 127.0.0.1:0 >"$WORK/hub.out" 2>"$WORK/hub.err" &
for _ in $(seq 1 100); do grep -q "listening https" "$WORK/hub.out" 2>/dev/null && break; sleep 0.2; done
OWNER="$(grep -m1 'SharedAccessKeyName=iothubowner' "$WORK/hub.out")"
TLS="$WORK/hub/tls"

BASELINE_OWNER=""
if [ -n "${FERROHUB_BASELINE_BIN:-}" ]; then
    "$FERROHUB_BASELINE_BIN" serve --data-dir "$WORK/baseline" --https-addr 127.0.0.1:19443 --mqtt-addr 127.0.0.1:19883 >"$WORK/baseline.out" 2>"$WORK/baseline.err" &
    for _ in $(seq 1 100); do grep -q "listening https" "$WORK/baseline.out" 2>/dev/null && break; sleep 0.2; done
    BASELINE_OWNER="$(grep -m1 'SharedAccessKeyName=iothubowner' "$WORK/baseline.out")"
fi

start_mosquitto() { # $1 = persistence true|false, $2 = port
    local conf="$WORK/mosquitto-$1.conf"
    mkdir -p "$WORK/mosq-$1"
    cat >"$conf" <<CONF
# Run as the invoking user: Mosquitto started as root otherwise drops to "mosquitto", which
# cannot read the hub's private key (mode 0600).
user $(id -un)
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

REPEAT="${REPEAT:-3}"
DEVICES="${DEVICES:-1 100 1000}"
per_device() { case "$1" in 1) echo 5000 ;; 100) echo 200 ;; *) echo $((20000 / $1)) ;; esac; }

run() { # name devices messages-per-device target port repetition [https-port owner ca]
    local name="$1" devices="$2" per="$3" target="$4" port="$5" rep="$6"
    local https="${7:-18443}" owner="${8:-$OWNER}" ca="${9:-$TLS/ca.pem}"
    "$LOADGEN" --target "$target" --host localhost --mqtt-port "$port" --https-port "$https" --ca "$ca" \
        ${owner:+--owner "$owner"} --devices "$devices" --messages-per-device "$per" --payload-bytes 256 \
        --inflight 10 --prefix "b$devices-" --time-limit 300 >"$OUT/$name-$devices-$rep.json"
}

# Interleaved repetitions, so drift on a shared machine hits every target alike.
for rep in $(seq 1 "$REPEAT"); do
    for devices in $DEVICES; do
        per="$(per_device "$devices")"
        run ferrohub "$devices" "$per" ferrohub 18883 "$rep"
        if [ -n "$BASELINE_OWNER" ]; then
            run baseline "$devices" "$per" ferrohub 19883 "$rep" 19443 "$BASELINE_OWNER" "$WORK/baseline/tls/ca.pem"
        fi
        run mosquitto "$devices" "$per" plain 28883 "$rep"
        run mosquitto-persistent "$devices" "$per" plain 28884 "$rep"
    done
done

python3 - "$OUT" "$REPEAT" "$DEVICES" "${BASELINE_OWNER:+baseline}" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
device_counts = [int(d) for d in sys.argv[3].split()]
names = ["ferrohub"] + (["baseline"] if len(sys.argv) > 4 and sys.argv[4] else []) + ["mosquitto", "mosquitto-persistent"]
print(f"medians of {reps} runs (QoS 1, 256-byte payloads, 10 in flight per device, TLS)")
print(f"{'target':<22} {'devices':>7} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}  runs msgs/s")
for devices in device_counts:
    for name in names:
        runs = [json.load(open(f"{out}/{name}-{devices}-{r}.json")) for r in range(1, reps + 1)]
        med = lambda f: statistics.median(f(r) for r in runs)
        print(f"{name:<22} {devices:>7} {med(lambda r: r['throughput_msgs_per_s']):>9.0f} "
              f"{med(lambda r: r['puback_latency']['p50_ms']):>8.2f} {med(lambda r: r['puback_latency']['p99_ms']):>8.2f} "
              f"{sum(r['errors'] for r in runs):>6}  " + " ".join(f"{r['throughput_msgs_per_s']:.0f}" for r in runs))
PY
