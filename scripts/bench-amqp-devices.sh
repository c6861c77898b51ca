#!/usr/bin/env bash
# Device telemetry over AMQP against MQTT on the same hub (issue 51): the same load generator,
# the same devices, payloads and window, interleaved repetitions; throughput and the latency
# to the hub's acknowledgement (PUBACK over MQTT, `accepted` over AMQP), both given only once
# the message is durable. Results: JSON per run in $OUT (default ./bench-results) and a
# summary with the AMQP/MQTT ratio. Bounded: fixed message counts and a time limit per run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_build_deps
cargo build --release --workspace --all-targets

bench_setup

"$FERROHUB_BIN" serve --data-dir "$WORK/hub" --https-addr 127.0.0.1:18443 --mqtt-addr 127.0.0.1:18883 --amqp-addr 127.0.0.1:18671 --mqtt-quic-addr 127.0.0.1:0 >"$WORK/hub.out" 2>"$WORK/hub.err" &
HUB_PID=$!
for _ in $(seq 1 100); do grep -q "listening https" "$WORK/hub.out" 2>/dev/null && break; sleep 0.2; done
OWNER="$(grep -m1 'SharedAccessKeyName=iothubowner' "$WORK/hub.out")"
TLS="$WORK/hub/tls"

REPEAT="${REPEAT:-3}"
DEVICES="${DEVICES:-1 100}"
# Enough messages that each run costs the hub well over a second of CPU (/proc counts 10 ms ticks).
per_device() { case "$1" in 1) echo "${SINGLE:-20000}" ;; *) echo $(( ${TOTAL:-60000} / $1 )) ;; esac; }

# The hub's CPU time (user + system, clock ticks) so far: runs are compared per hub core too,
# since the load generator shares the machine's cores and AMQP's client costs it more.
hub_ticks() { awk '{print $14 + $15}' "/proc/$HUB_PID/stat"; }

run() { # transport devices messages-per-device repetition
    local before; before="$(hub_ticks)"
    "$LOADGEN" --target ferrohub --transport "$1" --host localhost --mqtt-port 18883 --amqp-port 18671 \
        --https-port 18443 --ca "$TLS/ca.pem" --owner "$OWNER" --devices "$2" --messages-per-device "$3" \
        --payload-bytes 256 --inflight 10 --prefix "a$2-" --time-limit 300 >"$OUT/amqp-devices-$1-$2-$4.json"
    echo $(( $(hub_ticks) - before )) >"$OUT/amqp-devices-$1-$2-$4.ticks"
}

for rep in $(seq 1 "$REPEAT"); do
    for devices in $DEVICES; do
        per="$(per_device "$devices")"
        run tls "$devices" "$per" "$rep"
        run amqp "$devices" "$per" "$rep"
    done
done

python3 - "$OUT" "$REPEAT" "$DEVICES" <<'PY'
import json, os, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
tick = os.sysconf("SC_CLK_TCK")
print(f"medians of {reps} runs (256-byte payloads, 10 in flight per device, TLS, one hub)")
print(f"{'transport':<10} {'devices':>7} {'msgs/s':>9} {'msgs/hub-cpu-s':>15} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}  runs msgs/s")
for devices in [int(d) for d in sys.argv[3].split()]:
    rate, per_cpu = {}, {}
    for transport, name in [("tls", "MQTT"), ("amqp", "AMQP")]:
        base = f"{out}/amqp-devices-{transport}-{devices}"
        runs = [json.load(open(f"{base}-{r}.json")) for r in range(1, reps + 1)]
        cpu = [int(open(f"{base}-{r}.ticks").read()) / tick for r in range(1, reps + 1)]
        med = lambda f: statistics.median(f(r) for r in runs)
        rate[name] = med(lambda r: r['throughput_msgs_per_s'])
        per_cpu[name] = statistics.median(r['acknowledged'] / max(c, 1 / tick) for r, c in zip(runs, cpu))
        print(f"{name:<10} {devices:>7} {rate[name]:>9.0f} {per_cpu[name]:>15.0f} {med(lambda r: r['puback_latency']['p50_ms']):>8.2f} "
              f"{med(lambda r: r['puback_latency']['p99_ms']):>8.2f} {sum(r['errors'] for r in runs):>6}  "
              + " ".join(f"{r['throughput_msgs_per_s']:.0f}" for r in runs))
    print(f"{'AMQP/MQTT':<10} {devices:>7} {rate['AMQP'] / rate['MQTT']:>9.2f} {per_cpu['AMQP'] / per_cpu['MQTT']:>15.2f}")
PY
