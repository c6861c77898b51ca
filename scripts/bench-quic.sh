#!/usr/bin/env bash
# MQTT over QUIC against MQTT over TLS/TCP on a slow, lossy link (issue 17, PRF-2).
#
# Two network namespaces made here (fhq-hub, fhq-cli) joined by bench/lossy_link.py: 25 ms each
# way (50 ms RTT) and 0%, 1% and 5% packet loss each way. This kernel has no sch_netem, so the
# link is a user-space TUN relay instead of `tc netem` (see that file); nothing leaves the
# namespaces, whose only addresses are 10.77.0.1 and 10.77.0.2. The hub runs in fhq-hub; the
# load generator runs in fhq-cli, where `localhost` (the hub certificate's name) resolves to the
# hub through /etc/netns/fhq-cli/hosts for the duration of the run.
#
# At each loss rate, for each of $TRANSPORTS in turn (A B C A B C; tls, quic, and quic-tlp: QUIC
# devices that send tail loss probes too): $DEVICES devices connect (CONNECT latency: transport
# handshake + CONNACK) and each sends $PER QoS 1 messages one at a time (PUBACK latency,
# throughput); the hub's CPU seconds per run. Results: JSON per run in $OUT (default ./bench-results), every
# PUBACK latency per run (quic-latencies-*.json) and a summary of medians on stdout; "slow p50" is
# the median latency of the messages that met a loss (over twice the run's median). Bounded:
# fixed counts, a time limit per run and for the link.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
bench_prepare
ensure_python_env

DEVICES="${DEVICES:-1000}"
PER="${PER:-20}"
REPEAT="${REPEAT:-2}"
LOSSES="${LOSSES:-0 0.01 0.05}"
# quic-tlp: devices that also send tail loss probes (loadgen --quic-tail-probe), as the hub does.
TRANSPORTS="${TRANSPORTS:-tls quic quic-tlp}"
HUB_BIN="${HUB_BIN:-$FERROHUB_BIN}" # another build of the hub, to compare two
HUB_NS=fhq-hub
CLI_NS=fhq-cli

cleanup_ns() {
    ip netns del "$HUB_NS" 2>/dev/null || true
    ip netns del "$CLI_NS" 2>/dev/null || true
    rm -rf "/etc/netns/$CLI_NS"
}
cleanup_ns
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; cleanup_ns; rm -rf "$WORK" || true' EXIT
ip netns add "$HUB_NS"
ip netns add "$CLI_NS"
mkdir -p "/etc/netns/$CLI_NS"
echo "10.77.0.1 localhost" >"/etc/netns/$CLI_NS/hosts"
echo 0 >"$WORK/loss"
"$FERROHUB_VENV/bin/python" bench/lossy_link.py "$HUB_NS" 10.77.0.1 "$CLI_NS" 10.77.0.2 25 "$WORK/loss" 7200 \
    >"$WORK/link.out" 2>"$WORK/link.err" &
for _ in $(seq 1 50); do grep -q ready "$WORK/link.out" 2>/dev/null && break; sleep 0.2; done

ip netns exec "$HUB_NS" "$HUB_BIN" serve --data-dir "$WORK/hub" --https-addr 10.77.0.1:443 \
    --mqtt-addr 10.77.0.1:8883 --amqp-addr 10.77.0.1:5671 --mqtt-quic-addr 10.77.0.1:14567 \
    --metrics-addr 127.0.0.1:0 >"$WORK/hub.out" 2>"$WORK/hub.err" &
HUB_PID=$!
for _ in $(seq 1 100); do grep -q "listening https" "$WORK/hub.out" 2>/dev/null && break; sleep 0.2; done
OWNER="$(grep -m1 'SharedAccessKeyName=iothubowner' "$WORK/hub.out")"

hub_cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$HUB_PID/stat"; }

run() { # transport loss rep
    local flags=(--transport "${1%-tlp}") before
    before="$(hub_cpu_ticks)"
    [ "$1" = quic-tlp ] && flags+=(--quic-tail-probe)
    ip netns exec "$CLI_NS" "$LOADGEN" --target ferrohub --host localhost "${flags[@]}" \
        --https-port 443 --mqtt-port 8883 --quic-port 14567 --ca "$WORK/hub/tls/ca.pem" --owner "$OWNER" \
        --devices "$DEVICES" --messages-per-device "$PER" --payload-bytes 256 --inflight 1 \
        --connect-concurrency 128 --prefix "$1-$2-$3-" --time-limit 600 --latencies-out "$OUT/quic-latencies-$1-$2-$3.json" >"$OUT/quic-$1-$2-$3.json"
    # The hub's CPU seconds for the run: registering, connecting and serving its devices.
    echo "$(( $(hub_cpu_ticks) - before )) $(getconf CLK_TCK)" | awk '{ print $1 / $2 }' >"$OUT/quic-cpu-$1-$2-$3.txt"
}

for loss in $LOSSES; do
    echo "$loss" >"$WORK/loss"
    for rep in $(seq 1 "$REPEAT"); do
        for t in $TRANSPORTS; do run "$t" "$loss" "$rep"; done
    done
done

"$FERROHUB_VENV/bin/python" - "$OUT" "$LOSSES" "$REPEAT" "$TRANSPORTS" <<'PY'
import json, statistics, sys
out, losses, repeat, transports = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4].split()
def slow_median(run):
    # Messages that took over twice the run's median met a loss: what recovering from one costs.
    lat = json.load(open(f"{out}/quic-latencies-{run}.json"))
    flat = sorted(v for device in lat for v in device)
    slow = [v for v in flat if v > 2 * flat[len(flat) // 2]] if flat else []
    return slow[len(slow) // 2] / 1000 if slow else 0.0
def cpu_per_message(run, acknowledged):
    return float(open(f"{out}/quic-cpu-{run}.txt").read()) / max(acknowledged, 1) * 1e6
print(f"{'loss':>5} {'transport':>9} {'connect p50':>11} {'connect p99':>11} {'puback p50':>10} {'puback p99':>10} {'slow p50':>9} {'msgs/s':>8} {'hub us/msg':>10} {'errors':>6}")
for loss in losses:
    for t in transports:
        runs = [json.load(open(f"{out}/quic-{t}-{loss}-{r}.json")) for r in range(1, repeat + 1)]
        med = lambda f: statistics.median(f(r) for r in runs)
        print(f"{float(loss) * 100:>4.0f}% {t:>9} {med(lambda r: r['connect_latency']['p50_ms']):>9.1f}ms"
              f" {med(lambda r: r['connect_latency']['p99_ms']):>9.1f}ms {med(lambda r: r['puback_latency']['p50_ms']):>8.1f}ms"
              f" {med(lambda r: r['puback_latency']['p99_ms']):>8.1f}ms"
              f" {statistics.median(slow_median(f'{t}-{loss}-{r}') for r in range(1, repeat + 1)):>7.1f}ms"
              f" {med(lambda r: r['throughput_msgs_per_s']):>8.0f}"
              f" {statistics.median(cpu_per_message(f'{t}-{loss}-{r}', runs[r - 1]['acknowledged']) for r in range(1, repeat + 1)):>10.0f}"
              f" {sum(r['errors'] for r in runs):>6}")
PY
