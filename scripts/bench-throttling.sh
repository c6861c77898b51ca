#!/usr/bin/env bash
# Throttling benchmarks (THR-1, THR-2), in one session:
#  1. Cost of throttling that does not bind: telemetry throughput of a hub with throttling off
#     against one with tier S3 x 10 units configured and D2C sends raised to 1,000,000/s (every
#     limiter, the fair share and the daily quota are consulted, none binds), same load generator
#     and settings, runs interleaved A B B A; medians and their ratio.
#  2. Fair share: 1 device flooding and 99 devices sending 1 message a second each, with a D2C
#     budget of 120/s (bench/fair_share.py): the quiet devices' PUBACK latencies and share
#     acknowledged within 1 s, and what the flooder got.
# Results: JSON in $OUT (default ./bench-results) and a summary on stdout. Bounded: fixed
# message counts and durations. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
bench_prepare
ensure_python_env

REPEAT="${REPEAT:-5}"
DEVICES="${DEVICES:-100}"
PER="${PER:-300}"

start_hub() { # name https mqtt amqp [config]
    local name="$1"
    "$FERROHUB_BIN" serve --data-dir "$WORK/$name" --https-addr "127.0.0.1:$2" --mqtt-addr "127.0.0.1:$3" \
        --amqp-addr "127.0.0.1:$4" --metrics-addr 127.0.0.1:0 --mqtt-quic-addr 127.0.0.1:0 ${5:+--config "$5"} >"$WORK/$name.out" 2>"$WORK/$name.err" &
    for _ in $(seq 1 100); do grep -q "listening https" "$WORK/$name.out" 2>/dev/null && break; sleep 0.2; done
}
# S3 x 10 allows 60,000 D2C sends/s, which this machine can exceed: raise that one limit so the
# throttles are all configured and consulted but none binds.
printf '[throttling]\ntier = "s3"\nunits = 10\nd2c_sends_per_second = 1000000\n' >"$WORK/s3.toml"
start_hub off 18443 18883 18671
start_hub s3 19443 19883 19671 "$WORK/s3.toml"

run() { # name https mqtt rep
    local owner
    owner="$(grep -m1 'SharedAccessKeyName=iothubowner' "$WORK/$1.out")"
    "$LOADGEN" --target ferrohub --host localhost --mqtt-port "$3" --https-port "$2" --ca "$WORK/$1/tls/ca.pem" \
        --owner "$owner" --devices "$DEVICES" --messages-per-device "$PER" --payload-bytes 256 \
        --inflight 10 --prefix "t$4-" --time-limit 300 >"$OUT/throttling-$1-$4.json"
}
# A B B A ...: neither configuration always runs first.
for rep in $(seq 1 "$REPEAT"); do
    if [ $((rep % 2)) -eq 1 ]; then
        run off 18443 18883 "$rep"; run s3 19443 19883 "$rep"
    else
        run s3 19443 19883 "$rep"; run off 18443 18883 "$rep"
    fi
done
python3 - "$OUT" "$REPEAT" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
rate = {n: [json.load(open(f"{out}/throttling-{n}-{r}.json"))["throughput_msgs_per_s"] for r in range(1, reps + 1)] for n in ("off", "s3")}
med = {n: statistics.median(v) for n, v in rate.items()}
print(f"telemetry, medians of {reps} interleaved runs: throttling off {med['off']:.0f} msgs/s, "
      f"S3 x 10 configured, not binding {med['s3']:.0f} msgs/s, ratio {med['s3'] / med['off']:.3f}")
print("runs off:", " ".join(f"{x:.0f}" for x in rate["off"]), "| runs s3:", " ".join(f"{x:.0f}" for x in rate["s3"]))
PY
kill "$(jobs -p)" 2>/dev/null || true

"$FERROHUB_VENV/bin/python" bench/fair_share.py "$FERROHUB_BIN" "$WORK/fair" "$OUT/fair-share.json"
