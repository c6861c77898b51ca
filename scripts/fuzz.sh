#!/usr/bin/env bash
# Runs the coverage-guided fuzz targets (fuzz/, cargo-fuzz on the nightly toolchain), one after
# another, each for a time or a number of executions, and prints one line per target with its
# executions, corpus size and result.
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]     (default: 60 s, every target)
#   RUNS=10000000 bash scripts/fuzz.sh 3600 query             (stop at 10M executions or 1 h)
#   JOBS=2 ...                                                (targets run two at a time)
#
# The working corpus grows in ~/.cache/ferrohub/fuzz/corpus/<target> (seeded from fuzz/seeds);
# a crash is saved under fuzz/artifacts/<target>/ and makes the script fail. Add each crash to
# fuzz/regressions/<target>/ once fixed: server/tests/fuzz_replay.rs replays it in .ci/run.
#
# Builds outside the workspace's target dir, with the sanitizer off: the workspace forbids
# unsafe code, so what fuzzing looks for here is panics, overflows, stack exhaustion, hangs and
# runaway memory, which need no sanitizer, and runs are several times faster without one.
# RocksDB is linked from the workspace build's archive when there is one (build the workspace
# first) instead of compiling its C++ again for the nightly toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

SECONDS_PER_TARGET="${1:-60}"
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    mapfile -t TARGETS < <(ls fuzz/fuzz_targets | sed 's/\.rs$//')
fi
RUNS="${RUNS:--1}"
JOBS="${JOBS:-1}"
CACHE="$HOME/.cache/ferrohub/fuzz"
TOOLS="$HOME/.cache/ferrohub/tools"
export CARGO_TARGET_DIR="$CACHE/target"
mkdir -p "$CACHE/corpus" "$CACHE/logs"

if [ ! -x "$TOOLS/bin/cargo-fuzz" ]; then
    echo "installing cargo-fuzz into $TOOLS" >&2
    cargo install --locked cargo-fuzz --version 0.13.2 --root "$TOOLS" >&2
fi
if ! rustup toolchain list | grep -q '^nightly'; then
    echo "cargo-fuzz needs the nightly toolchain (rustup toolchain install nightly)" >&2
    exit 2
fi

archive=$(ls -t "$HOME"/.cache/ferrohub/target/release/build/librocksdb-sys-*/out/librocksdb.a 2>/dev/null | head -1 || true)
if [ -n "$archive" ]; then
    export ROCKSDB_LIB_DIR="$(dirname "$archive")" ROCKSDB_STATIC=1
else
    echo "no RocksDB archive from a workspace build: compiling RocksDB's C++ (about 30 min)" >&2
fi

fuzz() { RUSTUP_TOOLCHAIN=nightly "$TOOLS/bin/cargo-fuzz" "$@"; }
fuzz build --fuzz-dir fuzz -s none -a -O >&2

run_one() {
    local t="$1" log="$CACHE/logs/$1.log"
    mkdir -p "$CACHE/corpus/$t" "fuzz/artifacts/$t"
    local status=ok
    fuzz run --fuzz-dir fuzz -s none -a -O "$t" "$CACHE/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$SECONDS_PER_TARGET" -runs="$RUNS" -print_final_stats=1 \
        -rss_limit_mb=2048 -timeout=10 -artifact_prefix="fuzz/artifacts/$t/" \
        >"$log" 2>&1 || status=FAILED
    local runs corpus secs
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    secs=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    corpus=$(ls "$CACHE/corpus/$t" | wc -l)
    printf '%-14s %s executions, %s/s, corpus %s, %s\n' "$t" "${runs:-?}" "${secs:-?}" "$corpus" "$status"
    if [ "$status" != ok ]; then
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -8 | sed 's/^/    /'
        return 1
    fi
}

failed=0
pids=()
for t in "${TARGETS[@]}"; do
    run_one "$t" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$JOBS" ]; then
        wait "${pids[0]}" || failed=1
        pids=("${pids[@]:1}")
    fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit $failed
