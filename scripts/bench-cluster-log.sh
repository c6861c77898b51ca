#!/usr/bin/env bash
# What the cluster design's replicated commit log costs on this machine (issue 49,
# docs/cluster.md): one fenced writer appending serialized write batches to a JetStream
# stream, with the pinned nats-server. Three cases, each with 1 and 16 appends in flight:
#   r1-always   one server, one replica, every append synced before its acknowledgement
#   r3-always   three servers on 127.0.0.2-4, three replicas, each synced (JetStream acks once
#               a majority stored it)
#   r3-interval three servers, three replicas, synced every 2 minutes (JetStream's default)
# An entry is 64 records of 200 bytes (12.8 KB, a group commit's batch). Results: JSON per run
# in $OUT (default ./bench-results) and medians on stdout. Bounded: fixed counts, a time limit
# per run; every server is stopped on exit. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
bench_prepare
ensure_nats
LOGAPPEND="$CARGO_TARGET_DIR/release/logappend"
REPEAT="${REPEAT:-3}"
ENTRIES="${ENTRIES:-4000}"

# Starts nats-servers 1..$1 with sync_interval $2; their PIDs go to $WORK/nats.pids.
start_nats() {
    local n="$1" sync="$2" routes="" i
    for i in $(seq 1 "$n"); do routes="$routes, nats-route://127.0.0.$((i + 1)):6222"; done
    routes="${routes#, }"
    : >"$WORK/nats.pids"
    for i in $(seq 1 "$n"); do
        mkdir -p "$WORK/nats$i"
        cat >"$WORK/nats$i.conf" <<EOF
server_name: nats$i
listen: 127.0.0.$((i + 1)):4222
jetstream { store_dir: "$WORK/nats$i", sync_interval: "$sync" }
$( [ "$n" -gt 1 ] && printf 'cluster { name: bench, listen: 127.0.0.%d:6222, routes: [%s] }' "$((i + 1))" "$routes" )
EOF
        "$FERROHUB_NATS/bin/nats-server" -t -c "$WORK/nats$i.conf" >/dev/null 2>&1 || { echo "bad nats config $WORK/nats$i.conf" >&2; exit 1; }
        "$FERROHUB_NATS/bin/nats-server" -c "$WORK/nats$i.conf" -l "$WORK/nats$i.log" &
        echo $! >>"$WORK/nats.pids"
    done
    # Ready when JetStream answers on every server (a cluster also needs its meta leader).
    for _ in $(seq 1 100); do
        local ready=0
        for i in $(seq 1 "$n"); do
            grep -q "Server is ready" "$WORK/nats$i.log" 2>/dev/null && ready=$((ready + 1))
        done
        [ "$ready" -eq "$n" ] && break
        sleep 0.2
    done
    sleep 2
}

stop_nats() {
    while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$WORK/nats.pids"
    wait 2>/dev/null || true
    rm -rf "$WORK"/nats[0-9]*
}

run_case() {
    local name="$1" servers="$2" replicas="$3" sync="$4" urls="" i rep window
    for i in $(seq 1 "$servers"); do urls="$urls,nats://127.0.0.$((i + 1)):4222"; done
    for rep in $(seq 1 "$REPEAT"); do
        start_nats "$servers" "$sync"
        for window in 1 16; do
            "$LOGAPPEND" --nats "${urls#,}" --replicas "$replicas" --entries "$ENTRIES" --window "$window" \
                --time-limit 120s >"$OUT/log-$name-w$window-$rep.json"
        done
        stop_nats
    done
}

run_case r1-always 1 1 always
run_case r3-always 3 3 always
run_case r3-interval 3 3 2m

python3 - "$OUT" "$REPEAT" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
print(f"medians of {reps} runs; an entry is 64 records of 200 bytes; fenced appends (expected last sequence)")
print(f"{'case':<12} {'window':>6} {'entries/s':>10} {'records/s':>10} {'p50 ms':>7} {'p99 ms':>7}  fenced")
for case in ("r1-always", "r3-always", "r3-interval"):
    for w in (1, 16):
        runs = [json.load(open(f"{out}/log-{case}-w{w}-{r}.json")) for r in range(1, reps + 1)]
        med = lambda f: statistics.median(f(r) for r in runs)
        print(f"{case:<12} {w:>6} {med(lambda r: r['entries_per_s']):>10.0f} {med(lambda r: r['records_per_s']):>10.0f} "
              f"{med(lambda r: r['ack']['p50_ms']):>7.2f} {med(lambda r: r['ack']['p99_ms']):>7.2f}  "
              f"{all(r['fenced'] for r in runs)}")
PY
