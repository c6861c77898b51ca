"""Import/export throughput (JOB-1..JOB-5): N identities with twins through the hub's import and
export jobs, then the offline export and restore of the same data directory.

Usage: import_export.py FERROHUB_BIN WORKDIR N OUT_JSON
Writes one JSON object: identities/s and wall seconds for each step, the hub's peak RSS after
the jobs, and the offline commands' peak RSS (from wait4). Bounded: every wait has a limit.
"""
import base64, json, os, re, signal, subprocess, sys, time, urllib.parse
from pathlib import Path

import requests, urllib3

urllib3.disable_warnings()
binary, work, n, out = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
work.mkdir(parents=True, exist_ok=True)
LIMIT = 1800  # seconds per step


def sas(host, key, policy, ttl=7200):
    import hashlib, hmac
    expiry = int(time.time()) + ttl
    res = urllib.parse.quote_plus(host)
    sig = base64.b64encode(hmac.new(base64.b64decode(key), f"{res}\n{expiry}".encode(), hashlib.sha256).digest())
    return f"SharedAccessSignature sr={res}&sig={urllib.parse.quote_plus(sig)}&se={expiry}&skn={policy}"


def run_measured(args):
    t0 = time.monotonic()
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    err = p.stderr.read().decode()
    if status != 0:
        raise SystemExit(f"{args[1]} failed: {err[-2000:]}")
    return wall, ru.ru_maxrss * 1024


# 1. The input file: every device with keys, tags and desired properties; every 100th a module.
inp = work / "in"
inp.mkdir(exist_ok=True)
lines = 0
with open(inp / "devices.txt", "w") as f:
    for i in range(n):
        key = base64.b64encode(os.urandom(32)).decode()
        f.write(json.dumps({
            "id": f"bench-{i:07d}", "importMode": "create", "status": "enabled",
            "authentication": {"type": "sas", "symmetricKey": {"primaryKey": key, "secondaryKey": key}},
            "tags": {"site": f"plant-{i % 97}", "line": i % 13},
            "properties": {"desired": {"interval": 30 + i % 7, "mode": "eco"}},
        }) + "\n")
        lines += 1
        if i % 100 == 0:
            f.write(json.dumps({"id": f"bench-{i:07d}", "moduleId": "edge", "importMode": "create"}) + "\n")
            lines += 1

# 2. A fresh hub.
data = work / "hub"
hub = subprocess.Popen([binary, "serve", "--data-dir", str(data), "--https-addr", "127.0.0.1:0",
                        "--mqtt-addr", "127.0.0.1:0", "--amqp-addr", "127.0.0.1:0", "--mqtt-quic-addr", "127.0.0.1:0"],
                       stdout=subprocess.PIPE, stderr=open(work / "hub.err", "w"), text=True)
port, owner = None, None
for line in hub.stdout:
    m = re.search(r"HostName=([^;]+);SharedAccessKeyName=iothubowner;SharedAccessKey=([^\s]+)", line)
    if m:
        owner = m.group(2)
    m = re.match(r"listening https=.*:(\d+)$", line.strip())
    if m:
        port = int(m.group(1))
        break
token = sas("localhost", owner, "iothubowner")
url = f"https://127.0.0.1:{port}"
H = {"Authorization": token}


def job(body):
    r = requests.post(f"{url}/jobs/create?api-version=2021-04-12", json=body, headers=H, verify=False)
    r.raise_for_status()
    jid = r.json()["jobId"]
    deadline = time.time() + LIMIT
    while time.time() < deadline:
        j = requests.get(f"{url}/jobs/{jid}?api-version=2021-04-12", headers=H, verify=False).json()
        if j["status"] not in ("queued", "running"):
            break
        time.sleep(0.2)
    assert j["status"] == "completed", j
    from datetime import datetime
    t = lambda s: datetime.fromisoformat(s.replace("Z", "").split(".")[0] + "." + s.split(".")[1][:6])
    return (t(j["endTimeUtc"]) - t(j["startTimeUtc"])).total_seconds()


import_s = job({"type": "import", "inputBlobContainerUri": inp.as_uri(),
                "outputBlobContainerUri": (work / "import-out").as_uri()})
errors = (work / "import-out" / "importErrors.log").read_text()
assert errors == "", errors[:500]
export_s = job({"type": "export", "outputBlobContainerUri": (work / "export-job").as_uri()})
exported = sum(1 for _ in open(work / "export-job" / "devices.txt"))
assert exported == lines, (exported, lines)
hub_hwm = int(re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{hub.pid}/status").read_text()).group(1)) * 1024
hub.send_signal(signal.SIGTERM)
hub.wait(timeout=120)

# 3. Offline export and restore of the same data directory.
off_export_s, off_export_rss = run_measured([binary, "export", "--data-dir", str(data), "--to", (work / "offline").as_uri()])
restore_s, restore_rss = run_measured([binary, "restore", "--data-dir", str(work / "restored"), "--from", (work / "offline").as_uri()])
size = (work / "offline" / "devices.txt").stat().st_size
result = {
    "identities": n, "lines": lines, "devices_txt_bytes": size,
    "import_job_s": import_s, "import_job_per_s": lines / import_s,
    "export_job_s": export_s, "export_job_per_s": lines / export_s,
    "hub_peak_rss_bytes": hub_hwm,
    "offline_export_s": off_export_s, "offline_export_per_s": lines / off_export_s, "offline_export_peak_rss_bytes": off_export_rss,
    "restore_s": restore_s, "restore_per_s": lines / restore_s, "restore_peak_rss_bytes": restore_rss,
}
json.dump(result, open(out, "w"), indent=1)
print(json.dumps(result))
