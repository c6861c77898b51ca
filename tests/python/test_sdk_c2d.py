"""MQT-9, C2D-1, C2D-2 with the unmodified official device SDK (azure-iot-device 2.14.0, fixed
ports 8883/443, so these tests share one hub and run one after another): messages sent over the
service's HTTPS endpoint reach `on_message_received` with every property, the device's PUBACK
completes them, the persistent session delivers what was sent while the device was away, and the
queue stops at 50 messages.

The sync client runs handlers on a pool of four threads, so the order in which the handler runs
is not the order in which messages arrived. The wire order is read from the SDK's own log line
("message received on {topic}"), written by paho's network thread as each PUBLISH arrives."""

import json
import logging
import threading
import time
import urllib.parse
from datetime import datetime, timedelta, timezone

import pytest
from azure.iot.device import IoTHubDeviceClient

WAIT = 20  # seconds for anything the SDK should receive
TRANSPORT_LOGGER = "azure.iot.device.common.mqtt_transport"


def ca_text(hub):
    return open(hub.ca).read()


def new_client(hub, device_id, websockets):
    return IoTHubDeviceClient.create_from_connection_string(
        hub.device_connection_string(device_id), server_verification_cert=ca_text(hub), websockets=websockets)


def tag(websockets):
    return "ws" if websockets else "mqtt"


def send(hub, device_id, body, headers=None):
    return hub.request("POST", f"/devices/{device_id}/messages/deviceBound", hub.token(), data=body, headers=headers or {})


def send_ok(hub, device_id, body, headers=None):
    r = send(hub, device_id, body, headers)
    assert r.status_code == 204, (r.status_code, r.text)


def device_receive(hub, device_id):
    return hub.request("GET", f"/devices/{device_id}/messages/deviceBound", hub.device_token(device_id))


def mid_of(topic):
    """`$.mid` of a C2D topic, parsed as the SDK does (bag = segment 5, plain percent-decoding)."""
    parts = topic.split("/")
    bag = parts[4] if len(parts) > 4 else ""
    for pair in bag.split("&") if bag else []:
        kv = pair.split("=")
        if urllib.parse.unquote(kv[0]) == "$.mid":
            return urllib.parse.unquote(kv[1]) if len(kv) > 1 else None
    return None


class Receiver(logging.Handler):
    """Collects what `on_message_received` gets (thread-safe) and, from the transport's log, the
    `$.mid` of every C2D PUBLISH of one device in the order it came off the wire, and how many
    C2D SUBSCRIBEs the client sent."""

    def __init__(self, device_id):
        super().__init__(logging.INFO)
        self.prefix = f"devices/{device_id}/messages/devicebound"
        self.messages = []
        self.wire = []
        self.subscribes = 0
        self.cond = threading.Condition()
        self._logger = logging.getLogger(TRANSPORT_LOGGER)
        self._old_level = None

    def __enter__(self):
        self._old_level = self._logger.level
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self._logger.removeHandler(self)
        self._logger.setLevel(self._old_level)

    def emit(self, record):
        try:
            text = record.getMessage()
        except Exception:
            return
        if text.startswith("message received on "):
            topic = text[len("message received on "):]
            if topic.startswith(self.prefix):
                with self.cond:
                    self.wire.append(mid_of(topic))
                    self.cond.notify_all()
        elif text.startswith(f"subscribing to {self.prefix}/"):
            with self.cond:
                self.subscribes += 1

    def handler(self, message):
        with self.cond:
            self.messages.append(message)
            self.cond.notify_all()

    def wait(self, n, timeout=WAIT):
        """True once the handler has run at least n times and n PUBLISHes were seen."""
        with self.cond:
            return self.cond.wait_for(lambda: len(self.messages) >= n and len(self.wire) >= n, timeout)

    def settle(self, n, quiet=0.5):
        """Waits for n, then a little longer, so that duplicates would show up."""
        ok = self.wait(n)
        time.sleep(quiet)
        with self.cond:
            return ok, list(self.messages), list(self.wire)


def by_id(messages):
    out = {}
    for m in messages:
        assert m.message_id not in out, f"message {m.message_id!r} handed to the handler twice"
        out[m.message_id] = m
    return out


def wait_queue_empty(hub, device_id, timeout=5):
    """The device's own HTTPS receive finds nothing (completion after PUBACK is asynchronous)."""
    deadline = time.time() + timeout
    while True:
        r = device_receive(hub, device_id)
        assert r.status_code in (200, 204), (r.status_code, r.text)
        if r.status_code == 204:
            return
        assert time.time() < deadline, (
            f"a message is still deliverable after the device acknowledged everything: "
            f"messageid={r.headers.get('iothub-messageid')!r} deliverycount={r.headers.get('iothub-deliverycount')!r}")
        time.sleep(0.2)


def purged(hub, device_id):
    r = hub.request("DELETE", f"/devices/{device_id}/commands", hub.token())
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()["totalMessagesPurged"]


def feedback_records(hub, device_id, want_ids, timeout=10):
    """Feedback records of one device until every id in want_ids has one (completing each
    feedback message)."""
    records, deadline = [], time.time() + timeout
    while time.time() < deadline:
        r = hub.request("GET", "/messages/serviceBound/feedback", hub.token("service"))
        if r.status_code == 204:
            if want_ids <= {x["OriginalMessageId"] for x in records}:
                return records
            time.sleep(0.2)
            continue
        assert r.status_code == 200, (r.status_code, r.text)
        lock = r.headers["ETag"].strip('"')
        records.extend(x for x in r.json() if x["DeviceId"] == device_id)
        d = hub.request("DELETE", f"/messages/serviceBound/feedback/{urllib.parse.quote(lock, safe='')}", hub.token("service"))
        assert d.status_code == 204, (d.status_code, d.text)
    return records


@pytest.mark.parametrize("websockets", [False, True], ids=["mqtt", "websocket"])
def test_sdk_receives_c2d_with_properties(sdk_hub, websockets):
    device_id = f"c2d-props-{tag(websockets)}"
    sdk_hub.create_device(device_id)
    expiry = (datetime.now(timezone.utc) + timedelta(hours=1)).replace(microsecond=0)
    expiry_text = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
    json_body = json.dumps({"cmd": "reboot", "delay": 5, "who": device_id}).encode()
    sent = [
        dict(body=json_body, mid=f"{device_id}-m0", cid="corr/0&x=y", uid="svc-user", ack="full",
             ct="application/json", ce="utf-8", props={"n": "0", "text": "a b&c=d/e"}),
        dict(body=b"\x00\xff\x10", mid=f"{device_id}-m1", cid="corr/1", uid="svc-user", ack="positive",
             ct="application/octet-stream", ce="binary", props={"n": "1", "kind": "raw bytes"}),
        dict(body="plain text, ünïcode".encode(), mid=f"{device_id}-m2", cid="corr 2", uid="other user", ack="negative",
             ct="text/plain; charset=utf-8", ce="utf-8", props={"n": "2", "path.key": "/x?y=1#z", "sum": "1+1=2"}),
        dict(body=json_body, mid=f"{device_id}-m3", cid="corr/3", uid="svc-user", ack="none",
             ct="application/json", ce="utf-8", props={"n": "3"}),
    ]
    client = new_client(sdk_hub, device_id, websockets)
    with Receiver(device_id) as rx:
        try:
            client.connect()
            client.on_message_received = rx.handler
            for m in sent:
                headers = {
                    "iothub-messageid": m["mid"], "iothub-correlationid": m["cid"], "iothub-userid": m["uid"],
                    "iothub-ack": m["ack"], "iothub-expiry": expiry_text,
                    "Content-Type": m["ct"], "Content-Encoding": m["ce"],
                    **{f"iothub-app-{k}": v for k, v in m["props"].items()},
                }
                send_ok(sdk_hub, device_id, m["body"], headers)
            # A message with no headers at all.
            send_ok(sdk_hub, device_id, b"")

            ok, got, wire = rx.settle(len(sent) + 1)
            assert ok, f"received {len(got)} messages, wire {wire}"
            assert wire == [m["mid"] for m in sent] + [None], "delivered in send order"
            assert len(got) == len(sent) + 1
            received = by_id(got)
            for m in sent:
                r = received[m["mid"]]
                assert r.data == m["body"]
                assert r.message_id == m["mid"]
                assert r.correlation_id == m["cid"]
                assert r.user_id == m["uid"]
                assert r.content_type == m["ct"]
                assert r.content_encoding == m["ce"]
                assert r.custom_properties == m["props"]
                assert (r.ack == m["ack"]) if m["ack"] != "none" else r.ack in (None, "none")
                assert r.expiry_time_utc is not None
                assert datetime.fromisoformat(r.expiry_time_utc) == expiry, r.expiry_time_utc
            bare = received[None]
            assert bare.data == b""
            assert (bare.correlation_id, bare.user_id, bare.content_type, bare.content_encoding) == (None,) * 4
            assert bare.custom_properties == {}
            assert bare.ack in (None, "none")
            if bare.expiry_time_utc is not None:  # the hub's default TTL
                assert datetime.fromisoformat(bare.expiry_time_utc) > datetime.now(timezone.utc)

            # The PUBACKs completed everything: ack full and positive give Success feedback ...
            records = feedback_records(sdk_hub, device_id, {sent[0]["mid"], sent[1]["mid"]})
            assert sorted((x["OriginalMessageId"], x["StatusCode"], x["Description"]) for x in records) == [
                (sent[0]["mid"], 0, "Success"), (sent[1]["mid"], 0, "Success")]
            # ... and nothing is left for the device, not even after its connection has ended
            # (the hub abandons unsettled locks when a connection ends).
            wait_queue_empty(sdk_hub, device_id)
            client.disconnect()
            time.sleep(1)
            wait_queue_empty(sdk_hub, device_id, timeout=0)
            assert purged(sdk_hub, device_id) == 0
        finally:
            client.shutdown()


def warm_up(hub, rx, device_id, count):
    """One message while connected, to prove the subscription is live."""
    send_ok(hub, device_id, b"warm-up", {"iothub-messageid": f"{device_id}-warm"})
    ok, got, wire = rx.settle(count)
    assert ok and wire[-1] == f"{device_id}-warm", (wire, [m.message_id for m in got])


@pytest.mark.parametrize("websockets", [False, True], ids=["mqtt", "websocket"])
def test_messages_sent_while_disconnected_arrive_after_reconnect(sdk_hub, websockets):
    device_id = f"c2d-offline-{tag(websockets)}"
    sdk_hub.create_device(device_id)
    ids = [f"{device_id}-off{i}" for i in range(5)]
    client = new_client(sdk_hub, device_id, websockets)
    with Receiver(device_id) as rx:
        try:
            client.connect()
            client.on_message_received = rx.handler
            warm_up(sdk_hub, rx, device_id, 1)
            client.disconnect()
            time.sleep(0.5)
            for i, mid in enumerate(ids):
                send_ok(sdk_hub, device_id, f"offline {i}".encode(), {"iothub-messageid": mid, "iothub-app-i": str(i)})
            # Same client, handler untouched: the SDK does not subscribe again, so only the
            # session the hub kept for this client id can route these.
            client.connect()
            ok, got, wire = rx.settle(1 + len(ids))
            assert ok, f"after reconnect: handler got {[m.message_id for m in got]}, wire {wire}"
            assert wire == [f"{device_id}-warm"] + ids
            assert rx.subscribes == 1, "the SDK subscribed again after reconnecting; the session was not exercised"
            received = by_id(got)
            assert set(received) == {f"{device_id}-warm", *ids}
            for i, mid in enumerate(ids):
                assert received[mid].data == f"offline {i}".encode()
                assert received[mid].custom_properties == {"i": str(i)}
            wait_queue_empty(sdk_hub, device_id)
        finally:
            client.shutdown()


@pytest.mark.parametrize("websockets", [False, True], ids=["mqtt", "websocket"])
def test_messages_sent_before_a_new_client_connects_arrive(sdk_hub, websockets):
    device_id = f"c2d-newclient-{tag(websockets)}"
    sdk_hub.create_device(device_id)
    ids = [f"{device_id}-early{i}" for i in range(5)]
    first = new_client(sdk_hub, device_id, websockets)
    with Receiver(device_id) as rx:
        try:
            first.connect()
            first.on_message_received = rx.handler
            warm_up(sdk_hub, rx, device_id, 1)
        finally:
            first.shutdown()
    time.sleep(0.5)
    for i, mid in enumerate(ids):
        send_ok(sdk_hub, device_id, f"early {i}".encode(), {"iothub-messageid": mid})

    # A brand-new client object. The handler is set before connect(): the hub's kept session
    # may deliver as soon as the connection is up, and a sync client that has no handler yet
    # parks such messages in its legacy receive_message() inbox, where a handler never sees them.
    # Setting the handler connects the client and subscribes again.
    second = new_client(sdk_hub, device_id, websockets)
    with Receiver(device_id) as rx:
        try:
            second.on_message_received = rx.handler
            second.connect()
            ok, got, wire = rx.settle(len(ids))
            assert ok, f"new client: handler got {[m.message_id for m in got]}, wire {wire}"
            assert wire == ids
            received = by_id(got)
            assert [received[mid].data for mid in ids] == [f"early {i}".encode() for i in range(5)]
            wait_queue_empty(sdk_hub, device_id)
        finally:
            second.shutdown()


@pytest.mark.parametrize("websockets", [False, True], ids=["mqtt", "websocket"])
def test_queue_depth_limit(sdk_hub, websockets):
    device_id = f"c2d-depth-{tag(websockets)}"
    sdk_hub.create_device(device_id)
    ids = [f"{device_id}-q{i:02d}" for i in range(50)]
    for i, mid in enumerate(ids):
        send_ok(sdk_hub, device_id, json.dumps({"i": i}).encode(),
                {"iothub-messageid": mid, "Content-Type": "application/json", "iothub-app-i": str(i)})
    r = send(sdk_hub, device_id, b"one too many", {"iothub-messageid": f"{device_id}-q50"})
    assert r.status_code == 403, (r.status_code, r.text)
    assert r.json()["errorCode"] == 403004, r.text

    client = new_client(sdk_hub, device_id, websockets)
    with Receiver(device_id) as rx:
        try:
            client.on_message_received = rx.handler
            client.connect()
            ok, got, wire = rx.settle(len(ids))
            assert ok, f"handler got {len(got)} of 50, wire {len(wire)}"
            assert wire == ids, "the first 50, in order; the refused 51st never arrives"
            received = by_id(got)
            assert set(received) == set(ids)
            for i, mid in enumerate(ids):
                m = received[mid]
                assert json.loads(m.data) == {"i": i}
                assert m.content_type == "application/json"
                assert m.custom_properties == {"i": str(i)}

            # Completion frees the queue: the next send is accepted (retry while the PUBACK
            # completions are still being written) and arrives.
            deadline = time.time() + 5
            while True:
                r = send(sdk_hub, device_id, b"after", {"iothub-messageid": f"{device_id}-after"})
                if r.status_code == 204 or time.time() > deadline:
                    break
                time.sleep(0.2)
            assert r.status_code == 204, (r.status_code, r.text)
            ok, got, wire = rx.settle(len(ids) + 1)
            assert ok and wire[-1] == f"{device_id}-after", wire[-3:]
            assert by_id(got)[f"{device_id}-after"].data == b"after"
            wait_queue_empty(sdk_hub, device_id)
        finally:
            client.shutdown()
