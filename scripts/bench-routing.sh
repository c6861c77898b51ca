#!/usr/bin/env bash
# Telemetry throughput with 0, 1 and 10 routes with conditions (EVT-5 benchmark): the same
# load (100 devices over MQTT/TLS, QoS 1, JSON bodies with content type, encoding and an
# application property, 10 in flight per device) against a fresh hub per run, repetitions
# interleaved. Every message is stored once in the built-in endpoint in all three cases, so the
# difference is the cost of evaluating conditions. Results: JSON per run in $OUT (default
# ./bench-results) and a summary on stdout. Bounded; not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
bench_prepare
REPEAT="${REPEAT:-3}"
DEVICES="${DEVICES:-100}"
PER="${PER:-200}"

# One matching route (to the built-in endpoint); the ten-route case adds nine that never match.
config() { # routes
    local n="$1" f="$WORK/routes-$1.toml"
    : >"$f"
    if [ "$n" -ge 1 ]; then
        cat >>"$f" <<TOML
[[routing.routes]]
name = "match"
source = "DeviceMessages"
condition = "level = 'high' AND \$body.temp > 20"
endpoints = ["events"]
TOML
    fi
    for k in $(seq 1 $((n - 1))); do
        cat >>"$f" <<TOML
[[routing.routes]]
name = "miss$k"
source = "DeviceMessages"
condition = "\$body.temp > $((100 + k)) OR (STARTS_WITH(level, 'x$k') AND \$body.seq = $k)"
endpoints = ["events"]
TOML
    done
    echo "$f"
}

run() { # routes repetition
    local n="$1" rep="$2" dir="$WORK/hub-$1-$2"
    "$FERROHUB_BIN" serve --data-dir "$dir" --config "$(config "$n")" --https-addr 127.0.0.1:18443 \
        --mqtt-addr 127.0.0.1:18883 --amqp-addr 127.0.0.1:18671 --mqtt-quic-addr 127.0.0.1:0 >"$dir.out" 2>"$dir.err" &
    local pid=$!
    for _ in $(seq 1 100); do grep -q "listening https" "$dir.out" 2>/dev/null && break; sleep 0.2; done
    local owner
    owner="$(grep -m1 'SharedAccessKeyName=iothubowner' "$dir.out")"
    "$LOADGEN" --host localhost --mqtt-port 18883 --https-port 18443 --ca "$dir/tls/ca.pem" \
        --owner "$owner" --devices "$DEVICES" --messages-per-device "$PER" --payload-bytes 256 \
        --inflight 10 --json-body --time-limit 300 >"$OUT/routes-$n-$rep.json"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

for rep in $(seq 1 "$REPEAT"); do
    for n in 0 1 10; do
        run "$n" "$rep"
    done
done

python3 - "$OUT" "$REPEAT" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
print(f"medians of {reps} runs (100 devices, QoS 1, 256-byte JSON bodies, 10 in flight, TLS)")
print(f"{'routes':>6} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}  runs msgs/s")
base = None
for n in (0, 1, 10):
    runs = [json.load(open(f"{out}/routes-{n}-{r}.json")) for r in range(1, reps + 1)]
    med = lambda f: statistics.median(f(r) for r in runs)
    thr = med(lambda r: r["throughput_msgs_per_s"])
    base = base or thr
    print(f"{n:>6} {thr:>9.0f} {med(lambda r: r['puback_latency']['p50_ms']):>8.2f} "
          f"{med(lambda r: r['puback_latency']['p99_ms']):>8.2f} {sum(r['errors'] for r in runs):>6}  "
          + " ".join(f"{r['throughput_msgs_per_s']:.0f}" for r in runs) + f"   ({thr / base:.2f}x of 0 routes)")
PY
