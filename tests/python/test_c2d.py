"""C2D-1..C2D-7, HDV-2, MQT-9 through raw HTTPS and raw MQTT: queues, locks, delivery counts,
expiry, dead letters, feedback in seed 002's format, explicit MQTT settlement, and durability
across restarts and SIGKILL."""

import json
import struct
import time
import urllib.parse
from datetime import datetime, timedelta, timezone

import pytest

from hubkit import Hub
from mqttraw import PUBACK, PUBLISH, connect_device, packet

FEEDBACK_TYPE = "application/vnd.microsoft.iothub.feedback.json"


def start(tmp_path, toml=""):
    config = tmp_path / "hub.toml"
    config.write_text('[c2d]\nlock_timeout = "1s"\nmax_delivery_count = 3\n' + toml)
    return Hub(tmp_path / "hub").start(["--config", str(config)])


@pytest.fixture
def c2d_hub(tmp_path):
    h = start(tmp_path)
    yield h
    if h.proc and h.proc.poll() is None:
        h.kill()


def send(hub, device_id, body=b"x", **headers):
    hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
    return hub.request("POST", f"/devices/{device_id}/messages/deviceBound", hub.token(), data=body, headers=hdrs)


def receive(hub, device_id):
    return hub.request("GET", f"/devices/{device_id}/messages/deviceBound", hub.device_token(device_id))


def lock_of(r):
    return r.headers["ETag"].strip('"')


def complete(hub, device_id, lock, reject=False):
    path = f"/devices/{device_id}/messages/deviceBound/{urllib.parse.quote(lock)}" + ("?reject" if reject else "")
    return hub.request("DELETE", path, hub.device_token(device_id))


def abandon(hub, device_id, lock):
    return hub.request("POST", f"/devices/{device_id}/messages/deviceBound/{lock}/abandon", hub.device_token(device_id))


def feedback(hub, timeout=10.0):
    """Every feedback record available within `timeout` (completing each feedback message)."""
    records, deadline = [], time.time() + timeout
    while time.time() < deadline:
        r = hub.request("GET", "/messages/serviceBound/feedback", hub.token())
        if r.status_code == 204:
            if records:
                return records
            time.sleep(0.2)
            continue
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"] == FEEDBACK_TYPE
        records.extend(r.json())
        assert hub.request("DELETE", f"/messages/serviceBound/feedback/{lock_of(r)}", hub.token()).status_code == 204
    return records


def iso_in(seconds):
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).isoformat()


# -- service send ------------------------------------------------------------------------------

def test_send_refusals_change_nothing(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    r = send(hub, "nobody")
    assert r.status_code == 404 and r.json()["errorCode"] == 404001
    r = send(hub, "d1", iothub_ack="sometimes")
    assert r.status_code == 400 and "iothub-ack" in r.text
    r = send(hub, "d1", iothub_expiry="tomorrow")
    assert r.status_code == 400
    r = send(hub, "d1", body=b"x" * (64 * 1024 + 1))
    assert r.status_code == 413
    r = hub.request("POST", "/devices/d1/messages/deviceBound", None, data=b"x")
    assert r.status_code == 401
    r = hub.request("POST", "/devices/d1/messages/deviceBound", hub.device_token("d1"), data=b"x")
    assert r.status_code == 401, "a device key is not ServiceConnect"
    assert receive(hub, "d1").status_code == 204, "nothing was queued"


def test_51st_message_is_refused_and_first_50_intact(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    for i in range(50):
        assert send(hub, "d1", f"m{i}".encode(), iothub_messageid=f"id{i}").status_code == 204
    r = send(hub, "d1", b"m50")
    assert r.status_code == 403
    assert r.json()["errorCode"] == 403004
    assert "DeviceMaximumQueueDepthExceeded" in r.json()["Message"]
    for i in range(50):
        r = receive(hub, "d1")
        assert r.status_code == 200
        assert r.content == f"m{i}".encode()
        assert r.headers["iothub-messageid"] == f"id{i}"
        assert r.headers["iothub-sequencenumber"] == str(i)
        assert complete(hub, "d1", lock_of(r)).status_code == 204
    assert receive(hub, "d1").status_code == 204


def test_purge_empties_the_queue(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    for _ in range(3):
        send(hub, "d1")
    assert hub.request("GET", "/devices/d1", hub.token()).json()["cloudToDeviceMessageCount"] == 3
    listed = hub.request("GET", "/devices", hub.token()).json()
    assert [d["cloudToDeviceMessageCount"] for d in listed if d["deviceId"] == "d1"] == [3]
    r = hub.request("DELETE", "/devices/d1/commands", hub.token())
    assert r.status_code == 200
    assert r.json() == {"totalMessagesPurged": 3, "deviceId": "d1", "moduleId": None}
    assert receive(hub, "d1").status_code == 204
    assert hub.request("GET", "/devices/d1", hub.token()).json()["cloudToDeviceMessageCount"] == 0


# -- HTTPS device side ----------------------------------------------------------------------------

def test_https_receive_carries_properties_and_lock_token(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    expiry = iso_in(600)
    assert send(hub, "d1", b'{"a":1}', iothub_messageid="mid-1", iothub_correlationid="cid/1",
                iothub_userid="u1", iothub_ack="full", iothub_expiry=expiry,
                content_type="application/json", content_encoding="utf-8",
                **{"iothub-app-color": "red", "iothub-app-text": "a b"}).status_code == 204
    r = receive(hub, "d1")
    assert r.status_code == 200
    assert r.content == b'{"a":1}'
    h = r.headers
    assert h["iothub-messageid"] == "mid-1"
    assert h["iothub-correlationid"] == "cid/1"
    assert h["iothub-userid"] == "u1"
    assert h["iothub-ack"] == "full"
    assert h["Content-Type"] == "application/json"
    assert h["Content-Encoding"] == "utf-8"
    assert h["iothub-app-color"] == "red"
    assert h["iothub-app-text"] == "a b"
    assert h["iothub-deliverycount"] == "1"
    assert h["iothub-to"] == "/devices/d1/messages/deviceBound"
    assert abs(datetime.fromisoformat(h["iothub-expiry"].replace("Z", "+00:00"))
               - datetime.fromisoformat(expiry)) < timedelta(milliseconds=2)
    assert len(lock_of(r)) == 36
    # Locked: invisible to a second receive.
    assert receive(hub, "d1").status_code == 204
    # Another device cannot settle it.
    hub.create_device("d2")
    r2 = hub.request("DELETE", f"/devices/d1/messages/deviceBound/{lock_of(r)}", hub.device_token("d2"))
    assert r2.status_code == 401
    assert complete(hub, "d1", "not-a-token").status_code == 400
    assert complete(hub, "d1", lock_of(r)).status_code == 204
    r = complete(hub, "d1", lock_of(r))
    assert r.status_code == 412 and r.json()["errorCode"] == 412002
    # Completed with ack full: feedback 0.
    [rec] = feedback(hub)
    assert rec["StatusCode"] == 0 and rec["Description"] == "Success"


def test_abandon_and_lock_timeout_redeliver_with_higher_count_then_dead(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    send(hub, "d1", b"m", iothub_messageid="m1", iothub_ack="negative")
    r1 = receive(hub, "d1")
    assert r1.headers["iothub-deliverycount"] == "1"
    assert abandon(hub, "d1", lock_of(r1)).status_code == 204
    assert abandon(hub, "d1", lock_of(r1)).status_code == 412
    r2 = receive(hub, "d1")
    assert r2.status_code == 200 and r2.headers["iothub-deliverycount"] == "2"
    # Left locked past the 1 s lock timeout: delivered again.
    deadline = time.time() + 10
    while (r3 := receive(hub, "d1")).status_code == 204 and time.time() < deadline:
        time.sleep(0.1)
    assert r3.status_code == 200 and r3.headers["iothub-deliverycount"] == "3"
    assert complete(hub, "d1", lock_of(r2)).status_code == 412, "the expired lock is lost"
    # Third delivery was the last (max_delivery_count = 3): abandoning it kills it.
    assert abandon(hub, "d1", lock_of(r3)).status_code == 204
    assert receive(hub, "d1").status_code == 204
    [rec] = feedback(hub)
    assert rec["OriginalMessageId"] == "m1"
    assert rec["StatusCode"] == 2
    assert rec["DeviceId"] == "d1"


def test_reject_over_https_is_dead_with_feedback_3(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    send(hub, "d1", iothub_messageid="r1", iothub_ack="full")
    r = receive(hub, "d1")
    assert complete(hub, "d1", lock_of(r), reject=True).status_code == 204
    assert receive(hub, "d1").status_code == 204
    [rec] = feedback(hub)
    assert (rec["OriginalMessageId"], rec["StatusCode"]) == ("r1", 3)


def test_ttl_expiry_is_dead_with_feedback_1_and_ack_decides_feedback(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    send(hub, "d1", iothub_messageid="neg", iothub_ack="negative", iothub_expiry=iso_in(1))
    send(hub, "d1", iothub_messageid="pos", iothub_ack="positive", iothub_expiry=iso_in(1))
    send(hub, "d1", iothub_messageid="none", iothub_expiry=iso_in(1))
    time.sleep(1.5)
    assert receive(hub, "d1").status_code == 204, "expired messages are never delivered"
    records = feedback(hub)
    assert [(r["OriginalMessageId"], r["StatusCode"]) for r in records] == [("neg", 1)]


def test_expiry_before_1970_is_dead_at_once(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    assert send(hub, "d1", iothub_messageid="old", iothub_ack="negative",
                iothub_expiry="1969-01-01T00:00:00Z").status_code == 204
    assert receive(hub, "d1").status_code == 204
    assert [(r["OriginalMessageId"], r["StatusCode"]) for r in feedback(hub)] == [("old", 1)]
    assert hub.request("GET", "/devices/d1", hub.token()).json()["cloudToDeviceMessageCount"] == 0


def test_mqtt_window_refills_when_in_flight_messages_die(tmp_path):
    """16 messages fill a connection's window and die by TTL while locked; the ones queued
    behind them are delivered once the TTL kills the locked ones, not after the lock timeout.
    The TTL leaves setup (start, 20 sends, connect) seconds of slack on a loaded machine; the lock
    timeout is far enough beyond it that the two outcomes cannot be confused."""
    config = tmp_path / "hub.toml"
    config.write_text('[c2d]\nlock_timeout = "40s"\n')
    hub = Hub(tmp_path / "hub").start(["--config", str(config)])
    try:
        hub.create_device("d1")
        for i in range(16):
            send(hub, "d1", f"short{i}".encode(), iothub_expiry=iso_in(6))
        for i in range(4):
            send(hub, "d1", f"long{i}".encode())
        c = explicit(hub, "d1")
        c.subscribe([("devices/d1/messages/devicebound/#", 1)])
        for _ in range(16):
            _, pkid, payload = read_publish(c)
            assert payload.startswith(b"short"), "setup outlasted the TTL; nothing was locked"
            puback(c, pkid)  # receipt only: they stay locked and then expire
        locked_at = time.time()
        got = []
        for _ in range(4):
            _, pkid, payload = read_publish(c, timeout=30)
            got.append(payload)
            puback(c, pkid)
        assert got == [f"long{i}".encode() for i in range(4)]
        assert time.time() - locked_at < 25, "delivered after the lock timeout, not after the TTL kill"
        c.disconnect()
    finally:
        hub.kill()


def test_feedback_format_batching_and_abandon(c2d_hub):
    hub = c2d_hub
    generation = hub.create_device("d1")["generationId"]
    for i in range(3):
        send(hub, "d1", iothub_messageid=f"f{i}", iothub_ack="positive")
    for _ in range(3):
        assert complete(hub, "d1", lock_of(receive(hub, "d1"))).status_code == 204
    r = hub.request("GET", "/messages/serviceBound/feedback", hub.token())
    assert r.status_code == 200
    assert r.headers["Content-Type"] == FEEDBACK_TYPE
    body = r.json()
    assert len(body) == 3, "the three records are batched into one feedback message"
    for i, rec in enumerate(body):
        assert list(rec.keys()) == ["OriginalMessageId", "EnqueuedTimeUtc", "StatusCode", "Description",
                                    "DeviceId", "DeviceGenerationId"], "seed 002's fields, in its order"
        assert rec["OriginalMessageId"] == f"f{i}"
        assert rec["StatusCode"] == 0 and rec["Description"] == "Success"
        assert rec["DeviceId"] == "d1" and rec["DeviceGenerationId"] == generation
        datetime.fromisoformat(rec["EnqueuedTimeUtc"].replace("Z", "+00:00"))
        assert rec["EnqueuedTimeUtc"].endswith("Z")
    lock = lock_of(r)
    assert hub.request("GET", "/messages/serviceBound/feedback", hub.token()).status_code == 204, "locked"
    assert hub.request("POST", f"/messages/serviceBound/feedback/{lock}/abandon", hub.token()).status_code == 204
    again = hub.request("GET", "/messages/serviceBound/feedback", hub.token())
    assert again.status_code == 200 and again.json() == body
    assert hub.request("DELETE", f"/messages/serviceBound/feedback/{lock}", hub.token()).status_code == 412
    assert hub.request("DELETE", f"/messages/serviceBound/feedback/{lock_of(again)}", hub.token()).status_code == 204
    assert hub.request("GET", "/messages/serviceBound/feedback", hub.token()).status_code == 204
    assert hub.request("GET", "/messages/serviceBound/feedback", hub.device_token("d1")).status_code == 401


# -- MQTT -------------------------------------------------------------------------------------

def read_publish(c, timeout=10):
    while True:
        ptype, flags, body = c.read(timeout)
        if ptype != PUBLISH:
            continue
        n = struct.unpack("!H", body[:2])[0]
        topic = body[2:2 + n].decode()
        qos = (flags >> 1) & 3
        rest = body[2 + n:]
        pkid = None
        if qos:
            pkid, rest = struct.unpack("!H", rest[:2])[0], rest[2:]
        return topic, pkid, rest


def bag(topic):
    raw = topic.split("/", 4)[4]
    out = {}
    for pair in raw.split("&"):
        k, _, v = pair.partition("=")
        out[urllib.parse.unquote(k)] = urllib.parse.unquote(v)
    return out


def puback(c, pkid):
    c.send(packet(PUBACK, 0, struct.pack("!H", pkid)))


def test_mqtt_topic_bag_and_puback_completes(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    send(hub, "d1", b"hello", iothub_messageid="m 1", iothub_correlationid="c&1", iothub_ack="full",
         iothub_userid="u", content_type="text/plain", content_encoding="utf-8",
         **{"iothub-app-k": "a b&c=d/e"})
    c = connect_device(hub, "d1")
    assert c.subscribe([("devices/d1/messages/devicebound/#", 1)]) == [1]
    topic, pkid, payload = read_publish(c)
    assert payload == b"hello"
    assert topic.startswith("devices/d1/messages/devicebound/")
    b = bag(topic)
    assert b["$.mid"] == "m 1" and b["$.cid"] == "c&1" and b["$.uid"] == "u"
    assert b["$.ct"] == "text/plain" and b["$.ce"] == "utf-8"
    assert b["$.to"] == "/devices/d1/messages/deviceBound"
    assert b["iothub-ack"] == "full" and b["k"] == "a b&c=d/e"
    assert "$.lt" not in b, "standard clients never see lock tokens"
    assert pkid
    puback(c, pkid)
    [rec] = feedback(hub)
    assert rec["StatusCode"] == 0 and rec["OriginalMessageId"] == "m 1"
    assert receive(hub, "d1").status_code == 204
    c.disconnect()


def test_mqtt_clean_session_receives_only_after_subscribing(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    send(hub, "d1", b"queued")
    c = connect_device(hub, "d1", clean=True)
    with pytest.raises(TimeoutError):
        read_publish(c, timeout=1.5)
    c.subscribe([("devices/d1/messages/devicebound/#", 1)])
    _, pkid, payload = read_publish(c)
    assert payload == b"queued"
    puback(c, pkid)
    c.disconnect()


def test_mqtt_unacked_message_is_redelivered_after_reconnect(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    c = connect_device(hub, "d1")
    c.subscribe([("devices/d1/messages/devicebound/#", 1)])
    send(hub, "d1", b"once", iothub_messageid="x")
    _, _, payload = read_publish(c)
    assert payload == b"once"
    c.sock.close()  # no PUBACK
    c2 = connect_device(hub, "d1")  # CleanSession=0: no SUBSCRIBE
    topic, pkid, payload = read_publish(c2)
    assert payload == b"once"
    puback(c2, pkid)
    time.sleep(0.3)
    assert receive(hub, "d1").status_code == 204
    c2.disconnect()


def explicit(hub, device_id):
    return connect_device(hub, device_id,
                          username=f"localhost/{device_id}/?api-version=2021-04-12&ferrohub-c2d-settlement=explicit")


def test_mqtt_explicit_settlement_reject_abandon_complete(c2d_hub):
    hub = c2d_hub
    hub.create_device("d1")
    for name in ("rej", "aba", "com"):
        send(hub, "d1", name.encode(), iothub_messageid=name, iothub_ack="full")
    c = explicit(hub, "d1")
    c.subscribe([("devices/d1/messages/devicebound/#", 1)])
    got = {}
    for _ in range(3):
        topic, pkid, payload = read_publish(c)
        puback(c, pkid)  # receipt only: nothing is settled by it
        got[payload.decode()] = bag(topic)["$.lt"]
    time.sleep(0.3)
    assert receive(hub, "d1").status_code == 204, "all three still locked"
    c.publish(f"devices/d1/messages/devicebound/{got['rej']}/reject", qos=1, pkid=11)
    c.expect_puback(11)
    c.publish(f"devices/d1/messages/devicebound/{got['com']}/complete", qos=1, pkid=12)
    c.expect_puback(12)
    c.publish(f"devices/d1/messages/devicebound/{got['aba']}/abandon", qos=1, pkid=13)
    # The abandoned message comes back with a new lock token.
    while True:
        ptype, flags, body = c.read()
        if ptype == PUBACK:
            continue
        assert ptype == PUBLISH
        n = struct.unpack("!H", body[:2])[0]
        topic = body[2:2 + n].decode()
        pkid = struct.unpack("!H", body[2 + n:4 + n])[0]
        assert body[4 + n:] == b"aba"
        lt = bag(topic)["$.lt"]
        assert lt != got["aba"]
        puback(c, pkid)
        break
    c.publish(f"devices/d1/messages/devicebound/{lt}/complete", qos=1, pkid=14)
    c.expect_puback(14)
    records = sorted((r["OriginalMessageId"], r["StatusCode"]) for r in feedback(hub))
    assert records == [("aba", 0), ("com", 0), ("rej", 3)]
    c.disconnect()


# -- durability ---------------------------------------------------------------------------------

def test_lock_and_ttl_deadlines_pass_while_the_hub_is_down(tmp_path):
    hub = start(tmp_path, '[storage]\ndurability = "synced"\n')
    try:
        hub.create_device("d1")
        send(hub, "d1", b"locked", iothub_messageid="locked", iothub_ack="full")
        send(hub, "d1", b"ttl", iothub_messageid="ttl", iothub_ack="negative", iothub_expiry=iso_in(2))
        r = receive(hub, "d1")
        assert r.content == b"locked"
        lock = lock_of(r)
        hub.stop()
        time.sleep(2.5)  # both the 1 s lock and the 2 s TTL pass while down
        hub.start(["--config", str(tmp_path / "hub.toml")])
        assert complete(hub, "d1", lock).status_code == 412
        deadline = time.time() + 10
        while (r := receive(hub, "d1")).status_code == 204 and time.time() < deadline:
            time.sleep(0.1)
        assert r.content == b"locked" and r.headers["iothub-deliverycount"] == "2"
        assert complete(hub, "d1", lock_of(r)).status_code == 204
        assert receive(hub, "d1").status_code == 204, "the expired one is dead"
        records = sorted((x["OriginalMessageId"], x["StatusCode"]) for x in feedback(hub))
        assert records == [("locked", 0), ("ttl", 1)]
    finally:
        if hub.proc.poll() is None:
            hub.kill()


def test_sigkill_during_c2d_load_loses_no_accepted_message(tmp_path):
    import concurrent.futures
    import threading

    hub = start(tmp_path, "max_queue_depth = 2000\n")
    config = tmp_path / "hub.toml"
    accepted, lock = set(), threading.Lock()
    devices = [f"k{i}" for i in range(8)]
    for d in devices:
        hub.create_device(d)
    stop = threading.Event()

    def sender(d):
        i = 0
        while not stop.is_set() and i < 1500:
            mid = f"{d}-{i}"
            try:
                r = send(hub, d, mid.encode(), iothub_messageid=mid)
            except Exception:
                return
            if r.status_code == 204:
                with lock:
                    accepted.add(mid)
            i += 1

    with concurrent.futures.ThreadPoolExecutor(len(devices)) as pool:
        futures = [pool.submit(sender, d) for d in devices]
        # Killed mid-load: once enough were accepted to matter (a loaded machine takes longer
        # to get there than an idle one), and at most 30 s in.
        deadline = time.time() + 30
        while time.time() < deadline:
            with lock:
                if len(accepted) >= 200:
                    break
            time.sleep(0.05)
        hub.kill()
        stop.set()
        for f in futures:
            f.result(timeout=60)
    assert len(accepted) > 100
    hub.start(["--config", str(config)])
    try:
        found = set()
        for d in devices:
            while (r := receive(hub, d)).status_code == 200:
                found.add(r.headers["iothub-messageid"])
                assert complete(hub, d, lock_of(r)).status_code == 204
        missing = accepted - found
        assert not missing, f"{len(missing)} accepted messages lost, e.g. {sorted(missing)[:5]}"
    finally:
        hub.kill()
