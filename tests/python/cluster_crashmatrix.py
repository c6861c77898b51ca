"""The crash matrix in cluster mode (issue 49, docs/cluster.md): SIGKILL a random node of a
three-node cluster (a hub node, writer or follower, or a NATS server) at a random moment under
mixed load, and check that nothing acknowledged was lost; measure failover (kill to the first
write accepted again).

The load, each stream recording what the hub acknowledged, all through HAProxy and retried by
reconnecting through it after any failure:
- telemetry over MQTT/TLS (raw client, QoS 1, PUBACK = acknowledged);
- twin desired patches over REST setting two properties to the same number (200);
- C2D sends over REST to a device that is not connected (204);
- device creations over REST (200).

After the kill the load goes on until writes are accepted again and a second more; then the
killed node restarts, and: every acknowledged telemetry body is in the device's partition;
the twin's two properties equal each other and are at least the last acknowledged value; every
acknowledged C2D message is in the device's queue; every acknowledged device exists; and the
restarted node's replica has caught up (it holds a device created after it came back).

Run: python tests/python/cluster_crashmatrix.py --trials 50 [--seed S] --out FILE.jsonl
(scripts/crash-matrix-cluster.sh). Outside CI: the suite's test_cluster.py covers each kind of
kill once.
"""

import argparse
import base64
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).parent))
from clusterkit import Cluster  # noqa: E402
from hubkit import sas_token  # noqa: E402
from mqttraw import RawMqtt, Closed  # noqa: E402

TARGETS = ["writer", "follower", "nats1", "nats2", "nats3"]


class Load:
    def __init__(self, cluster: Cluster, trial: int, owner_key: str):
        self.c, self.trial, self.owner_key = cluster, trial, owner_key
        self.stop = threading.Event()
        self.acked_telemetry: list[str] = []
        self.acked_patch = 0
        self.acked_c2d: list[str] = []
        self.acked_devices: list[str] = []
        self.first_write_after_kill: float | None = None
        self.killed_at: float | None = None
        self.errors = 0

    def token(self):
        return sas_token("localhost", self.owner_key, policy="iothubowner")

    def request(self, method, path, **kw):
        sep = "&" if "?" in path else "?"
        return requests.request(method, f"https://localhost:443{path}{sep}api-version=2021-04-12",
                                headers={"Authorization": self.token(), **kw.pop("headers", {})},
                                verify=self.c.ca, timeout=15, **kw)

    def wrote(self):
        if self.killed_at is not None and self.first_write_after_kill is None:
            self.first_write_after_kill = time.time()

    def registry(self):
        i = 0
        while not self.stop.is_set():
            d = f"t{self.trial}-reg-{i}"
            try:
                r = self.request("PUT", f"/devices/{d}", json={"deviceId": d})
                if r.status_code == 200:
                    self.acked_devices.append(d)
                    self.wrote()
                    i += 1
                    continue
            except requests.RequestException:
                pass
            self.errors += 1
            time.sleep(0.05)

    def twin(self, device):
        n = self.acked_patch
        while not self.stop.is_set():
            n += 1
            try:
                r = self.request("PATCH", f"/twins/{device}", json={"properties": {"desired": {"a": n, "b": n}}})
                if r.status_code == 200:
                    self.acked_patch = n
                    self.wrote()
                    continue
            except requests.RequestException:
                pass
            self.errors += 1
            time.sleep(0.05)

    def c2d(self, device):
        i = 0
        while not self.stop.is_set():
            mid = f"t{self.trial}-c2d-{i}"
            try:
                r = self.request("POST", f"/devices/{device}/messages/deviceBound", data=mid.encode(),
                                 headers={"iothub-messageid": mid})
                if r.status_code == 204:
                    self.acked_c2d.append(mid)
                    i += 1
                    time.sleep(0.02)  # the queue holds 50 by default
                    continue
            except requests.RequestException:
                pass
            self.errors += 1
            time.sleep(0.05)

    def telemetry(self, device, key):
        i, client = 0, None
        while not self.stop.is_set():
            try:
                if client is None:
                    client = RawMqtt(8883, self.c.ca)
                    token = sas_token(f"localhost/devices/{device}", key)
                    _, code = client.connect(device, username=f"localhost/{device}/?api-version=2021-04-12",
                                             password=token, clean=True)
                    if code != 0:
                        raise Closed(f"CONNACK {code}")
                body = f"t{self.trial}-m{i}"
                pkid = i % 60000 + 1
                client.publish(f"devices/{device}/messages/events/", body.encode(), qos=1, pkid=pkid)
                client.expect_puback(pkid, timeout=10)
                self.acked_telemetry.append(body)
                i += 1
            except (Closed, TimeoutError, OSError, AssertionError):
                self.errors += 1
                if client is not None:
                    client.close()
                client = None
                time.sleep(0.1)
        if client is not None:
            client.close()


def get_settled(load: Load, path: str, timeout: float = 60) -> requests.Response:
    """A read through the balancer, retried through a step-down or an election (no writer
    for a moment): the answer once it is not a 5xx or a broken connection."""
    deadline = time.time() + timeout
    while True:
        try:
            r = load.request("GET", path)
            if r.status_code < 500:
                return r
        except requests.RequestException:
            if time.time() > deadline:
                raise
        if time.time() > deadline:
            return r
        time.sleep(0.2)


def device_key(load: Load, device: str) -> str:
    return get_settled(load, f"/devices/{device}").json()["authentication"]["symmetricKey"]["primaryKey"]


def trial(c: Cluster, n: int, rng: random.Random, owner_key: str, targets: list[str]) -> dict:
    c.wait_for_writer(timeout=90)
    load = Load(c, n, owner_key)
    tele, twin_dev, c2d_dev = f"t{n}-tele", f"t{n}-twin", f"t{n}-c2d"
    for d in (tele, twin_dev, c2d_dev):
        # The previous trial's restart may still be settling: a 503 is retried (it may have
        # happened, so a retry may find the device there: 409).
        deadline, retried = time.time() + 60, False
        while (r := load.request("PUT", f"/devices/{d}", json={"deviceId": d})).status_code == 503:
            assert time.time() < deadline, r.text
            retried = True
            time.sleep(0.5)
        assert r.status_code == 200 or (retried and r.status_code == 409), r.text
    key = device_key(load, tele)
    threads = [threading.Thread(target=load.registry), threading.Thread(target=load.twin, args=(twin_dev,)),
               threading.Thread(target=load.c2d, args=(c2d_dev,)), threading.Thread(target=load.telemetry, args=(tele, key))]
    for t in threads:
        t.start()
    time.sleep(rng.uniform(0.5, 2.5))
    target = rng.choice(targets)
    writer = c.writer()
    name = writer if target == "writer" else (rng.choice([h for h in ("hub1", "hub2", "hub3") if h != writer])
                                              if target == "follower" else target)
    load.killed_at = time.time()
    c.kill_node(name)
    deadline = time.time() + 60
    while load.first_write_after_kill is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(1)
    load.stop.set()
    for t in threads:
        t.join(timeout=30)
    failover = (load.first_write_after_kill - load.killed_at) if load.first_write_after_kill else None
    c.start_node(name)
    c.wait_for_writer(timeout=90)

    problems = []
    if failover is None:
        problems.append("writes never accepted again within 60 s")
    # Through the balancer a read may land on a follower whose replica is still catching up
    # (its NATS server was the one killed, say): a device is missing only if it stays 404.
    for d in load.acked_devices:
        deadline = time.time() + 30
        while (status := get_settled(load, f"/devices/{d}").status_code) == 404 and time.time() < deadline:
            time.sleep(0.5)
        if status != 200:
            problems.append(f"acknowledged device {d} missing ({status} for 30 s)")
    deadline = time.time() + 30
    while True:  # as for devices: a lagging follower's twin catches up, a lost patch never
        desired = get_settled(load, f"/twins/{twin_dev}").json()["properties"]["desired"]
        if (desired.get("a") or 0) >= load.acked_patch or time.time() > deadline:
            break
        time.sleep(0.5)
    if desired.get("a") != desired.get("b") or (desired.get("a") or 0) < load.acked_patch:
        problems.append(f"twin {desired.get('a')}/{desired.get('b')} against acknowledged {load.acked_patch}")
    # Drain the queue over HTTPS (receive, then complete), retrying through any blip, until the
    # hub answers 204: the queue is empty.
    queued = []
    dev_token = sas_token(f"localhost/devices/{c2d_dev}", device_key(load, c2d_dev))
    base = f"https://localhost:443/devices/{c2d_dev}/messages/deviceBound"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            r = requests.get(f"{base}?api-version=2021-04-12", headers={"Authorization": dev_token}, verify=c.ca, timeout=15)
            if r.status_code == 204:
                break
            if r.status_code != 200:
                time.sleep(0.2)
                continue
            queued.append(r.content.decode())
            etag = urllib.parse.quote(r.headers["ETag"].strip('"'))
            requests.delete(f"{base}/{etag}?api-version=2021-04-12", headers={"Authorization": dev_token}, verify=c.ca, timeout=15)
        except requests.RequestException:
            time.sleep(0.2)
    else:
        problems.append("the C2D queue could not be drained within 60 s")
    missing_c2d = set(load.acked_c2d) - set(queued)
    if missing_c2d:
        problems.append(f"{len(missing_c2d)} acknowledged C2D messages missing")
    deadline = time.time() + 60
    while True:
        try:
            events = c.events_of(tele)
            break
        except (AssertionError, requests.RequestException):
            if time.time() > deadline:
                raise
            time.sleep(0.5)
    bodies = {base64.b64decode(e["body"]).decode(errors="replace") for e in events}
    missing = [b for b in load.acked_telemetry if b not in bodies]
    if missing:
        problems.append(f"{len(missing)} acknowledged telemetry messages missing, first {missing[0]}")
    probe = f"t{n}-after"
    deadline = time.time() + 60
    while True:
        try:
            if load.request("PUT", f"/devices/{probe}", json={"deviceId": probe}).status_code == 200:
                break
        except requests.RequestException:
            pass
        if time.time() > deadline:
            problems.append("no write accepted within 60 s of the restart")
            break
        time.sleep(0.2)
    try:
        c.wait_node_has_device(name if name.startswith("hub") else c.writer(), probe, timeout=60)
    except AssertionError as e:
        problems.append(f"{name} did not catch up: {e}"[:300])
    return {"trial": n, "killed": name, "role": target, "killed_at": round(load.killed_at, 3), "failover_s": failover,
            "acked": {"telemetry": len(load.acked_telemetry), "twin": load.acked_patch,
                      "c2d": len(load.acked_c2d), "devices": len(load.acked_devices)},
            "client_errors": load.errors, "problems": problems}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--out", default=None)
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help="comma-separated kinds of node to kill, of " + ", ".join(TARGETS))
    args = ap.parse_args()
    targets = args.targets.split(",")
    unknown = set(targets) - set(TARGETS)
    if unknown:
        ap.error(f"unknown targets {sorted(unknown)}")
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="ferrohub-cluster-crash-"))
    print(f"cluster and its logs in {root}", file=sys.stderr, flush=True)
    c = Cluster(root).start()
    c.data_dir = root / c.writer()
    owner_key = c.policy_key("iothubowner")
    results = []
    out = open(args.out, "a") if args.out else None
    try:
        for n in range(args.trials):
            r = trial(c, n, rng, owner_key, targets)
            results.append(r)
            line = json.dumps(r)
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()
    finally:
        c.stop()
    bad = [r for r in results if r["problems"]]

    def failover(role_filter):
        times = sorted(r["failover_s"] for r in results if r["failover_s"] is not None and role_filter(r["role"]))
        if not times:
            return None
        return {"kills": len(times), "p50_s": round(statistics.median(times), 3),
                "p99_s": round(times[min(len(times) - 1, int(0.99 * len(times)))], 3), "max_s": round(times[-1], 3)}
    # Kill to the first write accepted again: for a follower or one NATS server, writes barely
    # pause; for the writer it is the takeover.
    summary = {"seed": args.seed, "trials": len(results), "with_problems": len(bad),
               "failover_all": failover(lambda _: True), "failover_writer_killed": failover(lambda r: r == "writer"),
               "failover_nats_killed": failover(lambda r: r.startswith("nats")),
               "failover_follower_killed": failover(lambda r: r == "follower"),
               "acked": {k: sum(r["acked"][k] for r in results) for k in ("telemetry", "twin", "c2d", "devices")}}
    print(json.dumps({"summary": summary}), flush=True)
    if out:
        out.write(json.dumps({"summary": summary}) + "\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
