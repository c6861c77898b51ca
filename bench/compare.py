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
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
hub_bin, mqttload, work, out_path = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
os.environ["FERROHUB_BIN"] = hub_bin
from hubkit import Hub  # noqa: E402
from jobkit import import_devices  # noqa: E402
from yardstick import (figures, median, raise_nofile, run_mqttload, scenarios,  # noqa: E402
                       wait_quiet, write_creds)

PROFILE = os.environ.get("PROFILE") == "1"
REPEAT = int(os.environ.get("REPEAT", "3"))
IDLE_REPEAT = int(os.environ.get("IDLE_REPEAT", "1"))
DEVICES = 19000
KEY = base64.b64encode(b"b" * 32).decode()
SCENARIOS = scenarios(REPEAT, IDLE_REPEAT)


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
    wait_quiet()
    perf = None
    if PROFILE and target.name == "ferrohub" and rep == 1:
        # Samples the measured window only (after the ramp and warm-up), with call graphs.
        perf = subprocess.Popen(["sh", "-c", f"sleep 5; exec perf record -F 999 -g -p {target.pid} "
                                 f"-o {work}/perf-{scenario}.data -- sleep 7"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = run_mqttload(mqttload, args, target.port, target.pid, creds, ca,
                          f"{target.name}/{scenario}/{rep}", quiet_first=False)
    if perf:
        perf.wait(30)
    if result is None:
        return None
    result.update(target=target.name, scenario=scenario, rep=rep)
    return result


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
        write_creds(creds, DEVICES, KEY)
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
                        r["figures"] = figures(scenario, r)
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
