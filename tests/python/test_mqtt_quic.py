"""MQTT over QUIC (issue 17) from an independent QUIC stack (aioquic carrying MQTT on one
bidirectional stream, tests/python/mqttquic.py): SAS and X.509 CONNECT, telemetry stored with
the same system properties as over TCP, a C2D message, a direct method, the twin; a client that
moves to a new UDP port keeps its connection and session; refusals (wrong token, another
device's certificate, wrong ALPN, garbage datagrams) leave the hub serving."""

import base64
import json
import os
import socket
import threading
import time

import pytest

import certs
from mqttquic import QuicMqtt, connect_quic_device
from mqttraw import PUBLISH, connect_device


def c2d(hub, device_id, body):
    r = hub.request("POST", f"/devices/{device_id}/messages/deviceBound", hub.token("service"),
                    data=body, headers={"iothub-messageid": "c2d-1"})
    assert r.status_code == 204, r.text


def test_a_device_does_everything_over_quic(hub):
    hub.create_device("q1")
    hub.create_device("t1")
    c, code = connect_quic_device(hub, "q1")
    assert code == 0
    try:
        assert c.subscribe([("devices/q1/messages/devicebound/#", 1), ("$iothub/methods/POST/#", 0),
                            ("$iothub/twin/res/#", 0)]) == [1, 0, 0]
        assert hub.request("GET", "/devices/q1", hub.token()).json()["connectionState"] == "Connected"
        # Telemetry, next to the same message over TLS.
        c.publish("devices/q1/messages/events/%24.mid=m1&app=1", b'{"t": 1}', qos=1, pkid=1)
        assert c.expect_puback(1)
        t = connect_device(hub, "t1")
        t.publish("devices/t1/messages/events/%24.mid=m1&app=1", b'{"t": 1}', qos=1, pkid=1)
        assert t.expect_puback(1)
        t.disconnect()
        (quic_event,) = hub.events_of("q1")
        (tcp_event,) = hub.events_of("t1")
        assert quic_event["properties"] == tcp_event["properties"] == {"app": "1"}
        assert quic_event["body"] == tcp_event["body"]
        qs, ts = quic_event["systemProperties"], tcp_event["systemProperties"]
        assert set(qs) == set(ts)
        for name in ("message-id", "iothub-message-source", "iothub-connection-auth-method"):
            assert qs[name] == ts[name], name
        assert qs["iothub-connection-device-id"] == "q1"

        # C2D.
        c2d(hub, "q1", b"to the device")
        ptype, flags, body = c.read()
        assert ptype == PUBLISH
        topic_len = int.from_bytes(body[:2], "big")
        assert body[2:2 + topic_len].decode().startswith("devices/q1/messages/devicebound/")
        assert body.endswith(b"to the device")
        pkid = body[2 + topic_len:4 + topic_len]
        c.send(bytes([0x40, 2]) + pkid)  # PUBACK completes the message.

        # A direct method, answered over QUIC.
        answer = {}

        def invoke():
            r = hub.request("POST", "/twins/q1/methods", hub.token("service"),
                            json={"methodName": "reboot", "payload": {"in": 1}, "responseTimeoutInSeconds": 10})
            answer["status"], answer["body"] = r.status_code, r.json()

        caller = threading.Thread(target=invoke)
        caller.start()
        ptype, _, body = c.read()
        topic = body[2:2 + int.from_bytes(body[:2], "big")].decode()
        assert ptype == PUBLISH and topic.startswith("$iothub/methods/POST/reboot/?$rid=")
        rid = topic.rsplit("=", 1)[1]
        c.publish(f"$iothub/methods/res/200/?$rid={rid}", b'{"out": 2}')
        caller.join(15)
        assert answer == {"status": 200, "body": {"status": 200, "payload": {"out": 2}}}

        # The twin.
        c.publish("$iothub/twin/PATCH/properties/reported/?$rid=7", b'{"over": "quic"}')
        ptype, _, body = c.read()
        assert ptype == PUBLISH and b"$iothub/twin/res/204/?$rid=7" in body
        c.publish("$iothub/twin/GET/?$rid=8", b"")
        ptype, _, body = c.read()
        assert b"$iothub/twin/res/200/?$rid=8" in body
        doc = json.loads(body[body.index(b"{"):])
        assert doc["reported"]["over"] == "quic"
        c.disconnect()
    finally:
        c.close()


def test_a_client_on_a_new_port_keeps_its_session(hub):
    hub.create_device("mover")
    c, code = connect_quic_device(hub, "mover")
    assert code == 0
    try:
        c.publish("devices/mover/messages/events/", b"before", qos=1, pkid=1)
        assert c.expect_puback(1)
        before = c.local_port()
        c.rebind()
        assert c.local_port() != before
        # No new CONNECT: the next publish is acknowledged on the same MQTT connection.
        c.publish("devices/mover/messages/events/", b"after", qos=1, pkid=2)
        assert c.expect_puback(2, timeout=10)
        c.ping()
        assert [base64.b64decode(e["body"]) for e in hub.events_of("mover")] == [b"before", b"after"]
        assert hub.request("GET", "/devices/mover", hub.token()).json()["connectionState"] == "Connected"
    finally:
        c.close()


def test_refusals_leave_the_hub_serving(hub, tmp_path):
    hub.create_device("victim")
    # A wrong token: CONNACK 5 (not authorized), and the connection ends.
    c, code = connect_quic_device(hub, "victim", password="SharedAccessSignature sr=x&sig=bad&se=1")
    assert code == 5
    assert c.wait_closed(5)
    c.close()
    # Another device's certificate.
    cert, key = certs.self_signed(tmp_path, "owner")
    hub.create_device("x509-owner", authentication={"type": "selfSigned",
                                                   "x509Thumbprint": {"primaryThumbprint": certs.thumbprint(cert)}})
    hub.create_device("x509-other", authentication={"type": "selfSigned",
                                                   "x509Thumbprint": {"primaryThumbprint": certs.thumbprint(certs.self_signed(tmp_path, "other")[0])}})
    own = QuicMqtt(hub.quic_port, hub.ca, cert=str(cert), key=str(key))
    assert own.connect("x509-owner", username="localhost/x509-owner/?api-version=2021-04-12")[1] == 0
    own.disconnect()
    own.close()
    stolen = QuicMqtt(hub.quic_port, hub.ca, cert=str(cert), key=str(key))
    assert stolen.connect("x509-other", username="localhost/x509-other/?api-version=2021-04-12")[1] == 5
    stolen.close()
    # Another ALPN: no handshake.
    with pytest.raises(Exception):
        QuicMqtt(hub.quic_port, hub.ca, alpn="h3")
    # Garbage datagrams, short and long, from many ports.
    for i in range(200):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(os.urandom(1 + (i * 37) % 1400), ("127.0.0.1", hub.quic_port))
        s.close()
    ok, code = connect_quic_device(hub, "victim")
    assert code == 0
    ok.ping()
    ok.disconnect()
    ok.close()
    # TCP MQTT is untouched too.
    t = connect_device(hub, "victim")
    t.ping()
    t.disconnect()


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_a_distant_device_gets_one_tail_loss_probe_per_quiet_period(hub):
    """A device 30 ms away that takes DATAGRAMs gets one 1-byte DATAGRAM after each burst the
    hub writes (CONNACK, SUBACK, each PUBACK), so a lost last packet is found by the probe's
    acknowledgement instead of the probe timeout (bench: scripts/bench-quic.sh)."""
    hub.create_device("far")
    c, code = connect_quic_device(hub, "far", datagrams=True, far_ms=30)
    assert code == 0
    try:
        assert wait_for(lambda: c.datagrams_received() == 1, 30), c.datagrams_received()
        for pkid in (1, 2, 3):
            c.publish("devices/far/messages/events/", f"m{pkid}".encode(), qos=1, pkid=pkid)
            assert c.expect_puback(pkid)
            assert wait_for(lambda: c.datagrams_received() == 1 + pkid, 30), c.datagrams_received()
        # Quiet: no more probes until the hub writes again.
        time.sleep(0.5)
        assert c.datagrams_received() == 4
        assert [base64.b64decode(e["body"]) for e in hub.events_of("far")] == [b"m1", b"m2", b"m3"]
    finally:
        c.close()


def test_probes_go_only_to_devices_that_take_datagrams_at_most_one_per_quiet_period(hub):
    """Whether a near device is probed depends on the RTT the hub measures (under MIN_RTT, none:
    a unit test in quic_tail_probe.rs holds the threshold), and a busy machine measures more. What
    holds whatever the RTT: a device that takes DATAGRAMs gets at most one probe per quiet period
    (CONNACK, then each PUBACK), and one that does not gets none."""
    hub.create_device("near")
    hub.create_device("plain")
    near, code = connect_quic_device(hub, "near", datagrams=True)
    assert code == 0
    # aioquic closes a connection that gets a DATAGRAM it did not ask for: this device's
    # PUBACKs arriving at all is the check.
    plain, code = connect_quic_device(hub, "plain", far_ms=30)
    assert code == 0
    try:
        for pkid in (1, 2):
            near.publish("devices/near/messages/events/", b"x", qos=1, pkid=pkid)
            assert near.expect_puback(pkid)
            plain.publish("devices/plain/messages/events/", b"x", qos=1, pkid=pkid)
            assert plain.expect_puback(pkid)
            time.sleep(0.3)
        assert near.datagrams_received() <= 3, near.datagrams_received()
        plain.ping()
    finally:
        near.close()
        plain.close()


def test_datagrams_from_a_device_are_dropped_unread(hub):
    """MQTT over QUIC gives DATAGRAMs no meaning: the hub keeps at most a few (quinn drops the
    oldest), the connection goes on, and nothing is stored from them."""
    hub.create_device("chatty")
    c, code = connect_quic_device(hub, "chatty", datagrams=True)
    assert code == 0
    try:
        for i in range(2_000):
            c.send_datagram(bytes([i % 256]) * 16)
        c.publish("devices/chatty/messages/events/", b"after", qos=1, pkid=1)
        assert c.expect_puback(1)
        assert [base64.b64decode(e["body"]) for e in hub.events_of("chatty")] == [b"after"]
        # One above the hub's small DATAGRAM window ends this connection only.
        c.send_datagram(b"x" * 1000)
        assert c.wait_closed(5)
    finally:
        c.close()
    ok, code = connect_quic_device(hub, "chatty")
    assert code == 0
    ok.ping()
    ok.close()
