"""One register-body parser behind the three provisioning protocols (issue 70): bodies the SDKs
never send (not JSON, not an object, another registration id, a TPM attestation) go over MQTT
(the raw client), HTTPS (raw requests) and AMQP (tests/node/dps_raw_amqp.js: rhea, the client
under the Node provisioning transport, speaking as that transport does), and each protocol
answers each body with the same DPS error (400004, the same message) and creates nothing. A
good body then registers over each.

Fixed ports (one `sdk_hub`: a three-node cluster with FERROHUB_TEST_CLUSTER=1)."""

import base64
import json
import subprocess

import pytest
import requests

from hubkit import REPO, sas_token
from mqttraw import RawMqtt
from routingkit import read_publish
from test_dps_python import DEVICE_API, assert_nothing_created, dps, id_scope, ok, put_enrollment
from test_node_event_hubs import node_env

RAW_AMQP_JS = str(REPO / "tests" / "node" / "dps_raw_amqp.js")
KEY = base64.b64encode(b"k" * 32).decode()
MALFORMED = [
    b"{",
    b"[1]",
    b'"dps-bodies"',
    b'{"registrationId":"someone-else","payload":{}}',
    b'{"registrationId":7}',
    b'{"registrationId":null,"tpm":{"endorsementKey":"AToAAQAL","storageRootKey":"ARgAAQAL"}}',
]


def token(scope: str, rid: str) -> str:
    return sas_token(f"{scope}/registrations/{rid}", KEY)


def over_https(hub, scope: str, rid: str, body: bytes) -> tuple[int, dict]:
    r = requests.put(f"https://localhost:{hub.port}/{scope}/registrations/{rid}/register?api-version={DEVICE_API}",
                     data=body, verify=hub.ca, timeout=30,
                     headers={"Content-Type": "application/json", "Authorization": token(scope, rid)})
    return r.status_code, r.json()


def over_mqtt(hub, scope: str, rid: str, bodies: list[bytes]) -> list[tuple[int, dict]]:
    c = RawMqtt(hub.mqtt_port, hub.ca)
    try:
        _, rc = c.connect(rid, f"{scope}/registrations/{rid}/api-version={DEVICE_API}", token(scope, rid))
        assert rc == 0, f"CONNACK {rc}"
        c.subscribe([("$dps/registrations/res/#", 0)])
        answers = []
        for n, body in enumerate(bodies):
            c.publish(f"$dps/registrations/PUT/iotdps-register/?$rid={n}", body)
            topic, payload = read_publish(c, timeout=30)
            assert topic.startswith("$dps/registrations/res/") and f"$rid={n}" in topic, topic
            answers.append((int(topic.split("/")[3]), json.loads(payload)))
        return answers
    finally:
        c.close()


def over_amqp(hub, scope: str, rid: str, bodies: list[bytes]) -> list[tuple[str, dict]]:
    request = {"host": "127.0.0.1", "port": hub.amqp_port, "idScope": scope, "registrationId": rid,
               "token": token(scope, rid), "bodies": [base64.b64encode(b).decode() for b in bodies],
               "timeoutMs": 45000}
    done = subprocess.run(["node", RAW_AMQP_JS], input=json.dumps(request), capture_output=True, text=True,
                          timeout=60, env=node_env(hub))
    assert done.returncode == 0, f"dps_raw_amqp.js exited {done.returncode}:\n{done.stderr[-3000:]}"
    replies = json.loads(done.stdout.strip().splitlines()[-1])["replies"]
    return [(r["status"], r["body"]) for r in replies]


def refusal(body: dict) -> tuple[int, str]:
    assert {"errorCode", "trackingId", "message", "timestampUtc"} <= body.keys(), body
    return body["errorCode"], body["message"]


@pytest.fixture(scope="module")
def enrolled(sdk_hub):
    rid = "dps-bodies"
    put_enrollment(sdk_hub, rid, attestation={"type": "symmetricKey",
                                               "symmetricKey": {"primaryKey": KEY, "secondaryKey": KEY}})
    return id_scope(sdk_hub), rid


def test_a_malformed_body_gets_the_same_refusal_on_every_protocol(sdk_hub, enrolled):
    scope, rid = enrolled
    https = [over_https(sdk_hub, scope, rid, b) for b in MALFORMED]
    mqtt = over_mqtt(sdk_hub, scope, rid, MALFORMED)
    amqp = over_amqp(sdk_hub, scope, rid, MALFORMED)
    for body, (h_status, h), (m_status, m), (a_status, a) in zip(MALFORMED, https, mqtt, amqp):
        assert (h_status, m_status, a_status) == (400, 400, "failed"), (body, h, m, a)
        assert refusal(h)[0] == 400004, (body, h)
        assert refusal(h) == refusal(m) == refusal(a), (body, h, m, a)
    # The messages say what is wrong, one kind per body.
    messages = [refusal(h)[1] for _, h in https]
    for needle, message in zip(["not JSON", "JSON object", "JSON object", "is not", "is not", "TPM"], messages):
        assert needle in message, (needle, message)
    assert_nothing_created(sdk_hub, rid)


def test_a_good_body_registers_over_every_protocol(sdk_hub, enrolled):
    scope, rid = enrolled
    good = json.dumps({"registrationId": rid, "payload": {"line": 3}}).encode()
    status, body = over_https(sdk_hub, scope, rid, good)
    assert status == 202 and body["status"] == "assigning", body
    [(status, body)] = over_mqtt(sdk_hub, scope, rid, [good])
    assert status == 202 and body["status"] == "assigning", body
    [(status, body)] = over_amqp(sdk_hub, scope, rid, [good])
    assert status in ("assigning", "assigned") and "operationId" in body, (status, body)
    ok(dps(sdk_hub, "GET", f"/registrations/{rid}"))
