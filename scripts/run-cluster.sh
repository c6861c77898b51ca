#!/usr/bin/env bash
# A ferrohub cluster on this machine's loopback (docs/cluster.md):
#   three nats-servers (JetStream, R3) on 127.0.0.2-4:4222, cluster routes on :6222, TLS on
#   both and a user per hub (DIR/secrets holds the CA, the passwords and the cluster's secret);
#   three hub nodes on 127.0.0.2-4 (HTTPS 443, MQTT 8883, AMQP 5671, health 9464);
#   HAProxy (TCP) on 127.0.0.1 and ::1, ports 443, 8883 and 5671, spreading clients over the
#   nodes (each serves the clients it accepts).
#
#   scripts/run-cluster.sh DIR             start everything; returns once the hub answers
#   scripts/run-cluster.sh --seed FROM DIR  the same, for a new cluster holding the hub of FROM
#                                          (a `ferrohub backup` or `restore` directory): hub1
#                                          starts on a copy of it and seeds the log first
#   scripts/run-cluster.sh --stop DIR      stop everything started in DIR (by PID)
#   scripts/run-cluster.sh --start NAME DIR  (re)start one process: nats1..3, hub1..3, haproxy
#   scripts/run-cluster.sh --writer DIR    print the name of the node serving as the writer
#
# FERROHUB_CLUSTER_EXTRA holds more lines for every node's file, after its [cluster] lines: more
# [cluster] keys, then any other sections (kept for later --start).
# PIDs go to DIR/pids/<name>.pid, logs to DIR/logs/, the CA to DIR/tls/ca.pem; the hub's
# connection strings are printed (and kept in DIR/connection-strings.txt).
# Needs the built hub (scripts/run-hub.sh or the test command builds it) and root for the
# SDKs' fixed ports.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

# nats1 and hub1 on 127.0.0.2, nats2 and hub2 on 127.0.0.3, nats3 and hub3 on 127.0.0.4.
ip_of() {
    local n="${1: -1}"
    echo "127.0.0.$((n + 1))"
}

# A process that exited but was not reaped (a zombie: its starter exited first) is not alive.
pid_alive() {
    [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null &&
        [ "$(awk '{print $3}' "/proc/$(cat "$1")/stat" 2>/dev/null)" != Z ]
}

# Waits up to $2 seconds for a TCP port ($1 = host:port) to accept.
wait_port() {
    local host="${1%:*}" port="${1##*:}"
    for _ in $(seq 1 $(($2 * 10))); do
        if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "run-cluster: nothing answers on $1 after $2 s" >&2
    return 1
}

# Once per cluster directory, in DIR/secrets (root only): the cluster's secret (every hub's,
# never a NATS server's), each hub's NATS password, and a CA with one certificate for the NATS
# servers, which their clients and their routes to each other verify.
make_secrets() {
    local s="$DIR/secrets"
    [ -f "$s/nats.pem" ] && return 0
    mkdir -p "$s"
    chmod 700 "$s"
    openssl rand -hex 32 >"$s/cluster.secret"
    for n in 1 2 3; do openssl rand -hex 24 >"$s/hub$n.password"; done
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
        -subj "/CN=ferrohub NATS CA" -keyout "$s/nats-ca.key" -out "$s/nats-ca.pem" 2>/dev/null
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "/CN=ferrohub NATS" -keyout "$s/nats.key" -out "$s/nats.csr" 2>/dev/null
    printf '%s\n' "subjectAltName=IP:127.0.0.2,IP:127.0.0.3,IP:127.0.0.4" \
        "extendedKeyUsage=serverAuth,clientAuth" "basicConstraints=CA:FALSE" >"$s/nats.ext"
    openssl x509 -req -in "$s/nats.csr" -CA "$s/nats-ca.pem" -CAkey "$s/nats-ca.key" \
        -CAcreateserial -days 3650 -extfile "$s/nats.ext" -out "$s/nats.pem" 2>/dev/null
}

# A nats-server tls block with the cluster's certificate; $1: more settings.
nats_tls() {
    local s="$DIR/secrets"
    echo "tls {
        cert_file: \"$s/nats.pem\"
        key_file: \"$s/nats.key\"
        ca_file: \"$s/nats-ca.pem\"
        timeout: 5
        $1
    }"
}

nats_config() {
    local n="$1" ip routes="" users=""
    ip="$(ip_of "nats$n")"
    for m in 1 2 3; do
        users="$users
        {user: hub$m, password: \"$(cat "$DIR/secrets/hub$m.password")\"}"
        [ "$m" = "$n" ] && continue
        routes="$routes nats://$(ip_of "nats$m"):6222"
    done
    cat <<EOF
server_name: nats$n
listen: $ip:4222
# Monitoring (/healthz), read before the hubs start.
http: $ip:8222
max_payload: 8MB
# Clients speak TLS only, and only the hubs' users are let in.
$(nats_tls "")
authorization {
    users: [$users
    ]
}
jetstream {
    store_dir: "$DIR/nats$n"
    # Every acknowledged entry is on a majority's disks (docs/cluster.md, durability).
    sync_interval: always
}
cluster {
    name: ferrohub
    listen: $ip:6222
    # Routes are TLS both ways: a server joins only with a certificate from the cluster's CA.
    $(nats_tls "verify: true")
    routes: [$(echo $routes | sed 's/ /, /g')]
}
EOF
}

hub_config() {
    local n="$1" ip
    ip="$(ip_of "hub$n")"
    cat <<EOF
[hub]
host_name = "localhost"

[listeners]
https = "$ip:443"
mqtt = "$ip:8883"
amqp = "$ip:5671"
mqtt_quic = "$ip:0"
metrics = "$ip:9464"

[cluster]
nats = ["nats://127.0.0.2:4222", "nats://127.0.0.3:4222", "nats://127.0.0.4:4222"]
node = "hub$n"
certificate_names = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
secret_file = "$DIR/secrets/cluster.secret"
nats_user = "hub$n"
nats_password_file = "$DIR/secrets/hub$n.password"
nats_ca_file = "$DIR/secrets/nats-ca.pem"
EOF
    # More [cluster] settings, then other sections, for every node (FERROHUB_CLUSTER_EXTRA at the
    # first start).
    if [ -f "$DIR/conf/cluster-extra.toml" ]; then cat "$DIR/conf/cluster-extra.toml"; fi
}

haproxy_config() {
    echo "global
    maxconn 9000
defaults
    mode tcp
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    timeout check 1s
    # A connection refused by a node between roles goes to another.
    retries 3
    option redispatch"
    for port in 443 8883 5671; do
        echo "frontend f$port
    bind 127.0.0.1:$port
    bind [::1]:$port
    default_backend b$port
backend b$port
    # A node is in rotation while its health endpoint says it serves in good standing (the
    # writer within its lease, a follower reaching NATS and caught up: docs/cluster.md); its
    # client sessions end with its standing, so HAProxy closes them too.
    balance $([ "$port" = 443 ] && echo roundrobin || echo leastconn)
    option httpchk
    http-check send meth GET uri /health/ready
    default-server check port 9464 inter 250ms fall 1 rise 1 on-marked-down shutdown-sessions"
        for n in 1 2 3; do echo "    server hub$n $(ip_of "hub$n"):$port"; done
    done
}

start_one() {
    local name="$1"
    if pid_alive "$DIR/pids/$name.pid"; then
        echo "run-cluster: $name is already running" >&2
        return 0
    fi
    case "$name" in
        nats[123])
            (umask 077 && nats_config "${name: -1}" >"$DIR/conf/$name.conf")
            "$FERROHUB_NATS/bin/nats-server" -c "$DIR/conf/$name.conf" >>"$DIR/logs/$name.log" 2>&1 &
            ;;
        hub[123])
            hub_config "${name: -1}" >"$DIR/conf/$name.toml"
            "$FERROHUB_BIN" serve --data-dir "$DIR/$name" --config "$DIR/conf/$name.toml" \
                >>"$DIR/logs/$name.out" 2>>"$DIR/logs/$name.log" &
            ;;
        haproxy)
            haproxy_config >"$DIR/conf/haproxy.cfg"
            haproxy -db -f "$DIR/conf/haproxy.cfg" >>"$DIR/logs/haproxy.log" 2>&1 &
            ;;
        *)
            echo "run-cluster: no process called $name" >&2
            return 2
            ;;
    esac
    echo $! >"$DIR/pids/$name.pid"
}

# Stops the processes whose PID files are given, by PID (SIGTERM, then SIGKILL after 20 s).
stop_pids() {
    local pids=() f
    for f in "$@"; do
        [ -f "$f" ] || continue
        if pid_alive "$f"; then pids+=("$(cat "$f")"); fi
        rm -f "$f"
    done
    [ ${#pids[@]} -gt 0 ] || return 0
    kill "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 1 100); do
        local alive=0 p
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && return 0
        sleep 0.2
    done
    kill -9 "${pids[@]}" 2>/dev/null || true
}

# The hubs first, while NATS still answers (a writer stopping releases its lease there instead
# of waiting for the release to time out), then HAProxy and the nats-servers.
stop_all() {
    stop_pids "$DIR"/pids/hub*.pid
    stop_pids "$DIR"/pids/*.pid
}

# Waits until every nats-server's JetStream is healthy (/healthz: the meta group has a leader
# and this server is current), so the hubs' first JetStream requests are answered instead of
# timing out.
wait_jetstream() {
    local n
    for n in 1 2 3; do
        local url="http://$(ip_of "nats$n"):8222/healthz"
        for _ in $(seq 1 600); do
            curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null && continue 2
            sleep 0.1
        done
        echo "run-cluster: JetStream on nats$n not healthy after 60 s ($url)" >&2
        return 1
    done
}

# Prints the name of the node whose health endpoint says it serves as the writer, or fails.
writer() {
    for n in 1 2 3; do
        if curl -fsS --max-time 1 "http://$(ip_of "hub$n"):9464/health/cluster" 2>/dev/null |
            grep -q '"role":"writer","serving":true'; then
            echo "hub$n"
            return 0
        fi
    done
    return 1
}

case "${1:-}" in
    --stop)
        DIR="$(realpath "${2:?usage: run-cluster.sh --stop DIR}")"
        stop_all
        exit 0
        ;;
    --start)
        NAME="${2:?usage: run-cluster.sh --start NAME DIR}"
        DIR="$(realpath "${3:?usage: run-cluster.sh --start NAME DIR}")"
        start_one "$NAME"
        exit 0
        ;;
    --writer)
        DIR="$(realpath "${2:?usage: run-cluster.sh --writer DIR}")"
        writer
        exit $?
        ;;
esac

SEED=""
if [ "${1:-}" = "--seed" ]; then
    SEED="$(realpath "${2:?usage: run-cluster.sh --seed FROM DIR}")"
    shift 2
fi
DIR="${1:?usage: run-cluster.sh [--seed FROM] DIR | --stop DIR | --start NAME DIR | --writer DIR}"
mkdir -p "$DIR"
DIR="$(realpath "$DIR")"
if [ -n "$SEED" ]; then
    if [ -e "$DIR/hub1" ]; then
        echo "run-cluster: $DIR/hub1 exists; a seeded cluster starts in a new directory" >&2
        exit 1
    fi
    cp -a "$SEED" "$DIR/hub1"
fi
ensure_cluster_tools
if [ ! -x "$FERROHUB_BIN" ]; then
    echo "run-cluster: build the hub first (cargo build --release --workspace --all-targets)" >&2
    exit 1
fi
mkdir -p "$DIR/pids" "$DIR/logs" "$DIR/conf" "$DIR/tls"
make_secrets
if [ -n "${FERROHUB_CLUSTER_EXTRA:-}" ]; then printf '%s\n' "$FERROHUB_CLUSTER_EXTRA" >"$DIR/conf/cluster-extra.toml"; fi
for n in 1 2 3; do start_one "nats$n"; done
for n in 1 2 3; do wait_port "$(ip_of "nats$n"):4222" 30; done
wait_jetstream
if [ -n "$SEED" ]; then
    # The seeded node writes its hub into the empty log before anyone else may write.
    start_one hub1
    for _ in $(seq 1 1200); do
        [ "$(writer || true)" = hub1 ] && break
        pid_alive "$DIR/pids/hub1.pid" || { echo "run-cluster: hub1 stopped while seeding; see $DIR/logs/hub1.log" >&2; exit 1; }
        sleep 0.1
    done
fi
for n in 1 2 3; do start_one "hub$n"; done
start_one haproxy
for _ in $(seq 1 600); do
    W="$(writer || true)"
    [ -n "$W" ] && break
    sleep 0.1
done
if [ -z "${W:-}" ]; then
    echo "run-cluster: no hub node became the writer within 60 s; logs in $DIR/logs" >&2
    exit 1
fi
# HAProxy checks each backend on its own timer, and a node serves only once it has opened its
# replica: wait until a TLS handshake succeeds through the balancer and through every
# node, on every port (a port with no writer behind it accepts and closes at once).
tls_through() {
    python3 - "$DIR/$W/tls/ca.pem" <<'PY'
import socket, ssl, sys, time
ctx = ssl.create_default_context(cafile=sys.argv[1])
deadline = time.time() + 30
for host, port in [(h, p) for h in ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")
                   for p in (443, 8883, 5671)]:
    while True:
        try:
            with socket.create_connection((host, port), timeout=5) as s, \
                    ctx.wrap_socket(s, server_hostname="localhost"):
                break
        except (OSError, ssl.SSLError) as e:
            if time.time() > deadline:
                sys.exit(f"run-cluster: no TLS handshake through {host}:{port}: {e}")
            time.sleep(0.1)
PY
}
tls_through
cp "$DIR/$W/tls/ca.pem" "$DIR/tls/ca.pem"
{
    "$FERROHUB_BIN" connection-string --data-dir "$DIR/$W"
    "$FERROHUB_BIN" connection-string --data-dir "$DIR/$W" --event-hubs --policy service
} >"$DIR/connection-strings.txt"
echo "writer: $W"
echo "CA certificate: $DIR/tls/ca.pem"
cat "$DIR/connection-strings.txt"
