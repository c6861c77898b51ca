"""SEC-1, SEC-2, SEC-4: every registry call is authenticated and authorised; refusals are 401
and change nothing."""

import time
import urllib.parse

import pytest

from hubkit import sas_token


@pytest.fixture
def seeded(hub, owner):
    r = hub.request("PUT", "/devices/victim", owner, json={"deviceId": "victim"})
    assert r.status_code == 200
    return r.json()


def assert_unchanged(hub, before):
    after = hub.request("GET", "/devices/victim", hub.token())
    assert after.status_code == 200 and after.json() == before
    listed = hub.request("GET", "/devices", hub.token()).json()
    assert [d["deviceId"] for d in listed] == ["victim"]


def attempt_writes(hub, token):
    """A create, an update and a delete; returns their statuses."""
    return [
        hub.request("PUT", "/devices/intruder", token, json={}).status_code,
        hub.request("PUT", "/devices/victim", token, json={"status": "disabled"}, headers={"If-Match": '"*"'}).status_code,
        hub.request("DELETE", "/devices/victim", token, headers={"If-Match": '"*"'}).status_code,
    ]


def test_no_token(hub, seeded):
    assert hub.request("GET", "/devices/victim").status_code == 401
    assert attempt_writes(hub, None) == [401, 401, 401]
    assert_unchanged(hub, seeded)


def test_expired_token(hub, seeded):
    token = hub.token("iothubowner", expiry=int(time.time()) - 5)
    assert hub.request("GET", "/devices/victim", token).status_code == 401
    assert attempt_writes(hub, token) == [401, 401, 401]
    assert_unchanged(hub, seeded)


def test_wrong_key(hub, seeded):
    token = sas_token(f"localhost:{hub.port}", hub.policy_key("service"), policy="iothubowner")
    assert attempt_writes(hub, token) == [401, 401, 401]
    body = hub.request("GET", "/devices/victim", token)
    assert body.status_code == 401 and "IotHubUnauthorizedAccess" in body.json()["Message"]
    assert_unchanged(hub, seeded)


def test_tampered_token(hub, seeded):
    good = hub.token("iothubowner")
    # Same signature, longer validity: the signature no longer matches.
    se = good.rsplit("&se=", 1)[1].split("&")[0]
    tampered = good.replace(f"se={se}", f"se={int(se) + 1000}")
    assert attempt_writes(hub, tampered) == [401, 401, 401]
    assert_unchanged(hub, seeded)


def test_device_policy_cannot_use_the_registry(hub, seeded):
    token = hub.token("device")
    assert hub.request("GET", "/devices/victim", token).status_code == 401
    assert attempt_writes(hub, token) == [401, 401, 401]
    assert_unchanged(hub, seeded)


def test_service_policy_cannot_use_the_registry(hub, seeded):
    token = hub.token("service")
    assert hub.request("GET", "/devices", token).status_code == 401
    assert hub.request("GET", "/statistics/service", token).status_code == 200
    assert_unchanged(hub, seeded)


def test_device_scoped_token_cannot_use_the_registry(hub, seeded):
    key = seeded["authentication"]["symmetricKey"]["primaryKey"]
    token = sas_token("localhost/devices/victim", key)
    assert hub.request("GET", "/devices/victim", token).status_code == 401
    assert attempt_writes(hub, token) == [401, 401, 401]
    # A hub policy token narrowed to one device is device-scoped too.
    narrowed = sas_token("localhost/devices/victim", hub.policy_key("iothubowner"), policy="iothubowner")
    assert hub.request("GET", "/devices/victim", narrowed).status_code == 401
    assert attempt_writes(hub, narrowed) == [401, 401, 401]
    assert_unchanged(hub, seeded)


def test_token_for_another_hub(hub, seeded):
    token = sas_token("elsewhere.azure-devices.net", hub.policy_key("iothubowner"), policy="iothubowner")
    assert attempt_writes(hub, token) == [401, 401, 401]
    assert_unchanged(hub, seeded)


def test_registry_read_reads_and_cannot_write(hub, seeded):
    token = hub.token("registryRead")
    assert hub.request("GET", "/devices/victim", token).status_code == 200
    assert hub.request("GET", "/devices", token).status_code == 200
    assert hub.request("GET", "/statistics/devices", token).status_code == 200
    assert attempt_writes(hub, token) == [401, 401, 401]
    assert hub.request("POST", "/devices", token, json=[{"id": "bulk-x", "importMode": "create"}]).status_code == 401
    assert_unchanged(hub, seeded)


def test_registry_read_write_writes(hub, seeded):
    token = hub.token("registryReadWrite")
    assert hub.request("PUT", "/devices/rw", token, json={}).status_code == 200
    assert hub.request("DELETE", "/devices/rw", token, headers={"If-Match": '"*"'}).status_code == 204


def test_token_in_query_parameter(hub, seeded):
    token = urllib.parse.quote(hub.token("iothubowner"), safe="")
    assert hub.request("GET", f"/devices/victim?authorization={token}").status_code == 200
    assert hub.request("GET", "/devices/victim?authorization=garbage").status_code == 401
