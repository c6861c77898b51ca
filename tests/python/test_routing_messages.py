"""EVT-5, EVT-6: routing device messages, end to end through a real hub.

- The routing query language on real device messages (HTTPS and MQTT), fallback, disabled
  routes, live route changes, refusal of malformed conditions.
- Enrichments with the twin's current value, static values and $iothubname, per endpoint.
- Defaults (no routes: all telemetry in `events`, no non-telemetry event anywhere).
- The configuration file's [routing] section.
"""

import json

import pytest

from hubkit import Hub
from mqttraw import connect_device
from routingkit import (
    BUILTIN_PARTITIONS,
    HUB_NAME,
    body,
    connection_state,
    dev_token,
    get_routing,
    mids,
    owner,
    put_endpoint,
    put_enrichment,
    put_route,
    read_endpoint,
    read_publish,
    send_http,
    send_mqtt,
    service,
    set_fallback,
    source,
    twin_write,
    wait_count,
    wait_until,
)


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
