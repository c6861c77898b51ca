"""Writes the fuzz targets' seed corpora into fuzz/seeds/<target>/.

Seeds are what the test suites send: queries and route conditions are taken from the test
files and docs as written there; MQTT packets are built with the raw client the compliance
tests use (tests/python/mqttraw.py); AMQP frames are encoded with the Event Hubs SDK's own
AMQP stack (pyamqp), as that SDK puts them on the wire; the configuration is the sample file.
Enrollment bodies and digital twin patches are what the provisioning service and
DigitalTwinClient SDKs send (tests/python/test_dps_*.py, test_pnp.py, tests/node); AMQP device
messages are encoded here (`amqp_*` below, AMQP 1.0 part 1 and 3) as the Node and C# device
SDKs fill them.

Run with the test virtualenv's python from the repository root:
    ~/.cache/ferrohub/venv/bin/python fuzz/seeds.py
"""

import hashlib
import json
import pathlib
import re
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))

import mqttraw  # noqa: E402
from mqttraw import packet, _str, CONNECT, PUBLISH, PUBACK, SUBSCRIBE, PINGREQ, DISCONNECT  # noqa: E402

SEEDS = ROOT / "fuzz" / "seeds"
HOST = "fuzz.azure-devices.net"


def write(target, data):
    if isinstance(data, str):
        data = data.encode()
    folder = SEEDS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


def sources(*globs):
    for g in globs:
        for p in sorted(ROOT.glob(g)):
            yield p.read_text(errors="replace")


# --- text the tests send -------------------------------------------------------------------

def string_literals(text):
    for m in re.finditer(r'"((?:[^"\\\n]|\\.)*)"|\'((?:[^\'\\\n]|\\.)*)\'', text):
        s = m.group(1) if m.group(1) is not None else m.group(2)
        yield s.replace('\\"', '"').replace("\\'", "'")


def queries():
    found = set()
    for text in sources("tests/python/*.py", "tests/node/*.js", "docs/query.md", "docs/routing.md",
                        "server/src/routing/query/*.rs"):
        for s in string_literals(text):
            if re.match(r"\s*select\b", s, re.I) or re.search(r"\$body\.|\$twin\.|\b(AND|OR)\b|=", s) \
                    and len(s) < 400 and "://" not in s:
                found.add(s)
        for m in re.finditer(r"^\s*(SELECT .*)$", text, re.M):
            found.add(m.group(1).strip("`"))
    return sorted(found)


SAS = ("SharedAccessSignature sr={sr}&sig=c2lnbmF0dXJlIGJ5dGVzIGZvciBmdXp6aW5nIQ%3D%3D"
       "&se=1900000000{skn}")


def sas_tokens():
    for sr in [f"{HOST}%2Fdevices%2Fdev-1", f"{HOST}/devices/dev-1/modules/mod-1", HOST,
               f"sb%3A%2F%2F{HOST}%2Fmessages%2Fevents", f"{HOST}%2Fdevices%2Fd%C3%A9v"]:
        for skn in ["", "&skn=iothubowner", "&skn=service"]:
            yield SAS.format(sr=sr, skn=skn)


BAGS = ["", "%24.ct=application%2Fjson&%24.ce=utf-8", "a=1&b=2&flag", "$.mid=m1&$.cid=c1&$.to=/x",
        "%24.exp=2026-11-23T00%3A00%3A00Z&temperatureAlert=true", "k=&=v", "a%zz=1", "x=%E2%82%AC",
        "iothub-connection-device-id=spoof&level=critical", "$.on=output1&$.ifid=urn%3Aa"]

TOPICS = [
    "devices/dev-1/messages/events/", "devices/dev-1/messages/events/a=1&%24.ct=application%2Fjson",
    "devices/dev-1/modules/mod-1/messages/events/x=y", "$iothub/twin/GET/?$rid=1",
    "$iothub/twin/PATCH/properties/reported/?$rid=7&$version=3", "$iothub/methods/res/200/?$rid=5",
    "$iothub/methods/POST/#", "$iothub/twin/res/#", "$iothub/twin/PATCH/properties/desired/#",
    "devices/dev-1/messages/devicebound/#", "devices/dev-1/modules/mod-1/inputs/#",
    "devices/dev-1/messages/devicebound/0123456789abcdef/complete", "devices/other/messages/events/",
]

CLIENT_IDS = ["dev-1", "dev-1/mod-1", "dev-1/", "/mod", "d\u00e9v", "a" * 130]
USERNAMES = [f"{HOST}/dev-1/?api-version=2021-04-12", f"{HOST}/dev-1/mod-1/?api-version=2021-04-12&DeviceClientType=py",
             f"{HOST}/dev-1", "other/dev-1/?api-version=2018-06-30"]

TWIN_PATCHES = [
    {"fw": "1.2.3", "telemetryInterval": 30},
    {"a": {"b": None, "c": {"d": [1, 2, {"e": None}]}}, "f": None},
    {"temperature": 21.5, "nested": {"deep": {"deeper": {"deepest": True}}}},
    {"$version": 3, "x": 1}, {"bad.key": 1}, {"bad key": 1}, {"n": 1.0000000000000002},
    {"big": 123456789012345678901234567890}, {"neg": -0.0, "exp": 1e308, "tiny": 5e-324},
    {"s": "\u00e9\u20ac\U0001F600"}, {"arr": [[[[[[]]]]]]}, {},
]

IDENTITIES = [
    {"deviceId": "dev-1"},
    {"deviceId": "dev-1", "status": "disabled", "statusReason": "maintenance",
     "authentication": {"type": "sas", "symmetricKey": {"primaryKey": "a2V5MQ==", "secondaryKey": "a2V5Mg=="}},
     "capabilities": {"iotEdge": True}},
    {"deviceId": "dev-1", "authentication": {"type": "selfSigned",
     "x509Thumbprint": {"primaryThumbprint": "A" * 40, "secondaryThumbprint": "B" * 64}}},
    {"deviceId": "dev-1", "moduleId": "mod-1", "managedBy": "IotEdge", "etag": "AAAA"},
    {"deviceId": "dev-1", "authentication": {"type": "certificateAuthority"}, "status": "Enabled"},
    {"id": "dev-1", "importMode": "create", "status": "enabled", "tags": {"site": "a"},
     "properties": {"desired": {"fw": "1"}},
     "authentication": {"type": "sas", "symmetricKey": {"primaryKey": "a2V5MQ==", "secondaryKey": "a2V5Mg=="}}},
    {"id": "dev-1", "importMode": "deleteIfMatchETag", "eTag": "MQ=="},
    {"id": "dev-1", "moduleId": "m", "importMode": "updateTwinIfMatchETag", "twinETag": "AAAAAAAAAAE="},
    {"id": "dev-1", "eTag": "MQ==", "status": "enabled", "statusUpdateTime": "2026-11-23T00:00:00Z",
     "connectionState": "Disconnected", "lastActivityTime": "0001-01-01T00:00:00Z",
     "cloudToDeviceMessageCount": 0, "authentication": {"type": "none"}, "version": 4,
     "tags": {}, "properties": {"desired": {"$version": 2}, "reported": {"$version": 1}}},
]


# --- MQTT packets, as the raw compliance client builds them ------------------------------------

def mqtt_streams():
    connect_body = _str("MQTT") + bytes([4, 0xC2]) + struct.pack("!H", 60) + _str("dev-1/mod-1") \
        + _str(f"{HOST}/dev-1/mod-1/?api-version=2021-04-12") + _str(next(sas_tokens()))
    connect = packet(CONNECT, 0, connect_body)
    will_body = _str("MQTT") + bytes([4, 0x2E]) + struct.pack("!H", 0) + _str("dev-1") \
        + _str("devices/dev-1/messages/events/") + _str("gone")
    publish1 = packet(PUBLISH, 2, _str("devices/dev-1/modules/mod-1/messages/events/a=1&%24.ct=application%2Fjson")
                      + struct.pack("!H", 7) + b'{"t":21}')
    publish0 = packet(PUBLISH, 0, _str("$iothub/twin/GET/?$rid=1"))
    reported = packet(PUBLISH, 2, _str("$iothub/twin/PATCH/properties/reported/?$rid=2")
                      + struct.pack("!H", 8) + json.dumps(TWIN_PATCHES[0]).encode())
    subscribe = packet(SUBSCRIBE, 2, struct.pack("!H", 9) + b"".join(
        _str(t) + bytes([1]) for t in ["$iothub/methods/POST/#", "$iothub/twin/res/#",
                                        "devices/dev-1/messages/devicebound/#"]))
    puback = packet(PUBACK, 0, struct.pack("!H", 3))
    ping = packet(PINGREQ, 0, b"")
    bye = packet(DISCONNECT, 0, b"")
    for piece in (0, 3, 15):
        yield bytes([piece]) + connect + subscribe + publish1 + publish0 + reported + puback + ping + bye
    yield bytes([1]) + packet(CONNECT, 0, will_body) + ping
    yield bytes([7]) + publish1 * 3


# --- AMQP frames, as the Event Hubs SDK's pyamqp encodes them ------------------------------------

def amqp_streams():
    from azure.eventhub._pyamqp import performatives as pf
    from azure.eventhub._pyamqp._encode import encode_frame, encode_payload
    from azure.eventhub._pyamqp.endpoints import Source, Target
    from azure.eventhub._pyamqp.message import Message, Properties
    from azure.eventhub._pyamqp import utils

    def frame(f, channel=0, frame_type=b"\x00"):
        header, body = encode_frame(f, frame_type)
        header = header[:6] + struct.pack("!H", channel)
        return header + (bytes(body) if body else b"")

    sasl_plain = frame(pf.SASLInit(mechanism=b"PLAIN", initial_response=b"\x00iothubowner\x00" + next(sas_tokens()).encode(),
                                   hostname=HOST), frame_type=b"\x01")
    sasl_anon = frame(pf.SASLInit(mechanism=b"ANONYMOUS", initial_response=None, hostname=HOST), frame_type=b"\x01")
    header = b"AMQP\x00\x01\x00\x00"
    open_ = frame(pf.OpenFrame(container_id="sdk", hostname=HOST, max_frame_size=65536, channel_max=65535,
                               idle_timeout=120000, outgoing_locales=None, incoming_locales=None,
                               offered_capabilities=None, desired_capabilities=None, properties=None))
    begin = frame(pf.BeginFrame(remote_channel=None, next_outgoing_id=0, outgoing_window=65536,
                                incoming_window=65536, handle_max=4294967295, offered_capabilities=None,
                                desired_capabilities=None, properties=None))

    def attach(role, source, target, handle):
        return frame(pf.AttachFrame(name=f"link-{handle}", handle=handle, role=role, send_settle_mode=0,
                                    rcv_settle_mode=0, source=source, target=target, unsettled=None,
                                    incomplete_unsettled=None, initial_delivery_count=0 if not role else None,
                                    max_message_size=None, offered_capabilities=None,
                                    desired_capabilities=None, properties=None))

    selector = b"apache.org:selector-filter:string"
    receiver = attach(True, Source(address=f"amqps://{HOST}/messages/events/ConsumerGroups/$Default/Partitions/0",
                                   filters={selector: (selector, utils.amqp_string_value(
                                       "amqp.annotation.x-opt-offset > '-1'"))}),
                      Target(address="receiver"), 1)
    sender = attach(False, Source(address="sender"), Target(address="/messages/devicebound"), 2)
    cbs = attach(False, Source(address="cbs"), Target(address="$cbs"), 3)
    payload = encode_payload(bytearray(), Message(
        data=b'{"c2d":1}', properties=Properties(message_id="m-1", to="/devices/dev-1/messages/devicebound",
                                                 correlation_id="c-1", user_id=b"u"),
        application_properties={"k": "v"}))
    transfer = frame(pf.TransferFrame(handle=2, delivery_id=0, delivery_tag=b"\x00\x00\x00\x01", message_format=0,
                                      settled=False, more=False, rcv_settle_mode=None, state=None, resume=None,
                                      aborted=None, batchable=None, payload=bytes(payload)))
    flow = frame(pf.FlowFrame(next_incoming_id=0, incoming_window=65536, next_outgoing_id=1, outgoing_window=65536,
                              handle=1, delivery_count=0, link_credit=300, available=None, drain=None, echo=None,
                              properties=None))
    detach = frame(pf.DetachFrame(handle=2, closed=True, error=None))
    close = frame(pf.CloseFrame(error=None))
    yield sasl_plain + header + open_ + begin + sender + transfer + detach + close
    yield sasl_anon + header + open_ + begin + cbs + receiver + flow + close
    yield sasl_anon + header + open_ + begin + receiver
    yield sasl_plain + header + frame(None) + open_


def dps_registers():
    """Register requests as the provisioning SDKs send them: the registration id, a newline,
    the body. The Python SDK sends {"registrationId", "payload"} (json.dumps, payload null when
    none); the Node SDK leaves payload out when none and its HTTP transport may send no body;
    a TPM device adds "tpm"."""
    rid = "dps-dev-1"
    bodies = [
        json.dumps({"registrationId": rid, "payload": None}),
        json.dumps({"registrationId": rid, "payload": {"site": "line-3", "modelId": "dtmi:x:y;1"}}),
        json.dumps({"registrationId": rid}, separators=(",", ":")),
        "",
        json.dumps({"registrationId": rid, "tpm": {"endorsementKey": "AToAAQAL", "storageRootKey": "ARgAAQAL"}}),
        json.dumps({"registrationId": "another", "payload": 1}),
        json.dumps([rid]),
    ]
    for b in bodies:
        yield f"{rid}\n{b}"


# --- DPS enrollment bodies, as the provisioning service SDKs PUT and POST them ---------------

# Self-signed P-256 certificates (made once with openssl; a leaf and a CA), as PEM text.
DEVICE_CERT = """-----BEGIN CERTIFICATE-----
MIIBhzCCAS2gAwIBAgIUF7bfwHXQ3g22mfhw21x2qYfG0/8wCgYIKoZIzj0EAwIw
GDEWMBQGA1UEAwwNZnV6ei1kZXZpY2UtMTAgFw0yNjEyMDcwNDE1MjNaGA8yMTI2
MTExMzA0MTUyM1owGDEWMBQGA1UEAwwNZnV6ei1kZXZpY2UtMTBZMBMGByqGSM49
AgEGCCqGSM49AwEHA0IABBVLvSgpqDS9jdnkY4YI+1fCPFzfbQVcJVclA7sGHiaP
d57x9vyu+qQrCh1OGg+cWqelXwet+d4p7nNAmlAZf6ujUzBRMB0GA1UdDgQWBBS+
mxs+DEBjWmwSChJBWTmaP9qbDTAfBgNVHSMEGDAWgBS+mxs+DEBjWmwSChJBWTma
P9qbDTAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIB30CdkI9hQg
hf+SKScuwnlyIsB9ak9LGu3q4Sb5BT90AiEAsduX/6r8uD5i5ewPGdeRt3DZopDf
1t7ReupncDO2QJ0=
-----END CERTIFICATE-----
"""
SIGNING_CERT = """-----BEGIN CERTIFICATE-----
MIIBjDCCATGgAwIBAgIULmKc6rxjXgyM32qag/kXGpzOF70wCgYIKoZIzj0EAwIw
GjEYMBYGA1UEAwwPZnV6ei1zaWduaW5nLWNhMCAXDTI2MTIwNzA0MTUyM1oYDzIx
MjYxMTEzMDQxNTIzWjAaMRgwFgYDVQQDDA9mdXp6LXNpZ25pbmctY2EwWTATBgcq
hkjOPQIBBggqhkjOPQMBBwNCAAR9n6mqjz02BxLEKJhOoTWrx7vwwThmI0miSkUp
R1myRnJ09ocuWhVlGZAYXzLLMnv1HXJ6ME1FzK1M1K+ov+HQo1MwUTAdBgNVHQ4E
FgQU4LPgRAvt9Baj2SW1gQ6YGpxre2kwHwYDVR0jBBgwFoAU4LPgRAvt9Baj2SW1
gQ6YGpxre2kwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNJADBGAiEAgVYK
NW7FCOQy2h1eHM7ceToNcZYKXe2wQofUJinAiVwCIQDObwvXQ01oePcS5nnpcDz7
aVYHHaPpHngKHpOm8IN8aw==
-----END CERTIFICATE-----
"""
KEY_1 = "a2V5LW9uZS1mb3ItZnV6emluZy1lbnJvbGxtZW50cy0xMjM0NQ=="
KEY_2 = "a2V5LXR3by1mb3ItZnV6emluZy1lbnJvbGxtZW50cy02Nzg5MA=="


def der_base64(pem):
    return "".join(l for l in pem.splitlines() if not l.startswith("-----"))


def enrollments():
    """Bodies as the Node client passes them through (the test's objects as written) and as the
    Python SDK's models serialise (camelCase, unset fields left out), plus what a read answers
    and a client writes back, and bulk bodies."""
    symmetric = {"type": "symmetricKey", "symmetricKey": {"primaryKey": KEY_1, "secondaryKey": KEY_2}}
    x509_leaf = {"type": "x509", "x509": {"clientCertificates": {"primary": {"certificate": DEVICE_CERT}}}}
    individual = {
        "registrationId": "svc-ind", "deviceId": "svc-ind-device", "attestation": symmetric,
        "capabilities": {"iotEdge": False}, "provisioningStatus": "enabled",
        "initialTwin": {"tags": {"site": "a", "version": 1},
                        "properties": {"desired": {"interval": 5, "$version": 1, "$metadata": {}}}},
        "reprovisionPolicy": {"updateHubAssignment": True, "migrateDeviceData": False},
        "allocationPolicy": "hashed", "iotHubs": ["fuzz.azure-devices.net"],
    }
    yield individual
    yield {"registrationId": "svc-ind-2", "attestation": {"type": "symmetricKey"}}
    yield {"registrationId": "dps-x509-self", "attestation": x509_leaf}
    yield {"registrationId": "dps-x509-b64", "deviceId": "edge-1", "capabilities": {"iotEdge": True},
           "attestation": {"type": "x509", "x509": {"clientCertificates": {
               "primary": {"certificate": der_base64(DEVICE_CERT)}, "secondary": None}}}}
    yield {"enrollmentGroupId": "svc-grp", "attestation": symmetric,
           "initialTwin": {"tags": {"via": "group"}}, "provisioningStatus": "disabled"}
    yield {"enrollmentGroupId": "dps-x509-fleet", "attestation": {"type": "x509", "x509": {
        "signingCertificates": {"primary": {"certificate": SIGNING_CERT}}}},
        "reprovisionPolicy": {"updateHubAssignment": False, "migrateDeviceData": False},
        "customAllocationDefinition": {"webhookUrl": "https://alloc.example/api", "apiVersion": "2021-10-01"},
        "optionalDeviceInformation": {"site": "line-3"}, "iotHubHostName": "fuzz.azure-devices.net"}
    yield {"enrollmentGroupId": "ca-fleet", "attestation": {"type": "x509", "x509": {
        "caReferences": {"primary": "fuzz-root-ca", "secondary": None}}}}
    # What a read answers (keys left out, certificates as info), written back with its etag.
    yield {"registrationId": "dps-x509-self", "etag": "\"MQ==\"",
           "attestation": {"type": "x509", "x509": {"clientCertificates": {"primary": {"info": {
               "subjectName": "CN=fuzz-device-1", "sha1Thumbprint": "A" * 40, "sha256Thumbprint": "B" * 64,
               "issuerName": "CN=fuzz-device-1", "notBeforeUtc": "2026-12-07T04:15:23.0000000Z",
               "notAfterUtc": "2126-11-13T04:15:23.0000000Z", "serialNumber": "17B6DF", "version": 3}}}}},
           "capabilities": {"iotEdge": False}, "provisioningStatus": "enabled",
           "reprovisionPolicy": {"updateHubAssignment": True, "migrateDeviceData": True},
           "createdDateTimeUtc": "2026-12-07T04:15:23.0000000Z",
           "lastUpdatedDateTimeUtc": "2026-12-07T04:15:23.0000000Z",
           "registrationState": {"registrationId": "dps-x509-self", "status": "assigned"},
           "allocationPolicy": "hashed", "iotHubs": ["fuzz.azure-devices.net"]}
    yield {"registrationId": "tpm-dev", "attestation": {"type": "tpm", "tpm": {"endorsementKey": "AToAAQAL"}}}
    yield {"registrationId": "bad", "attestation": {"type": "symmetricKey"}, "provisioningStatus": "paused",
           "initialTwin": {"tags": []}}
    bulk = [{"registrationId": f"bulk-{i}", "attestation": {"type": "symmetricKey"}} for i in range(3)]
    yield {"mode": "create", "enrollments": bulk + [individual]}
    yield {"mode": "delete", "enrollments": bulk + [{"registrationId": "bulk-x", "attestation": "anything"}]}
    yield {"mode": "updateIfMatchETag", "enrollmentGroups": [
        {"enrollmentGroupId": "svc-grp", "etag": "W/\"Mg==\"", "attestation": symmetric}]}
    yield {"mode": "Update", "enrollmentGroups": [{"attestation": symmetric}]}
    yield {"mode": "merge", "enrollments": []}


# --- digital twin patches, as the DigitalTwinClient SDKs send them ----------------------------

PNP_PATCHES = [
    [{"op": "add", "path": "/thermostat1/targetTemperature", "value": 21.8}],
    [{"op": "add", "path": "/fanSpeed", "value": 2},
     {"op": "replace", "path": "/thermostat1", "value": {"mode": "eco", "$metadata": {}}}],
    [{"op": "replace", "path": "/thermostat1/schedule", "value": {"on": "08:00", "off": None}}],
    [{"op": "add", "path": "/thermostat2/targetTemperature", "value": 19}],
    [{"op": "add", "path": "/thermostat3", "value": {"x": 1, "nested": {"y": None}, "$metadata": {}}}],
    [{"op": "remove", "path": "/fanSpeed"}, {"op": "remove", "path": "/absent/x"}],
    [{"op": "remove", "path": "/thermostat1"}],
    [{"op": "replace", "path": "/obj", "value": {"x": 5, "y": {"a": 3}}}],
    [{"op": "add", "path": "/odd~1~0name", "value": 2}, {"op": "add", "path": "/a~01", "value": True}],
    [{"op": "add", "path": "/new/deep/er", "value": {"k": [1, None, {"n": None}], "m": None}}],
    [{"op": "add", "path": "/flag/sub", "value": "x"}, {"op": "add", "path": "/added", "value": 1},
     {"op": "remove", "path": "/added"}],
    [{"op": "replace", "path": "/list/0", "value": 5}],
    [{"op": "move", "from": "/a", "path": "/b"}],
    [{"op": "add", "path": "/$metadata/a", "value": 1}],
    [{"op": "add", "path": "/thermostat1", "value": 5}],
    [{"op": "add", "path": "/a", "value": None}],
    [],
    {"op": "add", "path": "/a", "value": 1},
]


# --- AMQP messages on a device's links, encoded by hand (AMQP 1.0 part 1 types, part 3 sections)

def amqp_null():
    return b"\x40"


def amqp_bool(b):
    return b"\x41" if b else b"\x42"


def amqp_uint(n):
    return b"\x43" if n == 0 else (b"\x52" + bytes([n]) if n < 256 else b"\x70" + struct.pack("!I", n))


def amqp_ulong(n):
    return b"\x44" if n == 0 else (b"\x53" + bytes([n]) if n < 256 else b"\x80" + struct.pack("!Q", n))


def amqp_int(n):
    return b"\x54" + struct.pack("!b", n) if -128 <= n < 128 else b"\x71" + struct.pack("!i", n)


def amqp_long(n):
    return b"\x55" + struct.pack("!b", n) if -128 <= n < 128 else b"\x81" + struct.pack("!q", n)


def amqp_double(x):
    return b"\x82" + struct.pack("!d", x)


def _variable(small, large, data):
    return (bytes([small, len(data)]) if len(data) < 256 else bytes([large]) + struct.pack("!I", len(data))) + data


def amqp_str(s):
    return _variable(0xA1, 0xB1, s.encode())


def amqp_sym(s):
    return _variable(0xA3, 0xB3, s.encode())


def amqp_bin(b):
    return _variable(0xA0, 0xB0, b)


def amqp_timestamp(ms):
    return b"\x83" + struct.pack("!q", ms)


def amqp_uuid(text):
    return b"\x98" + bytes.fromhex(text.replace("-", ""))


def _compound(small, large, count, data):
    if len(data) + 1 < 256 and count < 256:
        return bytes([small, len(data) + 1, count]) + data
    return bytes([large]) + struct.pack("!II", len(data) + 4, count) + data


def amqp_list(items):
    return b"\x45" if not items else _compound(0xC0, 0xD0, len(items), b"".join(items))


def amqp_map(pairs):
    return _compound(0xC1, 0xD1, 2 * len(pairs), b"".join(k + v for k, v in pairs))


def section(code, value):
    return b"\x00\x53" + bytes([code]) + value


def amqp_message(header=None, annotations=None, properties=None, application=None, data=None, value=None,
                 sequence=None):
    """A message's sections in their order: header (0x70), message-annotations (0x72, symbol
    keys), properties (0x73, a list of the 13 fields, trailing nulls left out),
    application-properties (0x74, string keys), then the body: data sections (0x75), one
    amqp-value (0x77) or one amqp-sequence (0x76)."""
    out = b""
    if header is not None:
        out += section(0x70, amqp_list(header))
    if annotations is not None:
        out += section(0x72, amqp_map([(amqp_sym(k), v) for k, v in annotations]))
    if properties is not None:
        fields = list(properties)
        while fields and fields[-1] is None:
            fields.pop()
        out += section(0x73, amqp_list([f if f is not None else amqp_null() for f in fields]))
    if application is not None:
        out += section(0x74, amqp_map([(amqp_str(k), v) for k, v in application]))
    for d in data or []:
        out += section(0x75, amqp_bin(d))
    if value is not None:
        out += section(0x77, value)
    if sequence is not None:
        out += section(0x76, amqp_list(sequence))
    return out


def amqp_properties(message_id=None, user_id=None, to=None, correlation_id=None, content_type=None,
                    content_encoding=None, absolute_expiry_time=None, creation_time=None):
    """The 13 fields of the properties section, encoded (None for null)."""
    return [message_id, user_id, to, None, None, correlation_id, content_type, content_encoding,
            absolute_expiry_time, creation_time, None, None, None]


def amqp_device_messages():
    """What the Node SDK (rhea) and the C# SDK put in a device's transfers: telemetry with
    system properties, application properties (one spoofing a stamped name) and Plug and Play
    annotations, a C# batch (data sections each a message), twin requests (`operation`,
    `resource`, a correlation id), and method answers (`IoThub-status`, the call's id)."""
    rid = "0f8fad5b-d9cb-469f-a165-70867728950e"
    node_telemetry = amqp_message(
        annotations=[("iothub-interface-id", amqp_str("dtmi:com:example:Thermostat;1")),
                     ("dt-subject", amqp_str("thermostat1"))],
        properties=amqp_properties(message_id=amqp_str("m-1"), correlation_id=amqp_str("c-1"),
                                   content_type=amqp_sym("application/json"), content_encoding=amqp_sym("utf-8"),
                                   absolute_expiry_time=amqp_timestamp(1_900_000_000_000)),
        application=[("temperatureAlert", amqp_str("true")), ("level", amqp_int(5)), ("ratio", amqp_double(1.5)),
                     ("iothub-connection-device-id", amqp_str("spoof")), ("dt-dataschema", amqp_str("dtmi:x:y;1")),
                     ("$.mid", amqp_str("from-application")), ("big", amqp_long(-(2 ** 40)))],
        data=[b'{"temperature":21.5}'])
    csharp_telemetry = amqp_message(
        header=[amqp_bool(True)],
        properties=amqp_properties(message_id=amqp_uuid(rid), user_id=amqp_bin(b"dev-1"),
                                   to=amqp_str("/devices/dev-1/messages/events"),
                                   creation_time=amqp_timestamp(1_800_000_000_000)),
        application=[("iothub-outputname", amqp_str("output1")), ("flag", amqp_bool(False)),
                     ("n", amqp_ulong(7)), ("iothub-enqueuedtime", amqp_timestamp(1))],
        data=[b"hello ", b"world"])
    yield node_telemetry
    yield csharp_telemetry
    yield amqp_message(properties=amqp_properties(message_id=amqp_ulong(42)), value=amqp_str("a string body"))
    yield amqp_message(value=amqp_bin(b"\x00\x01binary body"))
    yield amqp_message(sequence=[amqp_int(1), amqp_str("two")])
    yield amqp_message(data=[node_telemetry, csharp_telemetry, amqp_message(data=[b"{}"])])
    yield amqp_message(properties=amqp_properties(message_id=amqp_str("batch-1")), data=[b"not a message"])
    twin = [("GET", None, None), ("PATCH", "/properties/reported", b'{"fw":"1.2.3","telemetryInterval":30}'),
            ("PUT", "/notifications/twin/properties/desired", None),
            ("DELETE", "/notifications/twin/properties/desired/", None), ("PATCH", "/properties/desired", b"{}"),
            ("PATCH", "/properties/reported", b"[1]")]
    for n, (operation, resource, body) in enumerate(twin):
        annotations = [("operation", amqp_str(operation))]
        if resource is not None:
            annotations.append(("resource", amqp_str(resource)))
        if operation == "PATCH":
            annotations.append(("version", amqp_null()))
        correlation = amqp_uuid(rid) if n % 2 else amqp_str(f"twin-{n}")
        yield amqp_message(annotations=annotations, properties=amqp_properties(correlation_id=correlation),
                           data=[body] if body is not None else [b""])
    yield amqp_message(annotations=[("operation", amqp_sym("GET"))],
                       properties=amqp_properties(correlation_id=amqp_bin(b"\xff\xfe")))
    for status, correlation in [(amqp_int(200), amqp_uuid(rid)), (amqp_long(404), amqp_str("7")),
                                (amqp_str("500"), amqp_ulong(9)), (amqp_uint(201), amqp_str("8"))]:
        yield amqp_message(properties=amqp_properties(correlation_id=correlation),
                           application=[("IoThub-status", status)], data=[b'{"result":"ok"}'])
    yield amqp_message(properties=amqp_properties(correlation_id=amqp_str("no-status")), data=[b"null"])


def main():
    for r in dps_registers():
        write("dps_register", r)
    for e in enrollments():
        write("enrollment_json", json.dumps(e))
    for p in PNP_PATCHES:
        write("pnp_patch", json.dumps(p, ensure_ascii=False))
    for m in amqp_device_messages():
        write("amqp_device_link", m)
    for q in queries():
        write("query", q)
    for t in sas_tokens():
        write("sas_token", t)
    for b in BAGS:
        write("property_bag", b)
    for c in CLIENT_IDS:
        for t in TOPICS + USERNAMES:
            write("topics", c.encode() + b"\x00" + t.encode())
    for p in TWIN_PATCHES:
        write("twin_patch", json.dumps(p, ensure_ascii=False))
    for i in IDENTITIES:
        write("identity_json", json.dumps(i))
    write("config_toml", (ROOT / "docs" / "config.sample.toml").read_bytes())
    write("config_toml", "[hub]\nname = \"fuzz\"\n[d2c]\npartitions = 4\nretention = \"1d\"\n")
    write("config_toml", "[throttling]\ntelemetry_per_minute = 0\n[c2d]\nlock_timeout = \"1ms\"\n")
    for s in mqtt_streams():
        write("mqtt_stream", s)
    for s in amqp_streams():
        write("amqp_frames", s)
    for d in sorted(SEEDS.iterdir()):
        print(f"{d.name}: {len(list(d.iterdir()))} seeds")


if __name__ == "__main__":
    main()
