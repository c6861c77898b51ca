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
ensure_cluster_tools
# The web console's browser tests.
ensure_browser

# One cargo invocation shape everywhere (workspace, all targets): a different package or target
# selection changes feature unification and would rebuild RocksDB's C++ from scratch.
# --all-targets also runs each criterion bench once as a smoke test (no measurement).
announce_build
cargo test --release --workspace --all-targets
install_cli

"$FERROHUB_VENV/bin/python" -m pytest -q -c tests/python/pytest.ini tests/python

# The suites that drive the hub with the official SDKs, again against a three-node cluster
# behind HAProxy (scripts/run-cluster.sh; docs/cluster.md): the sdk_hub fixture starts one
# per module instead of a single node.
FERROHUB_TEST_CLUSTER=1 "$FERROHUB_VENV/bin/python" -m pytest -q -c tests/python/pytest.ini \
    tests/python/test_sdk_device.py tests/python/test_sdk_twin.py tests/python/test_sdk_methods.py \
    tests/python/test_sdk_c2d.py tests/python/test_sdk_amqp.py tests/python/test_event_hubs.py \
    tests/python/test_event_hubs_sections.py tests/python/test_pnp.py tests/python/test_node_sdk.py \
    tests/python/test_configurations_sdk.py tests/python/test_scheduled_jobs_sdk.py \
    tests/python/test_node_jobs.py tests/python/test_node_fleet.py \
    tests/python/test_dps_python.py tests/python/test_dps_node.py tests/python/test_amqp_device.py \
    tests/python/test_console.py

# A few seconds of each coverage-guided fuzz target (cargo-fuzz needs the nightly toolchain;
# without it the stable replay smoke in server/tests/fuzz_replay.rs, run above, is what runs).
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    JOBS=2 bash scripts/fuzz.sh "${FUZZ_SMOKE_SECONDS:-5}"
else
    echo "no nightly toolchain: coverage-guided fuzz smoke skipped (scripts/fuzz.sh)" >&2
fi
