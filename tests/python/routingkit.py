"""Helpers shared by the routing suites (test_routing*.py): credentials, the routing and read
APIs, sending over HTTPS and MQTT, and checks of seed 004's event shapes."""

import base64
import json
import re
import time
from datetime import datetime, timezone

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
