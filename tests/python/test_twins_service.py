"""TWN-1..TWN-3, TWN-5..TWN-7 on the service side: the official service SDK's twin calls, and
raw REST for versions, metadata, concurrency and every limit (refused with 400, twin unchanged)."""

import re
import threading

import pytest
from azure.iot.hub import IoTHubRegistryManager
from azure.iot.hub.models import Twin, TwinProperties
from msrest.exceptions import HttpOperationError

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def registry(hub, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", hub.ca)
    mgr = IoTHubRegistryManager.from_connection_string(hub.connection_string("iothubowner"))
    mgr.protocol.config.connection.verify = hub.ca
    return mgr


def twin(hub, device, module=None):
    path = f"/twins/{device}" + (f"/modules/{module}" if module else "")
    r = hub.request("GET", path, hub.token("service"))
    assert r.status_code == 200, r.text
    return r.json()


def patch(hub, device, body, etag="*", module=None, method="PATCH"):
    path = f"/twins/{device}" + (f"/modules/{module}" if module else "")
    return hub.request(method, path, hub.token("service"), json=body, headers={"If-Match": f'"{etag}"'})


def test_sdk_twin_calls(hub, registry):
    registry.create_device_with_sas("tw", None, None, "enabled")
    t = registry.get_twin("tw")
    assert t.device_id == "tw" and t.properties.desired["$version"] == 1 and t.properties.reported["$version"] == 1
    updated = registry.update_twin("tw", Twin(tags={"site": "lab"}, properties=TwinProperties(desired={"fw": "1.0", "cfg": {"a": 1}})), t.etag)
    assert updated.tags == {"site": "lab"}
    assert updated.properties.desired["fw"] == "1.0" and updated.properties.desired["$version"] == 2
    assert updated.etag != t.etag and updated.version == t.version + 1
    # Without an etag: unconditional; null removes.
    again = registry.update_twin("tw", Twin(properties=TwinProperties(desired={"cfg": {"a": None, "b": 2}})))
    assert again.properties.desired["cfg"] == {"b": 2}
    replaced = registry.replace_twin("tw", Twin(tags={"only": True}, properties=TwinProperties(desired={"new": 1})))
    assert replaced.tags == {"only": True}
    desired = {k: v for k, v in replaced.properties.desired.items() if not k.startswith("$")}
    assert desired == {"new": 1}
    with pytest.raises(HttpOperationError) as stale:
        registry.update_twin("tw", Twin(tags={"x": 1}), t.etag)
    assert stale.value.response.status_code == 412
    assert registry.get_twin("tw").tags == {"only": True}

    registry.create_module_with_sas("tw", "mod", None, None, None)
    mt = registry.get_module_twin("tw", "mod")
    assert mt.module_id == "mod" and mt.properties.desired["$version"] == 1
    mu = registry.update_module_twin("tw", "mod", Twin(properties=TwinProperties(desired={"m": 1})), mt.etag)
    assert mu.properties.desired["m"] == 1
    mr = registry.replace_module_twin("tw", "mod", Twin(tags={"t": 1}, properties=TwinProperties(desired={})))
    assert mr.tags == {"t": 1} and set(mr.properties.desired) == {"$metadata", "$version"}
    assert registry.get_twin("tw").properties.desired["new"] == 1, "device and module twins are separate"


def test_versions_etags_and_metadata(hub):
    hub.create_device("v")
    start = twin(hub, "v")
    for i in range(100):
        assert patch(hub, "v", {"properties": {"desired": {"n": i}}}).status_code == 200
    after = twin(hub, "v")
    assert after["properties"]["desired"]["$version"] == start["properties"]["desired"]["$version"] + 100
    assert after["version"] == start["version"] + 100 and after["etag"] != start["etag"]
    r = patch(hub, "v", {"properties": {"desired": {"deep": {"a": {"b": 1}, "c": 2}}}})
    body = r.json()
    assert r.headers["ETag"] == f'"{body["etag"]}"'
    meta = body["properties"]["desired"]["$metadata"]
    assert TIME.match(meta["$lastUpdated"]) and TIME.match(meta["deep"]["a"]["b"]["$lastUpdated"])
    assert meta["deep"]["$lastUpdatedVersion"] == body["properties"]["desired"]["$version"]
    removed = patch(hub, "v", {"properties": {"desired": {"deep": {"a": None, "c": None}}}}).json()
    assert removed["properties"]["desired"]["deep"] == {}
    kept = removed["properties"]["desired"]["$metadata"]["deep"]
    assert TIME.match(kept["$lastUpdated"]) and kept["$lastUpdatedVersion"] == removed["properties"]["desired"]["$version"]
    assert "$lastUpdatedVersion" not in removed["properties"]["reported"]["$metadata"]
    stale = patch(hub, "v", {"tags": {"x": 1}}, etag=start["etag"])
    assert stale.status_code == 412
    assert twin(hub, "v")["tags"] == {}


def test_concurrent_writers_lose_no_update(hub):
    hub.create_device("c")
    before = twin(hub, "c")["properties"]["desired"]["$version"]
    errors = []

    def writer(w):
        for i in range(10):
            r = patch(hub, "c", {"properties": {"desired": {f"w{w}": i}}})
            if r.status_code != 200:
                errors.append(r.text)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    desired = twin(hub, "c")["properties"]["desired"]
    assert {k: v for k, v in desired.items() if not k.startswith("$")} == {f"w{w}": 9 for w in range(10)}
    assert desired["$version"] == before + 100


def deep(levels):
    v = {"leaf": 1}
    for i in range(levels):
        v = {f"l{i}": v}
    return v


@pytest.mark.parametrize("body", [
    {"properties": {"desired": {"a.b": 1}}},
    {"properties": {"desired": {"$a": 1}}},
    {"properties": {"desired": {"a b": 1}}},
    {"properties": {"desired": {"a\u0001b": 1}}},
    {"properties": {"desired": {"k" * 1025: 1}}},
    {"properties": {"desired": {"s": "x" * 4097}}},
    {"properties": {"desired": {"i": 4503599627370496}}},
    {"properties": {"desired": {"i": -4503599627370497}}},
    {"tags": deep(11)},
    {"tags": {f"t{i}": "x" * 1000 for i in range(9)}},
    {"properties": {"desired": {f"d{i}": "x" * 4000 for i in range(9)}}},
    {"tags": "not an object"},
], ids=["dot", "dollar", "space", "control", "long-key", "long-string", "int-high", "int-low", "depth-11",
        "tags-over-8k", "desired-over-32k", "tags-not-object"])
def test_limits_are_refused_and_change_nothing(hub, body):
    hub.create_device("lim")
    assert patch(hub, "lim", {"tags": {"keep": 1}, "properties": {"desired": {"keep": 1}}}).status_code == 200
    before = twin(hub, "lim")
    for method in ("PATCH", "PUT"):
        r = patch(hub, "lim", body, method=method)
        assert r.status_code == 400, r.text
    assert twin(hub, "lim") == before


def test_limits_at_the_edge_are_accepted(hub):
    hub.create_device("edge")
    ok = {"tags": deep(10), "properties": {"desired": {"k" * 1024: "x" * 4096, "i": 4503599627370495}}}
    assert patch(hub, "edge", ok).status_code == 200


def test_twin_lives_and_dies_with_its_identity(hub):
    hub.create_device("life")
    assert patch(hub, "life", {"tags": {"a": 1}}).status_code == 200
    assert hub.request("DELETE", "/devices/life", hub.token()).status_code == 204
    assert hub.request("GET", "/twins/life", hub.token("service")).status_code == 404
    hub.create_device("life")
    fresh = twin(hub, "life")
    assert fresh["tags"] == {} and fresh["properties"]["desired"]["$version"] == 1
    assert hub.request("GET", "/twins/life", hub.token("registryRead")).status_code == 200
    assert patch(hub, "life", {"tags": {"a": 1}}).status_code == 200
    assert hub.request("PATCH", "/twins/life", hub.token("registryRead"), json={"tags": {"b": 1}}).status_code == 401


REPORTED_LIMITS = {
    "dot": {"a.b": 1},
    "dollar": {"$a": 1},
    "space": {"a b": 1},
    "control": {"a\u0001b": 1},
    "long-key": {"k" * 1025: 1},
    "long-string": {"s": "x" * 4097},
    "int-high": {"i": 4503599627370496},
    "int-low": {"i": -4503599627370497},
    "depth-11": deep(11),
    "reported-over-32k": {f"r{i}": "x" * 4000 for i in range(9)},
}


@pytest.mark.parametrize("patch_body", REPORTED_LIMITS.values(), ids=REPORTED_LIMITS.keys())
def test_limits_over_mqtt_get_400_and_change_nothing(hub, patch_body):
    import json
    from mqttraw import connect_device
    from test_sdk_twin import read_publish
    hub.create_device("mlim")
    before = twin(hub, "mlim")
    c = connect_device(hub, "mlim")
    try:
        c.publish("$iothub/twin/PATCH/properties/reported/?$rid=x", json.dumps(patch_body).encode(), qos=1, pkid=1)
        assert c.expect_puback(1)
        topic, _ = read_publish(c)
        assert topic == "$iothub/twin/res/400/?$rid=x"
    finally:
        c.close()
    after = twin(hub, "mlim")
    # Connection state moved (the device connected); the twin itself did not.
    for part in ("properties", "tags", "version", "etag"):
        assert after[part] == before[part]


def test_acknowledged_reported_patch_survives_sigkill_and_sigterm(hub):
    import json
    from mqttraw import connect_device
    from test_sdk_twin import read_publish
    hub.create_device("dur")
    c = connect_device(hub, "dur")
    c.publish("$iothub/twin/PATCH/properties/reported/?$rid=k", json.dumps({"state": "acked"}).encode(), qos=0)
    topic, _ = read_publish(c)
    assert topic.startswith("$iothub/twin/res/204/")
    hub.kill()
    hub.start()
    assert twin(hub, "dur")["properties"]["reported"]["state"] == "acked"
    assert patch(hub, "dur", {"properties": {"desired": {"d": 1}}}).status_code == 200
    hub.stop()
    hub.start()
    t = twin(hub, "dur")
    assert t["properties"]["desired"]["d"] == 1 and t["properties"]["reported"]["state"] == "acked"
