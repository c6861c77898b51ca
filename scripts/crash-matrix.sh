#!/usr/bin/env bash
# The crash matrix (issue 18, docs/reliability.md): TRIALS (default 50) SIGKILLs of the hub at
# random moments under mixed load, each followed by a restart and a check that every
# acknowledged operation survived exactly and nothing unacknowledged is half-applied.
# One JSON line per trial and a summary line on stdout; exit status 1 if any trial found a
# problem (its data directory and log are kept, named in its line). SEED repeats a run.
# Bounded: each trial kills the hub within 3 s of starting its load. CI runs 3 trials
# (tests/python/test_crash_matrix.py).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
bench_prepare
ensure_python_env
cd tests/python
exec "$FERROHUB_VENV/bin/python" crashmatrix.py --trials "${TRIALS:-50}" --seed "${SEED:-$(date +%s)}"
