"""What the tests of endpoints outside the hub share (test_routing_webhook.py,
test_routing_brokers.py): routes of device messages, cleanup, endpoint health, an SDK device,
and waiting for a condition."""

from __future__ import annotations

import time
from pathlib import Path

from azure.iot.device import IoTHubDeviceClient


def wait_for(what, done, timeout=60.0, interval=0.2):
    """Calls `what` until `done` holds for its value, which it returns; fails with the last."""
    deadline = time.time() + timeout
    while True:
        value = what()
        if done(value):
            return value
        assert time.time() < deadline, f"timed out; last: {value!r}"[:3000]
        time.sleep(interval)


def health(hub) -> dict:
    """`GET /routing/endpointsHealth` by endpoint name."""
    r = hub.request("GET", "/routing/endpointsHealth", hub.token())
    assert r.status_code == 200, r.text
    return {h["endpointId"]: h for h in r.json()["value"]}


def put_route(hub, name: str, condition: str, endpoints: list[str]):
    """A route of device messages."""
    r = hub.request("PUT", f"/routing/routes/{name}", hub.token(),
                    json={"source": "DeviceMessages", "condition": condition, "endpointNames": endpoints})
    assert r.status_code == 200, r.text


def drop_routing(hub, routes: list[str], endpoints: list[str]):
    """Deletes routes, then endpoints (a named endpoint cannot go first)."""
    for r in routes:
        hub.request("DELETE", f"/routing/routes/{r}", hub.token())
    for e in endpoints:
        hub.request("DELETE", f"/routing/endpoints/{e}", hub.token())


def device(hub, device_id: str) -> IoTHubDeviceClient:
    """A device created on `hub` and connected with the official Python SDK over MQTT."""
    hub.request("PUT", f"/devices/{device_id}", hub.token(), json={"deviceId": device_id})
    client = IoTHubDeviceClient.create_from_connection_string(
        hub.device_connection_string(device_id), server_verification_cert=Path(hub.ca).read_text())
    client.connect()
    return client


def metric(hub, name: str, **labels) -> float:
    """One sample of the hub's /metrics (0 when absent); of the writer's, in a cluster (it
    routes and delivers)."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    r = requests.get(f"{hub.metrics_base()}/metrics", timeout=10)
    assert r.status_code == 200, r.text
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0
