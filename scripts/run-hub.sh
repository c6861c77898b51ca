#!/usr/bin/env bash
# Builds ferrohub (installing what the build needs) and runs a hub node.
# Data lives in ./data unless FERROHUB_DATA_DIR says otherwise; extra arguments go to
# `ferrohub serve` (for example --https-addr 127.0.0.1:8443).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_build_deps
announce_build
# The same cargo invocation as the test script, so the two share one RocksDB build.
cargo build --release --workspace --all-targets
install_cli
exec "$FERROHUB_BIN" serve --data-dir "${FERROHUB_DATA_DIR:-./data}" "$@"
