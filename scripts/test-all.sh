#!/usr/bin/env bash
# The test command (README; .ci/run runs it): every Rust test, then the end-to-end suites that
# drive real ferrohub processes with raw clients and the official Azure SDKs, single-node and
# against three-node clusters. docs/testing.md says what each tier holds and when to run which.
#
#   scripts/test-all.sh            the CI tier
#   scripts/test-all.sh --full     also the slow modules, every SDK module against a cluster,
#                                  and the coverage-guided fuzz smoke (nightly toolchain)
#   E2E_GROUPS=N                   end-to-end groups side by side (default 4; as root only)
#   E2E_ONLY="test_a.py ..."       only these end-to-end modules
#   E2E_ARGS="--record-durations"  more arguments for scripts/e2e.py
#
# Every phase runs even when an earlier one failed (but nothing is tested against a build that
# failed); the run ends with one line per phase and exits non-zero if any failed. Each phase's
# whole output is kept under $FERROHUB_TEST_OUT (default: a new directory in /tmp, printed).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

TIER=ci
for arg in "$@"; do
    case "$arg" in
        --full) TIER=full ;;
        *) echo "usage: scripts/test-all.sh [--full]" >&2; exit 2 ;;
    esac
done
OUT="${FERROHUB_TEST_OUT:-$(mktemp -d /tmp/ferrohub-test.XXXXXX)}"
mkdir -p "$OUT"
: >"$OUT/phases.tsv"
echo "test-all ($TIER tier): phase logs in $OUT"
RUN_STARTED=$SECONDS

# phase NAME COMMAND...: runs the command, its output shown and kept in $OUT/NAME.log, and
# records its status and time.
phase() {
    local name="$1" started=$SECONDS rc
    shift
    echo
    echo "==== $name: $*"
    "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    local status=passed detail=""
    [ "$rc" = 0 ] || status="failed (exit $rc)"
    # A phase may leave a line for the table (the Rust tests name their failures there).
    [ -f "$OUT/$name.detail" ] && detail="$(head -c 300 "$OUT/$name.detail")"
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - started))" "$detail" >>"$OUT/phases.tsv"
    return "$rc"
}

skipped() {
    printf '%s\t%s\t0\t\n' "$1" "not run: $2" >>"$OUT/phases.tsv"
}

# The fuzz targets' lock file follows the workspace's: it must resolve without changes (a stale
# one is resolved against the live registry when the fuzzers build), and every package the two
# share must be at the workspace's version, so the fuzzers test what ships.
fuzz_lock_current() {
    if ! cargo metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml >/dev/null; then
        echo "fuzz/Cargo.lock is out of step with the workspace: run" >&2
        echo "    cargo update --workspace --manifest-path fuzz/Cargo.toml" >&2
        return 1
    fi
    python3 - <<'PY'
import sys, tomllib
shipped = {}
for p in tomllib.load(open("Cargo.lock", "rb"))["package"]:
    shipped.setdefault(p["name"], set()).add(p["version"])
drift = [(p["name"], p["version"], sorted(shipped[p["name"]]))
         for p in tomllib.load(open("fuzz/Cargo.lock", "rb"))["package"]
         if p["name"] in shipped and p["version"] not in shipped[p["name"]]]
for name, version, want in drift:
    print(f"fuzz/Cargo.lock has {name} {version}; Cargo.lock has {', '.join(want)}: "
          f"cargo update --manifest-path fuzz/Cargo.toml -p {name}@{version} --precise {want[-1]}",
          file=sys.stderr)
sys.exit(1 if drift else 0)
PY
}

build() {
    announce_build
    cargo test --release --workspace --all-targets --no-run && install_cli
}

# One cargo invocation shape everywhere (workspace, all targets): a different package or target
# selection changes feature unification and would rebuild RocksDB's C++ from scratch.
# --all-targets also runs each criterion bench once as a smoke test (no measurement).
rust_tests() {
    cargo test --release --workspace --all-targets --no-fail-fast 2>&1 | tee "$OUT/rust-cargo.log"
    local rc=${PIPESTATUS[0]}
    grep -E '^test .* \.\.\. FAILED$' "$OUT/rust-cargo.log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/' |
        paste -sd ' ' | sed 's/^./failed: &/' >"$OUT/rust.detail"
    return "$rc"
}

e2e() {
    local args=(--out "$OUT/e2e" --groups "${E2E_GROUPS:-4}" --table "$OUT/phases.tsv")
    [ "$TIER" = full ] && args+=(--full)
    # shellcheck disable=SC2206
    [ -n "${E2E_ONLY:-}" ] && args+=(--only $E2E_ONLY)
    # shellcheck disable=SC2206
    [ -n "${E2E_ARGS:-}" ] && args+=($E2E_ARGS)
    "$FERROHUB_VENV/bin/python" scripts/e2e.py "${args[@]}"
}

fuzz_smoke() {
    if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
        echo "no nightly toolchain: the coverage-guided fuzz smoke needs it (scripts/fuzz.sh)" >&2
        return 1
    fi
    JOBS=2 bash scripts/fuzz.sh "${FUZZ_SMOKE_SECONDS:-5}"
}

# phase_in_background NAME COMMAND...: as `phase`, its output kept in $OUT/NAME.log only (shown
# by wait_for_phase), so it can run beside a phase in the foreground.
phase_in_background() {
    local name="$1"
    shift
    echo
    echo "==== $name (in the background; its output follows when it ends): $*"
    phase "$name" "$@" >/dev/null 2>&1 &
    eval "BACKGROUND_${name//-/_}=$!"
}

wait_for_phase() {
    local name="$1" pid rc
    pid="$(eval "echo \$BACKGROUND_${name//-/_}")"
    wait "$pid"
    rc=$?
    echo
    echo "==== $name: its output"
    cat "$OUT/$name.log"
    return "$rc"
}

phase packages ensure_test_packages
phase format cargo fmt --all -- --check
phase fuzz-lock fuzz_lock_current
# The build (CPU) runs while the SDKs install (downloads).
phase_in_background build build
phase sdks ensure_test_sdks
# Cluster starts need not check the tools again (scripts/run-cluster.sh).
export FERROHUB_TOOLS_READY=1
if wait_for_phase build; then
    phase rust rust_tests
    phase e2e e2e
    if [ "$TIER" = full ]; then phase fuzz fuzz_smoke; fi
else
    skipped rust "the build failed"
    skipped e2e "the build failed"
fi

echo
echo "==== test-all ($TIER tier), $(((SECONDS - RUN_STARTED) / 60)) min $(((SECONDS - RUN_STARTED) % 60)) s; logs in $OUT"
failed=0
while IFS=$'\t' read -r name status secs detail; do
    printf '  %-10s %-34s %4d:%02d  %s\n' "$name" "$status" $((secs / 60)) $((secs % 60)) "$detail"
    case "$status" in passed) ;; *) failed=1 ;; esac
done <"$OUT/phases.tsv"
if [ "$failed" = 0 ]; then echo "all phases passed"; else echo "SOME PHASES FAILED"; fi
exit "$failed"
