#!/usr/bin/env bash
# Cluster against single node (issue 49, docs/cluster.md), same load generator, same machine,
# interleaved: a single node on 127.0.0.1 (ports 18443/18883/18671) and the three-node cluster
# of scripts/run-cluster.sh (three nats-servers synced always, three hubs, HAProxy on
# 443/8883/5671; all seven processes share this machine's cores). The cluster is reached three
# ways: `cluster` through HAProxy (clients spread over the nodes; two thirds forwarded by a
# follower), `writer` straight to the writer's address, `follower` straight to one follower's
# (every connection forwarded); TARGETS picks some (single first), SCENARIOS likewise. Scenarios:
#   telemetry   100 devices x 2,000 QoS 1 messages, 10 in flight each: messages/s, PUBACK p50/p99
#   rate10k     the same devices paced to 10,000 messages/s in all (300 each): PUBACK p50/p99
#   reported    100 devices x 300 reported-property patches: patches/s, p50/p99
#   c2d         100 devices x 40 C2D messages over HTTPS, 8 senders: messages/s, send-to-receipt
# Results: JSON per run in $OUT (default ./bench-results) and medians with cluster/single
# ratios on stdout. With CPU=1, also the CPU seconds each process spent per run (from
# /proc/PID/stat; the load generator's from its rusage) in $OUT/cluster-cpu-*.txt and a table
# of medians in CPU microseconds per message: where a cluster's cycles go. Bounded: fixed counts and a time limit per run; everything is stopped on
# exit. Needs root (the cluster's fixed ports). Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
bench_prepare
ensure_cluster_tools

REPEAT="${REPEAT:-3}"
bench_start_hub 18443 18883 18671
SINGLE_OWNER="$OWNER"
SINGLE_PID=$!
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
SCENARIOS="${SCENARIOS:-telemetry rate10k reported c2d}"

run() { # target scenario repetition
    local target="$1" scenario="$2" rep="$3" owner mqtt https amqp ca
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
    cluster_bench_load "$scenario"
    local cpu="$OUT/cluster-cpu-$target-$scenario-$rep.txt" before
    [ "${CPU:-0}" = 1 ] && before="$(cpu_ticks)"
    cpu_wrap "$cpu.loadgen" "$LOADGEN" --target ferrohub --host localhost --mqtt-port "$mqtt" --https-port "$https" --amqp-port "$amqp" \
        --ca "$ca" --owner "$owner" "${via[@]}" "${LOAD_ARGS[@]}" --prefix "$target-$scenario-$rep-" \
        >"$OUT/cluster-bench-$target-$scenario-$rep.json"
    [ "${CPU:-0}" = 1 ] && cpu_delta "$before" "$(cpu_ticks)" "$cpu.loadgen" >"$cpu"
    return 0
}

# Every measured process's CPU ticks now, one "name ticks" line each.
# The hubs are named by role: writer, follower1, follower2.
cpu_ticks() {
    local f name writer followers=0
    writer="$(bash scripts/run-cluster.sh --writer "$WORK/cluster")"
    echo "single $(proc_ticks "$SINGLE_PID")"
    for f in "$WORK"/cluster/pids/*.pid; do
        name="$(basename "$f" .pid)"
        case "$name" in
            "$writer") name=writer ;;
            hub*) followers=$((followers + 1)) name="follower$followers" ;;
        esac
        echo "$name $(proc_ticks "$(cat "$f")")"
    done
    # Not CPU: the writer's log appends so far, for messages per log entry.
    curl -fsS --max-time 2 "http://$(node_ip "$writer"):9464/metrics" 2>/dev/null |
        awk '/^ferrohub_cluster_append_seconds_count/ {print "log-entries", $2; found=1} END {if (!found) print "log-entries 0"}'
}
proc_ticks() { # utime + stime of one process, in clock ticks (0 once it is gone)
    awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}
cpu_wrap() { # $1: where the command's user+system seconds go; the rest: the command
    local to="$1"
    shift
    if [ "${CPU:-0}" = 1 ]; then /usr/bin/time -o "$to" -f "%U %S" "$@"; else "$@"; fi
}
cpu_delta() { # before, after, the load generator's time file: "name seconds" lines
    local hz
    hz="$(getconf CLK_TCK)"
    join <(sort <<<"$1") <(sort <<<"$2") | awk -v hz="$hz" '$1 == "log-entries" {print $1, $3 - $2; next} {printf "%s %.2f\n", $1, ($3 - $2) / hz}'
    awk '{printf "loadgen %.2f\n", $1 + $2}' "$3"
}

for rep in $(seq 1 "$REPEAT"); do
    for scenario in $SCENARIOS; do
        for target in $TARGETS; do
            run "$target" "$scenario" "$rep"
        done
    done
done

python3 - "$OUT" "$REPEAT" "$TARGETS" "$SCENARIOS" <<'PY'
import json, statistics, sys
out, reps, targets, scenarios = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
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
for scenario in scenarios:
    base = m(load(targets[0], scenario), rate)
    for target in targets:
        runs = load(target, scenario)
        r = m(runs, rate)
        print(f"{scenario:<10} {target:<9} {r:>9.0f} {r / base:>6.2f} {m(runs, lambda x: lat(x, 'p50')):>8.2f} {m(runs, lambda x: lat(x, 'p99')):>8.2f}")
PY

[ "${CPU:-0}" = 1 ] || exit 0
python3 - "$OUT" "$REPEAT" "$TARGETS" "$SCENARIOS" <<'PY'
import json, statistics, sys
out, reps, targets, scenarios = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
names = ["single", "writer", "follower1", "follower2", "nats1", "nats2", "nats3", "haproxy", "loadgen"]
print()
print("CPU microseconds per message (medians)")
print("and messages per log entry (a commit group's; `-` for the single node, where no log is)")
print(f"{'scenario':<10} {'target':<9} " + " ".join(f"{n:>9}" for n in names) + f" {'total':>7} {'msgs/entry':>10}")
for scenario in scenarios:
    for target in targets:
        per, entries = {n: [] for n in names}, []
        for r in range(1, reps + 1):
            done = json.load(open(f"{out}/cluster-bench-{target}-{scenario}-{r}.json"))
            count = done["throughput_msgs_per_s"] * done["duration_s"]
            secs = dict(l.split() for l in open(f"{out}/cluster-cpu-{target}-{scenario}-{r}.txt"))
            for n in names:
                per[n].append(float(secs.get(n, 0)) * 1e6 / max(count, 1))
            entries.append(count / float(secs["log-entries"]) if float(secs.get("log-entries", 0)) > 0 else None)
        cells = [statistics.median(per[n]) for n in names]
        known = [e for e in entries if e is not None]
        per_entry = f"{statistics.median(known):>10.1f}" if known and target != "single" else f"{'-':>10}"
        print(f"{scenario:<10} {target:<9} " + " ".join(f"{c:>9.1f}" for c in cells) + f" {sum(cells):>7.1f} {per_entry}")
PY
