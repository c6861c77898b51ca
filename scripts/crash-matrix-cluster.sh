#!/usr/bin/env bash
# The crash matrix in cluster mode (issue 49, docs/cluster.md): TRIALS (default 50) SIGKILLs of
# a random node (writer hub, follower hub, or one of the three nats-servers) of the cluster of
# scripts/run-cluster.sh under mixed load, each checking that nothing acknowledged was lost and
# measuring failover (kill to the first write accepted again). One JSON line per trial and a
# summary line, on stdout and appended to $OUT/cluster-crash-<time>.jsonl; exit status 1 if any
# trial found a problem. SEED repeats a run; TARGETS_KILLED (comma-separated, of writer,
# follower, nats1, nats2, nats3) narrows what is killed. Needs root (the SDKs' fixed ports). Bounded: each
# trial kills within 2.5 s of starting its load and waits at most 60 s for writes. Not in CI
# (tests/python/test_cluster.py kills each kind of node once there).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
bench_prepare
ensure_cluster_tools
install_cli
"$FERROHUB_VENV/bin/python" tests/python/cluster_crashmatrix.py --trials "${TRIALS:-50}" \
    --seed "${SEED:-$(date +%s)}" --targets "${TARGETS_KILLED:-writer,follower,nats1,nats2,nats3}" --out "$OUT/cluster-crash-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
