"""The crash matrix (issue 18, part 5): SIGKILL the hub at a random moment under mixed load, restart
it, and check that every acknowledged operation is there exactly as acknowledged and that nothing
unacknowledged is half-applied.

The load, each stream recording what the hub acknowledged:
- telemetry over MQTT/TLS (raw client, QoS 1, PUBACK = acknowledged) and over MQTT/WebSocket
  (paho, the client the device SDK uses);
- twin desired patches over REST, each setting two properties to the same number (200 =
  acknowledged; a half-applied patch would leave them different);
- C2D sends over REST (204 = acknowledged) to a device that completes what it receives (PUBACK);
- registry writes: device creations over REST (200 = acknowledged), each with its twin;
- direct method calls answered by a connected device (no durable state: they only add load);
- an import job (POST /jobs/create, 200 = acknowledged) of IMPORT_LINES devices with tags and
  desired properties, read from an Azurite blob container, started at a random moment up to 0.8 s
  before the kill, so that many kills land while it runs.

After the restart: every acknowledged telemetry body is in the device's partition once at least,
bodies intact and no body the client never sent; the twin's two properties equal each other and
are the last acknowledged value or one attempted after it; every acknowledged C2D message is
completed or still queued (delivered again after the restart), none unknown; every acknowledged
device exists with its twin; an acknowledged import job is still there and finished (completed,
or failed as interrupted; one seen completed before the kill must still be completed with all
its devices), and each of its devices is either absent or present with identity, tags and
desired properties exactly as its line says; and the restarted hub takes new writes.

Run: python tests/python/crashmatrix.py --trials 50 [--seed S] (FERROHUB_BIN names the binary);
CI runs 3 trials through test_crash_matrix.py.
"""

import argparse
import base64
import json
import random
import shutil
import ssl
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
import requests

sys.path.insert(0, str(Path(__file__).parent))
from azurite import Azurite  # noqa: E402
from hubkit import Hub  # noqa: E402
from jobkit import FINISHED, azurite_container  # noqa: E402
from mqttraw import PUBLISH, SUBSCRIBE, Closed, _str, connect_device, packet  # noqa: E402


class Ledger:
    def __init__(self):
        self.lock = threading.Lock()
        self.telemetry_sent = set()
        self.telemetry_acked = set()
        self.twin_attempted = 0
        self.twin_acked = 0
        self.c2d_sent = set()
        self.c2d_acked = set()
        self.c2d_completed = set()
        self.devices_attempted = set()
        self.devices_acked = set()
        self.methods_answered = 0
        self.import_job = None
        self.import_statuses = []


IMPORT_LINES = 2000


def import_lines(trial):
    return [{"id": f"imp{trial}-{i:04d}", "importMode": "create", "status": "enabled",
             "tags": {"site": f"plant-{i % 7}", "n": i}, "properties": {"desired": {"interval": i % 60, "i": i}}}
            for i in range(IMPORT_LINES)]


def import_job(hub, ledger, stop, containers, start_after):
    """Starts the import at `start_after` seconds, then follows its status until the kill."""
    if stop.wait(start_after):
        return
    session = requests.Session()
    session.headers["Authorization"] = hub.token()
    try:
        r = session.post(hub.url("/jobs/create"), json={
            "type": "import", "inputBlobContainerUri": containers[0], "outputBlobContainerUri": containers[1]},
            timeout=5, verify=hub.ca)
    except requests.RequestException:
        return
    if r.status_code != 200:
        return
    job_id = r.json()["jobId"]
    with ledger.lock:
        ledger.import_job = job_id
    while not stop.is_set():
        try:
            status = session.get(hub.url(f"/jobs/{job_id}"), timeout=5, verify=hub.ca).json()["status"]
        except (requests.RequestException, ValueError, KeyError):
            return
        with ledger.lock:
            if not ledger.import_statuses or ledger.import_statuses[-1] != status:
                ledger.import_statuses.append(status)
        if status in FINISHED:
            return
        time.sleep(0.02)


def check_import(hub, snapshot, lines) -> list:
    """The import job after the restart, and every device it names."""
    problems = []
    session = requests.Session()
    session.headers["Authorization"] = hub.token()
    job_id = snapshot["import_job"]
    final = None
    if job_id is not None:
        deadline = time.time() + 60
        while True:
            r = session.get(hub.url(f"/jobs/{job_id}"), timeout=10, verify=hub.ca)
            if r.status_code != 200:
                problems.append(f"acknowledged import job {job_id} lost ({r.status_code})")
                break
            final = r.json()["status"]
            if final in FINISHED or time.time() > deadline:
                break
            time.sleep(0.05)
        if final is not None and final not in FINISHED:
            problems.append(f"import job {job_id} still {final} 60 s after the restart")
        if "completed" in snapshot["import_statuses"] and final != "completed":
            problems.append(f"import job {job_id} was completed before the kill, {final} after")
    present = 0
    for line in lines:
        name = line["id"]
        r = session.get(hub.url(f"/devices/{name}"), timeout=10, verify=hub.ca)
        t = session.get(hub.url(f"/twins/{name}"), timeout=10, verify=hub.ca)
        if r.status_code != t.status_code:
            problems.append(f"imported device {name} half-applied: identity {r.status_code}, twin {t.status_code}")
            continue
        if r.status_code == 404:
            if final == "completed":
                problems.append(f"import job completed but {name} is missing")
            continue
        present += 1
        if job_id is None:
            problems.append(f"{name} exists though no import job was acknowledged")
        twin = t.json()
        desired = {k: v for k, v in twin["properties"]["desired"].items() if not k.startswith("$")}
        if twin.get("tags") != line["tags"] or desired != line["properties"]["desired"]:
            problems.append(f"imported device {name} differs from its line: tags {twin.get('tags')}, desired {desired}")
    snapshot["import_present"] = present
    snapshot["import_final"] = final
    return problems


def mqtt_telemetry(hub, ledger, stop, device):
    try:
        c = connect_device(hub, device)
        n = 0
        while not stop.is_set():
            n += 1
            body = f"{device}-{n}"
            with ledger.lock:
                ledger.telemetry_sent.add(body)
            c.publish(f"devices/{device}/messages/events/", body.encode(), qos=1, pkid=n % 60000 + 1)
            c.expect_puback(n % 60000 + 1, timeout=5)
            with ledger.lock:
                ledger.telemetry_acked.add(body)
    except (Closed, OSError, AssertionError, TimeoutError, ssl.SSLError):
        pass


def ws_telemetry(hub, ledger, stop, device):
    acked = {}
    client = paho.Client(client_id=device, protocol=paho.MQTTv311, transport="websockets")
    client.ws_set_options(path="/$iothub/websocket")
    client.tls_set(ca_certs=hub.ca)
    client.username_pw_set(f"localhost/{device}/?api-version=2021-04-12", hub.device_token(device))

    def on_publish(_c, _u, mid):
        body = acked.pop(mid, None)
        if body is not None:
            with ledger.lock:
                ledger.telemetry_acked.add(body)

    client.on_publish = on_publish
    try:
        client.connect("localhost", hub.port, keepalive=30)
    except OSError:
        return
    client.loop_start()
    deadline = time.time() + 5
    while not client.is_connected() and time.time() < deadline and not stop.is_set():
        time.sleep(0.01)
    n = 0
    try:
        while not stop.is_set() and client.is_connected():
            n += 1
            body = f"{device}-{n}"
            with ledger.lock:
                ledger.telemetry_sent.add(body)
            info = client.publish(f"devices/{device}/messages/events/", body, qos=1)
            acked[info.mid] = body
            info.wait_for_publish(timeout=5)
            if not info.is_published():
                break
    except (RuntimeError, ValueError, OSError):
        pass
    finally:
        client.loop_stop()
        client.disconnect()


def twin_patches(hub, ledger, stop, device):
    session = requests.Session()
    session.headers["Authorization"] = hub.token()
    n = 0
    while not stop.is_set():
        n += 1
        with ledger.lock:
            ledger.twin_attempted = n
        try:
            r = session.patch(hub.url(f"/twins/{device}"), json={"properties": {"desired": {"a": n, "b": n}}},
                              timeout=5, verify=hub.ca)
        except requests.RequestException:
            return
        if r.status_code != 200:
            return
        with ledger.lock:
            ledger.twin_acked = n


def c2d_sender(hub, ledger, stop, device):
    session = requests.Session()
    session.headers["Authorization"] = hub.token()
    n = 0
    while not stop.is_set():
        with ledger.lock:
            backlog = len(ledger.c2d_acked - ledger.c2d_completed)
        if backlog > 20:  # The queue holds 50.
            time.sleep(0.005)
            continue
        n += 1
        mid = f"c-{n}"
        with ledger.lock:
            ledger.c2d_sent.add(mid)
        try:
            r = session.post(hub.url(f"/devices/{device}/messages/deviceBound"), data=mid.encode(),
                             headers={"iothub-messageid": mid}, timeout=5, verify=hub.ca)
        except requests.RequestException:
            return
        if r.status_code != 204:
            return
        with ledger.lock:
            ledger.c2d_acked.add(mid)


def c2d_receiver(hub, ledger, stop, device):
    """Completes (PUBACKs) every C2D message; records the completed message ids."""
    try:
        c = connect_device(hub, device)
        c.subscribe([(f"devices/{device}/messages/devicebound/#", 1)])
        while not stop.is_set():
            try:
                ptype, flags, body = c.read(timeout=0.5)
            except TimeoutError:
                continue
            if ptype != PUBLISH:
                continue
            tlen = int.from_bytes(body[:2], "big")
            pkid = body[2 + tlen:4 + tlen]
            payload = body[4 + tlen:]
            c.send(packet(4, 0, pkid))
            with ledger.lock:
                ledger.c2d_completed.add(payload.decode())
    except (Closed, OSError, AssertionError, ssl.SSLError):
        pass


def registry_writer(hub, ledger, stop, prefix):
    session = requests.Session()
    session.headers["Authorization"] = hub.token()
    n = 0
    while not stop.is_set():
        n += 1
        name = f"{prefix}-{n}"
        with ledger.lock:
            ledger.devices_attempted.add(name)
        try:
            r = session.put(hub.url(f"/devices/{name}"), json={"deviceId": name}, timeout=5, verify=hub.ca)
        except requests.RequestException:
            return
        if r.status_code != 200:
            return
        with ledger.lock:
            ledger.devices_acked.add(name)


def method_responder(hub, ledger, stop, device):
    try:
        c = connect_device(hub, device)
        c.subscribe([("$iothub/methods/POST/#", 0)])
        while not stop.is_set():
            try:
                ptype, _, body = c.read(timeout=0.5)
            except TimeoutError:
                continue
            if ptype != PUBLISH:
                continue
            topic = body[2:2 + int.from_bytes(body[:2], "big")].decode()
            rid = topic.split("$rid=")[1]
            c.publish(f"$iothub/methods/res/200/?$rid={rid}", b'{"ok":true}', qos=0)
    except (Closed, OSError, AssertionError, ssl.SSLError, IndexError):
        pass


def method_caller(hub, ledger, stop, device):
    session = requests.Session()
    session.headers["Authorization"] = hub.token()
    while not stop.is_set():
        try:
            r = session.post(hub.url(f"/twins/{device}/methods"), verify=hub.ca, timeout=5,
                             json={"methodName": "m", "payload": {}, "responseTimeoutInSeconds": 5})
        except requests.RequestException:
            return
        if r.status_code == 200:
            with ledger.lock:
                ledger.methods_answered += 1
        elif r.status_code >= 500 and r.status_code != 504:
            return


def drain_c2d(hub, device) -> set:
    """Receives and completes every C2D message still queued for `device`, locked ones too
    (their 1 s lock expires while this waits)."""
    got = set()
    c = connect_device(hub, device)
    # The device's session (clean=False) kept its subscription from the load, so queued
    # messages may arrive before the SUBACK of this subscribe: read both in one loop.
    c.send(packet(SUBSCRIBE, 2, struct.pack("!H", 1) + _str(f"devices/{device}/messages/devicebound/#") + b"\x01"))
    while True:
        try:
            ptype, _, body = c.read(timeout=3)
        except TimeoutError:
            break
        if ptype != PUBLISH:
            continue
        tlen = int.from_bytes(body[:2], "big")
        c.send(packet(4, 0, body[2 + tlen:4 + tlen]))
        got.add(body[4 + tlen:].decode())
    c.disconnect()
    return got


def run_trial(workdir: Path, rng: random.Random, trial: int, blob: Azurite) -> dict:
    lines = import_lines(trial)
    containers = (azurite_container(blob, f"import{trial}-in"), azurite_container(blob, f"import{trial}-out"))
    containers[0][1].upload_blob("devices.txt", "".join(json.dumps(l) + "\n" for l in lines))
    hub = Hub(workdir / "hub")
    hub.stderr_path = workdir / "hub.stderr.log"
    # A C2D message locked when the hub was killed is delivered again once its lock expires.
    config = workdir / "hub.toml"
    config.write_text('[c2d]\nlock_timeout = "1s"\n')
    hub.start(["--config", str(config)])
    devices = {"tel": "tel-mqtt", "ws": "tel-ws", "twin": "twin-dev", "c2d": "c2d-dev", "m": "method-dev"}
    for d in devices.values():
        hub.create_device(d)
    ledger = Ledger()
    stop = threading.Event()
    threads = [
        threading.Thread(target=mqtt_telemetry, args=(hub, ledger, stop, devices["tel"])),
        threading.Thread(target=ws_telemetry, args=(hub, ledger, stop, devices["ws"])),
        threading.Thread(target=twin_patches, args=(hub, ledger, stop, devices["twin"])),
        threading.Thread(target=c2d_sender, args=(hub, ledger, stop, devices["c2d"])),
        threading.Thread(target=c2d_receiver, args=(hub, ledger, stop, devices["c2d"])),
        threading.Thread(target=registry_writer, args=(hub, ledger, stop, f"reg{trial}")),
        threading.Thread(target=method_responder, args=(hub, ledger, stop, devices["m"])),
        threading.Thread(target=method_caller, args=(hub, ledger, stop, devices["m"])),
    ]
    kill_after = rng.uniform(0.3, 3.0)
    threads.append(threading.Thread(target=import_job, args=(
        hub, ledger, stop, (containers[0][0], containers[1][0]), max(0.0, kill_after - rng.uniform(0, 0.8)))))
    for t in threads:
        t.daemon = True
        t.start()
    time.sleep(kill_after)
    hub.kill()
    stop.set()
    for t in threads:
        t.join(15)
    with ledger.lock:
        snapshot = {k: (set(v) if isinstance(v, set) else v) for k, v in vars(ledger).items() if k != "lock"}

    hub.start(["--config", str(config)])
    problems = []
    try:
        bodies = []
        for key in ("tel", "ws"):
            bodies += [base64.b64decode(e["body"]).decode(errors="replace") for e in hub.events_of(devices[key])]
        present = set(bodies)
        lost = snapshot["telemetry_acked"] - present
        unknown = present - snapshot["telemetry_sent"]
        if lost:
            problems.append(f"{len(lost)} acknowledged telemetry messages lost, e.g. {sorted(lost)[:3]}")
        if unknown:
            problems.append(f"{len(unknown)} telemetry bodies never sent, e.g. {sorted(unknown)[:3]}")

        desired = hub.request("GET", f"/twins/{devices['twin']}", hub.token()).json()["properties"]["desired"]
        a, b = desired.get("a", 0), desired.get("b", 0)
        if a != b:
            problems.append(f"twin patch half-applied: a={a} b={b}")
        if not snapshot["twin_acked"] <= a <= snapshot["twin_attempted"]:
            problems.append(f"twin a={a}, acknowledged {snapshot['twin_acked']}, attempted {snapshot['twin_attempted']}")

        remaining = drain_c2d(hub, devices["c2d"])
        missing = snapshot["c2d_acked"] - snapshot["c2d_completed"] - remaining
        strange = remaining - snapshot["c2d_sent"]
        if missing:
            problems.append(f"{len(missing)} acknowledged C2D messages neither completed nor queued, e.g. {sorted(missing)[:3]}")
        if strange:
            problems.append(f"C2D messages never sent: {sorted(strange)[:3]}")

        session = requests.Session()
        session.headers["Authorization"] = hub.token()
        for name in snapshot["devices_attempted"]:
            r = session.get(hub.url(f"/devices/{name}"), timeout=10, verify=hub.ca)
            t = session.get(hub.url(f"/twins/{name}"), timeout=10, verify=hub.ca)
            if name in snapshot["devices_acked"] and r.status_code != 200:
                problems.append(f"acknowledged device {name} lost ({r.status_code})")
            if r.status_code != t.status_code:
                problems.append(f"device {name} half-created: identity {r.status_code}, twin {t.status_code}")

        problems += check_import(hub, snapshot, lines)

        hub.create_device(f"after{trial}")
        c = connect_device(hub, f"after{trial}")
        c.publish(f"devices/after{trial}/messages/events/", b"after", qos=1, pkid=1)
        c.expect_puback(1)
        c.close()
    finally:
        hub.kill()
    return {
        "trial": trial,
        "killed_after_s": round(kill_after, 3),
        "telemetry_acked": len(snapshot["telemetry_acked"]),
        "twin_acked": snapshot["twin_acked"],
        "c2d_acked": len(snapshot["c2d_acked"]),
        "c2d_completed": len(snapshot["c2d_completed"]),
        "devices_acked": len(snapshot["devices_acked"]),
        "methods_answered": snapshot["methods_answered"],
        "import_acked": snapshot["import_job"] is not None,
        "import_seen": snapshot["import_statuses"],
        "import_final": snapshot.get("import_final"),
        "imported_present": snapshot.get("import_present", 0),
        "problems": problems,
    }


def run(trials: int, seed: int, out=sys.stdout) -> list:
    rng = random.Random(seed)
    reports = []
    blob_dir = Path(tempfile.mkdtemp(prefix="crash-azurite-"))
    with Azurite(blob_dir / "data") as blob:
        for trial in range(1, trials + 1):
            reports.append(run_one(rng, trial, blob, out))
    shutil.rmtree(blob_dir, ignore_errors=True)
    totals = {k: sum(r[k] for r in reports) for k in
              ("telemetry_acked", "twin_acked", "c2d_acked", "c2d_completed", "devices_acked", "methods_answered",
               "import_acked", "imported_present")}
    totals["import_jobs_killed_while_running"] = sum(
        1 for r in reports if r["import_seen"] and r["import_seen"][-1] not in FINISHED)
    summary = {"trials": trials, "seed": seed, "trials_with_problems": sum(1 for r in reports if r["problems"]),
               "acknowledged_totals": totals}
    print(json.dumps({"summary": summary}), file=out, flush=True)
    return reports


def run_one(rng, trial, blob, out) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix=f"crash{trial}-"))
    report = run_trial(workdir, rng, trial, blob)
    if report["problems"]:
        report["kept"] = str(workdir)  # The data and log of a failed trial, to look at.
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report), file=out, flush=True)
    return report


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--seed", type=int, default=int(time.time()))
    args = p.parse_args()
    reports = run(args.trials, args.seed)
    sys.exit(1 if any(r["problems"] for r in reports) else 0)
