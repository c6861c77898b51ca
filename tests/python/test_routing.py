"""EVT-1..EVT-6: message routing and non-telemetry events, end to end through a real hub.

- Non-telemetry events (connection state, lifecycle, twin change) read back through the read
  API, field by field against seed 004's schema and examples, for devices and modules.
- Connection state sequence numbers: strictly increasing as strings, also across a restart.
- The routing query language on real device messages (HTTPS and MQTT), fallback, disabled
  routes, live route changes, refusal of malformed conditions.
- Enrichments with the twin's current value, static values and $iothubname, per endpoint.
- Defaults (no routes: all telemetry in `events`, no non-telemetry event anywhere).
- The configuration file's [routing] section.
"""

import base64
import json
import re
import time
import urllib.parse
from datetime import datetime, timezone

import pytest
import requests

from hubkit import Hub
from mqttraw import PUBLISH, connect_device

HUB_NAME = "ferrohub"
ISO7 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{7}Z$")
HEX64 = re.compile(r"^[0-9A-F]{64}$")
BUILTIN_PARTITIONS = 4

CONN = ("deviceConnectionStateEvents", "deviceConnectionStateNotification")
LIFE = ("deviceLifecycleEvents", "deviceLifecycleNotification")
TWIN = ("twinChangeEvents", "twinChangeNotification")


# -- credentials (cached: hub.token() runs the CLI) ---------------------------------------------

_tokens: dict = {}


def owner(hub) -> str:
    key = (str(hub.data_dir), hub.port, "iothubowner")
    if key not in _tokens:
        _tokens[key] = hub.token("iothubowner")
    return _tokens[key]


def service(hub) -> str:
    key = (str(hub.data_dir), hub.port, "service")
    if key not in _tokens:
        _tokens[key] = hub.token("service")
    return _tokens[key]


def dev_token(hub, device_id, module_id=None) -> str:
    key = (str(hub.data_dir), "device", device_id, module_id)
    if key not in _tokens:
        _tokens[key] = hub.device_token(device_id, module_id)
    return _tokens[key]


# -- the read API ---------------------------------------------------------------------------------

def read_endpoint(hub, name: str) -> list:
    """Every event of every partition of an endpoint (`events` or a custom one), partition by
    partition, each partition in stored order (hubkit reads them)."""
    return hub.read_endpoint(name)


def body(e) -> bytes:
    return base64.b64decode(e["body"])


def jbody(e):
    return json.loads(body(e))


def source(e) -> str:
    return e["systemProperties"].get("iothub-message-source")


def mids(events) -> list:
    """Sorted message ids of the telemetry among `events` (duplicates kept)."""
    return sorted(e["systemProperties"].get("message-id") for e in events if source(e) == "Telemetry")


def wait_until(read, done, timeout=10.0, interval=0.05):
    """Calls read() until done(value) or the timeout; returns the last value."""
    deadline = time.time() + timeout
    while True:
        value = read()
        if done(value) or time.time() > deadline:
            return value
        time.sleep(interval)


def wait_count(hub, endpoint, n, pred=lambda e: True, timeout=10.0):
    """The endpoint's events matching pred once there are at least n of them (or the timeout)."""
    return wait_until(lambda: [e for e in read_endpoint(hub, endpoint) if pred(e)], lambda v: len(v) >= n, timeout)


# -- routing API ---------------------------------------------------------------------------------

def put_endpoint(hub, name, partitions=1):
    r = hub.request("PUT", f"/routing/endpoints/{name}", owner(hub), json={"partitionCount": partitions})
    assert r.status_code == 201, r.text
    assert r.json() == {"name": name, "partitionCount": partitions}


def put_route(hub, name, src, condition, endpoints, enabled=True):
    r = hub.request("PUT", f"/routing/routes/{name}", owner(hub),
                    json={"source": src, "condition": condition, "endpointNames": endpoints, "isEnabled": enabled})
    assert r.status_code == 200, r.text
    return r.json()


def put_enrichment(hub, key, value, endpoints):
    r = hub.request("PUT", f"/routing/enrichments/{key}", owner(hub), json={"value": value, "endpointNames": endpoints})
    assert r.status_code == 200, r.text
    return r.json()


def set_fallback(hub, on: bool):
    r = hub.request("PUT", "/routing/fallback", owner(hub), json={"isEnabled": on})
    assert r.status_code == 200, r.text
    assert r.json() == {"isEnabled": on}


def get_routing(hub) -> dict:
    r = hub.request("GET", "/routing", owner(hub))
    assert r.status_code == 200, r.text
    return r.json()


# -- devices ---------------------------------------------------------------------------------------

def send_http(hub, device_id, payload=b"x", mid=None, props=None, ct=None, ce=None):
    headers = {}
    if mid is not None:
        headers["iothub-messageid"] = mid
    if ct is not None:
        headers["Content-Type"] = ct
    if ce is not None:
        headers["Content-Encoding"] = ce
    for k, v in (props or {}).items():
        headers[f"iothub-app-{k}"] = v
    data = payload.encode() if isinstance(payload, str) else payload
    r = hub.request("POST", f"/devices/{device_id}/messages/events", dev_token(hub, device_id), data=data, headers=headers)
    assert r.status_code == 204, r.text


def send_mqtt(hub, device_id, bag, payload, module_id=None):
    """One QoS 1 message over raw MQTT, acknowledged, then a clean disconnect."""
    c = connect_device(hub, device_id, module_id, password=dev_token(hub, device_id, module_id))
    try:
        topic = f"devices/{device_id}/" + (f"modules/{module_id}/" if module_id else "") + f"messages/events/{bag}"
        c.publish(topic, payload, qos=1, pkid=7)
        assert c.expect_puback(7)
        c.disconnect()
    finally:
        c.close()


def read_publish(c, timeout=10):
    ptype, flags, data = c.read(timeout)
    for _ in range(100):
        if ptype == PUBLISH:
            break
        ptype, flags, data = c.read(timeout)
    assert ptype == PUBLISH
    n = int.from_bytes(data[:2], "big")
    topic = data[2:2 + n].decode()
    offset = 2 + n + (2 if flags & 0x06 else 0)
    return topic, data[offset:]


def twin_get(hub, device_id, module_id=None) -> dict:
    path = f"/twins/{device_id}" + (f"/modules/{module_id}" if module_id else "")
    r = hub.request("GET", path, service(hub))
    assert r.status_code == 200, r.text
    return r.json()


def twin_write(hub, device_id, doc, module_id=None, method="PATCH") -> dict:
    path = f"/twins/{device_id}" + (f"/modules/{module_id}" if module_id else "")
    r = hub.request(method, path, service(hub), json=doc, headers={"If-Match": "*"})
    assert r.status_code == 200, r.text
    return r.json()


def connection_state(hub, device_id, module_id=None) -> str:
    path = f"/devices/{device_id}" + (f"/modules/{module_id}" if module_id else "")
    r = hub.request("GET", path, owner(hub))
    assert r.status_code == 200, r.text
    return r.json()["connectionState"]


# -- times -----------------------------------------------------------------------------------------

def iso_ms(text: str) -> int:
    """Milliseconds since the epoch of an ISO 8601 UTC time with 0 to 7 fraction digits."""
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,7}))?Z$", text)
    assert m, f"not an ISO 8601 UTC time: {text!r}"
    base = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    frac = (m.group(2) or "").ljust(7, "0")
    return int(base.timestamp()) * 1000 + int(frac) // 10_000


def now_ms() -> int:
    return int(time.time() * 1000)


# -- 1. non-telemetry events against seed 004 -----------------------------------------------------

def check_event(e, kind, op, device_id, module_id=None, window=None, module_system=None):
    """The common shape of a non-telemetry event (seed 004): exact system and application
    properties. `module_system`: whether iothub-connection-module-id is expected (modules'
    lifecycle and twin events only)."""
    message_source, schema = kind
    if module_system is None:
        module_system = module_id is not None and kind != CONN
    sp = e["systemProperties"]
    expected_sys = {"content-type", "content-encoding", "correlation-id", "user-id", "iothub-connection-device-id",
                    "iothub-message-source", "iothub-enqueuedtime"}
    if module_system:
        expected_sys.add("iothub-connection-module-id")
    assert set(sp) == expected_sys, (op, sorted(sp))
    assert sp["content-type"] == "application/json"
    assert sp["content-encoding"] == "utf-8"
    assert isinstance(sp["correlation-id"], str) and sp["correlation-id"] != ""
    assert sp["user-id"] == HUB_NAME
    assert sp["iothub-connection-device-id"] == device_id
    if module_system:
        assert sp["iothub-connection-module-id"] == module_id
    assert sp["iothub-message-source"] == message_source
    iso_ms(sp["iothub-enqueuedtime"])

    ap = e["properties"]
    expected_app = {"hubName": HUB_NAME, "deviceId": device_id, "opType": op, "iothub-message-schema": schema}
    if module_id is not None:
        expected_app["moduleId"] = module_id
    stamp = ap.get("operationTimestamp")
    assert {k: v for k, v in ap.items() if k != "operationTimestamp"} == expected_app, (op, ap)
    assert stamp is not None and ISO7.match(stamp), (op, stamp)
    if window is not None:
        lo, hi = window
        assert lo - 1000 <= iso_ms(stamp) <= hi + 1000, (op, stamp, lo, hi)
    # The event is enqueued after the operation.
    assert iso_ms(sp["iothub-enqueuedtime"]) >= iso_ms(stamp) - 1
    return jbody(e)


def check_lifecycle_body(b, twin, device_id, module_id=None):
    """A lifecycle body is the twin: ids, etag, version, tags when there are tags, both
    property sections with $metadata.$lastUpdated and $version."""
    expected_keys = {"deviceId", "etag", "version", "properties"}
    if module_id is not None:
        expected_keys.add("moduleId")
        assert b["moduleId"] == module_id
    if twin.get("tags"):
        expected_keys.add("tags")
        assert b["tags"] == twin["tags"]
    assert set(b) == expected_keys, sorted(b)
    assert b["deviceId"] == device_id
    assert b["etag"] == twin["etag"]
    assert b["version"] == twin["version"]
    assert set(b["properties"]) == {"desired", "reported"}
    for section in ("desired", "reported"):
        got, want = b["properties"][section], twin["properties"][section]
        assert {k: v for k, v in got.items() if not k.startswith("$")} == \
            {k: v for k, v in want.items() if not k.startswith("$")}, section
        assert got["$version"] == want["$version"], section
        assert ISO7.match(got["$metadata"]["$lastUpdated"]), got["$metadata"]
        assert iso_ms(got["$metadata"]["$lastUpdated"]) == iso_ms(want["$metadata"]["$lastUpdated"]), section


def test_non_telemetry_events_match_seed_004(hub):
    dev, mod = "schema-dev", "module-1"
    put_endpoint(hub, "notes", 1)
    put_route(hub, "conn", "DeviceConnectionStateEvents", "true", ["notes", "events"])
    put_route(hub, "life", "DeviceLifecycleEvents", "true", ["notes", "events"])
    put_route(hub, "twin", "TwinChangeEvents", "true", ["notes", "events"])

    steps = []   # (window, twin or response snapshot) per expected event, in production order

    def step(action, expect_total):
        t0 = now_ms()
        snapshot = action()
        got = wait_count(hub, "notes", expect_total)
        assert len(got) == expect_total, f"expected {expect_total} events in notes, got {[e['properties'].get('opType') for e in got]}"
        steps.append(((t0, now_ms()), snapshot))

    # 1, 2: lifecycle create (device, module).
    step(lambda: hub.create_device(dev) and twin_get(hub, dev), 1)
    step(lambda: hub.create_module(dev, mod) and twin_get(hub, dev, mod), 2)

    # 3..5: the device connects, patches reported over MQTT, disconnects.
    holder = {}

    def device_connect():
        holder["c"] = connect_device(hub, dev, password=dev_token(hub, dev))

    step(device_connect, 3)

    def reported_patch():
        c = holder["c"]
        assert c.subscribe([("$iothub/twin/res/#", 0)]) == [0]
        c.publish("$iothub/twin/PATCH/properties/reported/?$rid=1", json.dumps({"fw": "2.1", "battery": 87}).encode(), qos=0)
        topic, _ = read_publish(c)
        assert topic.startswith("$iothub/twin/res/204/?$rid=1"), topic
        return twin_get(hub, dev)

    step(reported_patch, 4)

    def device_disconnect():
        holder["c"].disconnect()
        holder["c"].close()

    step(device_disconnect, 5)

    # 6, 7: the module connects and disconnects.
    def module_connect():
        holder["m"] = connect_device(hub, dev, mod, password=dev_token(hub, dev, mod))

    step(module_connect, 6)

    def module_disconnect():
        holder["m"].disconnect()
        holder["m"].close()

    step(module_disconnect, 7)

    # 8: seed 004's twin change example: a tag and a desired property of a module twin.
    step(lambda: twin_write(hub, dev, {"tags": {"tag1": "new value"}, "properties": {"desired": {"property1": "new value"}}}, mod), 8)
    # 9: replace the module twin.
    step(lambda: twin_write(hub, dev, {"tags": {"only": "this"}, "properties": {"desired": {"p2": 2}}}, mod, "PUT"), 9)
    # 10: a device twin update with tags only.
    step(lambda: twin_write(hub, dev, {"tags": {"site": "lab"}}), 10)

    # 11, 12: lifecycle delete (module, then device); the body is the twin as it was.
    def delete_module():
        before = twin_get(hub, dev, mod)
        assert hub.request("DELETE", f"/devices/{dev}/modules/{mod}", owner(hub), headers={"If-Match": "*"}).status_code == 204
        return before

    step(delete_module, 11)

    def delete_device():
        before = twin_get(hub, dev)
        assert hub.request("DELETE", f"/devices/{dev}", owner(hub), headers={"If-Match": "*"}).status_code == 204
        return before

    step(delete_device, 12)

    events = read_endpoint(hub, "notes")
    assert len(events) == 12
    ops = [(e["properties"].get("opType"), e["properties"].get("moduleId")) for e in events]
    assert ops == [
        ("createDeviceIdentity", None), ("createDeviceIdentity", mod),
        ("deviceConnected", None), ("updateTwin", None), ("deviceDisconnected", None),
        ("deviceConnected", mod), ("deviceDisconnected", mod),
        ("updateTwin", mod), ("replaceTwin", mod), ("updateTwin", None),
        ("deleteDeviceIdentity", mod), ("deleteDeviceIdentity", None),
    ]
    # Correlation ids identify events: all distinct.
    assert len({e["systemProperties"]["correlation-id"] for e in events}) == 12
    w = [s[0] for s in steps]
    snap = [s[1] for s in steps]

    # Lifecycle create: device, then module.
    b = check_event(events[0], LIFE, "createDeviceIdentity", dev, window=w[0])
    check_lifecycle_body(b, snap[0], dev)
    assert b["version"] == 1
    assert b["properties"]["desired"]["$version"] == 1 and b["properties"]["reported"]["$version"] == 1
    b = check_event(events[1], LIFE, "createDeviceIdentity", dev, mod, window=w[1])
    check_lifecycle_body(b, snap[1], dev, mod)
    assert b["version"] == 1

    # Connection state: body is only the sequence number.
    conn_events = [(2, "deviceConnected", None), (4, "deviceDisconnected", None),
                   (5, "deviceConnected", mod), (6, "deviceDisconnected", mod)]
    seqs = []
    for i, op, m in conn_events:
        b = check_event(events[i], CONN, op, dev, m, window=w[i])
        assert set(b) == {"sequenceNumber"}, b
        assert isinstance(b["sequenceNumber"], str) and HEX64.match(b["sequenceNumber"]), b
        seqs.append(b["sequenceNumber"])
    assert seqs == sorted(seqs) and len(set(seqs)) == 4, seqs

    # Reported patch over MQTT: updateTwin with properties.reported.
    t = snap[3]
    b = check_event(events[3], TWIN, "updateTwin", dev, window=w[3])
    rep_meta = t["properties"]["reported"]["$metadata"]
    stamp = b["properties"]["reported"]["$metadata"]["$lastUpdated"]
    assert ISO7.match(stamp) and iso_ms(stamp) == iso_ms(rep_meta["fw"]["$lastUpdated"])
    assert b == {
        "version": t["version"],
        "properties": {"reported": {
            "fw": "2.1", "battery": 87,
            "$metadata": {"$lastUpdated": stamp, "fw": {"$lastUpdated": stamp}, "battery": {"$lastUpdated": stamp}},
            "$version": t["properties"]["reported"]["$version"],
        }},
    }
    assert t["properties"]["reported"]["$version"] == 2 and t["version"] == 2

    # Seed 004's example: tags and desired of a module twin.
    r = snap[7]
    b = check_event(events[7], TWIN, "updateTwin", dev, mod, window=w[7])
    stamp = b["properties"]["desired"]["$metadata"]["$lastUpdated"]
    assert ISO7.match(stamp), stamp
    assert iso_ms(stamp) == iso_ms(r["properties"]["desired"]["$metadata"]["$lastUpdated"])
    dv = r["properties"]["desired"]["$version"]
    assert dv == 2 and r["version"] == 2
    assert b == {
        "version": r["version"],
        "tags": {"tag1": "new value"},
        "properties": {"desired": {
            "property1": "new value",
            "$metadata": {"$lastUpdated": stamp, "$lastUpdatedVersion": dv,
                          "property1": {"$lastUpdated": stamp, "$lastUpdatedVersion": dv}},
            "$version": dv,
        }},
    }

    # Replace: the whole twin (ids, etag, version, all tags, properties and metadata).
    r = snap[8]
    b = check_event(events[8], TWIN, "replaceTwin", dev, mod, window=w[8])
    replaced = b
    assert b["version"] == r["version"] == 3
    assert b["tags"] == {"only": "this"}
    desired = b["properties"]["desired"]
    assert {k: v for k, v in desired.items() if not k.startswith("$")} == {"p2": 2}
    assert desired["$version"] == r["properties"]["desired"]["$version"] == 3
    assert ISO7.match(desired["$metadata"]["$lastUpdated"])
    assert iso_ms(desired["$metadata"]["$lastUpdated"]) == iso_ms(r["properties"]["desired"]["$metadata"]["$lastUpdated"])
    assert "property1" not in desired and "property1" not in desired["$metadata"]
    reported = b["properties"]["reported"]
    assert reported["$version"] == r["properties"]["reported"]["$version"]
    assert "$lastUpdated" in reported["$metadata"]

    # Device twin update with tags only: version and tags, no properties.
    r = snap[9]
    b = check_event(events[9], TWIN, "updateTwin", dev, window=w[9])
    assert b == {"version": r["version"], "tags": {"site": "lab"}}
    assert r["version"] == 3   # 1 at creation, 2 after the reported patch, 3 now

    # Lifecycle delete: the twin as it was.
    b = check_event(events[10], LIFE, "deleteDeviceIdentity", dev, mod, window=w[10])
    check_lifecycle_body(b, snap[10], dev, mod)
    assert b["tags"] == {"only": "this"} and b["version"] == 3
    b = check_event(events[11], LIFE, "deleteDeviceIdentity", dev, window=w[11])
    check_lifecycle_body(b, snap[11], dev)
    assert b["tags"] == {"site": "lab"} and b["properties"]["reported"]["fw"] == "2.1"

    # The same events reached `events` too (each route names both endpoints), once each.
    builtin = [e for e in read_endpoint(hub, "events") if source(e) != "Telemetry"]
    assert sorted(e["systemProperties"]["correlation-id"] for e in builtin) == \
        sorted(e["systemProperties"]["correlation-id"] for e in events)

    # Seed 004: on a replacement the body has the device id, module id and twin etag too.
    r = snap[8]
    assert replaced.get("deviceId") == dev, f"replaceTwin body lacks deviceId: {replaced}"
    assert replaced.get("moduleId") == mod, f"replaceTwin body lacks moduleId: {replaced}"
    assert replaced.get("etag") == r["etag"], f"replaceTwin body etag {replaced.get('etag')!r} != twin etag {r['etag']!r}"
    assert set(replaced) == {"deviceId", "moduleId", "etag", "version", "tags", "properties"}, sorted(replaced)


def test_conditions_on_non_telemetry_routes(hub):
    """Routes on the other sources evaluate conditions against the event's properties and its
    JSON body; fallback never takes non-telemetry events."""
    for e in ("mod-deletes", "tag-changes", "b-connects", "rep", "sent"):
        put_endpoint(hub, e, 1)
    put_route(hub, "life-del", "DeviceLifecycleEvents", "opType = 'deleteDeviceIdentity' AND IS_DEFINED(moduleId)", ["mod-deletes"])
    put_route(hub, "twin-tag", "TwinChangeEvents", "$body.tags.tag1 = 'go' AND hubName = 'ferrohub'", ["tag-changes"])
    put_route(hub, "conn-b", "DeviceConnectionStateEvents", "$connectionDeviceId = 'nt-b' AND opType = 'deviceConnected'", ["b-connects"])
    put_route(hub, "twin-rep", "TwinChangeEvents", "IS_DEFINED($body.properties.reported.fw) AND $userId = 'ferrohub'", ["rep"])
    put_route(hub, "sentinel", "DeviceLifecycleEvents", "deviceId = 'nt-sentinel'", ["sent"])
    hub.create_device("nt-a")
    hub.create_device("nt-b")
    hub.create_module("nt-a", "m")
    twin_write(hub, "nt-a", {"tags": {"tag1": "go"}})
    twin_write(hub, "nt-a", {"tags": {"tag1": "stop"}})
    twin_write(hub, "nt-a", {"tags": {"tag1": "go"}}, "m")
    for d in ("nt-a", "nt-b", "nt-b"):
        c = connect_device(hub, d, password=dev_token(hub, d))
        if d == "nt-b":
            c.subscribe([("$iothub/twin/res/#", 0)])
            c.publish("$iothub/twin/PATCH/properties/reported/?$rid=3", json.dumps({"fw": "9"}).encode(), qos=0)
            assert read_publish(c)[0].startswith("$iothub/twin/res/204/")
        c.disconnect()
        c.close()
        assert wait_until(lambda: connection_state(hub, d), lambda s: s == "Disconnected") == "Disconnected"
    assert hub.request("DELETE", "/devices/nt-a/modules/m", owner(hub), headers={"If-Match": "*"}).status_code == 204
    assert hub.request("DELETE", "/devices/nt-b", owner(hub), headers={"If-Match": "*"}).status_code == 204
    hub.create_device("nt-sentinel")
    assert len(wait_count(hub, "sent", 1)) == 1

    def ops(endpoint):
        return [(e["properties"]["deviceId"], e["properties"].get("moduleId"), e["properties"]["opType"])
                for e in read_endpoint(hub, endpoint)]

    assert ops("mod-deletes") == [("nt-a", "m", "deleteDeviceIdentity")]
    assert ops("tag-changes") == [("nt-a", None, "updateTwin"), ("nt-a", "m", "updateTwin")]
    assert ops("b-connects") == [("nt-b", None, "deviceConnected"), ("nt-b", None, "deviceConnected")]
    assert ops("rep") == [("nt-b", None, "updateTwin"), ("nt-b", None, "updateTwin")]
    assert [jbody(e)["properties"]["reported"]["fw"] for e in read_endpoint(hub, "rep")] == ["9", "9"]
    # Fallback is on, but it is for device messages only.
    assert [source(e) for e in read_endpoint(hub, "events")] == []


# -- 2. connection state sequence numbers ---------------------------------------------------------

def test_connection_sequence_numbers_increase_across_cycles_and_restart(hub):
    devices = ["seq-a", "seq-b"]
    for d in devices:
        hub.create_device(d)
    put_endpoint(hub, "conn", 1)
    put_route(hub, "conn", "DeviceConnectionStateEvents", "true", ["conn"])
    produced = []   # (device, opType) in production order

    def cycles(n):
        for _ in range(n):
            for d in devices:
                c = connect_device(hub, d, password=dev_token(hub, d))
                produced.append((d, "deviceConnected"))
                got = wait_count(hub, "conn", len(produced))
                assert len(got) == len(produced), f"connect of {d}: {len(got)} events, expected {len(produced)}"
                c.disconnect()
                c.close()
                produced.append((d, "deviceDisconnected"))
                got = wait_count(hub, "conn", len(produced))
                assert len(got) == len(produced), f"disconnect of {d}: {len(got)} events, expected {len(produced)}"

    cycles(10)
    before = len(produced)
    assert before == 40
    hub.stop()
    hub.start()
    cycles(5)
    assert len(produced) == 60

    events = read_endpoint(hub, "conn")
    assert [(e["properties"]["deviceId"], e["properties"]["opType"]) for e in events] == produced
    seqs = [jbody(e)["sequenceNumber"] for e in events]
    for s in seqs:
        assert isinstance(s, str) and HEX64.match(s), s
    # Strictly increasing as strings in production order, before, across and after the restart.
    for i in range(1, len(seqs)):
        assert seqs[i - 1] < seqs[i], (i, seqs[i - 1], seqs[i])
    assert seqs[before - 1] < seqs[before]
    # Sorting by the string gives production order; and the hex value agrees.
    assert sorted(range(len(seqs)), key=lambda i: seqs[i]) == list(range(len(seqs)))
    assert [int(s, 16) for s in seqs] == sorted(int(s, 16) for s in seqs)
    # Operation timestamps follow production order too.
    stamps = [iso_ms(e["properties"]["operationTimestamp"]) for e in events]
    assert stamps == sorted(stamps)
    for e in events:
        check_event(e, CONN, e["properties"]["opType"], e["properties"]["deviceId"])


# -- 3. routing API and queries -------------------------------------------------------------------

def test_routing_api_shape_and_validation(hub):
    assert get_routing(hub) == {"routes": [], "fallbackRoute": {"isEnabled": True}, "enrichments": [],
                                "endpoints": [{"name": "events", "partitionCount": BUILTIN_PARTITIONS}]}
    put_endpoint(hub, "cold", 3)
    r = hub.request("GET", "/endpoints/cold/partitions", service(hub))
    assert r.status_code == 200, r.text
    assert [p["partitionId"] for p in r.json()] == ["0", "1", "2"]
    assert all(p["isEmpty"] for p in r.json())
    route = {"source": "DeviceMessages", "condition": "level = 'x'", "endpointNames": ["cold"], "isEnabled": True}
    r = hub.request("PUT", "/routing/routes/r1", owner(hub), json=route)
    assert r.status_code == 200, r.text
    assert r.json() == {"name": "r1", **route}
    assert put_enrichment(hub, "k", "v", ["cold"]) == {"key": "k", "value": "v", "endpointNames": ["cold"]}
    set_fallback(hub, False)
    good = {"routes": [{"name": "r1", **route}], "fallbackRoute": {"isEnabled": False},
            "enrichments": [{"key": "k", "value": "v", "endpointNames": ["cold"]}],
            "endpoints": [{"name": "events", "partitionCount": BUILTIN_PARTITIONS}, {"name": "cold", "partitionCount": 3}]}
    assert get_routing(hub) == good

    def refused(path, doc, status=400, code=400004):
        r = hub.request("PUT", path, owner(hub), json=doc)
        assert r.status_code == status, (doc, r.status_code, r.text)
        assert r.json()["errorCode"] == code, (doc, r.text)

    malformed = ["level = ", "level = 'x", "(level = 'x'", "level = 'x')", "level == 'x'", "AND level = 'x'",
                 "level = 'x' AND", "FOO(level)", "STARTS_WITH(level)", "LENGTH()", "$ = 'a'", "$body. = 1",
                 "NOT", "level = 'x' level = 'y'", ""]
    for cond in malformed:
        refused("/routing/routes/bad", {**route, "condition": cond})
        refused("/routing/routes/r1", {**route, "condition": cond})   # replacing an existing one
    refused("/routing/routes/bad", {**route, "endpointNames": ["nowhere"]})
    refused("/routing/routes/bad", {**route, "endpointNames": []})
    refused("/routing/routes/bad", {**route, "source": "Telemetry"})
    refused("/routing/routes/bad", {**route, "source": "DeviceJobLifecycleEvents"})
    refused("/routing/enrichments/e2", {"value": "v", "endpointNames": ["nowhere"]})
    refused("/routing/enrichments/e2", {"value": "$twin.nothing.x", "endpointNames": ["cold"]})
    refused("/routing/enrichments/e2", {"value": "$unknownthing", "endpointNames": ["cold"]})
    # Nothing refused was stored.
    assert get_routing(hub) == good

    # Registry-read may read the configuration but not change it.
    assert hub.request("GET", "/routing", hub.token("registryRead")).status_code == 200
    assert hub.request("PUT", "/routing/fallback", hub.token("registryRead"), json={"isEnabled": True}).status_code == 401
    # An endpoint in use cannot be deleted.
    r = hub.request("DELETE", "/routing/endpoints/cold", owner(hub))
    assert r.status_code == 409, r.text
    assert hub.request("DELETE", "/routing/routes/r1", owner(hub)).status_code == 204
    assert hub.request("DELETE", "/routing/routes/r1", owner(hub)).status_code == 404
    assert hub.request("DELETE", "/routing/endpoints/cold", owner(hub)).status_code == 409   # the enrichment
    assert hub.request("DELETE", "/routing/enrichments/k", owner(hub)).status_code == 204
    assert hub.request("DELETE", "/routing/enrichments/k", owner(hub)).status_code == 404
    assert get_routing(hub)["routes"] == [] and get_routing(hub)["enrichments"] == []


def test_unused_endpoint_can_be_deleted(hub):
    put_endpoint(hub, "warm", 2)
    put_route(hub, "w", "DeviceMessages", "true", ["warm"])
    hub.create_device("del-dev")
    send_http(hub, "del-dev", b"x", mid="w1")
    assert mids(read_endpoint(hub, "warm")) == ["w1"]
    assert hub.request("DELETE", "/routing/endpoints/warm", owner(hub)).status_code == 409
    assert hub.request("DELETE", "/routing/routes/w", owner(hub)).status_code == 204
    # Once no route or enrichment names it, it can be deleted (and quickly: a short timeout,
    # not hubkit's 30 s, so a hang shows as such).
    try:
        r = requests.delete(hub.url("/routing/endpoints/warm"), headers={"Authorization": owner(hub)},
                            verify=hub.ca, timeout=10)
    except requests.exceptions.Timeout:
        pytest.fail("DELETE /routing/endpoints/warm (unused endpoint) got no answer within 10 s")
    assert r.status_code == 204, r.text
    assert hub.request("GET", "/endpoints/warm/partitions", service(hub)).status_code == 404
    assert get_routing(hub)["endpoints"] == [{"name": "events", "partitionCount": BUILTIN_PARTITIONS}]
    # The hub still takes routing changes afterwards.
    put_endpoint(hub, "warm2", 1)
    put_route(hub, "w2", "DeviceMessages", "true", ["warm2"])
    send_http(hub, "del-dev", b"x", mid="w2")
    assert mids(read_endpoint(hub, "warm2")) == ["w2"]


JSON = {"ct": "application/json", "ce": "utf-8"}

ROUTES = {
    # name: (condition, endpoints, enabled)
    "r-eq": ("level = 'critical'", ["ep-eq"], True),
    "r-cmp": ("$body.temp > 30", ["ep-cmp"], True),
    "r-logic": ("(level = 'high' OR level = 'critical') AND NOT (zone = 'lab')", ["ep-logic"], True),
    "r-def": ("IS_DEFINED([x-trace])", ["ep-def"], True),
    "r-str": ("STARTS_WITH($messageId, 'ord-') AND CONTAINS(LOWER(site), 'north') AND LENGTH(code) = 4", ["ep-str"], True),
    "r-body": ("$body.sensor.kind = 'thermo' AND $contentType = 'application/json'", ["ep-body"], True),
    "r-prio": ("prio = '7'", ["ep-prio"], True),
    "r-prionum": ("prio = 7", ["ep-prionum"], True),
    "r-dev": ("$connectionDeviceId = 'qdev-b'", ["ep-dev"], True),
    "r-off": ("true", ["ep-off"], False),
    "r-dup1": ("dup = '1'", ["ep-both-a", "ep-both-b"], True),
    "r-dup2": ("dup = '1' OR dup = '2'", ["ep-both-b"], True),
}
ENDPOINTS = sorted({e for _, eps, _ in ROUTES.values() for e in eps})


def setup_query_routes(hub):
    for e in ENDPOINTS:
        put_endpoint(hub, e, 1)
    for name, (cond, eps, enabled) in ROUTES.items():
        put_route(hub, name, "DeviceMessages", cond, eps, enabled)


def check_routed(hub, expected: dict):
    """expected: message id -> endpoints; every endpoint must hold exactly its messages, once."""
    want = {e: [] for e in ENDPOINTS + ["events"]}
    for mid, eps in expected.items():
        for e in eps:
            want[e].append(mid)
    got = {e: mids(read_endpoint(hub, e)) for e in want}
    assert got == {e: sorted(v) for e, v in want.items()}


def test_routing_conditions_on_device_messages(hub):
    hub.create_device("qdev-a")
    hub.create_device("qdev-b")
    setup_query_routes(hub)
    expected = {}

    def send(mid, eps, payload=b"x", props=None, ct=None, ce=None, device="qdev-a"):
        send_http(hub, device, payload, mid=mid, props=props, ct=ct, ce=ce)
        expected[mid] = eps

    temp31 = json.dumps({"temp": 31.5, "sensor": {"kind": "thermo"}})
    send("m1", ["ep-eq"], props={"level": "critical", "zone": "lab"})
    send("m2", ["ep-logic"], props={"level": "high", "zone": "yard"})
    send("m3", ["events"], props={"level": "high", "zone": "lab"})
    send("m4", ["ep-cmp", "ep-body"], temp31, ct="application/json", ce="utf-8")
    send("m5", ["events"], temp31)                                            # not queryable: no ct/ce
    send("m6", ["events"], json.dumps({"temp": 30}), ct="application/json", ce="utf-8")   # 30 > 30 is false
    send("m7", ["events"], temp31, ct="application/json")                    # no content encoding
    send("m8", ["events"], temp31, ce="utf-8")                               # no content type
    send("m9", ["events"], temp31, ct="text/plain", ce="utf-8")
    send("m10", ["events"], json.dumps({"temp": "31"}), ct="application/json", ce="utf-8")  # string vs number
    send("m11", ["ep-def"], props={"x-trace": "1"})
    send("ord-77", ["ep-str"], props={"site": "North-East", "code": "AB12"})
    send("ord-78", ["events"], props={"site": "south", "code": "AB12"})
    send("ord-79", ["events"], props={"site": "NORTHWEST", "code": "AB123"})
    send("xord-80", ["events"], props={"site": "north", "code": "AB12"})
    send("m12", ["ep-eq", "ep-logic", "ep-def"], props={"level": "critical", "zone": "yard", "x-trace": "on"})
    send("m13", ["ep-prio"], props={"prio": "7"})                            # property values are strings
    send("m14", ["ep-dev", "ep-eq"], props={"level": "critical"}, device="qdev-b")
    send("m15", ["ep-dev"], device="qdev-b")
    send("m16", ["ep-both-a", "ep-both-b"], props={"dup": "1"})               # two routes, same endpoint once
    send("m17", ["ep-both-b"], props={"dup": "2"})
    send("m18", ["events"], props={"level": "Critical"})                    # case-sensitive equality

    # Over MQTT: the property bag carries content type and encoding.
    send_mqtt(hub, "qdev-a", "%24.mid=q1&%24.ct=application%2Fjson&%24.ce=utf-8&level=critical", json.dumps({"temp": 40}))
    expected["q1"] = ["ep-eq", "ep-cmp"]
    send_mqtt(hub, "qdev-a", "%24.mid=q2&level=low", json.dumps({"temp": 40}))
    expected["q2"] = ["events"]
    send_mqtt(hub, "qdev-a", "%24.mid=q3&%24.ct=application%2Fjson&%24.ce=utf-8",
              json.dumps({"temp": 12, "sensor": {"kind": "thermo"}}))
    expected["q3"] = ["ep-body"]
    check_routed(hub, expected)

    # Stored bodies and properties are the device's, unchanged by routing.
    (m4,) = [e for e in read_endpoint(hub, "ep-cmp") if e["systemProperties"].get("message-id") == "m4"]
    assert body(m4) == temp31.encode()
    assert m4["systemProperties"]["content-type"] == "application/json"
    assert m4["systemProperties"]["iothub-connection-device-id"] == "qdev-a"
    (m12,) = [e for e in read_endpoint(hub, "ep-def") if e["systemProperties"].get("message-id") == "m12"]
    assert m12["properties"] == {"level": "critical", "zone": "yard", "x-trace": "on"}


def test_fallback_disabled_routes_and_live_changes(hub):
    hub.create_device("fb-dev")
    setup_query_routes(hub)
    expected = {}

    def send(mid, eps, **kw):
        send_http(hub, "fb-dev", kw.pop("payload", b"x"), mid=mid, **kw)
        expected[mid] = eps

    send("a1", ["events"])
    send("a2", ["ep-eq"], props={"level": "critical"})
    # Fallback off: unmatched messages go nowhere, matched ones still reach their endpoint.
    set_fallback(hub, False)
    assert get_routing(hub)["fallbackRoute"] == {"isEnabled": False}
    send("a3", [])
    send("a4", ["ep-eq"], props={"level": "critical"})
    send_mqtt(hub, "fb-dev", "%24.mid=a5&level=none", b"y")
    expected["a5"] = []
    send_mqtt(hub, "fb-dev", "%24.mid=a6&level=critical", b"y")
    expected["a6"] = ["ep-eq"]
    check_routed(hub, expected)
    # Back on.
    set_fallback(hub, True)
    send("a7", ["events"])
    # Changing a condition applies at once.
    put_route(hub, "r-eq", "DeviceMessages", "level = 'fatal'", ["ep-eq"])
    # zone is undefined: NOT undefined is undefined, so r-logic does not match (falls back).
    send("a8", ["events"], props={"level": "critical"})
    send("a8b", ["ep-logic"], props={"level": "critical", "zone": "yard"})
    send("a9", ["ep-eq"], props={"level": "fatal"})
    # Deleting a route: its messages fall back.
    assert hub.request("DELETE", "/routing/routes/r-logic", owner(hub)).status_code == 204
    send("a10", ["events"], props={"level": "high", "zone": "yard"})
    # Disabling a route: nothing reaches its endpoint, the message falls back.
    put_route(hub, "r-dev", "DeviceMessages", "$connectionDeviceId = 'fb-dev'", ["ep-dev"], enabled=False)
    send("a11", ["events"])
    # A refused change leaves the working route as it was.
    r = hub.request("PUT", "/routing/routes/r-eq", owner(hub),
                    json={"source": "DeviceMessages", "condition": "level = ", "endpointNames": ["ep-eq"]})
    assert r.status_code == 400 and r.json()["errorCode"] == 400004
    send("a12", ["ep-eq"], props={"level": "fatal"})
    # Enabling the disabled route: every message now reaches it (and only it: no fallback).
    put_route(hub, "r-off", "DeviceMessages", "true", ["ep-off"], enabled=True)
    send("a13", ["ep-off"])
    send("a14", ["ep-off", "ep-eq"], props={"level": "fatal"})
    check_routed(hub, expected)
    # A route on another source does not take device messages.
    put_endpoint(hub, "ep-life", 1)
    put_route(hub, "r-life", "DeviceLifecycleEvents", "true", ["ep-life"])
    assert hub.request("DELETE", "/routing/routes/r-off", owner(hub)).status_code == 204
    send("a15", ["events"])
    check_routed(hub, expected)
    assert mids(read_endpoint(hub, "ep-life")) == []


# -- 4. enrichments -------------------------------------------------------------------------------

def test_enrichments_use_the_current_twin(hub):
    dev = "enr-dev"
    hub.create_device(dev)
    put_endpoint(hub, "enr", 1)
    put_endpoint(hub, "plain", 1)
    put_route(hub, "all", "DeviceMessages", "true", ["enr", "plain", "events"])
    put_enrichment(hub, "site", "$twin.tags.site", ["enr"])
    put_enrichment(hub, "mode", "$twin.properties.desired.mode", ["enr"])
    put_enrichment(hub, "hub", "$iothubname", ["enr"])
    put_enrichment(hub, "fixed", "static-value", ["enr", "events"])

    def last(endpoint, mid):
        found = [e for e in read_endpoint(hub, endpoint) if e["systemProperties"].get("message-id") == mid]
        assert len(found) == 1, (endpoint, mid, len(found))
        return found[0]["properties"]

    twin_write(hub, dev, {"tags": {"site": "alpha"}, "properties": {"desired": {"mode": "eco"}}})
    send_http(hub, dev, b"1", mid="e1", props={"own": "p"})
    assert last("enr", "e1") == {"own": "p", "site": "alpha", "mode": "eco", "hub": HUB_NAME, "fixed": "static-value"}
    assert last("plain", "e1") == {"own": "p"}
    assert last("events", "e1") == {"own": "p", "fixed": "static-value"}

    # The twin changes: the next message carries the new values, the earlier one keeps its own.
    twin_write(hub, dev, {"tags": {"site": "beta"}})
    twin_write(hub, dev, {"properties": {"desired": {"mode": "turbo"}}})
    send_mqtt(hub, dev, "%24.mid=e2&own=q", b"2")
    assert last("enr", "e2") == {"own": "q", "site": "beta", "mode": "turbo", "hub": HUB_NAME, "fixed": "static-value"}
    assert last("enr", "e1")["site"] == "alpha"
    assert last("plain", "e2") == {"own": "q"}

    # Changing an enrichment applies at once; deleting one removes it.
    put_enrichment(hub, "fixed", "other-value", ["plain"])
    assert hub.request("DELETE", "/routing/enrichments/mode", owner(hub)).status_code == 204
    twin_write(hub, dev, {"tags": {"site": "gamma"}})
    send_http(hub, dev, b"3", mid="e3")
    assert last("enr", "e3") == {"site": "gamma", "hub": HUB_NAME}
    assert last("plain", "e3") == {"fixed": "other-value"}
    assert last("events", "e3") == {}
    assert [e["key"] for e in get_routing(hub)["enrichments"]] == ["site", "hub", "fixed"]


# -- 5. defaults ----------------------------------------------------------------------------------

def test_defaults_telemetry_in_events_and_no_non_telemetry_events(hub):
    assert get_routing(hub)["routes"] == []
    dev, mod, other = "def-dev", "def-mod", "def-other"
    hub.create_device(dev)
    hub.create_module(dev, mod)
    hub.create_device(other)
    send_http(hub, dev, b"h", mid="d1")
    send_mqtt(hub, dev, "%24.mid=d2", b"m")
    send_mqtt(hub, dev, "%24.mid=d3", b"mm", module_id=mod)
    c = connect_device(hub, dev, password=dev_token(hub, dev))
    c.subscribe([("$iothub/twin/res/#", 0)])
    c.publish("$iothub/twin/PATCH/properties/reported/?$rid=9", json.dumps({"r": 1}).encode(), qos=0)
    topic, _ = read_publish(c)
    assert topic.startswith("$iothub/twin/res/204/?$rid=9"), topic
    c.disconnect()
    c.close()
    twin_write(hub, dev, {"tags": {"a": 1}, "properties": {"desired": {"d": 1}}})
    twin_write(hub, dev, {"tags": {"b": 2}}, mod, "PUT")
    assert hub.request("DELETE", f"/devices/{dev}/modules/{mod}", owner(hub), headers={"If-Match": "*"}).status_code == 204
    assert hub.request("DELETE", f"/devices/{other}", owner(hub), headers={"If-Match": "*"}).status_code == 204
    state = wait_until(lambda: connection_state(hub, dev), lambda s: s == "Disconnected")
    assert state == "Disconnected"

    # A sentinel: the router handles records in order, so once the sentinel's lifecycle event
    # is in the probe endpoint, every earlier record has been handled.
    put_endpoint(hub, "probe", 1)
    put_route(hub, "probe", "DeviceLifecycleEvents", "deviceId = 'def-sentinel'", ["probe"])
    hub.create_device("def-sentinel")
    got = wait_count(hub, "probe", 1)
    assert [e["properties"]["deviceId"] for e in got] == ["def-sentinel"]

    events = read_endpoint(hub, "events")
    assert [source(e) for e in events] == ["Telemetry"] * 3, [e["properties"] for e in events]
    assert mids(events) == ["d1", "d2", "d3"]
    (d3,) = [e for e in events if e["systemProperties"]["message-id"] == "d3"]
    assert d3["systemProperties"]["iothub-connection-module-id"] == mod
    assert body(d3) == b"mm"


# -- 6. the configuration file --------------------------------------------------------------------

CONFIG = """
[routing]
fallback = false

[[routing.endpoints]]
name = "cold"
partitions = 2

[[routing.routes]]
name = "r"
source = "DeviceMessages"
condition = "level = 'x'"
endpoints = ["cold"]

[[routing.enrichments]]
key = "origin"
value = "config"
endpoints = ["cold"]
"""


def test_config_file_routing(tmp_path):
    config = tmp_path / "hub.toml"
    config.write_text(CONFIG)
    hub = Hub(tmp_path / "hub").start(["--config", str(config)])
    try:
        expected = {"routes": [{"name": "r", "source": "DeviceMessages", "condition": "level = 'x'",
                                "endpointNames": ["cold"], "isEnabled": True}],
                    "fallbackRoute": {"isEnabled": False},
                    "enrichments": [{"key": "origin", "value": "config", "endpointNames": ["cold"]}],
                    "endpoints": [{"name": "events", "partitionCount": BUILTIN_PARTITIONS},
                                  {"name": "cold", "partitionCount": 2}]}
        assert get_routing(hub) == expected
        r = hub.request("GET", "/endpoints/cold/partitions", service(hub))
        assert [p["partitionId"] for p in r.json()] == ["0", "1"]
        devices = [f"cfg-{i}" for i in range(6)]
        for d in devices:
            hub.create_device(d)
            send_http(hub, d, b"x", mid=f"{d}-x", props={"level": "x"})
            send_http(hub, d, b"y", mid=f"{d}-y", props={"level": "y"})
        cold = read_endpoint(hub, "cold")
        assert mids(cold) == sorted(f"{d}-x" for d in devices)
        assert all(e["properties"] == {"level": "x", "origin": "config"} for e in cold)
        assert {e["partitionId"] for e in cold} <= {"0", "1"}
        assert mids(read_endpoint(hub, "events")) == []   # fallback off
        # A restart with the same file keeps one copy of everything.
        hub.stop()
        hub.start(["--config", str(config)])
        assert get_routing(hub) == expected
        send_http(hub, devices[0], b"x", mid="after", props={"level": "x"})
        assert "after" in mids(read_endpoint(hub, "cold"))
    finally:
        if hub.proc and hub.proc.poll() is None:
            hub.kill()


@pytest.mark.parametrize("section,reason", [
    ('[[routing.routes]]\nname = "r"\nsource = "DeviceMessages"\ncondition = "level = "\nendpoints = ["events"]\n', r"condition \"level = \" is invalid"),
    ('[[routing.routes]]\nname = "r"\nsource = "DeviceMessages"\ncondition = "(level = \'x\'"\nendpoints = ["events"]\n', "expected '\\)'"),
    ('[[routing.routes]]\nname = "r"\nsource = "DeviceMessages"\ncondition = "true"\nendpoints = ["nowhere"]\n', "nowhere"),
    ('[[routing.routes]]\nname = "r"\nsource = "Bogus"\ncondition = "true"\nendpoints = ["events"]\n', "Bogus"),
], ids=["malformed", "unbalanced", "unknown-endpoint", "bad-source"])
def test_config_file_with_bad_route_refuses_to_start(tmp_path, section, reason):
    config = tmp_path / "hub.toml"
    config.write_text("[routing]\n" + section)
    hub = Hub(tmp_path / "hub")
    with pytest.raises(RuntimeError, match=rf"route r.*{reason}"):
        hub.start(["--config", str(config)])
    assert hub.proc.wait(timeout=30) != 0
