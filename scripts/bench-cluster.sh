#!/usr/bin/env bash
# Cluster against single node (issue 49, docs/cluster.md), same load generator, same machine,
# interleaved: a single node on 127.0.0.1 (ports 18443/18883/18671) and the three-node cluster
# of scripts/run-cluster.sh (three nats-servers synced always, three hubs, HAProxy on
# 443/8883/5671; all seven processes share this machine's cores). The cluster is reached three
# ways: `cluster` through HAProxy (clients spread over the nodes; two thirds forwarded by a
# follower), `writer` straight to the writer's address, `follower` straight to one follower's
# (every connection forwarded). Scenarios:
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

node_ip() { echo "127.0.0.$((${1: -1} + 1))"; }
a_follower() {
    local w n
    w="$(bash scripts/run-cluster.sh --writer "$WORK/cluster")"
    for n in hub1 hub2 hub3; do [ "$n" != "$w" ] && { echo "$n"; return; }; done
}
TARGETS="${TARGETS:-single cluster writer follower}"

run() { # target scenario repetition
    local target="$1" scenario="$2" rep="$3" owner mqtt https amqp ca args
    local via=()
    if [ "$target" = single ]; then
        owner="$SINGLE_OWNER" mqtt=18883 https=18443 amqp=18671 ca="$WORK/hub/tls/ca.pem"
    else
        owner="$CLUSTER_OWNER" mqtt=8883 https=443 amqp=5671 ca="$WORK/cluster/tls/ca.pem"
        case "$target" in
            writer) via=(--connect-to "$(node_ip "$(bash scripts/run-cluster.sh --writer "$WORK/cluster")")") ;;
            follower) via=(--connect-to "$(node_ip "$(a_follower)")") ;;
        esac
    fi
    case "$scenario" in
        telemetry) args=(--scenario telemetry --devices 100 --messages-per-device 2000 --inflight 10) ;;
        rate10k) args=(--scenario telemetry --devices 100 --messages-per-device 300 --inflight 10 --rate 10000) ;;
        reported) args=(--scenario reported --devices 100 --messages-per-device 300) ;;
        c2d) args=(--scenario c2d --devices 100 --messages-per-device 40 --callers 8 --c2d-sender https) ;;
    esac
    "$LOADGEN" --target ferrohub --host localhost --mqtt-port "$mqtt" --https-port "$https" --amqp-port "$amqp" \
        --ca "$ca" --owner "$owner" "${via[@]}" "${args[@]}" --payload-bytes 256 --prefix "$target-$scenario-$rep-" \
        --time-limit 300 >"$OUT/cluster-bench-$target-$scenario-$rep.json"
}

for rep in $(seq 1 "$REPEAT"); do
    for scenario in telemetry rate10k reported c2d; do
        for target in $TARGETS; do
            run "$target" "$scenario" "$rep"
        done
    done
done

python3 - "$OUT" "$REPEAT" "$TARGETS" <<'PY'
import json, statistics, sys
out, reps, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def load(target, scenario):
    return [json.load(open(f"{out}/cluster-bench-{target}-{scenario}-{r}.json")) for r in range(1, reps + 1)]
def rate(r):
    return r["throughput_msgs_per_s"]
def lat(r, q):
    # PUBACK (telemetry), the 204 answer (reported), or send to receipt (c2d).
    return (r.get("puback_latency") or r["send_to_receipt_latency"])[f"{q}_ms"]
m = lambda runs, f: statistics.median(f(r) for r in runs)
print(f"medians of {reps} interleaved runs; cluster = 3 nats-servers (R3, synced always) + 3 hubs + HAProxy on the same cores")
print("ratio: against single (the first target)")
print(f"{'scenario':<10} {'target':<9} {'msgs/s':>9} {'ratio':>6} {'p50 ms':>8} {'p99 ms':>8}")
for scenario in ("telemetry", "rate10k", "reported", "c2d"):
    base = m(load(targets[0], scenario), rate)
    for target in targets:
        runs = load(target, scenario)
        r = m(runs, rate)
        print(f"{scenario:<10} {target:<9} {r:>9.0f} {r / base:>6.2f} {m(runs, lambda x: lat(x, 'p50')):>8.2f} {m(runs, lambda x: lat(x, 'p99')):>8.2f}")
PY
