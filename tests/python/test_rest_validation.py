"""REG-1, REG-3, REG-5: bad input gets a clear 4xx with IoT Hub's error body, and nothing is
stored."""

import pytest


def registry_is_empty(hub, owner):
    assert hub.request("GET", "/devices", owner).json() == []
    stats = hub.request("GET", "/statistics/devices", owner).json()
    assert stats == {"totalDeviceCount": 0, "enabledDeviceCount": 0, "disabledDeviceCount": 0}


def error_code(r):
    return r.json()["Message"].split(";", 1)[0]


def test_129_character_device_id(hub, owner):
    long_id = "a" * 129
    r = hub.request("PUT", f"/devices/{long_id}", owner, json={"deviceId": long_id})
    assert r.status_code == 400 and error_code(r) == "ErrorCode:ArgumentInvalid"
    assert "128" in r.json()["Message"]
    # 128 is fine.
    assert hub.request("PUT", f"/devices/{'a' * 128}", owner, json={}).status_code == 200
    assert hub.request("DELETE", f"/devices/{'a' * 128}", owner).status_code == 204
    registry_is_empty(hub, owner)


@pytest.mark.parametrize("bad", ["dev%201", "dev%2F1", "d%C3%A9v", "dev%22", "dev%3C"])
def test_disallowed_characters(hub, owner, bad):
    r = hub.request("PUT", f"/devices/{bad}", owner, json={})
    assert r.status_code == 400, r.text
    assert "deviceId" in r.json()["Message"]
    registry_is_empty(hub, owner)


def test_every_allowed_punctuation_character(hub, owner):
    import urllib.parse
    dev = "a-:.+%_#*?!(),=@;$'z"
    r = hub.request("PUT", f"/devices/{urllib.parse.quote(dev, safe='')}", owner, json={"deviceId": dev})
    assert r.status_code == 200, r.text
    assert r.json()["deviceId"] == dev


def test_status_reason_over_128(hub, owner):
    r = hub.request("PUT", "/devices/d1", owner, json={"status": "disabled", "statusReason": "x" * 129})
    assert r.status_code == 400 and "statusReason" in r.json()["Message"]
    registry_is_empty(hub, owner)
    ok = hub.request("PUT", "/devices/d1", owner, json={"status": "disabled", "statusReason": "é" * 128})
    assert ok.status_code == 200 and ok.json()["statusReason"] == "é" * 128
    # An update with a too-long reason leaves the stored device as it was.
    bad = hub.request("PUT", "/devices/d1", owner, headers={"If-Match": '"*"'},
                      json={"status": "enabled", "statusReason": "y" * 129})
    assert bad.status_code == 400
    assert hub.request("GET", "/devices/d1", owner).json() == ok.json()


def test_51st_module(hub, owner):
    assert hub.request("PUT", "/devices/host", owner, json={}).status_code == 200
    for i in range(50):
        assert hub.request("PUT", f"/devices/host/modules/m{i}", owner, json={}).status_code == 200
    r = hub.request("PUT", "/devices/host/modules/m50", owner, json={})
    assert r.status_code == 413 and error_code(r) == "ErrorCode:TooManyModulesOnDevice"
    mods = hub.request("GET", "/devices/host/modules", owner).json()
    assert len(mods) == 50 and "m50" not in {m["moduleId"] for m in mods}


def test_malformed_json(hub, owner):
    r = hub.request("PUT", "/devices/d1", owner, data=b'{"deviceId": "d1",',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["Message"]
    registry_is_empty(hub, owner)


@pytest.mark.parametrize("body", [
    [1, 2, 3],
    "a string",
    {"deviceId": "d1", "status": 5},
    {"deviceId": "d1", "authentication": "sas"},
    {"deviceId": "d1", "capabilities": {"iotEdge": "yes"}},
    {"deviceId": "d1", "status": "sleeping"},
    {"deviceId": "d1", "authentication": {"type": "magic"}},
    {"deviceId": "d1", "authentication": {"symmetricKey": {"primaryKey": "c2hvcnQ="}}},
    {"deviceId": "other"},
])
def test_wrong_body(hub, owner, body):
    r = hub.request("PUT", "/devices/d1", owner, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["Message"].startswith("ErrorCode:")
    registry_is_empty(hub, owner)


def test_bulk_with_bad_items_reports_each(hub, owner):
    items = [{"id": "good", "importMode": "create"},
             {"id": "bad id", "importMode": "create"},
             {"id": "bad-mode", "importMode": "explode"}]
    r = hub.request("POST", "/devices", owner, json=items)
    assert r.status_code == 400
    body = r.json()
    assert body["isSuccessful"] is False
    assert sorted(e["deviceId"] for e in body["errors"]) == ["bad id", "bad-mode"]
    assert [d["deviceId"] for d in hub.request("GET", "/devices", owner).json()] == ["good"]


def test_unknown_route_and_method(hub, owner):
    assert hub.request("GET", "/nothing/here", owner).status_code == 404
    assert hub.request("PATCH", "/devices/d1", owner, json={}).status_code in (404, 405)


def test_missing_device_and_module(hub, owner):
    r = hub.request("GET", "/devices/ghost", owner)
    assert r.status_code == 404 and error_code(r) == "ErrorCode:DeviceNotFound"
    assert hub.request("DELETE", "/devices/ghost", owner).status_code == 404
    assert hub.request("GET", "/devices/ghost/modules", owner).status_code == 404
    assert hub.request("PUT", "/devices/ghost/modules/m", owner, json={}).status_code == 404
    assert hub.request("PUT", "/devices/real", owner, json={}).status_code == 200
    r = hub.request("GET", "/devices/real/modules/ghost", owner)
    assert r.status_code == 404 and error_code(r) == "ErrorCode:ModuleNotFound"


def test_conflicts_and_preconditions(hub, owner):
    first = hub.request("PUT", "/devices/d1", owner, json={}).json()
    r = hub.request("PUT", "/devices/d1", owner, json={})
    assert r.status_code == 409 and error_code(r) == "ErrorCode:DeviceAlreadyExists"
    r = hub.request("PUT", "/devices/d1", owner, json={"status": "disabled"}, headers={"If-Match": '"stale"'})
    assert r.status_code == 412
    assert hub.request("GET", "/devices/d1", owner).json() == first
