"""ferrohub against Mosquitto with the shared yardstick, `../shared/tools/mqttload` (issue 19).

Three servers on this machine, TLS 1.2 with the hub's certificate:
- ferrohub: real devices (imported, one SAS token each), every PUBACK after a synced write;
- Mosquitto 2.0 (Debian) with persistence off, and with persistence on.
Each scenario runs on the three interleaved (A B C A B C ...), REPEAT times (default 3), and the
table gives medians with ferrohub/Mosquitto ratios. Server CPU per message is the server's own
utime+stime over the measured window (from /proc, read by mqttload) divided by the messages
acknowledged in that window, so the load generator's cost on the shared cores does not count.

Usage: compare.py FERROHUB_BIN MQTTLOAD_BIN WORKDIR OUT_JSONL [SCENARIO...]
Scenarios (default all, in this order): idle5000 idle19000 pub100 pub1000 rate10k single
connect-full connect-resumed. PROFILE=1 records a perf profile of ferrohub's first run of each
scenario (WORKDIR/perf-SCENARIO.data, call graphs). Bounded: every mqttload run has a fixed
duration and stops by itself.
"""
import base64
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
hub_bin, mqttload, work, out_path = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
os.environ["FERROHUB_BIN"] = hub_bin
from hubkit import Hub, sas_token  # noqa: E402
from jobkit import import_devices  # noqa: E402

PROFILE = os.environ.get("PROFILE") == "1"
REPEAT = int(os.environ.get("REPEAT", "3"))
IDLE_REPEAT = int(os.environ.get("IDLE_REPEAT", "1"))
DEVICES = 19000
KEY = base64.b64encode(b"b" * 32).decode()
TOPIC = "devices/{client_id}/messages/events/"
PUBLISH = ["publish", "--qos", "1", "--payload", "256", "--topic", TOPIC, "--warmup", "3"]

# name -> (mqttload arguments, repetitions). Idle memory comes first, on servers that have
# carried no load yet: memory an allocator kept from earlier runs is reused by new connections,
# which makes "RSS growth per connection" meaningless after a flood (seen: -0.3 KiB). For the
# same reason idle runs once per server by default (IDLE_REPEAT).
SCENARIOS = {
    "idle5000": (["idle", "-c", "5000", "--connect-rate", "1000", "-d", "10"], IDLE_REPEAT),
    "idle19000": (["idle", "-c", "19000", "--connect-rate", "1000", "-d", "10"], IDLE_REPEAT),
    "pub100": (PUBLISH + ["-c", "100", "--inflight", "10", "-d", "13"], REPEAT),
    "pub1000": (PUBLISH + ["-c", "1000", "--inflight", "10", "-d", "13"], REPEAT),
    "rate10k": (PUBLISH + ["-c", "100", "--rate", "100", "--inflight", "10", "-d", "13"], REPEAT),
    "single": (PUBLISH + ["-c", "1", "--inflight", "10", "-d", "13"], REPEAT),
    "connect-full": (["connect-rate", "-c", "8", "-d", "10", "--tls-no-resume"], REPEAT),
    "connect-resumed": (["connect-rate", "-c", "8", "-d", "10"], REPEAT),
}


def raise_nofile():
    resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))


def cpu_busy():
    """Machine CPU busy fraction over 1 s (all cores)."""
    def sample():
        f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return sum(f), f[3] + f[4]
    t0, i0 = sample()
    time.sleep(1)
    t1, i1 = sample()
    return 1 - (i1 - i0) / max(1, t1 - t0)


def wait_quiet(limit=0.10, timeout=20):
    """One run's backlog must not leak into the next: wait until the machine is quiet."""
    deadline = time.time() + timeout
    while cpu_busy() > limit and time.time() < deadline:
        pass


class Target:
    def __init__(self, name, port, pid):
        self.name, self.port, self.pid = name, port, pid

    def stop(self):
        pass


class Mosquitto:
    def __init__(self, name, persistence, port, tls):
        self.name, self.port = name, port
        d = work / name
        d.mkdir(parents=True, exist_ok=True)
        conf = d / "mosquitto.conf"
        conf.write_text(
            f"user {os.environ.get('USER') or 'root'}\nlistener {port} 127.0.0.1\n"
            f"cafile {tls}/ca.pem\ncertfile {tls}/server.pem\nkeyfile {tls}/server-key.pem\n"
            f"tls_version tlsv1.2\nallow_anonymous true\npersistence {persistence}\n"
            f"persistence_location {d}/\nmax_queued_messages 100000\nmax_connections -1\n")
        self.proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL,
                                     stderr=open(d / "log", "wb"), preexec_fn=raise_nofile)
        time.sleep(1)
        assert self.proc.poll() is None, (d / "log").read_text()
        self.pid = self.proc.pid

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)


def run(target, scenario, rep, creds, ca):
    args, _ = SCENARIOS[scenario]
    cmd = [mqttload, *args, "--host", "127.0.0.1", "--port", str(target.port), "--tls",
           "--tls-version", "1.2", "--ca-file", ca, "--sni", "localhost", "--creds-file", creds,
           "--server-pid", str(target.pid), "--label", f"{target.name}/{scenario}/{rep}"]
    wait_quiet()
    perf = None
    if PROFILE and target.name == "ferrohub" and rep == 1:
        # Samples the measured window only (after the ramp and warm-up), with call graphs.
        perf = subprocess.Popen(["sh", "-c", f"sleep 5; exec perf record -F 999 -g -p {target.pid} "
                                 f"-o {work}/perf-{scenario}.data -- sleep 7"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, preexec_fn=raise_nofile)
    if perf:
        perf.wait(30)
    if p.returncode != 0 or not p.stdout.strip():
        print(f"{target.name} {scenario}: mqttload failed\n{p.stderr[-2000:]}", file=sys.stderr)
        return None
    result = json.loads(p.stdout.strip().splitlines()[-1])
    result.update(target=target.name, scenario=scenario, rep=rep)
    return result


def figures(r):
    """The headline figures of one run."""
    if r["scenario"].startswith("idle"):
        return {"kib_per_conn": r.get("server_kb_per_conn")}
    if r["scenario"].startswith("connect"):
        return {"connects_per_s": r.get("connects_per_s")}
    cpu = r["cpu"]
    rate = r["msgs_per_s"]
    lat = r.get("puback_latency") or {}
    msgs = rate * cpu["wall_s"]
    ms = lambda k: lat[k] / 1000 if k in lat else None  # noqa: E731
    return {"msgs_per_s": rate, "p50_ms": ms("p50_us"), "p99_ms": ms("p99_us"),
            "server_us_per_msg": 1e6 * cpu["server_cpu_s"] / msgs if msgs else None}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main():
    scenarios = sys.argv[5:] or list(SCENARIOS)
    work.mkdir(parents=True, exist_ok=True)
    config = work / "hub.toml"
    config.write_text(f"[listeners]\nmqtt_max_connections = {DEVICES + 500}\n")
    raise_nofile()
    hub = Hub(work / "hub").start(["--config", str(config)])
    servers = []
    try:
        import_devices(hub, work, ({"id": f"b{i:05d}", "authentication": {
            "type": "sas", "symmetricKey": {"primaryKey": KEY, "secondaryKey": KEY}}} for i in range(DEVICES)))
        creds = work / "devices.tsv"
        with open(creds, "w") as f:
            for i in range(DEVICES):
                d = f"b{i:05d}"
                f.write(f"{d}\tlocalhost/{d}/?api-version=2021-04-12\t"
                        f"{sas_token(f'localhost/devices/{d}', KEY, ttl=86400)}\n")
        # A fresh process: the import's memory must not count as room for idle connections.
        hub.stop()
        hub.start(["--config", str(config)])
        time.sleep(2)
        tls = work / "hub" / "tls"
        servers = [Target("ferrohub", hub.mqtt_port, hub.proc.pid), Mosquitto("mosquitto", "false", 28883, tls),
                   Mosquitto("mosquitto-persistent", "true", 28884, tls)]
        results = []
        with open(out_path, "a") as out:
            for scenario in scenarios:
                for rep in range(1, SCENARIOS[scenario][1] + 1):
                    for target in servers:
                        r = run(target, scenario, rep, str(creds), str(tls / "ca.pem"))
                        if r is None:
                            continue
                        r["figures"] = figures(r)
                        results.append(r)
                        out.write(json.dumps(r) + "\n")
                        out.flush()
                        print(f"{target.name:22} {scenario:16} {rep} {r['figures']}", file=sys.stderr)
    finally:
        for s in servers:
            s.stop()
        hub.stop()
    report(results)


def report(results):
    print("| scenario | figure | ferrohub | Mosquitto | Mosquitto persistent | ferrohub / Mosquitto |")
    print("|---|---|---|---|---|---|")
    by = {}
    for r in results:
        by.setdefault((r["scenario"], r["target"]), []).append(r["figures"])
    for scenario in dict.fromkeys(r["scenario"] for r in results):
        keys = next(iter(by.get((scenario, "ferrohub"), [{}])), {}).keys()
        for k in keys:
            m = {t: median([f.get(k) for f in by.get((scenario, t), [])])
                 for t in ("ferrohub", "mosquitto", "mosquitto-persistent")}
            ratio = (m["ferrohub"] / m["mosquitto"]) if m["ferrohub"] and m["mosquitto"] else None
            cells = [f"{m[t]:,.2f}" if m[t] is not None else "-" for t in m]
            print(f"| {scenario} | {k} | {' | '.join(cells)} | {f'{ratio:.2f}x' if ratio else '-'} |")


if __name__ == "__main__":
    main()
