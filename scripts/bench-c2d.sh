#!/usr/bin/env bash
# C2D send throughput (AMQ-2 benchmark): the AMQP send path (what the service SDKs use) against
# the HTTPS send, same hub, same load, interleaved: 1 connection with 8 sender links, and
# 8 connections with 8 links each, against 8 and 64 concurrent HTTPS senders; 1000 devices,
# 20,000 sends per run (20 per device), 256-byte bodies. Every send is durable before it is
# acknowledged. Results: JSON per run in $OUT (default ./bench-results) and medians on stdout.
# Bounded: fixed counts and a time limit per run. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
bench_prepare
C2DSEND="$CARGO_TARGET_DIR/release/c2dsend"
bench_start_hub 18443 18883 18671

REPEAT="${REPEAT:-3}"
MESSAGES="${MESSAGES:-20000}"
for rep in $(seq 1 "$REPEAT"); do
    for case in "amqp 1" "https 1" "amqp 8" "https 8"; do
        set -- $case
        "$C2DSEND" --transport "$1" --connections "$2" --links 8 --devices 1000 --messages "$MESSAGES" \
            --host localhost --https-port 18443 --amqp-port 18671 --ca "$WORK/hub/tls/ca.pem" --owner "$OWNER" \
            --prefix "r$rep-$1-$2-" --time-limit 300 >"$OUT/c2d-$1-$2-$rep.json"
    done
done

python3 - "$OUT" "$REPEAT" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
print(f"medians of {reps} runs (1000 devices, 8 senders per connection, durable before acknowledged)")
print(f"{'transport':<10} {'conns':>5} {'senders':>7} {'sends/s':>9} {'p50 ms':>8} {'p99 ms':>8}  runs sends/s")
for conns in (1, 8):
    for t in ("amqp", "https"):
        runs = [json.load(open(f"{out}/c2d-{t}-{conns}-{r}.json")) for r in range(1, reps + 1)]
        med = lambda f: statistics.median(f(r) for r in runs)
        assert all(r["refused"] == 0 for r in runs), f"{t}/{conns}: refused sends"
        print(f"{t:<10} {conns:>5} {conns * 8:>7} {med(lambda r: r['sends_per_s']):>9.0f} "
              f"{med(lambda r: r['latency']['p50_ms']):>8.2f} {med(lambda r: r['latency']['p99_ms']):>8.2f}  "
              + " ".join(f"{r['sends_per_s']:.0f}" for r in runs))
PY
