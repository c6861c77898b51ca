"""Routed telemetry to a webhook endpoint against the built-in endpoint alone (issue 68), in one
session, interleaved.

Each run starts a fresh hub and routes every device message either to `events` alone
(`builtin`) or to `events` and a webhook endpoint of --partitions partitions (`webhook`); then
the Rust load generator (`loadgen`) sends --devices x --messages QoS 1 telemetry over MQTT/TLS.
Reported per run: the generator's throughput and PUBACK p50/p99 (what a device sees), and for
`webhook` what the receiver saw: the time until it held every message, the delivery rate
(messages / that time, from the first message sent) and the latency from enqueueing
(`iothub-enqueuedtime`) to receipt, p50/p99. The receiver is an asyncio HTTPS server in a
process of its own that answers 200 at once.

Usage:
  ~/.cache/ferrohub/venv/bin/python bench/routing_endpoints.py [--bin FERROHUB] [--loadgen PATH]
      [--devices 50] [--messages 200] [--partitions 4] [--repeats 3] [--out FILE.json]

Bounded: every run has the generator's --time-limit and a 120 s wait for deliveries.
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


def one_run(mode: str, args, work: Path, tls: tuple[Path, Path, Path]) -> dict:
    from hubkit import Hub

    hub = Hub(work / f"hub-{mode}-{time.monotonic_ns()}").start()
    receiver = None
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
        return result
    finally:
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
    ap.add_argument("--out")
    args = ap.parse_args()
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
        for mode in ("builtin", "webhook"):
            runs.append(one_run(mode, args, work, (ca, cert, key)))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    med = lambda mode, k: statistics.median(r[k] for r in runs if r["mode"] == mode and r.get(k) is not None)  # noqa: E731
    summary = {
        "devices": args.devices, "messages_per_device": args.messages, "partitions": args.partitions,
        "repeats": args.repeats,
        "builtin": {k: med("builtin", k) for k in ("msgs_per_s", "puback_p50_ms", "puback_p99_ms")},
        "webhook": {k: med("webhook", k) for k in ("msgs_per_s", "puback_p50_ms", "puback_p99_ms", "delivered_per_s",
                                                   "all_received_s", "delivery_p50_ms", "delivery_p99_ms")},
        "runs": runs,
    }
    summary["ingest_ratio_webhook_to_builtin"] = round(summary["webhook"]["msgs_per_s"] /
                                                        summary["builtin"]["msgs_per_s"], 2)
    text = json.dumps(summary, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
