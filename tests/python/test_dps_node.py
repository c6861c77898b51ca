"""DPS through the official Node SDKs, unmodified (tests/node/dps.js; fixed ports: one `sdk_hub`,
or the three-node cluster behind HAProxy with FERROHUB_TEST_CLUSTER=1):

- `azure-iot-provisioning-service`: individual and group symmetric-key enrollments are created
  (the write answers the keys), read (without keys) and their attestation mechanism read (with
  them); a write with the current etag replaces, one with a stale etag is InvalidEtagError (412)
  and one without an etag on an existing id is 409; deletes by id and by object with its etag.
- Enrollment queries page by `pageSize` and the continuation reaches every enrollment once; bulk
  create and delete (callback form) of three enrollments, a bulk create of an existing id is
  reported per item.
- Registration states: read, listed by their group's query, deleted by id and by object with its
  etag, after which they are 404 while the devices remain.
- `azure-iot-provisioning-device` with `SymmetricKeySecurityClient` over Mqtt, MqttWs, Http, Amqp
  and AmqpWs (individual and group enrollments; group device keys derived in dps.js): the result
  names the hub, the device and echoes the payload; the device is created with the enrollment's
  device id and initial twin, connects with `azure-iot-device-mqtt` and its telemetry arrives.
- `X509Security` over Mqtt, Http and Amqp: an individual enrollment holding a self-signed leaf
  and a group whose signing certificate is the CA of the leaf; the device is created with the
  leaf's SHA-256 thumbprint, connects with that certificate and its telemetry arrives.
- Refusals: a wrong key over Http and Mqtt is UnauthorizedError; a disabled individual
  enrollment or group is an error; none of them creates a device or a registration state.
"""

import base64
import json
import subprocess
import time
import urllib.parse
import uuid

import pytest

import certs
from hubkit import REPO, parse_cs
from test_node_event_hubs import node_env

DPS_JS = str(REPO / "tests" / "node" / "dps.js")
PRIMARY = base64.b64encode(b"p" * 32).decode()
SECONDARY = base64.b64encode(b"s" * 32).decode()


class Dps:
    """What the Node clients need to reach the hub's provisioning service."""

    def __init__(self, hub):
        self.hub = hub
        self.connection_string = hub.cli("connection-string", "--provisioning")
        self.id_scope = hub.cli("connection-string", "--id-scope")
        self.host = parse_cs(self.connection_string)["HostName"]
        self.hub_host = parse_cs(hub.connection_string("iothubowner", with_port=False))["HostName"]


@pytest.fixture(scope="module")
def dps(sdk_hub):
    return Dps(sdk_hub)


def run_node(hub, request, timeout_ms=45000):
    done = subprocess.run(["node", DPS_JS], input=json.dumps({"timeoutMs": timeout_ms, **request}),
                          capture_output=True, text=True, timeout=timeout_ms / 1000 + 15, env=node_env(hub))
    assert done.returncode == 0, f"dps.js exited {done.returncode}:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def call(method, *args):
    return {"method": method, "args": list(args)}


def service(dps, *calls):
    """Each call's result ({"body", "status"}, {"pages"} or {"error"}), in order."""
    return run_node(dps.hub, {"op": "service", "connectionString": dps.connection_string, "calls": list(calls)})["results"]


def ok(result):
    assert "error" not in result, result["error"]
    return result.get("body", result)


def failed(result, name, status):
    assert "error" in result, f"succeeded: {result}"
    e = result["error"]
    assert (e["name"], e["statusCode"]) == (name, status), e
    return e


def provision(dps, transport, registration_id, timeout_ms=45000, **request):
    """Registers through the device SDK (and with `telemetry`, sends it as the device)."""
    return run_node(dps.hub, {"op": "provision", "provisioningHost": dps.host, "idScope": dps.id_scope,
                              "transport": transport, "registrationId": registration_id, **request},
                    timeout_ms=timeout_ms)


def symmetric(**keys):
    return {"type": "symmetricKey", "symmetricKey": keys}


def x509(field, pem_path):
    return {"type": "x509", "x509": {field: {"primary": {"certificate": pem_path.read_text()}}}}


def device(hub, device_id):
    return hub.request("GET", f"/devices/{urllib.parse.quote(device_id, safe='')}", hub.token())


def twin(hub, device_id):
    r = hub.request("GET", f"/twins/{urllib.parse.quote(device_id, safe='')}", hub.token())
    assert r.status_code == 200, r.text
    return r.json()


def wait_for_telemetry(hub, device_id, body, timeout=20):
    deadline = time.time() + timeout
    while True:
        bodies = [base64.b64decode(e["body"]).decode(errors="replace") for e in hub.events_of(device_id)]
        if body in bodies:
            return
        assert time.time() < deadline, f"{device_id}'s telemetry {body!r} never arrived; got {bodies}"
        time.sleep(0.2)


def sha256_thumbprint(cert):
    out = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256"],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().split("=", 1)[1].replace(":", "")


def assert_assigned(dps, outcome, device_id, payload=None):
    assert "error" not in outcome, outcome["error"]
    state = outcome["registration"]
    assert (state["assignedHub"], state["deviceId"], state["status"]) == (dps.hub_host, device_id, "assigned"), state
    if payload is not None:
        assert state["payload"] == payload, state


def assert_nothing_created(dps, registration_id, device_id=None):
    assert device(dps.hub, device_id or registration_id).status_code == 404
    (state,) = service(dps, call("getDeviceRegistrationState", registration_id))
    failed(state, "Error", 404)


# -- the service client ---------------------------------------------------------------------

def test_service_client_enrollments_keys_and_etags(dps):
    individual = {"registrationId": "svc-ind", "deviceId": "svc-ind-device", "attestation": symmetric(),
                  "initialTwin": {"tags": {"site": "a"}}}
    group = {"enrollmentGroupId": "svc-grp", "attestation": symmetric(primaryKey=PRIMARY, secondaryKey=SECONDARY)}
    created, created_group, read, read_group, mechanism, group_mechanism, again = service(
        dps,
        call("createOrUpdateIndividualEnrollment", individual),
        call("createOrUpdateEnrollmentGroup", group),
        call("getIndividualEnrollment", "svc-ind"),
        call("getEnrollmentGroup", "svc-grp"),
        call("getIndividualEnrollmentAttestationMechanism", "svc-ind"),
        call("getEnrollmentGroupAttestationMechanism", "svc-grp"),
        call("createOrUpdateIndividualEnrollment", individual))
    created, created_group = ok(created), ok(created_group)
    keys = created["attestation"]["symmetricKey"]
    for k in ("primaryKey", "secondaryKey"):
        assert 16 <= len(base64.b64decode(keys[k])) <= 64, keys
    assert keys["primaryKey"] != keys["secondaryKey"]
    assert created_group["attestation"]["symmetricKey"] == {"primaryKey": PRIMARY, "secondaryKey": SECONDARY}
    assert (created["deviceId"], created["provisioningStatus"], created["initialTwin"]["tags"]) == (
        "svc-ind-device", "enabled", {"site": "a"})

    read, read_group = ok(read), ok(read_group)
    assert read["registrationId"] == "svc-ind" and read["etag"] == created["etag"]
    assert read_group["enrollmentGroupId"] == "svc-grp" and read_group["etag"] == created_group["etag"]
    for body in (read, read_group):
        assert body["attestation"]["type"] == "symmetricKey"
        assert not {"primaryKey", "secondaryKey"} & set(body["attestation"].get("symmetricKey") or {}), body
    assert ok(mechanism) == {"type": "symmetricKey", "symmetricKey": keys}
    assert ok(group_mechanism)["symmetricKey"] == {"primaryKey": PRIMARY, "secondaryKey": SECONDARY}
    failed(again, "DeviceAlreadyExistsError", 409)  # no etag on an existing id

    # A write with the current etag replaces (new etag); the stale one is then refused.
    updated = dict(created, initialTwin={"tags": {"site": "b"}})
    replaced, stale, reread = service(
        dps,
        call("createOrUpdateIndividualEnrollment", updated),
        call("createOrUpdateIndividualEnrollment", dict(updated, initialTwin={"tags": {"site": "c"}})),
        call("getIndividualEnrollment", "svc-ind"))
    replaced = ok(replaced)
    assert replaced["etag"] != created["etag"]
    failed(stale, "InvalidEtagError", 412)
    assert ok(reread)["initialTwin"]["tags"] == {"site": "b"}
    assert ok(reread)["etag"] == replaced["etag"]

    # Deletes: by id; by object with a stale etag (412) and then with its etag.
    other = ok(service(dps, call("createOrUpdateIndividualEnrollment",
                                 {"registrationId": "svc-ind-2", "attestation": symmetric()}))[0])
    results = service(
        dps,
        call("deleteIndividualEnrollment", "svc-ind"),
        call("deleteIndividualEnrollment", dict(other, etag='"stale"')),
        call("deleteIndividualEnrollment", other),
        call("deleteEnrollmentGroup", dict(created_group, etag='"stale"')),
        call("deleteEnrollmentGroup", created_group),
        call("getIndividualEnrollment", "svc-ind"),
        call("getIndividualEnrollment", "svc-ind-2"),
        call("getEnrollmentGroup", "svc-grp"),
        call("deleteIndividualEnrollment", "svc-ind"))
    ok(results[0])
    failed(results[1], "InvalidEtagError", 412)
    ok(results[2])
    failed(results[3], "InvalidEtagError", 412)
    ok(results[4])
    for gone in results[5:]:
        failed(gone, "Error", 404)


def test_service_client_query_pages_and_bulk(dps):
    ids = [f"page-{i}" for i in range(5)]
    service(dps, *[call("createOrUpdateIndividualEnrollment", {"registrationId": i, "attestation": symmetric()})
                   for i in ids])
    paged, whole = service(dps, call("queryEnrollments", 2), call("queryEnrollments", 1000))
    pages = ok(paged)["pages"]
    assert all(len(p["items"]) <= 2 for p in pages), pages
    assert all(p["continuation"] for p in pages[:-1]) and pages[-1]["continuation"] is None, pages
    seen = [e["registrationId"] for p in pages for e in p["items"]]
    assert len(seen) == len(set(seen)), f"an enrollment came twice: {seen}"
    assert set(ids) <= set(seen)
    assert len(pages) >= 3
    (only_page,) = ok(whole)["pages"]
    assert sorted(seen) == sorted(e["registrationId"] for e in only_page["items"])
    assert all("primaryKey" not in (e["attestation"].get("symmetricKey") or {}) for e in only_page["items"])

    bulk = [{"registrationId": f"bulk-{i}", "attestation": symmetric()} for i in range(3)]
    created, clash, read, deleted, after, listed = service(
        dps,
        call("runBulkEnrollmentOperation", {"mode": "create", "enrollments": bulk}),
        call("runBulkEnrollmentOperation", {"mode": "create", "enrollments": bulk[:1]}),
        call("getIndividualEnrollment", "bulk-2"),
        call("runBulkEnrollmentOperation", {"mode": "delete", "enrollments": bulk}),
        call("getIndividualEnrollment", "bulk-2"),
        call("queryEnrollments", 1000))
    assert created["status"] == 200
    assert ok(created)["isSuccessful"] is True and not ok(created).get("errors"), created
    clash = ok(clash)
    assert clash["isSuccessful"] is False
    assert [e["registrationId"] for e in clash["errors"]] == ["bulk-0"], clash
    assert ok(read)["registrationId"] == "bulk-2"
    assert ok(deleted)["isSuccessful"] is True, deleted
    failed(after, "Error", 404)
    remaining = {e["registrationId"] for p in ok(listed)["pages"] for e in p["items"]}
    assert not remaining & {"bulk-0", "bulk-1", "bulk-2"} and set(ids) <= remaining


def test_service_client_registration_states(dps):
    service(dps, call("createOrUpdateEnrollmentGroup",
                      {"enrollmentGroupId": "reg-grp", "attestation": symmetric(primaryKey=PRIMARY)}))
    for rid in ("reg-dev-1", "reg-dev-2"):
        assert_assigned(dps, provision(dps, "Mqtt", rid, groupKey=PRIMARY), rid)
    state, listed = service(dps, call("getDeviceRegistrationState", "reg-dev-1"), call("queryRegistrations", "reg-grp", 1))
    state = ok(state)
    assert (state["registrationId"], state["deviceId"], state["assignedHub"], state["status"]) == (
        "reg-dev-1", "reg-dev-1", dps.hub_host, "assigned"), state
    assert state["etag"]
    pages = ok(listed)["pages"]
    assert [e["registrationId"] for p in pages for e in p["items"]] == ["reg-dev-1", "reg-dev-2"], pages
    assert all(len(p["items"]) <= 1 for p in pages)

    second = ok(service(dps, call("getDeviceRegistrationState", "reg-dev-2"))[0])
    results = service(
        dps,
        call("deleteDeviceRegistrationState", "reg-dev-1"),
        call("deleteDeviceRegistrationState", dict(second, etag='"stale"')),
        call("deleteDeviceRegistrationState", second),
        call("getDeviceRegistrationState", "reg-dev-1"),
        call("getDeviceRegistrationState", "reg-dev-2"),
        call("queryRegistrations", "reg-grp", 10))
    ok(results[0])
    failed(results[1], "InvalidEtagError", 412)
    ok(results[2])
    failed(results[3], "Error", 404)
    failed(results[4], "Error", 404)
    assert [e for p in ok(results[5])["pages"] for e in p["items"]] == []
    # The hub's devices stay: the registration state is the provisioning service's record only.
    for rid in ("reg-dev-1", "reg-dev-2"):
        assert device(dps.hub, rid).status_code == 200


# -- the device client ------------------------------------------------------------------------

@pytest.mark.parametrize("transport,group", [
    ("Mqtt", False), ("MqttWs", True), ("Http", False), ("Amqp", True), ("AmqpWs", False)])
def test_symmetric_key_registration_then_telemetry(dps, transport, group):
    rid = f"sym-{transport.lower()}"
    payload = {"transport": transport, "firmware": "1.2.3"}
    body = f"hello from {rid} {uuid.uuid4()}"
    if group:
        created = ok(service(dps, call("createOrUpdateEnrollmentGroup", {
            "enrollmentGroupId": f"{rid}-grp", "attestation": symmetric(),
            "initialTwin": {"tags": {"via": "group"}}}))[0])
        key = created["attestation"]["symmetricKey"]["primaryKey"]
        outcome = provision(dps, transport, rid, groupKey=key, payload=payload, telemetry=body)
        device_id = rid
    else:
        device_id = f"{rid}-device"
        created = ok(service(dps, call("createOrUpdateIndividualEnrollment", {
            "registrationId": rid, "deviceId": device_id, "attestation": symmetric(),
            "initialTwin": {"tags": {"via": "individual"}, "properties": {"desired": {"interval": 5}}}}))[0])
        key = created["attestation"]["symmetricKey"]["primaryKey"]
        outcome = provision(dps, transport, rid, symmetricKey=key, payload=payload, telemetry=body)
    assert_assigned(dps, outcome, device_id, payload)
    assert outcome.get("sent") is True, outcome

    identity = device(dps.hub, device_id).json()
    assert identity["authentication"]["type"] == "sas"
    assert identity["authentication"]["symmetricKey"]["primaryKey"] == outcome["derivedKey"]
    t = twin(dps.hub, device_id)
    if group:
        assert t["tags"] == {"via": "group"}
    else:
        assert t["tags"] == {"via": "individual"}
        assert t["properties"]["desired"]["interval"] == 5
    wait_for_telemetry(dps.hub, device_id, body)


@pytest.mark.parametrize("transport", ["Mqtt", "Http", "Amqp"])
def test_x509_registration_then_telemetry(dps, transport, tmp_path):
    t = transport.lower()
    leaf, leaf_key = certs.self_signed(tmp_path, f"x509-ind-{t}")
    ca, ca_key = certs.ca(tmp_path, f"dps-{t}")
    member, member_key = certs.signed_by(tmp_path, f"x509-grp-{t}", ca, ca_key)
    ind, grp = service(
        dps,
        call("createOrUpdateIndividualEnrollment",
             {"registrationId": f"x509-ind-{t}", "attestation": x509("clientCertificates", leaf)}),
        call("createOrUpdateEnrollmentGroup",
             {"enrollmentGroupId": f"x509-grp-{t}-group", "attestation": x509("signingCertificates", ca)}))
    info = ok(ind)["attestation"]["x509"]["clientCertificates"]["primary"]["info"]
    assert info["sha256Thumbprint"].upper() == sha256_thumbprint(leaf).upper(), info
    ok(grp)

    for rid, cert, key in ((f"x509-ind-{t}", leaf, leaf_key), (f"x509-grp-{t}", member, member_key)):
        body = f"x509 hello from {rid} {uuid.uuid4()}"
        outcome = provision(dps, transport, rid, certFile=str(cert), keyFile=str(key),
                            payload={"cert": rid}, telemetry=body)
        assert_assigned(dps, outcome, rid, {"cert": rid})
        assert outcome.get("sent") is True, outcome
        auth = device(dps.hub, rid).json()["authentication"]
        assert auth["type"] == "selfSigned", auth
        assert auth["x509Thumbprint"]["primaryThumbprint"].upper() == sha256_thumbprint(cert).upper(), auth
        wait_for_telemetry(dps.hub, rid, body)


# -- refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", ["Http", "Mqtt"])
def test_a_wrong_key_is_unauthorized_and_creates_nothing(dps, transport):
    rid = f"wrong-key-{transport.lower()}"
    service(dps, call("createOrUpdateIndividualEnrollment",
                      {"registrationId": rid, "attestation": symmetric(primaryKey=PRIMARY, secondaryKey=SECONDARY)}))
    outcome = provision(dps, transport, rid, symmetricKey=base64.b64encode(b"w" * 32).decode())
    assert "registration" not in outcome, outcome
    assert outcome["error"]["name"] == "UnauthorizedError", outcome
    assert_nothing_created(dps, rid)


def test_a_disabled_enrollment_or_group_creates_nothing(dps):
    service(
        dps,
        call("createOrUpdateIndividualEnrollment",
             {"registrationId": "off-ind", "attestation": symmetric(primaryKey=PRIMARY),
              "provisioningStatus": "disabled"}),
        call("createOrUpdateEnrollmentGroup",
             {"enrollmentGroupId": "off-grp", "provisioningStatus": "disabled",
              "attestation": symmetric(primaryKey=base64.b64encode(b"g" * 32).decode())}))
    for transport, rid, cred in (("Mqtt", "off-ind", {"symmetricKey": PRIMARY}),
                                 ("Http", "off-grp-dev", {"groupKey": base64.b64encode(b"g" * 32).decode()})):
        outcome = provision(dps, transport, rid, **cred)
        assert "registration" not in outcome, outcome
        assert outcome["error"]["message"], outcome
        assert_nothing_created(dps, rid)
