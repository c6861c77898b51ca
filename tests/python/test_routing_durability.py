"""EVT-5/EVT-6 durability: SIGKILL during mixed traffic (routed telemetry over MQTT, twin
changes over REST). After the restart every PUBACKed device message is in every endpoint its
routes name, and every acknowledged twin change produced its change event."""

import base64
import json
import threading
import time

from mqttraw import Closed, connect_device


def test_sigkill_during_routed_mixed_traffic_loses_nothing(hub):
    t = hub.token()
    assert hub.request("PUT", "/routing/endpoints/hot", t, json={"partitionCount": 2}).status_code == 201
    assert hub.request("PUT", "/routing/endpoints/twins", t, json={"partitionCount": 1}).status_code == 201
    for name, body in {
        "all": {"source": "DeviceMessages", "condition": "true", "endpointNames": ["events"]},
        "hot": {"source": "DeviceMessages", "condition": "level = 'high'", "endpointNames": ["hot"]},
        "twins": {"source": "TwinChangeEvents", "condition": "true", "endpointNames": ["twins"]},
    }.items():
        r = hub.request("PUT", f"/routing/routes/{name}", t, json=body)
        assert r.status_code == 200, r.text
    devices = [f"mix-{i}" for i in range(16)]
    r = hub.request("POST", "/devices", t, json=[{"id": d, "importMode": "create"} for d in devices])
    assert r.status_code == 200, r.text
    acked = {d: [] for d in devices}
    twin_acked = []
    stop = threading.Event()
    clients = {d: connect_device(hub, d) for d in devices}

    def pump(device_id):
        c, n = clients[device_id], 0
        try:
            while not stop.is_set():
                n += 1
                level = "high" if n % 2 else "low"
                pkid = (n % 65535) + 1
                c.publish(f"devices/{device_id}/messages/events/%24.mid={device_id}-{n}&level={level}",
                          b"payload", qos=1, pkid=pkid)
                c.expect_puback(pkid, timeout=30)
                acked[device_id].append((f"{device_id}-{n}", level))
        except (Closed, TimeoutError, OSError, AssertionError):
            pass

    def twins():
        n = 0
        try:
            while not stop.is_set():
                n += 1
                d = devices[n % len(devices)]
                r = hub.request("PATCH", f"/twins/{d}", t, headers={"If-Match": "*"},
                                json={"properties": {"desired": {"n": n}}})
                if r.status_code != 200:
                    return
                twin_acked.append((d, r.json()["version"]))
        except Exception:
            pass

    threads = [threading.Thread(target=pump, args=(d,)) for d in devices] + [threading.Thread(target=twins)]
    for th in threads:
        th.start()
    time.sleep(3)
    hub.kill()
    stop.set()
    for th in threads:
        th.join(60)
    total = sum(len(v) for v in acked.values())
    assert total > 200, f"only {total} messages acknowledged before the kill"
    assert len(twin_acked) > 10, f"only {len(twin_acked)} twin changes acknowledged"

    hub.start()
    in_events = {e["systemProperties"]["message-id"] for e in hub.read_endpoint("events")}
    in_hot = {e["systemProperties"]["message-id"] for e in hub.read_endpoint("hot")}
    missing = [m for v in acked.values() for m, _ in v if m not in in_events]
    assert missing == [], f"{len(missing)} acknowledged messages missing from events, e.g. {missing[:5]}"
    missing_hot = [m for v in acked.values() for m, level in v if level == "high" and m not in in_hot]
    assert missing_hot == [], f"{len(missing_hot)} high messages missing from hot, e.g. {missing_hot[:5]}"
    wrong_hot = [m for v in acked.values() for m, level in v if level == "low" and m in in_hot]
    assert wrong_hot == [], "low messages were routed to hot"

    # Twin change events are produced from the durable outbox after the restart.
    deadline, seen = time.time() + 20, set()
    while time.time() < deadline:
        seen = set()
        for e in hub.read_endpoint("twins"):
            body = json.loads(base64.b64decode(e["body"]))
            seen.add((e["properties"]["deviceId"], body["version"]))
        if all(x in seen for x in twin_acked):
            break
        time.sleep(0.5)
    lost = [x for x in twin_acked if x not in seen]
    assert lost == [], f"{len(lost)} acknowledged twin changes without an event, e.g. {lost[:5]}"
    hub.kill()
