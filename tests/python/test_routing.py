"""EVT-1..EVT-4, EVT-6: non-telemetry events and the routing API, end to end through a real hub.

- Non-telemetry events (connection state, lifecycle, twin change) read back through the read
  API, field by field against seed 004's schema and examples, for devices and modules.
- Connection state sequence numbers: strictly increasing as strings, also across a restart.
- The routing API's shapes and validation; deleting an unused endpoint.
"""

import json

import pytest
import requests

from mqttraw import connect_device
from routingkit import (
    BUILTIN_PARTITIONS,
    CONN,
    HEX64,
    ISO7,
    LIFE,
    TWIN,
    body,
    check_event,
    check_lifecycle_body,
    connection_state,
    dev_token,
    get_routing,
    iso_ms,
    jbody,
    mids,
    now_ms,
    owner,
    put_endpoint,
    put_enrichment,
    put_route,
    read_endpoint,
    read_publish,
    send_http,
    service,
    set_fallback,
    source,
    twin_get,
    twin_write,
    wait_count,
    wait_until,
)


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
