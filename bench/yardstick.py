"""What the comparisons with the shared yardstick (`../shared/tools/mqttload`) have in common:
its scenarios, how one run is launched against a server, and the figures read from its JSON.

Used by `compare.py` (ferrohub against Mosquitto) and `ab_hubs.py` (two ferrohub builds). The
figures are the server's own CPU (utime+stime from /proc, read by mqttload over the measured
window) per acknowledged message or per connect, so the load generator's share of the shared
cores does not count, and the rates.
"""
import json
import resource
import statistics
import subprocess
import sys
import time

TOPIC = "devices/{client_id}/messages/events/"
PUBLISH = ["publish", "--qos", "1", "--payload", "256", "--topic", TOPIC, "--warmup", "3"]
IDLE_REPEAT_DEFAULT = 1

# name -> (mqttload arguments, repetitions in compare.py). Idle memory comes first there, on
# servers that have carried no load yet: memory an allocator kept from earlier runs is reused by
# new connections, which makes "RSS growth per connection" meaningless after a flood (seen:
# -0.3 KiB). For the same reason idle runs once per server by default.
def scenarios(repeat: int, idle_repeat: int = IDLE_REPEAT_DEFAULT) -> dict:
    return {
        "idle5000": (["idle", "-c", "5000", "--connect-rate", "1000", "-d", "10"], idle_repeat),
        "idle19000": (["idle", "-c", "19000", "--connect-rate", "1000", "-d", "10"], idle_repeat),
        "pub100": (PUBLISH + ["-c", "100", "--inflight", "10", "-d", "13"], repeat),
        "pub1000": (PUBLISH + ["-c", "1000", "--inflight", "10", "-d", "13"], repeat),
        "rate10k": (PUBLISH + ["-c", "100", "--rate", "100", "--inflight", "10", "-d", "13"], repeat),
        "single": (PUBLISH + ["-c", "1", "--inflight", "10", "-d", "13"], repeat),
        "connect-full": (["connect-rate", "-c", "8", "-d", "10", "--tls-no-resume"], repeat),
        "connect-resumed": (["connect-rate", "-c", "8", "-d", "10"], repeat),
    }


def write_creds(path, devices, key, prefix="b"):
    """The load generator's credentials file: devices `{prefix}00000`... with SAS tokens of
    `key`, valid for a day."""
    from hubkit import sas_token
    with open(path, "w") as f:
        for i in range(devices):
            d = f"{prefix}{i:05d}"
            f.write(f"{d}\tlocalhost/{d}/?api-version=2021-04-12\t"
                    f"{sas_token(f'localhost/devices/{d}', key, ttl=86400)}\n")


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


def run_mqttload(mqttload, args, port, pid, creds, ca, label, quiet_first=True):
    """One bounded mqttload run against a TLS 1.2 server on loopback; its JSON summary, or None
    when it failed (the reason goes to stderr). Waits for a quiet machine first unless the
    caller did."""
    cmd = [mqttload, *args, "--host", "127.0.0.1", "--port", str(port), "--tls",
           "--tls-version", "1.2", "--ca-file", ca, "--sni", "localhost", "--creds-file", creds,
           "--server-pid", str(pid), "--label", label]
    if quiet_first:
        wait_quiet()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, preexec_fn=raise_nofile)
    if p.returncode != 0 or not p.stdout.strip():
        print(f"{label}: mqttload failed\n{p.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def figures(scenario, r):
    """The headline figures of one run."""
    if scenario.startswith("idle"):
        return {"kib_per_conn": r.get("server_kb_per_conn")}
    cpu = r.get("cpu") or {}
    if scenario.startswith("connect"):
        rate = r.get("connects_per_s")
        done = rate * cpu["wall_s"] if rate and cpu.get("wall_s") else None
        return {"connects_per_s": rate,
                "server_us_per_connect": 1e6 * cpu["server_cpu_s"] / done if done else None}
    rate = r["msgs_per_s"]
    lat = r.get("puback_latency") or {}
    msgs = rate * cpu["wall_s"]
    ms = lambda k: lat[k] / 1000 if k in lat else None  # noqa: E731
    return {"msgs_per_s": rate, "p50_ms": ms("p50_us"), "p99_ms": ms("p99_us"),
            "server_us_per_msg": 1e6 * cpu["server_cpu_s"] / msgs if msgs else None}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
