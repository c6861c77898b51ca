"""MQT-1, MQT-6, SEC-3, D2C-1/2 through the unmodified official device SDK (azure-iot-device
2.14.0), which always uses ports 8883 (MQTT) and 443 (WebSocket): these tests share one hub on
the fixed ports and run one after another."""

import base64
import json

import pytest
from azure.iot.device import IoTHubDeviceClient, IoTHubModuleClient, Message, X509
from azure.iot.device.exceptions import ClientError, CredentialError

import certs

MESSAGES = 1000


def ca_text(hub):
    return open(hub.ca).read()


def send_all(client, device_id, n):
    for i in range(n):
        msg = Message(json.dumps({"i": i, "device": device_id}))
        msg.message_id = f"{device_id}-m{i}"
        msg.correlation_id = f"corr/{i}"
        msg.content_type = "application/json"
        msg.content_encoding = "utf-8"
        msg.custom_properties["n"] = str(i)
        msg.custom_properties["text"] = "a b&c=d/e"
        client.send_message(msg)


def check_events(hub, device_id, n, module_id=None):
    events = hub.events_of(device_id)
    assert len(events) == n
    generation = hub.request("GET", f"/devices/{device_id}" + (f"/modules/{module_id}" if module_id else ""), hub.token()).json()["generationId"]
    for i, e in enumerate(events):
        assert json.loads(base64.b64decode(e["body"])) == {"i": i, "device": device_id}, "in order"
        sp = e["systemProperties"]
        assert sp["message-id"] == f"{device_id}-m{i}"
        assert sp["correlation-id"] == f"corr/{i}"
        assert sp["content-type"] == "application/json"
        assert sp["content-encoding"] == "utf-8"
        assert sp["iothub-connection-device-id"] == device_id
        assert sp.get("iothub-connection-module-id") == module_id
        assert sp["iothub-connection-auth-generation-id"] == generation
        assert json.loads(sp["iothub-connection-auth-method"])["type"] == "sas"
        assert sp["iothub-enqueuedtime"] == e["enqueuedTimeUtc"]
        assert e["properties"] == {"n": str(i), "text": "a b&c=d/e"}
        if i:
            assert e["sequenceNumber"] > events[i - 1]["sequenceNumber"]
            assert int(e["offset"]) > int(events[i - 1]["offset"])
            assert e["enqueuedTimeUtc"] >= events[i - 1]["enqueuedTimeUtc"]
    # Sequence numbers strictly increase in every partition, whoever sent.
    for p in hub.partitions():
        seqs = [e["sequenceNumber"] for e in hub.read_partition(int(p["partitionId"]))]
        assert seqs == sorted(set(seqs))


@pytest.mark.parametrize("websockets", [False, True], ids=["mqtt", "websocket"])
def test_device_sends_1000_messages(sdk_hub, websockets):
    device_id = f"sdk-{'ws' if websockets else 'mqtt'}"
    sdk_hub.create_device(device_id)
    client = IoTHubDeviceClient.create_from_connection_string(
        sdk_hub.device_connection_string(device_id), server_verification_cert=ca_text(sdk_hub), websockets=websockets)
    try:
        client.connect()
        send_all(client, device_id, MESSAGES)
    finally:
        client.shutdown()
    check_events(sdk_hub, device_id, MESSAGES)


def test_module_client_telemetry_carries_the_module_id(sdk_hub):
    sdk_hub.create_device("sdk-host")
    sdk_hub.create_module("sdk-host", "sdk-mod")
    client = IoTHubModuleClient.create_from_connection_string(
        sdk_hub.device_connection_string("sdk-host", "sdk-mod"), server_verification_cert=ca_text(sdk_hub))
    try:
        client.connect()
        send_all(client, "sdk-host", 5)
        client.send_message_to_output(Message("to output"), "out1")
    finally:
        client.shutdown()
    events = sdk_hub.events_of("sdk-host")
    assert len(events) == 6
    assert all(e["systemProperties"]["iothub-connection-module-id"] == "sdk-mod" for e in events)
    assert events[-1]["systemProperties"]["iothub-outputname"] == "out1"


def x509_client(hub, device_id, cert, key):
    return IoTHubDeviceClient.create_from_x509_certificate(
        x509=X509(cert_file=str(cert), key_file=str(key)), hostname="localhost", device_id=device_id,
        server_verification_cert=ca_text(hub), connection_retry=False)


def test_x509_self_signed(sdk_hub, tmp_path):
    cert, key = certs.self_signed(tmp_path, "x509-dev")
    sdk_hub.create_device("x509-dev", authentication={"type": "selfSigned", "x509Thumbprint": {"primaryThumbprint": certs.thumbprint(cert)}})
    client = x509_client(sdk_hub, "x509-dev", cert, key)
    try:
        client.connect()
        client.send_message(Message("signed"))
    finally:
        client.shutdown()
    (event,) = sdk_hub.events_of("x509-dev")
    assert json.loads(event["systemProperties"]["iothub-connection-auth-method"])["type"] == "x509Certificate"

    other_cert, other_key = certs.self_signed(tmp_path, "impostor")
    sdk_hub.create_device("x509-wrong", authentication={"type": "selfSigned", "x509Thumbprint": {"primaryThumbprint": certs.thumbprint(cert)}})
    client = x509_client(sdk_hub, "x509-wrong", other_cert, other_key)
    try:
        with pytest.raises((CredentialError, ClientError)):
            client.connect()
    finally:
        client.shutdown()
    assert sdk_hub.events_of("x509-wrong") == []


def test_x509_ca_signed(sdk_hub, tmp_path):
    ca_cert, ca_key = certs.ca(tmp_path, "fleet")
    r = sdk_hub.request("PUT", "/certificates/fleet", sdk_hub.token(), json={"certificate": ca_cert.read_text()})
    assert r.status_code == 200, r.text
    assert [c["name"] for c in sdk_hub.request("GET", "/certificates", sdk_hub.token()).json()] == ["fleet"]
    sdk_hub.create_device("ca-dev", authentication={"type": "certificateAuthority"})
    cert, key = certs.signed_by(tmp_path, "ca-dev", ca_cert, ca_key)
    client = x509_client(sdk_hub, "ca-dev", cert, key)
    try:
        client.connect()
        client.send_message(Message("from a CA-signed device"))
    finally:
        client.shutdown()
    (event,) = sdk_hub.events_of("ca-dev")
    assert json.loads(event["systemProperties"]["iothub-connection-auth-method"])["type"] == "x509Ca"

    # A certificate from a CA the hub does not know is refused, as is one for another device.
    rogue_cert, rogue_key = certs.ca(tmp_path, "rogue")
    bad_cert, bad_key = certs.signed_by(tmp_path, "ca-dev-rogue", rogue_cert, rogue_key)
    sdk_hub.create_device("ca-dev-rogue", authentication={"type": "certificateAuthority"})
    wrong_cn_cert, wrong_cn_key = certs.signed_by(tmp_path, "someone-else", ca_cert, ca_key)
    for device_id, (c, k) in [("ca-dev-rogue", (bad_cert, bad_key)), ("ca-dev", (wrong_cn_cert, wrong_cn_key))]:
        client = x509_client(sdk_hub, device_id, c, k)
        try:
            with pytest.raises((CredentialError, ClientError)):
                client.connect()
        finally:
            client.shutdown()
