"""AMQ-4, D2C-6 with the unmodified official Node Event Hubs SDK (@azure/event-hubs 6.0.4, pinned
in tests/node/package-lock.json and installed by scripts/lib.sh): `EventHubConsumerClient.subscribe`
reads the built-in endpoint the way the Python SDK does.

- From the earliest position it gets every event devices sent over HTTPS exactly once, in order
  per device, with the device id in the system properties (`iothub-connection-device-id`), the
  enqueued time, the application properties and the body as sent, and the same partition,
  sequence number, offset and enqueued time the Python SDK (`azure-eventhub`) reads.
- `getEventHubProperties` / `getPartitionProperties` agree with the Python SDK's
  `get_eventhub_properties` / `get_partition_properties` and with what was sent.
- A start position by sequence number on one partition returns exactly the later events
  (and, inclusive, that event too).

The SDK runs in its own node process (tests/node/eventhubs.js) on the hub's ephemeral AMQP port
(`customEndpointAddress`); it trusts the hub's CA through NODE_EXTRA_CA_CERTS.
"""

import datetime
import json
import os
import subprocess
import zlib
from pathlib import Path

from ehkit import consumer, device_of, event_hubs_connection_string, prop, read
from hubkit import REPO
from routingkit import BUILTIN_PARTITIONS, HUB_NAME, send_http

NODE_DIR = Path(os.environ.get("FERROHUB_NODE", Path.home() / ".cache" / "ferrohub" / "node"))
EVENTHUBS_JS = str(REPO / "tests" / "node" / "eventhubs.js")
PER_DEVICE = 8


def node_env(hub):
    modules = NODE_DIR / "node_modules"
    assert modules.is_dir(), f"the Node SDKs are not installed in {NODE_DIR}: run scripts/test-all.sh"
    return dict(os.environ, NODE_PATH=str(modules), NODE_EXTRA_CA_CERTS=hub.ca)


def node(hub, timeout_ms=60000, **config):
    """Runs eventhubs.js; returns (exit code, stdout JSON lines, stderr JSON lines)."""
    config = {"connectionString": event_hubs_connection_string(hub), "consumerGroup": "$Default",
              "customEndpointAddress": f"amqps://localhost:{hub.amqp_port}", "timeoutMs": timeout_ms, **config}
    done = subprocess.run(["node", EVENTHUBS_JS, json.dumps(config)], capture_output=True, text=True,
                          timeout=timeout_ms / 1000 + 30, env=node_env(hub))

    def lines(text):
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # Node's own warnings
        return out

    return done.returncode, lines(done.stdout), lines(done.stderr), done.stderr


def node_read(hub, expected, **config):
    code, events, errors, stderr = node(hub, expected=expected, **config)
    assert code == 0, f"exit {code}; {len(events)} of {expected} events; stderr {stderr[-3000:]}"
    return events, errors


def devices(n, prefix):
    """n device ids in n different partitions (the hub puts a device's events in
    crc32(id) % partitions, engine/src/slots.rs), so several partitions are read."""
    out, taken, k = [], set(), 0
    while len(out) < n:
        d, k = f"{prefix}-{k}", k + 1
        p = zlib.crc32(d.encode()) % BUILTIN_PARTITIONS
        if p not in taken:
            taken.add(p)
            out.append(d)
    return out


def send(hub, device_ids, n=PER_DEVICE):
    """Each device sends n JSON events with application properties; returns the send window."""
    for d in device_ids:
        hub.create_device(d)
    before = datetime.datetime.now(datetime.timezone.utc)
    for i in range(n):
        for d in device_ids:
            send_http(hub, d, json.dumps({"i": i, "from": d}), mid=f"{d}-{i}",
                      props={"i": str(i), "sender": d}, ct="application/json", ce="utf-8")
    return before, datetime.datetime.now(datetime.timezone.utc)


def ms(t):
    return round(t.timestamp() * 1000)


def test_subscribe_reads_every_event_once_in_order_with_iot_hub_properties(hub):
    ids = devices(3, "node-eh")
    before, after = send(hub, ids)
    n = len(ids) * PER_DEVICE
    events, errors = node_read(hub, n, startPosition="earliest")
    assert errors == []
    assert len(events) == n, "no event twice (surplus delivered while closing is printed too)"
    by_device = {}
    for e in events:
        by_device.setdefault(e["systemProperties"]["iothub-connection-device-id"], []).append(e)
    assert sorted(by_device) == sorted(ids)
    for d, mine in by_device.items():
        assert [e["properties"]["i"] for e in mine] == [str(i) for i in range(PER_DEVICE)], "in order per device"
        assert len({e["partitionId"] for e in mine}) == 1, "one partition per device"
        for i, e in enumerate(mine):
            assert e["properties"] == {"i": str(i), "sender": d}
            assert json.loads(e["body"]) == {"i": i, "from": d}
            assert e["messageId"] == f"{d}-{i}"
            assert e["contentType"] == "application/json"
            assert ms(before) - 1 <= e["enqueuedTimeUtc"] <= ms(after) + 1
            sp = e["systemProperties"]
            assert sp["iothub-message-source"] == "Telemetry"
            assert sp["iothub-connection-device-id"] == d
            assert sp["iothub-enqueuedtime"] == e["enqueuedTimeUtc"], "the same instant, as IoT Hub names it"
            assert sp["contentEncoding"] == "utf-8"  # the AMQP content-encoding, as Node names it
            assert sp["messageId"] == e["messageId"]
        seqs = [e["sequenceNumber"] for e in mine]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert len({mine[0]["partitionId"] for mine in by_device.values()}) == len(ids), "several partitions read"

    # The same events as the Python SDK reads: partition, sequence number, offset, enqueued time.
    py = read(hub, n, starting_position="-1")
    assert not py.errors
    mine = {(e["partitionId"], e["sequenceNumber"]): e for e in events}
    theirs = {(pid, ev.sequence_number): ev for pid, ev in py.events}
    assert set(mine) == set(theirs)
    for key, ev in theirs.items():
        e = mine[key]
        assert str(e["offset"]) == str(ev.offset)
        assert e["enqueuedTimeUtc"] == ms(ev.enqueued_time)
        assert e["systemProperties"]["iothub-connection-device-id"] == device_of(ev)
        assert e["properties"]["i"] == prop(ev, "i")
        assert e["body"] == ev.body_as_str()


def test_properties_agree_with_the_python_sdk_and_a_sequence_number_start(hub):
    ids = devices(2, "node-pp")
    send(hub, ids)
    events, _ = node_read(hub, len(ids) * PER_DEVICE, startPosition="earliest")

    code, out, _, stderr = node(hub, op="properties", timeout_ms=30000)
    assert code == 0, stderr[-3000:]
    [got] = out
    client = consumer(hub)
    try:
        hub_props = client.get_eventhub_properties()
        assert got["eventHub"]["name"] == hub_props["eventhub_name"] == HUB_NAME
        assert got["eventHub"]["partitionIds"] == hub_props["partition_ids"] \
            == [str(p) for p in range(BUILTIN_PARTITIONS)]
        assert got["eventHub"]["createdOn"] == ms(hub_props["created_at"])
        assert [p["partitionId"] for p in got["partitions"]] == hub_props["partition_ids"]
        for p in got["partitions"]:
            py = client.get_partition_properties(p["partitionId"])
            mine = [e for e in events if e["partitionId"] == p["partitionId"]]
            assert p["eventHubName"] == py["eventhub_name"] == HUB_NAME
            assert p["isEmpty"] == py["is_empty"] == (not mine)
            if not mine:
                continue
            last = max(mine, key=lambda e: e["sequenceNumber"])
            assert p["lastEnqueuedSequenceNumber"] == py["last_enqueued_sequence_number"] == last["sequenceNumber"]
            assert p["beginningSequenceNumber"] == py["beginning_sequence_number"] \
                == min(e["sequenceNumber"] for e in mine)
            assert str(p["lastEnqueuedOffset"]) == str(py["last_enqueued_offset"]) == str(last["offset"])
            assert p["lastEnqueuedOnUtc"] == ms(py["last_enqueued_time_utc"]) == last["enqueuedTimeUtc"]
    finally:
        client.close()

    # A start by sequence number on one partition: exactly the events after it (in order), or
    # from it with isInclusive. `expected` is the count wanted, and every event delivered up to
    # the close is printed, so an earlier event shows as a wrong first element, a surplus as a
    # longer list.
    pid = events[0]["partitionId"]
    partition = sorted((e for e in events if e["partitionId"] == pid), key=lambda e: e["sequenceNumber"])
    pivot = partition[3]["sequenceNumber"]
    later = [e["sequenceNumber"] for e in partition if e["sequenceNumber"] > pivot]
    got, _ = node_read(hub, len(later), partitionId=pid, startPosition={"sequenceNumber": pivot})
    assert [e["sequenceNumber"] for e in got] == later
    assert {e["partitionId"] for e in got} == {pid}
    assert [e["properties"]["i"] for e in got] == [e["properties"]["i"] for e in partition[4:]]
    got, _ = node_read(hub, len(later) + 1, partitionId=pid,
                       startPosition={"sequenceNumber": pivot, "isInclusive": True})
    assert [e["sequenceNumber"] for e in got] == [pivot] + later
