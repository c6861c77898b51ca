#!/usr/bin/env bash
# Import/export benchmark (JOB-1..JOB-5): for each count in $COUNTS (default "100000 1000000"),
# a fresh hub imports that many identities with twins (tags, desired; every 100th with a module)
# from a file:// devices.txt through an import job, exports them through an export job, and
# then, stopped, is exported offline and restored into an empty data directory. Reports
# identities/s per step and peak RSS (the hub after its jobs; the offline commands from wait4).
# Results: JSON per count in $OUT (default ./bench-results). Bounded: fixed counts, a time limit
# per step. Needs ~2 GB of scratch space per million identities. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
bench_prepare
ensure_python_env
COUNTS="${COUNTS:-100000 1000000}"
for n in $COUNTS; do
    "$FERROHUB_VENV/bin/python" bench/import_export.py "$FERROHUB_BIN" "$WORK/n$n" "$n" "$OUT/import-export-$n.json"
    rm -rf "$WORK/n$n"
done
