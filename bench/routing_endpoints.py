"""Routed telemetry to each kind of endpoint outside the hub against the built-in endpoint alone
(issue 68), in one session, interleaved.

Each run starts a fresh hub and routes every device message either to `events` alone
(`builtin`) or to `events` and an endpoint of --partitions partitions delivering to a webhook
(`webhook`), a NATS JetStream stream (`nats`), an MQTT broker (`mqtt`) or an Azure Storage
container in Azurite (`storage`, Avro, a 60 s batch window: IoT Hub's shortest); then the Rust
load generator (`loadgen`) sends --devices x --messages QoS 1 telemetry over MQTT/TLS.
Reported per run: the generator's throughput and PUBACK p50/p99 (what a device sees), and what
the target held: the time from the first message sent until it held every message, and the
delivery rate (messages / that time). For `webhook` also the latency from enqueueing
(`iothub-enqueuedtime`) to receipt, p50/p99. The webhook receiver is an asyncio HTTPS server in
a process of its own that answers 200 at once; the stream is counted with nats-py, the broker
with a paho subscriber (QoS 1), the container by reading its Avro blobs back (fastavro).

Usage:
  ~/.cache/ferrohub/venv/bin/python bench/routing_endpoints.py [--bin FERROHUB] [--loadgen PATH]
      [--devices 50] [--messages 200] [--partitions 4] [--repeats 3]
      [--modes builtin,webhook,nats,mqtt,storage] [--out FILE.json]

Bounded: every run has the generator's --time-limit and a 120 s wait for deliveries (200 s for
`storage`, whose first blob waits out its batch window).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))


def enqueued_epoch(text: str) -> float:
    # 2026-12-07T11:41:31.1234567Z: seven fractional digits, which fromisoformat does not take.
    whole, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole + "+00:00").timestamp() + float("0." + (frac or "0"))


def receiver_process(cert: str, key: str, ready, stop, out, count):
    """Serves POSTs on 127.0.0.1 (a free port, sent through `ready`) until `stop`; then puts
    (receipt time, enqueued time) of every POST into `out`."""
    seen: list[tuple[float, float]] = []

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length, enqueued = 0, None
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"iothub-enqueuedtime":
                        enqueued = value.strip().decode()
                await reader.readexactly(length)
                seen.append((time.time(), enqueued_epoch(enqueued) if enqueued else 0.0))
                count.value += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the hub closed the connection, or the receiver is stopping
        finally:
            writer.close()

    async def main():
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
        ready.put(server.sockets[0].getsockname()[1])
        while not stop.is_set():
            await asyncio.sleep(0.05)
        server.close()
        out.put(seen)

    asyncio.run(main())


def percentile(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


class Counted:
    """A target outside the hub for the broker and storage modes: `target()` is the endpoint's
    target JSON, `held()` how many messages it holds now."""

    def __init__(self, mode: str, work: Path):
        import asyncio as aio

        self.mode, self.work, self.aio = mode, work, aio
        if mode == "nats":
            from brokerkit import NatsServer
            self.server = NatsServer(work / "nats", user="bench", password="bench-pw").__enter__()
            self._nats(lambda js: js.add_stream(name="BENCH", subjects=["bench.>"]))
        elif mode == "mqtt":
            import paho.mqtt.client as paho
            import threading
            from brokerkit import Mosquitto
            self.server = Mosquitto(work / "mosq", user="bench", password="bench-pw").__enter__()
            self.count, subscribed = 0, threading.Event()
            self.client = paho.Client(client_id="bench-subscriber", protocol=paho.MQTTv5)
            self.client.username_pw_set("bench", "bench-pw")
            self.client.on_connect = lambda c, *_: c.subscribe("bench/#", qos=1)
            self.client.on_subscribe = lambda *_: subscribed.set()

            def on_message(*_):
                self.count += 1
            self.client.on_message = on_message
            self.client.connect("127.0.0.1", self.server.port)
            self.client.loop_start()
            assert subscribed.wait(10)
        elif mode == "storage":
            from azurite import Azurite
            self.server = Azurite(work / "azurite").__enter__()
            self.server.create_container("bench")

    def _nats(self, work):
        import nats

        async def run():
            nc = await nats.connect(self.server.url, user="bench", password="bench-pw")
            try:
                return await work(nc.jetstream())
            finally:
                await nc.close()
        return self.aio.run(run())

    def target(self) -> dict:
        if self.mode == "nats":
            return {"nats": {"url": self.server.url, "subject": "bench.{deviceId}", "username": "bench",
                             "password": "bench-pw"}}
        if self.mode == "mqtt":
            return {"mqtt": {"url": f"mqtt://127.0.0.1:{self.server.port}", "topic": "bench/{deviceId}",
                             "username": "bench", "password": "bench-pw"}}
        return {"storageContainer": {"connectionString": self.server.connection_string, "containerName": "bench",
                                     "batchFrequencyInSeconds": 60, "encoding": "avro"}}

    def held(self) -> int:
        if self.mode == "nats":
            async def messages(js):
                return (await js.stream_info("BENCH")).state.messages
            return self._nats(messages)
        if self.mode == "mqtt":
            return self.count
        import io
        import fastavro
        from azure.storage.blob import BlobServiceClient
        client = BlobServiceClient.from_connection_string(self.server.connection_string).get_container_client("bench")
        return sum(sum(1 for _ in fastavro.reader(io.BytesIO(client.download_blob(b.name).readall())))
                   for b in client.list_blobs())

    def close(self):
        if self.mode == "mqtt":
            self.client.loop_stop()
            self.client.disconnect()
        self.server.__exit__(None, None, None)


def one_run(mode: str, args, work: Path, tls: tuple[Path, Path, Path]) -> dict:
    from hubkit import Hub

    hub = Hub(work / f"hub-{mode}-{time.monotonic_ns()}").start()
    receiver = None
    counted = Counted(mode, work / f"{mode}-{time.monotonic_ns()}") if mode in ("nats", "mqtt", "storage") else None
    try:
        token = hub.token()
        endpoints = ["events"]
        if mode == "webhook":
            mp = multiprocessing.get_context("spawn")
            ready, stop, out, count = mp.Queue(), mp.Event(), mp.Queue(), mp.Value("l", 0, lock=False)
            receiver = (mp.Process(target=receiver_process,
                                   args=(str(tls[1]), str(tls[2]), ready, stop, out, count)), stop, out, count)
            receiver[0].start()
            port = ready.get(timeout=30)
            hook = {"url": f"https://127.0.0.1:{port}/", "caCertificate": tls[0].read_text(),
                    "signingKey": base64.b64encode(os.urandom(32)).decode()}
            r = hub.request("PUT", "/routing/endpoints/hook", token,
                            json={"partitionCount": args.partitions, "webhook": hook})
            assert r.status_code == 201, r.text
            endpoints.append("hook")
        if counted:
            r = hub.request("PUT", "/routing/endpoints/out", token,
                            json={"partitionCount": args.partitions, **counted.target()})
            assert r.status_code == 201, r.text
            endpoints.append("out")
        r = hub.request("PUT", "/routing/routes/all", token,
                        json={"source": "DeviceMessages", "condition": "true", "endpointNames": endpoints})
        assert r.status_code == 200, r.text
        started = time.time()
        gen = subprocess.run(
            [args.loadgen, "--ca", str(hub.ca), "--owner", hub.connection_string(with_port=False),
             "--mqtt-port", str(hub.mqtt_port), "--https-port", str(hub.port), "--devices", str(args.devices),
             "--messages-per-device", str(args.messages), "--time-limit", "120"],
            capture_output=True, text=True, timeout=300)
        assert gen.returncode == 0, gen.stderr[-2000:]
        report = json.loads(gen.stdout[gen.stdout.index("{"):])
        result = {"mode": mode, "acknowledged": report["acknowledged"], "errors": report["errors"],
                  "msgs_per_s": report["throughput_msgs_per_s"],
                  "puback_p50_ms": report["puback_latency"]["p50_ms"],
                  "puback_p99_ms": report["puback_latency"]["p99_ms"]}
        if receiver:
            expected = report["acknowledged"]
            deadline = time.time() + 120
            while time.time() < deadline and receiver[3].value < expected:
                time.sleep(0.05)
            receiver[1].set()
            seen = receiver[2].get(timeout=60)
            receiver[0].join(10)
            took = (max(t for t, _ in seen) - started) if seen else None
            lat = [t - e for t, e in seen if e]
            result.update({"received": len(seen), "all_received_s": round(took, 2) if took else None,
                           "delivered_per_s": round(len(seen) / took, 1) if took else None,
                           "delivery_p50_ms": round(percentile(lat, 50) * 1000, 1) if lat else None,
                           "delivery_p99_ms": round(percentile(lat, 99) * 1000, 1) if lat else None})
        if counted:
            expected = report["acknowledged"]
            deadline = time.time() + (200 if mode == "storage" else 120)
            held = counted.held()
            while time.time() < deadline and held < expected:
                time.sleep(0.5 if mode == "storage" else 0.05)
                held = counted.held()
            took = time.time() - started
            result.update({"received": held, "all_received_s": round(took, 2),
                           "delivered_per_s": round(held / took, 1)})
        return result
    finally:
        if counted:
            counted.close()
        if receiver and receiver[0].is_alive():
            receiver[1].set()
            receiver[0].join(10)
        hub.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin")
    ap.add_argument("--loadgen")
    ap.add_argument("--devices", type=int, default=50)
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="builtin,webhook,nats,mqtt,storage")
    ap.add_argument("--out")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if args.bin:
        os.environ["FERROHUB_BIN"] = args.bin
    from hubkit import binary

    args.loadgen = args.loadgen or str(Path(binary()).parent / "loadgen")
    import certs

    work = Path(tempfile.mkdtemp(prefix="routing-bench-"))
    ca, ca_key = certs.ca(work, "bench-hook")
    cert, key = certs.server_signed_by(work, "bench-receiver", ["127.0.0.1"], ca, ca_key)
    runs = []
    for i in range(args.repeats):
        for mode in modes:
            runs.append(one_run(mode, args, work, (ca, cert, key)))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    med = lambda mode, k: statistics.median(r[k] for r in runs if r["mode"] == mode and r.get(k) is not None)  # noqa: E731
    summary = {
        "devices": args.devices, "messages_per_device": args.messages, "partitions": args.partitions,
        "repeats": args.repeats,
        "runs": runs,
    }
    keys = ("msgs_per_s", "puback_p50_ms", "puback_p99_ms", "received", "delivered_per_s", "all_received_s",
            "delivery_p50_ms", "delivery_p99_ms")
    for mode in modes:
        summary[mode] = {k: med(mode, k) for k in keys if any(r.get(k) is not None for r in runs if r["mode"] == mode)}
        if mode != "builtin" and "builtin" in modes:
            summary[mode]["ingest_ratio_to_builtin"] = round(summary[mode]["msgs_per_s"] /
                                                             summary["builtin"]["msgs_per_s"], 2)
    text = json.dumps(summary, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
