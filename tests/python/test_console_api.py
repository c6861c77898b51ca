"""The web console's own calls (server/src/console/api.rs, docs/console.md) and the headers
that keep REST answers from ever being pages in the origin the console keeps its key in,
through raw HTTPS against a hub on ephemeral ports. The console's pages are driven in Chromium
by test_console.py and test_console_admin.py."""

import json

import pytest

from azure.iot.hub import IoTHubRegistryManager

from hubkit import sas_token
from mqttraw import connect_device


def get(hub, path, policy):
    return hub.request("GET", path, hub.token(policy))


def test_session_answers_any_policy_with_its_rights(hub):
    for policy, rights in [
        ("iothubowner", ["RegistryRead", "RegistryWrite", "ServiceConnect", "DeviceConnect"]),
        ("registryRead", ["RegistryRead"]),
        ("device", ["DeviceConnect"]),
    ]:
        r = get(hub, "/console/api/session", policy)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["policy"] == policy
        assert body["permissions"] == rights
        assert body["hubName"] and body["hostName"] == "localhost"
        assert body["uptimeSeconds"] >= 0 and body["node"] is None
    r = hub.request("GET", "/console/api/session", None)
    assert r.status_code == 401 and "IotHubUnauthorizedAccess" in r.json()["Message"]


@pytest.mark.parametrize("path", ["/console/api/metrics", "/console/api/errors", "/console/api/policies"])
def test_what_the_hub_reports_is_for_the_service_side_only(hub, path):
    for policy in ["iothubowner", "registryRead", "service"]:
        assert get(hub, path, policy).status_code == 200, policy
    # The `device` policy is what field gateways carry: it learns nothing of the hub here.
    r = get(hub, path, "device")
    assert r.status_code == 401, r.text
    assert "IotHubUnauthorizedAccess" in r.json()["Message"]


def test_policy_list_has_no_keys_and_keys_need_every_right(hub):
    listed = get(hub, "/console/api/policies", "registryRead").json()
    assert {p["keyName"] for p in listed} >= {"iothubowner", "service", "device", "registryRead"}
    assert all(set(p) == {"keyName", "rights"} for p in listed)
    owner = next(p for p in listed if p["keyName"] == "iothubowner")
    assert owner["rights"] == "RegistryRead, RegistryWrite, ServiceConnect, DeviceConnect"

    r = get(hub, "/console/api/policies/service/keys", "iothubowner")
    assert r.status_code == 200
    assert r.headers["Cache-Control"] == "no-store"
    keys = r.json()
    # The keys answered are the ones that sign: a token made with them is accepted.
    assert f"SharedAccessKey={keys['primaryKey']}" in hub.connection_string("service")
    for policy in ["registryRead", "registryReadWrite", "service"]:
        r = get(hub, "/console/api/policies/iothubowner/keys", policy)
        assert r.status_code == 401, policy
        assert "primaryKey" not in r.text
    assert get(hub, "/console/api/policies/nope/keys", "iothubowner").status_code == 404


def test_provisioning_overview_and_keys_for_the_console(hub):
    """The ID scope and provisioning policies for any service-side policy; a provisioning
    policy's keys only for one holding every hub right, and they sign the DPS service API."""
    for policy in ["iothubowner", "registryRead", "service"]:
        r = get(hub, "/console/api/provisioning", policy)
        assert r.status_code == 200, (policy, r.text)
    body = r.json()
    assert body["idScope"] == hub.cli("connection-string", "--id-scope")
    assert body["globalEndpoint"] == "localhost"
    rights = {p["keyName"]: p["rights"] for p in body["policies"]}
    assert rights == {
        "provisioningserviceowner":
            "ServiceConfig, EnrollmentRead, EnrollmentWrite, RegistrationStatusRead, RegistrationStatusWrite",
        "enrollmentread": "EnrollmentRead, RegistrationStatusRead",
    }
    assert "primaryKey" not in r.text
    assert get(hub, "/console/api/provisioning", "device").status_code == 401

    r = get(hub, "/console/api/provisioning/policies/provisioningserviceowner/keys", "iothubowner")
    assert r.status_code == 200 and r.headers["Cache-Control"] == "no-store"
    keys = r.json()
    assert keys["connectionString"] == hub.cli("connection-string", "--provisioning")
    assert keys["connectionString"].endswith(f"SharedAccessKey={keys['primaryKey']}")
    assert keys["secondaryKey"] and keys["secondaryKey"] != keys["primaryKey"]
    # The key answered signs the provisioning service API.
    token = sas_token("localhost", keys["primaryKey"], policy="provisioningserviceowner")
    r = hub.request("POST", "/enrollments/query?api-version=2021-10-01", token, json={"query": "*"})
    assert r.status_code == 200, r.text
    for policy in ["registryRead", "registryReadWrite", "service"]:
        r = get(hub, "/console/api/provisioning/policies/provisioningserviceowner/keys", policy)
        assert r.status_code == 401, policy
        assert "primaryKey" not in r.text
    assert get(hub, "/console/api/provisioning/policies/nope/keys", "iothubowner").status_code == 404


def test_history_counts_what_devices_did_with_their_puback_latency(hub):
    """The console's charts read this: each point counts what happened in its interval, the
    last one up to the moment of asking, so 25 messages just sent are in the points' sum."""
    before = get(hub, "/console/api/history?minutes=5", "registryRead")
    assert before.status_code == 200, before.text
    sent_before = sum(p["deviceMessages"] for p in before.json()["points"])
    hub.create_device("charted")
    c = connect_device(hub, "charted")
    try:
        for pkid in range(1, 26):
            c.publish("devices/charted/messages/events/", f"m{pkid}", qos=1, pkid=pkid)
            c.expect_puback(pkid)
        r = get(hub, "/console/api/history?minutes=5", "registryRead")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["intervalSeconds"] == 10 and body["minutes"] == 5 and body["node"] is None
        assert {"name": "deviceMessages", "gauge": False} in body["series"]
        points = body["points"]
        # Every point but the last spans a sample interval (later, never earlier, on a busy
        # machine); the last runs up to the moment of asking.
        assert points and all(p["seconds"] >= 5 for p in points[:-1]), [p["seconds"] for p in points]
        assert sum(p["deviceMessages"] for p in points) - sent_before == 25
        last = points[-1]
        assert last["connectedDevices"] >= 1
        # Some point holds those 25 PUBACKs, with a latency read from the histogram.
        assert any(p["pubackP50Ms"] is not None and 0 < p["pubackP50Ms"] <= p["pubackP99Ms"] for p in points)
    finally:
        c.close()
    # A window is 1 to 60 minutes; the hub's own reports are for the service side only.
    assert get(hub, "/console/api/history?minutes=600", "service").json()["minutes"] == 60
    assert get(hub, "/console/api/history", "device").status_code == 401


def test_the_hubs_ca_downloads_without_a_token(hub):
    """The CA devices and back-ends verify the hub with, as a plain link downloads it."""
    r = hub.request("GET", "/console/api/ca.pem", None)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/x-pem-file"
    assert 'filename="ferrohub-ca.pem"' in r.headers["Content-Disposition"]
    assert r.content == open(hub.ca, "rb").read()
    assert r.content.startswith(b"-----BEGIN CERTIFICATE-----")


def test_policies_are_added_changed_rekeyed_and_removed_while_the_hub_serves(hub, monkeypatch):
    """What the portal's shared access policies blade does, through the console's API: a new
    policy's keys sign at once (the official service SDK reads the registry with it), changed
    rights take effect, a regenerated key replaces only that key, a removed policy signs
    nothing; refusals change nothing."""
    owner = hub.token("iothubowner")

    def call(method, path, token=owner, **kw):
        return hub.request(method, path, token, **kw)

    def token(name, key):
        return sas_token(f"localhost:{hub.port}", key, policy=name)

    hub.create_device("policy-probe")
    r = call("PUT", "/console/api/policies/ops", json={"rights": ["RegistryRead"]})
    assert r.status_code == 200, r.text
    assert {"keyName": "ops", "rights": "RegistryRead"} in r.json()
    keys = call("GET", "/console/api/policies/ops/keys").json()
    assert hub.cli("connection-string", "--policy", "ops").endswith(f"SharedAccessKey={keys['primaryKey']}")
    assert call("GET", "/devices/policy-probe", token("ops", keys["primaryKey"])).status_code == 200
    assert call("GET", "/devices/policy-probe", token("ops", keys["secondaryKey"])).status_code == 200
    # RegistryRead only: a write is refused.
    r = call("PUT", "/devices/by-ops", token("ops", keys["primaryKey"]), json={"deviceId": "by-ops"})
    assert r.status_code == 401, r.text
    # The official service SDK signs with the new policy's connection string.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", hub.ca)
    cs = f"HostName=localhost:{hub.port};SharedAccessKeyName=ops;SharedAccessKey={keys['primaryKey']}"
    manager = IoTHubRegistryManager.from_connection_string(cs)
    manager.protocol.config.connection.verify = hub.ca
    assert manager.get_device("policy-probe").device_id == "policy-probe"

    # New rights, same keys: now it writes.
    r = call("PUT", "/console/api/policies/ops", json={"rights": ["RegistryWrite", "ServiceConnect"]})
    assert {"keyName": "ops", "rights": "RegistryRead, RegistryWrite, ServiceConnect"} in r.json()
    assert call("GET", "/console/api/policies/ops/keys").json() == keys
    r = call("PUT", "/devices/by-ops", token("ops", keys["primaryKey"]), json={"deviceId": "by-ops"})
    assert r.status_code == 200, r.text

    # A new secondary key: the old one signs nothing, the primary still does.
    r = call("POST", "/console/api/policies/ops/regenerate", json={"key": "secondary"})
    assert r.status_code == 200, r.text
    rekeyed = call("GET", "/console/api/policies/ops/keys").json()
    assert rekeyed["primaryKey"] == keys["primaryKey"] and rekeyed["secondaryKey"] != keys["secondaryKey"]
    assert call("GET", "/devices/policy-probe", token("ops", keys["secondaryKey"])).status_code == 401
    assert call("GET", "/devices/policy-probe", token("ops", rekeyed["secondaryKey"])).status_code == 200

    # Refusals: each answers IoT Hub's error and changes nothing.
    before = call("GET", "/console/api/policies").json()
    for method, path, body, status in [
        ("DELETE", "/console/api/policies/iothubowner", None, 400),  # the only one with every right
        ("DELETE", "/console/api/policies/nope", None, 404),
        ("POST", "/console/api/policies/nope/regenerate", {"key": "primary"}, 404),
        ("PUT", "/console/api/policies/bad name", {"rights": ["RegistryRead"]}, 400),
        ("PUT", "/console/api/policies/empty", {"rights": []}, 400),
        ("PUT", "/console/api/policies/odd", {"rights": ["Everything"]}, 400),
        ("POST", "/console/api/policies/ops/regenerate", {"key": "tertiary"}, 400),
    ]:
        r = call(method, path, json=body)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        assert "errorCode" in r.json() or "Message" in r.json(), r.text
    for policy in ["registryRead", "registryReadWrite", "service"]:
        r = call("PUT", "/console/api/policies/sneaky", hub.token(policy), json={"rights": ["DeviceConnect"]})
        assert r.status_code == 401, (policy, r.text)
    assert call("GET", "/console/api/policies").json() == before

    r = call("DELETE", "/console/api/policies/ops")
    assert r.status_code == 200 and all(p["keyName"] != "ops" for p in r.json()), r.text
    assert call("GET", "/devices/policy-probe", token("ops", rekeyed["primaryKey"])).status_code == 401
    # The change is stored: what the CLI reads from the hub's database agrees.
    with pytest.raises(RuntimeError, match="no policy named"):
        hub.cli("connection-string", "--policy", "ops")


def test_route_tester_evaluates_with_the_routers_own_conditions(hub):
    sample = {
        "message": {
            "body": json.dumps({"temperature": 31}),
            "appProperties": {"level": "high"},
            "systemProperties": {"contentType": "application/json", "contentEncoding": "utf-8"},
        },
        "twin": {"tags": {"site": "lab"}, "properties": {"desired": {}, "reported": {}}},
    }

    def test(condition, policy="registryRead", message=None):
        body = dict(sample, condition=condition)
        if message is not None:
            body["message"] = message
        return hub.request("POST", "/console/api/routing/test", hub.token(policy), json=body)

    assert test("$body.temperature > 30 AND level = 'high'").json() == {"result": "true"}
    assert test("$twin.tags.site = 'lab'").json() == {"result": "true"}
    assert test("$body.temperature > 40").json() == {"result": "false"}
    # Not JSON by its content type: the body is undefined to conditions, as when routing.
    plain = dict(sample["message"], systemProperties={"contentType": "text/plain"})
    assert test("$body.temperature > 30", message=plain).json() == {"result": "false"}
    bad = test("$body.temperature >")
    assert bad.status_code == 400 and "ArgumentInvalid" in bad.json()["Message"]
    assert test("true", policy="device").status_code == 401


def test_rest_answers_are_never_pages(hub):
    hub.create_device("d1")
    sent = hub.request(
        "POST", "/devices/d1/messages/deviceBound", hub.token(),
        data=b"<script>alert(1)</script>", headers={"Content-Type": "text/html"},
    )
    assert sent.status_code == 204, sent.text
    received = hub.request("GET", "/devices/d1/messages/deviceBound", hub.device_token("d1"))
    assert received.status_code == 200 and received.content == b"<script>alert(1)</script>"
    for r in [received, hub.request("GET", "/devices/d1", hub.token()), hub.request("GET", "/nope", None)]:
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Content-Security-Policy"].startswith("sandbox;")
    # The console's own files keep their own policy, which lets its scripts run.
    page = hub.request("GET", "/console/", None)
    assert page.status_code == 200 and "sandbox" not in page.headers["Content-Security-Policy"]
