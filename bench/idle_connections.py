"""Idle MQTT devices over TLS: what each costs the hub (issues 18 and 19).

N devices (one shared SAS key, imported by an import job) connect over MQTT/TLS with a SAS
token, 64 handshakes at a time, and then stay idle (keep-alive 60 s, so no PINGREQ falls in
the window). With every device of a step connected the hub's resident memory is read, and
over the next 10 s its CPU time and the bytes it wrote to storage (/proc/PID/io write_bytes).
Steps grow (e.g. 5000 then 19000): each step adds devices to those already connected.
Memory per connection is (RSS with the step's devices - RSS before any device connected) / N.

Usage: idle_connections.py FERROHUB_BIN WORKDIR STEPS OUT_JSON   (STEPS like 5000,19000)
Bounded: fixed counts, a 300 s limit per step, 10 s windows. Needs about STEPS[-1] + 100 open
files in this process and in the hub (ulimit -n; the machine allows 20,000).
"""
import asyncio
import base64
import json
import os
import ssl
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
binary, work, steps, out = sys.argv[1], Path(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")], sys.argv[4]
os.environ["FERROHUB_BIN"] = binary

from hubkit import Hub, sas_token  # noqa: E402
from jobkit import import_devices  # noqa: E402
from mqttraw import _remaining, _str  # noqa: E402

KEY = base64.b64encode(b"k" * 32).decode()
TICKS = os.sysconf("SC_CLK_TCK")


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])


def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def write_bytes(pid):
    for line in open(f"/proc/{pid}/io"):
        if line.startswith("write_bytes:"):
            return int(line.split()[1])


def connect_packet(device):
    user = f"localhost/{device}/?api-version=2021-04-12"
    password = sas_token(f"localhost/devices/{device}", KEY, ttl=7200)
    body = _str("MQTT") + bytes([4, 0xC2]) + struct.pack("!H", 60) + _str(device) + _str(user) + _str(password)
    return bytes([0x10]) + _remaining(len(body)) + body


async def connect(port, ctx, device, gate, held):
    async with gate:
        reader, writer = await asyncio.open_connection("localhost", port, ssl=ctx, server_hostname="localhost")
        writer.write(connect_packet(device))
        await writer.drain()
        connack = await asyncio.wait_for(reader.readexactly(4), 30)
        assert connack[0] == 0x20 and connack[3] == 0, connack
        held.append(writer)


async def main():
    work.mkdir(parents=True, exist_ok=True)
    config = work / "hub.toml"
    config.write_text(f"[listeners]\nmqtt_max_connections = {steps[-1] + 100}\n")
    hub = Hub(work / "hub").start(["--config", str(config)])
    results = {"steps": []}
    held = []
    try:
        import_devices(hub, work, ({"id": f"idle{i:05d}", "authentication": {
            "type": "sas", "symmetricKey": {"primaryKey": KEY, "secondaryKey": KEY}}} for i in range(steps[-1])))
        ctx = ssl.create_default_context(cafile=hub.ca)
        pid = hub.proc.pid
        await asyncio.sleep(5)
        base_rss = rss_kib(pid)
        results["rss_before_kib"] = base_rss
        gate = asyncio.Semaphore(64)
        for n in steps:
            started = time.perf_counter()
            await asyncio.wait_for(asyncio.gather(*(
                connect(hub.mqtt_port, ctx, f"idle{i:05d}", gate, held) for i in range(len(held), n))), 300)
            connect_s = time.perf_counter() - started
            await asyncio.sleep(5)
            rss = rss_kib(pid)
            cpu0, wb0, t0 = cpu_s(pid), write_bytes(pid), time.perf_counter()
            await asyncio.sleep(10)
            window = time.perf_counter() - t0
            step = {
                "connections": len(held),
                "connect_s": round(connect_s, 1),
                "rss_kib": rss,
                "kib_per_connection": round((rss - base_rss) / len(held), 1),
                "idle_cpu_percent_of_a_core": round(100 * (cpu_s(pid) - cpu0) / window, 1),
                "idle_storage_write_bytes_per_s": round((write_bytes(pid) - wb0) / window),
            }
            results["steps"].append(step)
            print(json.dumps(step), flush=True)
        for w in held:
            w.close()
    finally:
        hub.kill()
    Path(out).write_text(json.dumps(results, indent=2))


asyncio.run(main())
