"""Writes the fuzz targets' seed corpora into fuzz/seeds/<target>/.

Seeds are what the test suites send: queries and route conditions are taken from the test
files and docs as written there; MQTT packets are built with the raw client the compliance
tests use (tests/python/mqttraw.py); AMQP frames are encoded with the Event Hubs SDK's own
AMQP stack (pyamqp), as that SDK puts them on the wire; the configuration is the sample file.

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


def main():
    for r in dps_registers():
        write("dps_register", r)
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
