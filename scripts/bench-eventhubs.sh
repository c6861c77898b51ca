#!/usr/bin/env bash
# Built-in endpoint read benchmark (AMQ-4): an Event Hubs-style AMQP reader (one connection, one
# receiver link per partition, prefetch 300) against the HTTPS long-poll read API, reading all
# four partitions and one partition, while 100 devices publish 200 QoS 1 messages each over
# MQTT/TLS (10 in flight per device, 256-byte bodies: as fast as the hub takes them), and a
# light load (10 devices, 300 messages each, 1 in flight) for latency below saturation. Reports events/s read and the latency
# from a device's PUBACK to the reader's receipt. Results: JSON per run in $OUT (default
# ./bench-results), medians on stdout. Bounded: fixed counts and a time limit per run. Not part
# of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
bench_prepare
EHREAD="$CARGO_TARGET_DIR/release/ehread"
bench_start_hub 19443 19883 19671
SERVICE_KEY="$(grep -m1 'SharedAccessKeyName=service' "$WORK/hub.out" | sed 's/.*SharedAccessKey=//')"

REPEAT="${REPEAT:-3}"
DEVICES="${DEVICES:-100}"
MESSAGES="${MESSAGES:-200}"
for rep in $(seq 1 "$REPEAT"); do
    for case in "amqp all 0,1,2,3 $DEVICES $MESSAGES 10" "https all 0,1,2,3 $DEVICES $MESSAGES 10" \
        "amqp one 0 $DEVICES $MESSAGES 10" "https one 0 $DEVICES $MESSAGES 10" \
        "amqp light 0,1,2,3 10 300 1" "https light 0,1,2,3 10 300 1"; do
        set -- $case
        "$EHREAD" --reader "$1" --partitions "$3" --devices "$4" --messages "$5" --inflight "$6" \
            --host localhost --mqtt-port 19883 --https-port 19443 --amqp-port 19671 --ca "$WORK/hub/tls/ca.pem" \
            --owner "$OWNER" --service-key "$SERVICE_KEY" --prefix "r$rep-$1-$2-" --time-limit 300 \
            >"$OUT/eh-$1-$2-$rep.json"
    done
done

python3 - "$OUT" "$REPEAT" "$DEVICES" "$MESSAGES" <<'PY'
import json, statistics, sys
out, reps, devices, messages = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"medians of {reps} runs ({devices} devices x {messages} QoS 1 messages, read while published; light: 10 x 300, 1 in flight)")
print(f"{'reader':<7} {'parts':<5} {'events':>7} {'read ev/s':>10} {'PUBACK->rx p50':>15} {'p99 ms':>8} {'publish->rx p50':>16} {'p99 ms':>8}  runs ev/s")
for scope in ("all", "one", "light"):
    for reader in ("amqp", "https"):
        runs = [json.load(open(f"{out}/eh-{reader}-{scope}-{r}.json")) for r in range(1, reps + 1)]
        med = lambda f: statistics.median(f(r) for r in runs)
        assert all(r["events"] == r["expected"] for r in runs), f"{reader}/{scope}: events missing"
        print(f"{reader:<7} {scope:<5} {med(lambda r: r['events']):>7.0f} {med(lambda r: r['read_events_per_s']):>10.0f} "
              f"{med(lambda r: r['receipt_after_puback_ms']['p50']):>15.2f} {med(lambda r: r['receipt_after_puback_ms']['p99']):>8.2f} "
              f"{med(lambda r: r['receipt_after_publish']['p50_ms']):>16.2f} {med(lambda r: r['receipt_after_publish']['p99_ms']):>8.2f}  "
              + " ".join(f"{r['read_events_per_s']:.0f}" for r in runs))
PY
