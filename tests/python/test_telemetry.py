"""D2C-1..D2C-5, HDV-1, P-7: the read API, HTTPS telemetry, retention, and durability of
acknowledged telemetry across SIGKILL."""

import base64
import threading
import time

import pytest

from hubkit import Hub
from mqttraw import Closed, connect_device


def test_read_positions_groups_and_checkpoints(hub):
    hub.create_device("reader-dev")
    c = connect_device(hub, "reader-dev")
    for i in range(10):
        c.publish(f"devices/reader-dev/messages/events/i={i}", f"m{i}", qos=1, pkid=i + 1)
        assert c.expect_puback(i + 1)
    c.disconnect()
    events = hub.events_of("reader-dev")
    assert [e["properties"]["i"] for e in events] == [str(i) for i in range(10)]
    p = int(events[0]["partitionId"])
    info = hub.request("GET", f"/events/partitions/{p}", hub.token("service")).json()
    assert info["lastEnqueuedSequenceNumber"] == events[-1]["sequenceNumber"]
    assert info["lastEnqueuedOffset"] == events[-1]["offset"]
    assert info["lastEnqueuedTimeUtc"] == events[-1]["enqueuedTimeUtc"]
    assert [e["sequenceNumber"] for e in hub.read_partition(p, sequenceNumber=events[4]["sequenceNumber"])] == \
        [e["sequenceNumber"] for e in events[4:]]
    assert hub.read_partition(p, offset=events[7]["offset"])[0]["sequenceNumber"] == events[7]["sequenceNumber"]
    assert hub.read_partition(p, enqueuedTimeUtc=events[0]["enqueuedTimeUtc"])[0]["sequenceNumber"] == events[0]["sequenceNumber"]
    assert hub.read_partition(p, **{"from": "end"}) == []

    svc = hub.token("service")
    assert hub.request("PUT", "/events/consumergroups/analytics", svc).status_code == 201
    assert hub.request("PUT", "/events/consumergroups/analytics", svc).status_code == 409
    assert hub.request("GET", "/events/consumergroups", svc).json() == ["$Default", "analytics"]
    cp = {"sequenceNumber": events[5]["sequenceNumber"], "offset": events[5]["offset"]}
    assert hub.request("PUT", f"/events/consumergroups/analytics/partitions/{p}/checkpoint", svc, json=cp).status_code == 204
    got = hub.request("GET", f"/events/consumergroups/analytics/partitions/{p}/checkpoint", svc).json()
    assert (got["sequenceNumber"], got["offset"]) == (cp["sequenceNumber"], cp["offset"])
    assert hub.request("GET", f"/events/consumergroups/nobody/partitions/{p}/messages", svc).status_code == 404
    assert hub.request("DELETE", "/events/consumergroups/$Default", svc).status_code == 400
    assert hub.request("DELETE", "/events/consumergroups/analytics", svc).status_code == 204
    # The read API needs ServiceConnect.
    assert hub.request("GET", "/events/partitions", hub.token("registryReadWrite")).status_code == 401
    assert hub.request("GET", f"/events/partitions/{hub_partitions_count(hub)}", svc).status_code == 404


def hub_partitions_count(hub):
    return len(hub.partitions())


def test_long_poll_wakes_on_new_events(hub):
    hub.create_device("poll-dev")
    c = connect_device(hub, "poll-dev")
    c.publish("devices/poll-dev/messages/events/", "first", qos=1, pkid=1)
    assert c.expect_puback(1)
    (first,) = hub.events_of("poll-dev")
    p, nxt = first["partitionId"], first["sequenceNumber"] + 1
    result = {}

    def poll():
        t0 = time.time()
        r = hub.request("GET", f"/events/consumergroups/$Default/partitions/{p}/messages?sequenceNumber={nxt}&timeout=20", hub.token("service"))
        result["elapsed"], result["events"] = time.time() - t0, r.json()["events"]

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(1.5)
    c.publish("devices/poll-dev/messages/events/", "second", qos=1, pkid=2)
    assert c.expect_puback(2)
    t.join(30)
    assert [base64.b64decode(e["body"]) for e in result["events"]] == [b"second"]
    assert 1.0 < result["elapsed"] < 10
    # With nothing new, the poll returns empty after its timeout.
    t0 = time.time()
    r = hub.request("GET", f"/events/consumergroups/$Default/partitions/{p}/messages?sequenceNumber={nxt + 1}&timeout=1", hub.token("service"))
    assert r.json()["events"] == [] and time.time() - t0 >= 0.9


def test_https_telemetry(hub):
    hub.create_device("http-dev")
    token = hub.device_token("http-dev")
    r = hub.request("POST", "/devices/http-dev/messages/events", token, data=b'{"t": 21.5}',
                    headers={"iothub-messageid": "h1", "iothub-correlationid": "c1", "Content-Type": "application/json",
                             "Content-Encoding": "utf-8", "iothub-app-room": "kitchen"})
    assert r.status_code == 204, r.text
    batch = [{"body": base64.b64encode(b"b1").decode(), "base64Encoded": True, "properties": {"k": "1"}},
             {"body": "plain", "properties": {"k": "2"}}]
    r = hub.request("POST", "/devices/http-dev/messages/events", token, json=batch,
                    headers={"Content-Type": "application/vnd.microsoft.iothub.json"})
    assert r.status_code == 204, r.text
    events = hub.events_of("http-dev")
    assert [base64.b64decode(e["body"]) for e in events] == [b'{"t": 21.5}', b"b1", b"plain"]
    sp = events[0]["systemProperties"]
    assert (sp["message-id"], sp["correlation-id"], sp["content-type"], sp["content-encoding"]) == ("h1", "c1", "application/json", "utf-8")
    assert events[0]["properties"] == {"room": "kitchen"}
    assert [e["properties"] for e in events[1:]] == [{"k": "1"}, {"k": "2"}]
    # Another device's token, a registry token, an oversized body: refused, nothing stored.
    hub.create_device("other-dev")
    assert hub.request("POST", "/devices/http-dev/messages/events", hub.device_token("other-dev"), data=b"x").status_code == 401
    assert hub.request("POST", "/devices/http-dev/messages/events", hub.token("registryReadWrite"), data=b"x").status_code == 401
    assert hub.request("POST", "/devices/http-dev/messages/events", token, data=b"x" * (256 * 1024 + 1)).status_code == 413
    assert len(hub.events_of("http-dev")) == 3


def test_retention_removes_expired_events(tmp_path):
    config = tmp_path / "hub.toml"
    config.write_text('[d2c]\nretention = "2s"\nretention_check_interval = "1s"\n[development]\nallow_short_retention = true\n')
    hub = Hub(tmp_path / "hub").start(["--config", str(config)])
    try:
        hub.create_device("old-dev")
        c = connect_device(hub, "old-dev")
        for i in range(5):
            c.publish("devices/old-dev/messages/events/", f"old{i}", qos=1, pkid=i + 1)
            assert c.expect_puback(i + 1)
        p = int(hub.events_of("old-dev")[0]["partitionId"])
        deadline = time.time() + 15
        while hub.events_of("old-dev") and time.time() < deadline:
            time.sleep(0.5)
        assert hub.events_of("old-dev") == []
        info = hub.request("GET", f"/events/partitions/{p}", hub.token("service")).json()
        assert info["isEmpty"] and info["beginSequenceNumber"] == 5
        c.publish("devices/old-dev/messages/events/", "new", qos=1, pkid=9)
        assert c.expect_puback(9)
        assert [e["sequenceNumber"] for e in hub.events_of("old-dev")] == [5]
        c.close()
    finally:
        hub.stop()


def test_retention_setting_is_validated(tmp_path):
    config = tmp_path / "hub.toml"
    config.write_text('[d2c]\nretention = "2s"\n')
    with pytest.raises(RuntimeError, match="d2c.retention"):
        Hub(tmp_path / "hub").start(["--config", str(config)])


def test_sigkill_loses_no_acknowledged_message(hub):
    devices = [f"kill-{i}" for i in range(50)]
    r = hub.request("POST", "/devices", hub.token(), json=[{"id": d, "importMode": "create"} for d in devices])
    assert r.status_code == 200, r.text
    acked = {d: [] for d in devices}
    stop = threading.Event()
    clients = {d: connect_device(hub, d) for d in devices}

    def pump(device_id):
        c, n = clients[device_id], 0
        try:
            while not stop.is_set():
                n += 1
                pkid = (n % 65535) + 1
                c.publish(f"devices/{device_id}/messages/events/%24.mid={device_id}-{n}", b"payload", qos=1, pkid=pkid)
                c.expect_puback(pkid, timeout=30)
                acked[device_id].append(f"{device_id}-{n}")
        except (Closed, TimeoutError, OSError, AssertionError):
            pass

    threads = [threading.Thread(target=pump, args=(d,)) for d in devices]
    for t in threads:
        t.start()
    time.sleep(3)
    hub.kill()
    stop.set()
    for t in threads:
        t.join(60)
    total_acked = sum(len(v) for v in acked.values())
    assert total_acked > 200, f"only {total_acked} messages were acknowledged before the kill"
    hub.start()
    stored = {}
    for e in hub.all_events():
        stored.setdefault(e["systemProperties"]["iothub-connection-device-id"], set()).add(e["systemProperties"]["message-id"])
    missing = [m for d, mids in acked.items() for m in mids if m not in stored.get(d, set())]
    assert missing == [], f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
