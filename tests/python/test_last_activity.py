"""`lastActivityTime` moves with a device's traffic, as IoT Hub's does ("the last time the device
connected, received, or sent a message"), not only when it connects and disconnects: over MQTT
while a connection streams, and for a device that only sends over HTTPS. It moves at most once
per `[hub] last_activity_interval` (one second here) and changes neither the etag nor the
connection state."""

import time

from hubkit import Hub
from mqttraw import connect_device


def activity(hub, device_id):
    d = hub.request("GET", f"/devices/{device_id}", hub.token()).json()
    return d["lastActivityTime"], d


def wait_past(hub, device_id, previous, timeout=15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        now, d = activity(hub, device_id)
        if now > previous:
            return now, d
        time.sleep(0.2)
    raise AssertionError(f"lastActivityTime of {device_id} stayed at {previous}")


def test_traffic_moves_last_activity_time(tmp_path):
    config = tmp_path / "ferrohub.toml"
    config.write_text('[hub]\nlast_activity_interval = "1s"\n')
    hub = Hub(tmp_path / "hub").start(extra_args=["--config", str(config)])
    try:
        hub.create_device("streamer")
        hub.create_device("https-only")
        c = connect_device(hub, "streamer")
        at_connect, before = activity(hub, "streamer")
        assert before["connectionState"] == "Connected"
        # A streaming device: every message keeps the time within about an interval of now.
        latest = at_connect
        for round_ in range(3):
            time.sleep(1.2)
            pkid = round_ + 1
            c.publish("devices/streamer/messages/events/", b"tick", qos=1, pkid=pkid)
            c.expect_puback(pkid, timeout=5)
            latest, after = wait_past(hub, "streamer", latest)
        assert after["etag"] == before["etag"], "traffic is not a registry update"
        assert after["connectionState"] == "Connected"
        assert after["connectionStateUpdatedTime"] == before["connectionStateUpdatedTime"]
        # Within one interval, more traffic writes nothing more.
        c.publish("devices/streamer/messages/events/", b"tock", qos=1, pkid=9)
        c.expect_puback(9, timeout=5)
        c.disconnect()

        # A device that never connects: its HTTPS telemetry moves the time from "never".
        never, _ = activity(hub, "https-only")
        r = hub.request("POST", "/devices/https-only/messages/events", hub.device_token("https-only"), data=b"hello")
        assert r.status_code == 204, r.text
        moved, _ = wait_past(hub, "https-only", never)
        assert moved.startswith("20"), moved
    finally:
        hub.stop()
