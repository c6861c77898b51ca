#!/usr/bin/env bash
# ferrohub against Mosquitto 2.0 (persistence off and on) with the shared yardstick
# ../shared/tools/mqttload (issue 19): interleaved runs, REPEAT repetitions (default 3), and a
# table of medians with the ferrohub/Mosquitto ratios on stdout. Per-run JSON is appended to
# $OUT/compare-<time>.jsonl. Scenarios as arguments (default all; see bench/compare.py):
#   idle5000 idle19000 pub100 pub1000 rate10k single connect-full connect-resumed
# PROFILE=1 records a perf profile of ferrohub's first run of each scenario. Not part of the
# test suite; every run is bounded by its duration.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_build_deps
ensure_apt mosquitto
[ "${PROFILE:-}" = 1 ] && ensure_apt linux-perf
ensure_python_env
cargo build --release --workspace --all-targets

MQTTLOAD_SRC="${MQTTLOAD_SRC:-../shared/tools/mqttload}"
MQTTLOAD_TARGET="$HOME/.cache/ferrohub/mqttload-target"
CARGO_TARGET_DIR="$MQTTLOAD_TARGET" cargo build --release --manifest-path "$MQTTLOAD_SRC/Cargo.toml"

bench_setup
exec_out="$OUT/compare-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
"$FERROHUB_VENV/bin/python" bench/compare.py "$FERROHUB_BIN" "$MQTTLOAD_TARGET/release/mqttload" \
    "$WORK/compare" "$exec_out" "$@"
echo "per-run JSON: $exec_out" >&2
