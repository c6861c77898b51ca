#!/usr/bin/env bash
# Runs every test: the Rust unit and integration tests, then the end-to-end suites that drive a
# real ferrohub process with raw HTTPS and with the official Azure IoT SDKs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_build_deps
ensure_python_env
ensure_node_env
# Cluster mode's suites: a pinned nats-server and HAProxy in front (scripts/run-cluster.sh).
ensure_nats
ensure_apt haproxy curl

# One cargo invocation shape everywhere (workspace, all targets): a different package or target
# selection changes feature unification and would rebuild RocksDB's C++ from scratch.
# --all-targets also runs each criterion bench once as a smoke test (no measurement).
announce_build
cargo test --release --workspace --all-targets
install_cli

"$FERROHUB_VENV/bin/python" -m pytest -q -c tests/python/pytest.ini tests/python

# A few seconds of each coverage-guided fuzz target (cargo-fuzz needs the nightly toolchain;
# without it the stable replay smoke in server/tests/fuzz_replay.rs, run above, is what runs).
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    JOBS=2 bash scripts/fuzz.sh "${FUZZ_SMOKE_SECONDS:-5}"
else
    echo "no nightly toolchain: coverage-guided fuzz smoke skipped (scripts/fuzz.sh)" >&2
fi
