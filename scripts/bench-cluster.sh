#!/usr/bin/env bash
# Cluster against single node (issue 49, docs/cluster.md), same load generator, same machine,
# interleaved: a single node on 127.0.0.1 (ports 18443/18883/18671) and the three-node cluster
# of scripts/run-cluster.sh (three nats-servers synced always, three hubs, HAProxy on
# 443/8883/5671; all seven processes share this machine's cores). Scenarios:
#   telemetry   100 devices x 2,000 QoS 1 messages, 10 in flight each: messages/s, PUBACK p50/p99
#   rate10k     the same devices paced to 10,000 messages/s in all (300 each): PUBACK p50/p99
#   reported    100 devices x 300 reported-property patches: patches/s, p50/p99
#   c2d         100 devices x 40 C2D messages over HTTPS, 8 senders: messages/s, send-to-receipt
# Results: JSON per run in $OUT (default ./bench-results) and medians with cluster/single
# ratios on stdout. Bounded: fixed counts and a time limit per run; everything is stopped on
# exit. Needs root (the cluster's fixed ports). Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
bench_prepare
ensure_cluster_tools

REPEAT="${REPEAT:-3}"
bench_start_hub 18443 18883 18671
SINGLE_OWNER="$OWNER"
bash scripts/run-cluster.sh "$WORK/cluster" >"$WORK/cluster.out"
trap 'bash scripts/run-cluster.sh --stop "$WORK/cluster"; kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK" || true' EXIT
CLUSTER_OWNER="$(grep -m1 'SharedAccessKeyName=iothubowner' "$WORK/cluster/connection-strings.txt")"

run() { # target scenario repetition
    local target="$1" scenario="$2" rep="$3" owner mqtt https amqp ca args
    if [ "$target" = single ]; then
        owner="$SINGLE_OWNER" mqtt=18883 https=18443 amqp=18671 ca="$WORK/hub/tls/ca.pem"
    else
        owner="$CLUSTER_OWNER" mqtt=8883 https=443 amqp=5671 ca="$WORK/cluster/tls/ca.pem"
    fi
    case "$scenario" in
        telemetry) args=(--scenario telemetry --devices 100 --messages-per-device 2000 --inflight 10) ;;
        rate10k) args=(--scenario telemetry --devices 100 --messages-per-device 300 --inflight 10 --rate 10000) ;;
        reported) args=(--scenario reported --devices 100 --messages-per-device 300) ;;
        c2d) args=(--scenario c2d --devices 100 --messages-per-device 40 --callers 8 --c2d-sender https) ;;
    esac
    "$LOADGEN" --target ferrohub --host localhost --mqtt-port "$mqtt" --https-port "$https" --amqp-port "$amqp" \
        --ca "$ca" --owner "$owner" "${args[@]}" --payload-bytes 256 --prefix "$target-$scenario-$rep-" \
        --time-limit 300 >"$OUT/cluster-bench-$target-$scenario-$rep.json"
}

for rep in $(seq 1 "$REPEAT"); do
    for scenario in telemetry rate10k reported c2d; do
        for target in single cluster; do
            run "$target" "$scenario" "$rep"
        done
    done
done

python3 - "$OUT" "$REPEAT" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def load(target, scenario):
    return [json.load(open(f"{out}/cluster-bench-{target}-{scenario}-{r}.json")) for r in range(1, reps + 1)]
def rate(r):
    return r["throughput_msgs_per_s"]
def lat(r, q):
    # PUBACK (telemetry), the 204 answer (reported), or send to receipt (c2d).
    return (r.get("puback_latency") or r["send_to_receipt_latency"])[f"{q}_ms"]
print(f"medians of {reps} interleaved runs; cluster = 3 nats-servers (R3, synced always) + 3 hubs + HAProxy on the same cores")
print(f"{'scenario':<10} {'single/s':>9} {'cluster/s':>9} {'ratio':>6} {'p50 single':>10} {'p50 cluster':>11} {'p99 single':>10} {'p99 cluster':>11}")
for scenario in ("telemetry", "rate10k", "reported", "c2d"):
    s, c = load("single", scenario), load("cluster", scenario)
    m = lambda runs, f: statistics.median(f(r) for r in runs)
    rs, rc = m(s, rate), m(c, rate)
    print(f"{scenario:<10} {rs:>9.0f} {rc:>9.0f} {rc / rs:>6.2f} {m(s, lambda r: lat(r, 'p50')):>10.2f} "
          f"{m(c, lambda r: lat(r, 'p50')):>11.2f} {m(s, lambda r: lat(r, 'p99')):>10.2f} {m(c, lambda r: lat(r, 'p99')):>11.2f}")
PY
