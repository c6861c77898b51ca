"""DPS-1..DPS-4, the Device Provisioning Service on the hub's own host name and ports, driven by
the official Python device SDK (`ProvisioningDeviceClient`, fixed ports: one `sdk_hub`, which is
a three-node cluster with FERROHUB_TEST_CLUSTER=1) and raw REST for the service API:

- A symmetric-key individual enrollment (device id other than the registration id, initial
  twin, a device payload) registers over MQTT: the result names the hub, the device and echoes
  the payload; the device then connects with the enrollment's key, its telemetry arrives, and
  its twin holds the initial tags and desired properties.
- A symmetric-key enrollment group admits members with keys derived from the group key (two
  over MQTT, one over MQTT/WebSocket), each connects and sends telemetry; the group's
  registration query lists them, page by page.
- X.509: an individual enrollment holding a self-signed leaf, and a group whose signing
  certificate is an intermediate CA (the device presents leaf + intermediate); each device is
  created with its leaf's SHA-256 thumbprint and connects to the hub with that certificate.
- Refusals create nothing (no device, no registration state): a wrong key, a registration id
  nothing admits, a certificate outside every group, a disabled enrollment, a deleted one; and
  the service API answers DPS's error bodies (401, 409, 412, 400).
- Reprovisioning: `migrateDeviceData: false` resets the twin to the initial one
  (`deviceDataReset`); the default keeps it (`deviceDataMigrated`).
- Durability (its own hub, ephemeral ports, registration over HTTPS): after SIGKILL the
  enrollments, the registration states, the devices and the ID scope are as they were.
- CLI: `--id-scope`, `--provisioning` and `--provisioning --policy enrollmentread`.
"""

import base64
import hashlib
import hmac
import json
import re
import time
import urllib.parse

import pytest
import requests
from azure.iot.device import IoTHubDeviceClient, Message, ProvisioningDeviceClient, X509
from azure.iot.device.common.evented_callback import EventedCallback
from azure.iot.device.exceptions import ClientError

import certs
from hubkit import parse_cs, sas_token

SERVICE_API = "2021-10-01"
DEVICE_API = "2021-06-01"
HOST = "localhost"
MODEL = "dtmi:com:example:Thermostat;1"
ID_SCOPE = re.compile(r"^0ne[0-9A-F]{8}$")
PROVISIONING_CS = re.compile(
    r"^HostName=localhost;SharedAccessKeyName=(provisioningserviceowner|enrollmentread);SharedAccessKey=[A-Za-z0-9+/]{43}=$")
REFUSED = "register request returned a service error status code 401"
ERROR_BODY = {"errorCode", "trackingId", "message", "timestampUtc"}


# -- service side ---------------------------------------------------------------------------
def id_scope(hub) -> str:
    return hub.cli("connection-string", "--id-scope")


_policy_keys: dict[tuple[str, str], str] = {}


def service_token(hub, policy: str = "provisioningserviceowner") -> str:
    """A service token signed with a provisioning policy's key (read once per hub with the CLI)."""
    cached = (hub.ca, policy)  # one CA per hub or cluster, whichever node writes
    if cached not in _policy_keys:
        cs = hub.cli("connection-string", "--provisioning", "--policy", policy)
        _policy_keys[cached] = parse_cs(cs)["SharedAccessKey"]
    return sas_token(HOST, _policy_keys[cached], policy=policy)


def dps(hub, method: str, path: str, token: str | None = "owner", api_version: str | None = SERVICE_API,
        **kw) -> requests.Response:
    """A call to the provisioning service's HTTPS API; `token="owner"` signs it with
    provisioningserviceowner, None sends it unsigned."""
    headers = dict(kw.pop("headers", {}))
    if token == "owner":
        token = service_token(hub)
    if token is not None:
        headers["Authorization"] = token
    url = f"https://localhost:{hub.port}{path}"
    if api_version:
        url += ("&" if "?" in path else "?") + f"api-version={api_version}"
    return requests.request(method, url, headers=headers, verify=hub.ca, timeout=30, **kw)


def ok(r: requests.Response, status: int = 200):
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text)
    return r.json() if r.content else None


def refused(r: requests.Response, status: int, code: int) -> dict:
    """Checks a refusal carries DPS's error body with `code`; returns the body."""
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text)
    body = r.json()
    assert ERROR_BODY <= body.keys() and body["errorCode"] == code, body
    return body


def refused_once_seen(request, status: int, code: int, within: float = 10.0) -> dict:
    """`refused` for a read right after a write: through a cluster's balancer the read may
    reach a node whose replica is a moment behind the write (docs/cluster.md, reads are
    consistent per node), so it is read again, for up to `within` seconds, until it shows it."""
    deadline = time.monotonic() + within
    while True:
        r = request()
        if r.status_code == status or time.monotonic() > deadline:
            return refused(r, status, code)
        time.sleep(0.1)


def put_enrollment(hub, registration_id: str, **fields) -> dict:
    body = {"registrationId": registration_id, "attestation": {"type": "symmetricKey"}, **fields}
    return ok(dps(hub, "PUT", f"/enrollments/{registration_id}", json=body))


def put_group(hub, group_id: str, attestation: dict, **fields) -> dict:
    body = {"enrollmentGroupId": group_id, "attestation": attestation, **fields}
    return ok(dps(hub, "PUT", f"/enrollmentGroups/{group_id}", json=body))


def x509_attestation(slot: str, cert) -> dict:
    return {"type": "x509", "x509": {slot: {"primary": {"certificate": cert.read_text()}}}}


def derived_key(group_key: str, registration_id: str) -> str:
    """A group member's key, as `az iot dps enrollment-group compute-device-key` derives it."""
    mac = hmac.new(base64.b64decode(group_key), registration_id.encode(), hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


def twin(hub, device_id: str) -> dict:
    return ok(hub.request("GET", f"/twins/{urllib.parse.quote(device_id, safe='')}", hub.token()))


def assert_nothing_created(hub, registration_id: str, device_id: str | None = None):
    r = hub.request("GET", f"/devices/{device_id or registration_id}", hub.token())
    assert r.status_code == 404, r.text
    refused(dps(hub, "GET", f"/registrations/{registration_id}"), 404, 404203)


# -- device side ----------------------------------------------------------------------------
def provisioning_client(hub, registration_id: str, key: str | None = None, x509: X509 | None = None,
                        **kw) -> ProvisioningDeviceClient:
    common = dict(provisioning_host=HOST, registration_id=registration_id, id_scope=id_scope(hub),
                  server_verification_cert=open(hub.ca).read(), **kw)
    if x509 is not None:
        return ProvisioningDeviceClient.create_from_x509_certificate(x509=x509, **common)
    return ProvisioningDeviceClient.create_from_symmetric_key(symmetric_key=key, **common)


def register(hub, registration_id: str, payload=None, **kw):
    """Registers through the SDK; the result once assigned."""
    client = provisioning_client(hub, registration_id, **kw)
    if payload is not None:
        client.provisioning_payload = payload
    try:
        result = client.register()
    except BaseException:
        close(client)
        raise
    assert result.status == "assigned", str(result)
    return result


def register_refused(hub, registration_id: str, why: str = REFUSED, **kw):
    """Registers through the SDK and expects it to raise; `why` is the SDK's reason."""
    client = provisioning_client(hub, registration_id, **kw)
    try:
        with pytest.raises(ClientError) as excinfo:
            client.register()
    finally:
        close(client)
    assert str(excinfo.value.__cause__) == why, repr(excinfo.value.__cause__)


def close(client: ProvisioningDeviceClient):
    """The SDK (2.14) shuts its pipeline down only after an assignment; a refused client is
    shut down here so its connection does not outlive the test."""
    done = EventedCallback()
    try:
        client._pipeline.shutdown(callback=done)
    except Exception:
        return  # already shut down
    done.wait_for_completion(timeout=10)


def send_telemetry(hub, state, text: str, key: str | None = None, x509: X509 | None = None, **kw):
    """Connects to the assigned hub as the SDK's sample does and sends one message."""
    common = dict(hostname=state.assigned_hub, device_id=state.device_id,
                  server_verification_cert=open(hub.ca).read(), connection_retry=False, **kw)
    if x509 is not None:
        client = IoTHubDeviceClient.create_from_x509_certificate(x509=x509, **common)
    else:
        client = IoTHubDeviceClient.create_from_symmetric_key(symmetric_key=key, **common)
    try:
        client.connect()
        client.send_message(Message(text))
    finally:
        client.shutdown()


def wait_for_event(hub, device_id: str, text: str, timeout: float = 15) -> dict:
    deadline = time.time() + timeout
    while True:
        events = hub.events_of(device_id)
        bodies = [base64.b64decode(e["body"]).decode() for e in events]
        if text in bodies:
            return events[bodies.index(text)]
        assert time.time() < deadline, f"{text!r} from {device_id} never arrived: {bodies}"
        time.sleep(0.2)


# -- tests ----------------------------------------------------------------------------------
def test_symmetric_key_enrollment_provisions_a_connecting_device(sdk_hub):
    hub, rid = sdk_hub, "dps-thermostat-reg"
    initial_twin = {"tags": {"site": "plant-4", "floor": 2}, "properties": {"desired": {"targetTemperature": 21.5}}}
    created = put_enrollment(hub, rid, deviceId="thermostat-17", initialTwin=initial_twin)
    keys = created["attestation"]["symmetricKey"]
    assert keys["primaryKey"] and keys["secondaryKey"] and keys["primaryKey"] != keys["secondaryKey"]
    # Reads leave the keys out; attestationmechanism answers them.
    read = ok(dps(hub, "GET", f"/enrollments/{rid}"))
    assert read["attestation"] == {"type": "symmetricKey", "symmetricKey": {}}
    assert read["etag"] == created["etag"] and read["deviceId"] == "thermostat-17"
    assert ok(dps(hub, "POST", f"/enrollments/{rid}/attestationmechanism"))["symmetricKey"] == keys

    result = register(hub, rid, key=keys["primaryKey"], payload={"modelId": MODEL})
    state = result.registration_state
    assert (state.assigned_hub, state.device_id, state.sub_status) == (HOST, "thermostat-17", "initialAssignment")
    assert json.loads(state.response_payload) == {"modelId": MODEL}

    send_telemetry(hub, state, "21.7 degrees", key=keys["primaryKey"])
    wait_for_event(hub, "thermostat-17", "21.7 degrees")
    t = twin(hub, "thermostat-17")
    assert t["tags"] == initial_twin["tags"]
    assert t["properties"]["desired"]["targetTemperature"] == 21.5

    registration = ok(dps(hub, "GET", f"/registrations/{rid}"))
    assert {k: registration[k] for k in ("registrationId", "deviceId", "assignedHub", "status", "etag")} == {
        "registrationId": rid, "deviceId": "thermostat-17", "assignedHub": HOST, "status": "assigned",
        "etag": state.etag}
    assert ok(dps(hub, "GET", f"/enrollments/{rid}"))["registrationState"]["deviceId"] == "thermostat-17"


def test_symmetric_key_group_admits_members_with_derived_keys(sdk_hub):
    hub, group = sdk_hub, "dps-sensors"
    put_group(hub, group, {"type": "symmetricKey"})
    group_key = ok(dps(hub, "POST", f"/enrollmentGroups/{group}/attestationmechanism"))["symmetricKey"]["primaryKey"]
    members = [("dps-sensor-a", False), ("dps-sensor-b", False), ("dps-sensor-ws", True)]
    for rid, websockets in members:
        key = derived_key(group_key, rid)
        state = register(hub, rid, key=key, websockets=websockets).registration_state
        assert (state.assigned_hub, state.device_id) == (HOST, rid)
        send_telemetry(hub, state, f"hello from {rid}", key=key, websockets=websockets)
        wait_for_event(hub, rid, f"hello from {rid}")
        device = ok(hub.request("GET", f"/devices/{rid}", hub.token()))
        assert device["authentication"]["symmetricKey"]["primaryKey"] == key

    listed = ok(dps(hub, "POST", f"/registrations/{group}/query", json={}))
    assert sorted(r["registrationId"] for r in listed) == [rid for rid, _ in members]
    assert all(r["status"] == "assigned" and r["assignedHub"] == HOST for r in listed)
    # Two pages of two: a continuation after the first only.
    first = dps(hub, "POST", f"/registrations/{group}/query", json={}, headers={"x-ms-max-item-count": "2"})
    continuation = first.headers.get("x-ms-continuation")
    assert len(ok(first)) == 2 and continuation
    second = dps(hub, "POST", f"/registrations/{group}/query", json={},
                 headers={"x-ms-max-item-count": "2", "x-ms-continuation": continuation})
    assert len(ok(second)) == 1 and "x-ms-continuation" not in second.headers
    assert sorted(r["registrationId"] for r in ok(first) + ok(second)) == [rid for rid, _ in members]


def test_x509_individual_and_intermediate_signed_group(sdk_hub, tmp_path):
    hub = sdk_hub
    # Individual: the enrollment holds the self-signed leaf itself.
    leaf, leaf_key = certs.self_signed(tmp_path, "dps-x509-self")
    put_enrollment(hub, "dps-x509-self", attestation=x509_attestation("clientCertificates", leaf))
    info = ok(dps(hub, "GET", "/enrollments/dps-x509-self"))["attestation"]["x509"]["clientCertificates"]["primary"]["info"]
    assert info["sha1Thumbprint"].upper() == certs.thumbprint(leaf).upper()
    # Group: the signing certificate is an intermediate; the device presents leaf + intermediate.
    root, root_key = certs.ca(tmp_path, "dps-root")
    inter, inter_key = certs.intermediate(tmp_path, "dps-inter", root, root_key)
    member, member_key = certs.signed_by(tmp_path, "dps-x509-member", inter, inter_key)
    chain = certs.chain_file(tmp_path / "dps-x509-member-chain.pem", member, inter)
    put_group(hub, "dps-x509-fleet", x509_attestation("signingCertificates", inter))

    for rid, cert_file, key_file, leaf_cert in [("dps-x509-self", leaf, leaf_key, leaf),
                                                ("dps-x509-member", chain, member_key, member)]:
        x509 = X509(cert_file=str(cert_file), key_file=str(key_file))
        state = register(hub, rid, x509=x509).registration_state
        assert (state.assigned_hub, state.device_id) == (HOST, rid)
        auth = ok(hub.request("GET", f"/devices/{rid}", hub.token()))["authentication"]
        assert auth["type"] == "selfSigned"
        assert auth["x509Thumbprint"]["primaryThumbprint"].upper() == certs.sha256_thumbprint(leaf_cert).upper()
        send_telemetry(hub, state, f"signed by {rid}", x509=x509)
        event = wait_for_event(hub, rid, f"signed by {rid}")
        assert json.loads(event["systemProperties"]["iothub-connection-auth-method"])["type"] == "x509Certificate"
    assert [r["registrationId"] for r in ok(dps(hub, "POST", "/registrations/dps-x509-fleet/query", json={}))] == [
        "dps-x509-member"]


def test_device_refusals_create_nothing(sdk_hub, tmp_path):
    hub = sdk_hub
    # A wrong key for an enrollment that exists.
    put_enrollment(hub, "dps-deny-key")
    register_refused(hub, "dps-deny-key", key=base64.b64encode(b"k" * 32).decode())
    assert_nothing_created(hub, "dps-deny-key")
    # A registration id no enrollment or group admits.
    register_refused(hub, "dps-deny-nobody", key=base64.b64encode(b"n" * 32).decode())
    assert_nothing_created(hub, "dps-deny-nobody")
    # A certificate whose chain reaches no group (another CA signed it).
    fleet, fleet_key = certs.ca(tmp_path, "dps-deny-fleet")
    put_group(hub, "dps-deny-fleet", x509_attestation("signingCertificates", fleet))
    rogue, rogue_key = certs.ca(tmp_path, "dps-rogue")
    stray, stray_key = certs.signed_by(tmp_path, "dps-deny-stray", rogue, rogue_key)
    register_refused(hub, "dps-deny-stray", x509=X509(cert_file=str(stray), key_file=str(stray_key)))
    assert_nothing_created(hub, "dps-deny-stray")
    # A disabled enrollment, with its right key: status "disabled", which the SDK raises.
    key = put_enrollment(hub, "dps-deny-disabled", provisioningStatus="disabled")["attestation"]["symmetricKey"]["primaryKey"]
    register_refused(hub, "dps-deny-disabled", key=key,
                     why="Query Status Operation encountered an invalid registration status disabled with a status code of 200")
    assert_nothing_created(hub, "dps-deny-disabled")
    # A deleted enrollment: it admitted the device once, and no longer.
    key = put_enrollment(hub, "dps-deny-deleted")["attestation"]["symmetricKey"]["primaryKey"]
    register(hub, "dps-deny-deleted", key=key)
    ok(dps(hub, "DELETE", "/registrations/dps-deny-deleted"), 204)
    ok(dps(hub, "DELETE", "/enrollments/dps-deny-deleted"), 204)
    refused_once_seen(lambda: dps(hub, "GET", "/enrollments/dps-deny-deleted"), 404, 404201)
    ok(hub.request("DELETE", "/devices/dps-deny-deleted", hub.token(), headers={"If-Match": "*"}), 204)
    register_refused(hub, "dps-deny-deleted", key=key)
    assert_nothing_created(hub, "dps-deny-deleted")


def test_service_api_refusals_carry_dps_error_bodies(sdk_hub):
    hub, rid = sdk_hub, "dps-rest"
    created = put_enrollment(hub, rid, initialTwin={"tags": {"version": 1}})
    path = f"/enrollments/{rid}"
    body = {"registrationId": rid, "attestation": {"type": "symmetricKey"}, "initialTwin": {"tags": {"version": 2}}}

    refused(dps(hub, "GET", path, token=None), 401, 401002)
    refused(dps(hub, "GET", path, token=hub.token("iothubowner")), 401, 401002)  # a hub policy is not a DPS one
    reader = service_token(hub, "enrollmentread")
    assert ok(dps(hub, "GET", path, token=reader))["etag"] == created["etag"]
    refused(dps(hub, "PUT", path, token=reader, json=body), 401, 401002)
    refused(dps(hub, "PUT", path, json=body), 409, 409001)
    refused(dps(hub, "PUT", path, json=body, headers={"If-Match": '"not-the-etag"'}), 412, 412001)
    refused(dps(hub, "DELETE", path, headers={"If-Match": '"not-the-etag"'}), 412, 412001)
    refused(dps(hub, "PUT", path, data=b"{nope", headers={"Content-Type": "application/json"}), 400, 400004)
    refused(dps(hub, "PUT", path, json={**body, "attestation": {"type": "tpm", "tpm": {"endorsementKey": "AAAA"}}}),
            400, 400004)
    refused(dps(hub, "GET", path, api_version=None), 400, 400004)
    unchanged = ok(dps(hub, "GET", path))
    assert (unchanged["etag"], unchanged["initialTwin"]["tags"]) == (created["etag"], {"version": 1})
    # With the right etag the replacement goes through.
    replaced = ok(dps(hub, "PUT", path, json=body, headers={"If-Match": f'"{created["etag"]}"'}))
    assert replaced["etag"] != created["etag"] and replaced["initialTwin"]["tags"] == {"version": 2}

    # A malformed register over HTTPS, correctly signed: 400, and nothing is created.
    scope, key = id_scope(hub), replaced["attestation"]["symmetricKey"]["primaryKey"]
    r = requests.put(f"https://localhost:{hub.port}/{scope}/registrations/{rid}/register?api-version={DEVICE_API}",
                     data=b"{nope", verify=hub.ca, timeout=30,
                     headers={"Content-Type": "application/json",
                              "Authorization": sas_token(f"{scope}/registrations/{rid}", key)})
    refused(r, 400, 400004)
    assert_nothing_created(hub, rid)


def test_reprovisioning_resets_or_migrates_device_data(sdk_hub):
    hub = sdk_hub
    initial_tags = {"fleet": "initial"}
    for rid, policy, substatus in [
        ("dps-reset", {"updateHubAssignment": True, "migrateDeviceData": False}, "deviceDataReset"),
        ("dps-migrate", None, "deviceDataMigrated"),
    ]:
        extra = {"reprovisionPolicy": policy} if policy else {}
        created = put_enrollment(hub, rid, initialTwin={"tags": initial_tags}, **extra)
        key = created["attestation"]["symmetricKey"]["primaryKey"]
        first = register(hub, rid, key=key).registration_state
        assert first.sub_status == "initialAssignment"
        hub.set_tags(rid, {"fleet": "changed", "owner": "ops"})
        again = register(hub, rid, key=key).registration_state
        assert again.sub_status == substatus, rid
        assert again.etag != first.etag and again.created_date_time == first.created_date_time
        tags = twin(hub, rid)["tags"]
        assert tags == (initial_tags if substatus == "deviceDataReset" else {"fleet": "changed", "owner": "ops"}), rid
        assert ok(dps(hub, "GET", f"/registrations/{rid}"))["substatus"] == substatus


def https_register(hub, scope: str, rid: str, key: str) -> dict:
    """A registration over HTTPS as the SDKs' HTTP transport does it: PUT register, then poll
    the operation until it is no longer `assigning`."""
    base = f"https://localhost:{hub.port}/{scope}/registrations/{rid}"
    auth = {"Authorization": sas_token(f"{scope}/registrations/{rid}", key)}
    r = requests.put(f"{base}/register?api-version={DEVICE_API}", json={"registrationId": rid},
                     headers=auth, verify=hub.ca, timeout=30)
    op = ok(r, 202)
    assert op["status"] == "assigning" and op["operationId"]
    deadline = time.time() + 15
    while True:
        r = requests.get(f"{base}/operations/{op['operationId']}?api-version={DEVICE_API}",
                         headers=auth, verify=hub.ca, timeout=30)
        status = ok(r, 202 if r.status_code == 202 else 200)
        if status["status"] != "assigning":
            status["operationId"] = op["operationId"]
            return status
        assert time.time() < deadline, "the registration stayed assigning"
        time.sleep(0.2)


def test_enrollments_registrations_and_devices_survive_sigkill(hub):
    scope = id_scope(hub)
    assert ID_SCOPE.match(scope), scope
    banner = [l for l in hub.startup_lines if l.startswith("Provisioning service")]
    assert banner == [f"Provisioning service (ID scope {scope}): "
                      f"{hub.cli('connection-string', '--provisioning')}"], hub.startup_lines

    individual = put_enrollment(hub, "dps-durable", deviceId="durable-device",
                                initialTwin={"tags": {"kept": True}})
    put_group(hub, "dps-durable-group", {"type": "symmetricKey"})
    group_key = ok(dps(hub, "POST", "/enrollmentGroups/dps-durable-group/attestationmechanism"))["symmetricKey"]["primaryKey"]
    assigned = {
        "dps-durable": https_register(hub, scope, "dps-durable", individual["attestation"]["symmetricKey"]["primaryKey"]),
        "dps-durable-member": https_register(hub, scope, "dps-durable-member", derived_key(group_key, "dps-durable-member")),
    }
    for rid, status in assigned.items():
        assert status["status"] == "assigned", status

    def snapshot():
        return {
            "enrollment": ok(dps(hub, "GET", "/enrollments/dps-durable")),
            "keys": ok(dps(hub, "POST", "/enrollments/dps-durable/attestationmechanism")),
            "group": ok(dps(hub, "GET", "/enrollmentGroups/dps-durable-group")),
            "group keys": ok(dps(hub, "POST", "/enrollmentGroups/dps-durable-group/attestationmechanism")),
            "registrations": [ok(dps(hub, "GET", f"/registrations/{rid}")) for rid in assigned],
            "devices": [ok(hub.request("GET", f"/devices/{d}", hub.token())) for d in ("durable-device", "dps-durable-member")],
            "tags": twin(hub, "durable-device")["tags"],
        }

    before = snapshot()
    assert [r["etag"] for r in before["registrations"]] == [s["registrationState"]["etag"] for s in assigned.values()]
    hub.kill()
    hub.start()
    assert id_scope(hub) == scope
    after = snapshot()
    for part in before:
        if part == "devices":  # connection state and the like are not the point: identity and keys are
            for b, a in zip(before[part], after[part]):
                assert (a["deviceId"], a["etag"], a["generationId"], a["authentication"]) == \
                    (b["deviceId"], b["etag"], b["generationId"], b["authentication"])
        else:
            assert after[part] == before[part], part
    assert after["tags"] == {"kept": True}
    # The device's poll of its operation is still answered after the restart.
    rid = "dps-durable"
    r = requests.get(f"https://localhost:{hub.port}/{scope}/registrations/{rid}/operations/"
                     f"{assigned[rid]['operationId']}?api-version={DEVICE_API}", verify=hub.ca, timeout=30,
                     headers={"Authorization": sas_token(f"{scope}/registrations/{rid}",
                                                         after["keys"]["symmetricKey"]["primaryKey"])})
    assert ok(r)["registrationState"]["etag"] == before["registrations"][0]["etag"]


def test_cli_prints_the_id_scope_and_working_provisioning_connection_strings(sdk_hub):
    hub = sdk_hub
    assert ID_SCOPE.match(id_scope(hub)), id_scope(hub)
    owner_cs = hub.cli("connection-string", "--provisioning")
    reader_cs = hub.cli("connection-string", "--provisioning", "--policy", "enrollmentread")
    for cs, policy in [(owner_cs, "provisioningserviceowner"), (reader_cs, "enrollmentread")]:
        assert PROVISIONING_CS.match(cs) and parse_cs(cs)["SharedAccessKeyName"] == policy, cs
    owner = sas_token(parse_cs(owner_cs)["HostName"], parse_cs(owner_cs)["SharedAccessKey"], policy="provisioningserviceowner")
    reader = sas_token(parse_cs(reader_cs)["HostName"], parse_cs(reader_cs)["SharedAccessKey"], policy="enrollmentread")

    body = {"registrationId": "dps-cli", "attestation": {"type": "symmetricKey"}}
    created = ok(dps(hub, "PUT", "/enrollments/dps-cli", token=owner, json=body))
    page = ok(dps(hub, "POST", "/enrollments/query", token=reader, json={"query": "*"}))
    assert "dps-cli" in [e["registrationId"] for e in page]
    assert ok(dps(hub, "GET", "/enrollments/dps-cli", token=reader))["etag"] == created["etag"]
    refused(dps(hub, "PUT", "/enrollments/dps-cli-2", token=reader, json={**body, "registrationId": "dps-cli-2"}),
            401, 401002)
    refused(dps(hub, "DELETE", "/enrollments/dps-cli", token=reader), 401, 401002)
    refused(dps(hub, "GET", "/enrollments/dps-cli-2"), 404, 404201)
    ok(dps(hub, "DELETE", "/enrollments/dps-cli", token=owner), 204)
