"""DPS registration throughput and latency (issue 70), against a hub this script starts or one
already running.

Modes (--modes, comma-separated, all by default, in this order):
  dps    N devices of a symmetric-key group register at once over raw HTTPS (SAS tokens made
         here with hmac, so the client is cheap), at most --concurrency at a time: each opens
         its own TLS connection, PUTs register, then polls its operation until assigned
         (right away, then every --poll-interval; --honour-retry-after waits what the hub
         says, as the SDKs do). Time-to-assigned runs from the device's TCP connect to the
         poll that says assigned.
  x509   the same with an X.509 group (leaves made here, signed by an intermediate whose root
         tests/python/certs.py makes): the TLS client certificate is the credential.
  hub    the devices `dps` created connect straight to the hub: TLS, MQTT CONNECT with a SAS
         token, CONNACK, DISCONNECT; time from TCP connect to CONNACK. Reported with the ratio
         of its rate to `dps`'s.
  flood  a fresh N register at once twice: without, then during a flood of registrations with
         bad signatures from 127.0.0.5 (--flood-processes processes of --flood-workers
         connections each, back to back, until the good ones are done). Reports both runs,
         the flood's answers and the ratios of p50 and p99 (goal: <= 2).

Usage:
  bench/dps_register.py [--bin FERROHUB] [--work DIR] [--config HUB_TOML]   # starts a hub
  bench/dps_register.py --hub-data-dir DIR --https-port P --mqtt-port P      # takes a running one
      [--devices 1000] [--concurrency 200] [--modes dps,x509,hub,flood]
      [--flood-processes 1] [--flood-workers 8]
      [--poll-interval 0.05] [--honour-retry-after] [--out FILE.json]
      [--generator rust|python] [--crowd-bin PATH]

The crowd in dps, x509 and hub is played by bench/src/bin/dpscrowd.rs (built with the workspace,
found beside the ferrohub binary) unless --generator python: one Python process doing every TLS
handshake tops out near 800 connects/s here, below what the hub can take. The flood stays in
Python processes of its own.

Prints one JSON object (and writes it to --out). A running hub is read with the `ferrohub` CLI
(--bin, else FERROHUB_BIN, else target/release) on its data directory; its registration ids
are prefixed by the run's start time so runs do not collide. 127.0.0.5 must be a local address
(on Linux all of 127/8 is). Bounded: every request has a 30 s limit, every mode --limit s.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import ssl
import struct
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))

DEVICE_API = "2021-06-01"
SERVICE_API = "2021-10-01"
ATTACKER = "127.0.0.5"
REQUEST_TIMEOUT = 30


# -- small helpers ----------------------------------------------------------------------------
def sas(resource: str, key_b64: str, ttl: int = 7200, policy: str | None = None) -> str:
    se = str(int(time.time()) + ttl)
    sr = urllib.parse.quote(resource, safe="")
    mac = hmac.new(base64.b64decode(key_b64), f"{sr}\n{se}".encode(), hashlib.sha256)
    token = f"SharedAccessSignature sr={sr}&sig={urllib.parse.quote(base64.b64encode(mac.digest()).decode(), safe='')}&se={se}"
    return token + (f"&skn={policy}" if policy else "")


def derived_key(group_key: str, rid: str) -> str:
    return base64.b64encode(hmac.new(base64.b64decode(group_key), rid.encode(), hashlib.sha256).digest()).decode()


def percentiles(xs: list[float]) -> dict:
    if not xs:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    s = sorted(xs)
    pick = lambda p: s[min(len(s) - 1, int(p / 100 * len(s)))]  # noqa: E731
    return {"p50_ms": round(pick(50) * 1000, 1), "p99_ms": round(pick(99) * 1000, 1), "max_ms": round(s[-1] * 1000, 1)}


async def http(reader, writer, method: str, path: str, headers: dict, body: bytes = b""):
    """One HTTP/1.1 request on a kept-alive connection: (status, headers, body)."""
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    writer.write(head.encode() + body)
    await writer.drain()

    async def read():
        line = await reader.readline()
        if not line:
            raise ConnectionError("closed")
        status = int(line.split()[1])
        hdrs = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            k, v = line.decode().split(":", 1)
            hdrs[k.strip().lower()] = v.strip()
        if "content-length" in hdrs:
            data = await reader.readexactly(int(hdrs["content-length"]))
        elif hdrs.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while (size := int((await reader.readline()).split(b";")[0], 16)):
                data += await reader.readexactly(size)
                await reader.readline()
            await reader.readline()
        else:
            data = b""
        return status, hdrs, data

    return await asyncio.wait_for(read(), REQUEST_TIMEOUT)


# -- the hub ----------------------------------------------------------------------------------
class Target:
    """The hub under test and what the clients need of it."""

    def __init__(self, args):
        if args.bin:
            os.environ["FERROHUB_BIN"] = args.bin
        from hubkit import Hub, parse_cs

        self.started = args.hub_data_dir is None
        if self.started:
            work = Path(args.work or tempfile.mkdtemp(prefix="dps-bench-"))
            work.mkdir(parents=True, exist_ok=True)
            self.hub = Hub(work / "hub").start(["--config", args.config] if args.config else [])
        else:
            self.hub = Hub(Path(args.hub_data_dir))
            self.hub.port, self.hub.mqtt_port = args.https_port, args.mqtt_port
        self.scope = self.hub.cli("connection-string", "--id-scope")
        self.host = parse_cs(self.hub.connection_string(with_port=False))["HostName"]
        owner = parse_cs(self.hub.cli("connection-string", "--provisioning"))
        self.owner_token = sas(owner["HostName"], owner["SharedAccessKey"], policy="provisioningserviceowner")
        self.ca = self.hub.ca
        self.ctx = ssl.create_default_context(cafile=self.ca)

    def service(self, method: str, path: str, body=None) -> dict:
        import requests

        r = requests.request(method, f"https://localhost:{self.hub.port}{path}?api-version={SERVICE_API}",
                             json=body, verify=self.ca, timeout=60, headers={"Authorization": self.owner_token})
        assert r.status_code == 200, (method, path, r.status_code, r.text)
        return r.json()

    def group(self, group_id: str, attestation: dict) -> dict:
        return self.service("PUT", f"/enrollmentGroups/{group_id}",
                            {"enrollmentGroupId": group_id, "attestation": attestation})

    def stop(self):
        if self.started:
            self.hub.kill()


# -- one device's registration ----------------------------------------------------------------
class Tally:
    def __init__(self):
        self.latencies: list[float] = []
        self.throttled = 0
        self.failures: list[str] = []


async def register(t: Target, rid: str, auth: dict, ctx: ssl.SSLContext, tally: Tally, args, source=None):
    """Registers `rid` and polls until assigned; appends its time-to-assigned to the tally."""
    started = time.perf_counter()
    base = f"/{t.scope}/registrations/{rid}"
    body = json.dumps({"registrationId": rid}).encode()
    headers = {"Content-Type": "application/json", **auth}
    reader, writer = await asyncio.wait_for(asyncio.open_connection(
        "127.0.0.1", t.hub.port, ssl=ctx, server_hostname="localhost",
        local_addr=(source, 0) if source else None), REQUEST_TIMEOUT)
    try:
        while True:
            status, hdrs, data = await http(reader, writer, "PUT", f"{base}/register?api-version={DEVICE_API}",
                                            headers, body)
            if status != 429:
                break
            tally.throttled += 1
            await asyncio.sleep(int(hdrs.get("retry-after", "1")))
        if status != 202:
            tally.failures.append(f"{rid}: register {status} {data[:200]!r}")
            return
        op = json.loads(data)["operationId"]
        if args.honour_retry_after:
            await asyncio.sleep(int(hdrs.get("retry-after", "1")))
        while True:
            status, hdrs, data = await http(reader, writer, "GET",
                                            f"{base}/operations/{op}?api-version={DEVICE_API}", headers)
            if status == 200:
                state = json.loads(data)
                if state["status"] != "assigned":
                    tally.failures.append(f"{rid}: {state['status']}")
                    return
                tally.latencies.append(time.perf_counter() - started)
                return
            if status not in (202, 429):
                tally.failures.append(f"{rid}: poll {status} {data[:200]!r}")
                return
            tally.throttled += status == 429
            wait = int(hdrs.get("retry-after", "1")) if args.honour_retry_after or status == 429 else args.poll_interval
            await asyncio.sleep(wait)
    finally:
        writer.close()


def generator_binary(args) -> str | None:
    """The Rust crowd (bench/src/bin/dpscrowd.rs) built beside the ferrohub binary, when
    --generator rust."""
    if args.generator != "rust":
        return None
    from hubkit import binary

    path = Path(args.crowd_bin) if args.crowd_bin else Path(binary()).parent / "dpscrowd"
    if not path.exists():
        sys.exit(f"{path} is missing: cargo build --release --workspace --all-targets (or --generator python)")
    return str(path)


async def rust_crowd(t: Target, mode: str, port: int, devices: list[dict], args) -> dict:
    """Hands `devices` ({id, token} or {id, cert, key}) to the Rust crowd; its report."""
    job = {"mode": mode, "host": "localhost", "connect_to": "127.0.0.1", "port": port, "ca": str(t.ca),
           "scope": t.scope, "concurrency": args.concurrency, "poll_interval_ms": int(args.poll_interval * 1000),
           "limit_s": int(args.limit), "devices": devices}
    proc = await asyncio.create_subprocess_exec(generator_binary(args), stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate(json.dumps(job).encode())
    if proc.returncode != 0:
        raise RuntimeError(f"dpscrowd exited {proc.returncode}")
    return json.loads(out)


async def crowd(t: Target, devices: list, args) -> dict:
    """Every (rid, auth headers, ssl context, (chain, key) or None) registered at once, at most
    --concurrency at a time."""
    if generator_binary(args):
        jobs = [{"id": rid, "token": auth.get("Authorization"),
                 **({"cert": str(files[0]), "key": str(files[1])} if files else {})}
                for rid, auth, _, files in devices]
        r = await rust_crowd(t, "register", t.hub.port, jobs, args)
        return {"devices": r["devices"], "assigned": r["done"], "failures": r["failures"],
                "failure_examples": r["failure_examples"], "throttled_429": r["throttled_429"],
                "wall_s": r["wall_s"], "registrations_per_s": r["per_s"], "time_to_assigned": r["latency"],
                "generator": "rust"}
    tally, gate = Tally(), asyncio.Semaphore(args.concurrency)

    async def one(rid, auth, ctx, _files):
        async with gate:
            try:
                await register(t, rid, auth, ctx, tally, args)
            except Exception as e:  # noqa: BLE001 - counted and reported
                tally.failures.append(f"{rid}: {type(e).__name__} {e}")

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(one(*d) for d in devices)), args.limit)
    wall = time.perf_counter() - started
    return {"devices": len(devices), "assigned": len(tally.latencies), "failures": len(tally.failures),
            "failure_examples": tally.failures[:3], "throttled_429": tally.throttled,
            "wall_s": round(wall, 2), "registrations_per_s": round(len(tally.latencies) / wall, 1),
            "time_to_assigned": percentiles(tally.latencies), "generator": "python"}


def symmetric_devices(t: Target, prefix: str, n: int, group_key: str) -> list:
    out = []
    for i in range(n):
        rid = f"{prefix}-{i:05d}"
        out.append((rid, {"Authorization": sas(f"{t.scope}/registrations/{rid}", derived_key(group_key, rid))}, t.ctx,
                    None))
    return out


# -- modes ------------------------------------------------------------------------------------
async def mode_dps(t: Target, args, run: str) -> tuple[dict, str, str]:
    group = f"bench-sym-{run}"
    key = t.group(group, {"type": "symmetricKey"})["attestation"]["symmetricKey"]["primaryKey"]
    result = await crowd(t, symmetric_devices(t, group, args.devices, key), args)
    return result, group, key


def x509_devices(t: Target, prefix: str, n: int, work: Path) -> tuple[list, str]:
    """An intermediate CA (its root from certs.py) and n leaves it signs, CN = registration id;
    the devices with their TLS contexts, and the intermediate's PEM for the group."""
    import datetime

    import certs
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    root_pem, root_key_pem = certs.ca(work, f"{prefix}-root")
    inter_pem, inter_key_pem = certs.intermediate(work, prefix, root_pem, root_key_pem)
    inter = x509.load_pem_x509_certificate(inter_pem.read_bytes())
    inter_key = serialization.load_pem_private_key(inter_key_pem.read_bytes(), None)
    now = datetime.datetime.now(datetime.timezone.utc)
    devices = []
    for i in range(n):
        rid = f"{prefix}-{i:05d}"
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, rid)]))
                .issuer_name(inter.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(inter_key, hashes.SHA256()))
        chain = work / f"{rid}.pem"
        chain.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + inter_pem.read_bytes())
        key_file = work / f"{rid}.key"
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        ctx = ssl.create_default_context(cafile=t.ca)
        ctx.load_cert_chain(str(chain), str(key_file))
        devices.append((rid, {}, ctx, (chain, key_file)))
    return devices, inter_pem.read_text()


async def mode_x509(t: Target, args, run: str) -> dict:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return {"skipped": "the cryptography package is not importable here"}
    group = f"bench-x509-{run}"
    work = Path(tempfile.mkdtemp(prefix="dps-bench-x509-"))
    made = time.perf_counter()
    devices, inter_pem = x509_devices(t, group, args.devices, work)
    made = time.perf_counter() - made
    t.group(group, {"type": "x509", "x509": {"signingCertificates": {"primary": {"certificate": inter_pem}}}})
    result = await crowd(t, devices, args)
    result["certificates_made_s"] = round(made, 1)
    return result


def connect_packet(host: str, device: str, key: str) -> bytes:
    def s(v: str) -> bytes:
        b = v.encode()
        return struct.pack("!H", len(b)) + b

    user = f"{host}/{device}/?api-version=2021-04-12"
    body = s("MQTT") + bytes([4, 0xC2]) + struct.pack("!H", 60) + s(device) + s(user) + \
        s(sas(f"{host}/devices/{device}", key))
    n, length = len(body), bytearray()
    while True:
        byte, n = n % 128, n // 128
        length.append(byte | (0x80 if n else 0))
        if not n:
            break
    return bytes([0x10]) + bytes(length) + body


async def mode_hub(t: Target, args, group: str, group_key: str) -> dict:
    """The devices `dps` created: TLS, CONNECT, CONNACK, DISCONNECT."""
    if generator_binary(args):
        jobs = [{"id": f"{group}-{i:05d}",
                 "token": sas(f"{t.host}/devices/{group}-{i:05d}", derived_key(group_key, f"{group}-{i:05d}"))}
                for i in range(args.devices)]
        r = await rust_crowd(t, "connect", t.hub.mqtt_port, jobs, args)
        return {"devices": r["devices"], "connected": r["done"], "failures": r["failures"],
                "failure_examples": r["failure_examples"], "wall_s": r["wall_s"], "connects_per_s": r["per_s"],
                "time_to_connack": r["latency"], "generator": "rust"}
    latencies, failures, refused = [], [], 0
    gate = asyncio.Semaphore(args.concurrency)

    async def one(i):
        nonlocal refused
        device = f"{group}-{i:05d}"
        async with gate:
            started = time.perf_counter()
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    "127.0.0.1", t.hub.mqtt_port, ssl=t.ctx, server_hostname="localhost"), REQUEST_TIMEOUT)
                try:
                    writer.write(connect_packet(t.host, device, derived_key(group_key, device)))
                    await writer.drain()
                    connack = await asyncio.wait_for(reader.readexactly(4), REQUEST_TIMEOUT)
                    if connack[0] != 0x20 or connack[3] != 0:
                        refused += 1
                        failures.append(f"{device}: CONNACK {connack.hex()}")
                        return
                    latencies.append(time.perf_counter() - started)
                    writer.write(b"\xe0\x00")
                    await writer.drain()
                finally:
                    writer.close()
            except Exception as e:  # noqa: BLE001 - counted and reported
                failures.append(f"{device}: {type(e).__name__} {e}")

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(args.devices))), args.limit)
    wall = time.perf_counter() - started
    return {"devices": args.devices, "connected": len(latencies), "failures": len(failures),
            "failure_examples": failures[:3], "refused_connacks": refused, "wall_s": round(wall, 2),
            "connects_per_s": round(len(latencies) / wall, 1), "time_to_connack": percentiles(latencies)}


async def flood(t: Target, stop: asyncio.Event, workers: int, counts: dict):
    """Registrations with bad signatures from ATTACKER, back to back on kept-alive connections."""
    bad_key = base64.b64encode(b"nobody's key, a flood's").decode()

    async def worker(w):
        n = 0
        while not stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    "127.0.0.1", t.hub.port, ssl=t.ctx, server_hostname="localhost", local_addr=(ATTACKER, 0)),
                    REQUEST_TIMEOUT)
            except Exception as e:  # noqa: BLE001
                counts["errors"] = counts.get("errors", 0) + 1
                counts["last_error"] = repr(e)
                await asyncio.sleep(0.1)
                continue
            try:
                while not stop.is_set():
                    rid = f"flood-{w}-{n}"
                    n += 1
                    status, _, _ = await http(reader, writer, "PUT",
                                              f"/{t.scope}/registrations/{rid}/register?api-version={DEVICE_API}",
                                              {"Content-Type": "application/json",
                                               "Authorization": sas(f"{t.scope}/registrations/{rid}", bad_key)},
                                              json.dumps({"registrationId": rid}).encode())
                    counts[str(status)] = counts.get(str(status), 0) + 1
            except Exception:  # noqa: BLE001 - the hub closed the connection: open another
                counts["reconnects"] = counts.get("reconnects", 0) + 1
            finally:
                writer.close()

    await asyncio.gather(*(worker(w) for w in range(workers)))


def flood_process(port: int, ca: str, scope: str, workers: int, stop, out):
    """The flood in a process of its own (so it does not share the good clients' event loop);
    its answer counts go to `out` once `stop` is set."""
    from types import SimpleNamespace

    t = SimpleNamespace(hub=SimpleNamespace(port=port), scope=scope, ctx=ssl.create_default_context(cafile=ca))
    counts: dict = {}

    async def run():
        stopping = asyncio.Event()

        async def watch():
            while not stop.is_set():
                await asyncio.sleep(0.05)
            stopping.set()

        await asyncio.gather(watch(), flood(t, stopping, workers, counts))

    asyncio.run(run())
    out.put(counts)


async def mode_flood(t: Target, args, run: str) -> dict:
    import multiprocessing

    group = f"bench-flood-{run}"
    key = t.group(group, {"type": "symmetricKey"})["attestation"]["symmetricKey"]["primaryKey"]
    quiet = await crowd(t, symmetric_devices(t, f"{group}-quiet", args.devices, key), args)
    mp = multiprocessing.get_context("spawn")
    stop, results = mp.Event(), mp.Queue()
    flooders = [mp.Process(target=flood_process, args=(t.hub.port, t.ca, t.scope, args.flood_workers, stop, results))
                for _ in range(args.flood_processes)]
    for p in flooders:
        p.start()
    await asyncio.sleep(2)  # the flood is under way (and its source blocked, where the hub does that)
    started = time.perf_counter()
    try:
        loud = await crowd(t, symmetric_devices(t, f"{group}-loud", args.devices, key), args)
    finally:
        stop.set()
        took = time.perf_counter() - started + 2
        counts: dict = {}
        for _ in flooders:
            for k, v in (await asyncio.to_thread(results.get, True, REQUEST_TIMEOUT + 10)).items():
                counts[k] = v if isinstance(v, str) else counts.get(k, 0) + v
        for p in flooders:
            p.join(10)
    requests = sum(v for k, v in counts.items() if k.isdigit())
    ratio = lambda p: round(loud["time_to_assigned"][p] / quiet["time_to_assigned"][p], 2)  # noqa: E731
    return {"without_flood": quiet, "with_flood": loud,
            "flood": {"source": ATTACKER, "processes": args.flood_processes, "workers": args.flood_workers,
                      "requests": requests,
                      "requests_per_s": round(requests / took, 1), "answers": counts},
            "p50_ratio": ratio("p50_ms"), "p99_ratio": ratio("p99_ms"),
            "goal_met": ratio("p50_ms") <= 2 and ratio("p99_ms") <= 2}


async def main(args):
    t = Target(args)
    run = time.strftime("%H%M%S")
    report = {"devices": args.devices, "concurrency": args.concurrency,
              "poll": "retry-after" if args.honour_retry_after else f"{args.poll_interval}s",
              "generator": args.generator,
              "target": "started here" if t.started else f"https :{t.hub.port}, mqtt :{t.hub.mqtt_port}"}
    modes = args.modes.split(",")
    try:
        group = group_key = None
        if "dps" in modes or "hub" in modes:
            report["dps"], group, group_key = await mode_dps(t, args, run)
            print(json.dumps({"dps": report["dps"]}), file=sys.stderr, flush=True)
        if "x509" in modes:
            report["x509"] = await mode_x509(t, args, run)
            print(json.dumps({"x509": report["x509"]}), file=sys.stderr, flush=True)
        if "hub" in modes:
            report["hub"] = await mode_hub(t, args, group, group_key)
            if report["dps"]["registrations_per_s"]:
                report["hub"]["connects_per_registration"] = round(
                    report["hub"]["connects_per_s"] / report["dps"]["registrations_per_s"], 2)
            print(json.dumps({"hub": report["hub"]}), file=sys.stderr, flush=True)
        if "flood" in modes:
            report["flood"] = await mode_flood(t, args, run)
    finally:
        t.stop()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="the ferrohub binary (to start a hub, and for its CLI)")
    ap.add_argument("--work", help="where a started hub keeps its data (a temporary directory by default)")
    ap.add_argument("--config", help="a TOML config for the started hub ([throttling] and so on)")
    ap.add_argument("--hub-data-dir", help="take the hub running on this data directory instead")
    ap.add_argument("--https-port", type=int, help="the running hub's HTTPS port")
    ap.add_argument("--mqtt-port", type=int, help="the running hub's MQTT port")
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--modes", default="dps,x509,hub,flood")
    ap.add_argument("--flood-processes", type=int, default=1, help="flooding processes (each its own event loop)")
    ap.add_argument("--flood-workers", type=int, default=8, help="connections per flooding process")
    ap.add_argument("--poll-interval", type=float, default=0.05)
    ap.add_argument("--honour-retry-after", action="store_true")
    ap.add_argument("--limit", type=float, default=600, help="seconds per mode before giving up")
    ap.add_argument("--generator", choices=["rust", "python"], default="rust",
                    help="who plays the crowd in dps, x509 and hub: the Rust dpscrowd (default) or this script")
    ap.add_argument("--crowd-bin", help="the dpscrowd binary (default: beside the ferrohub binary)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.honour_retry_after and a.generator == "rust":
        ap.error("--honour-retry-after needs --generator python (the Rust crowd polls every --poll-interval)")
    if a.hub_data_dir and not (a.https_port and a.mqtt_port):
        ap.error("--hub-data-dir needs --https-port and --mqtt-port")
    asyncio.run(main(a))
