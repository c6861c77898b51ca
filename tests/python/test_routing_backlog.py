"""The bound on a delivered endpoint's backlog (issue 68, point 4; docs/routing.md, "Endpoints
outside the hub"): an endpoint with a target whose receiver stays down holds at most
`[routing] endpoint_backlog_limit` undelivered events (here 20), measured on /metrics as
`ferrohub_endpoint_backlog_events`; once full, the messages routes send it go to the built-in
endpoint when the fallback route is on, else are dropped, each counted against the endpoint
(`ferrohub_endpoint_deliveries_total{outcome="sent_to_fallback"|"dropped"}`); when the receiver
is back, the stored backlog is delivered in order and the endpoint takes messages again.

A real HTTPS receiver (webhookkit) answers 503 while "down"; the device sends with the official
Python SDK over MQTT; the built-in endpoint is read back through the hub's partitions. Against a
cluster (FERROHUB_TEST_CLUSTER=1) the writer routes, delivers and measures.
"""

import base64
import json
import os
import time

from azure.iot.device import IoTHubDeviceClient, Message

from deliverykit import device, drop_routing, health, metric, put_route, wait_for
from webhookkit import Receiver, put_webhook_endpoint, webhook

LIMIT = 20
HUB_CONFIG = f"[routing]\nendpoint_backlog_limit = {LIMIT}\n"
DEVICE = "backlog-1"


def send(client: IoTHubDeviceClient, start: int, n: int):
    for i in range(start, start + n):
        m = Message(json.dumps({"kind": "backlog", "n": i}))
        m.content_type, m.content_encoding = "application/json", "utf-8"
        m.custom_properties["kind"] = "backlog"
        client.send_message(m)


def backlog(hub) -> float:
    return metric(hub, "ferrohub_endpoint_backlog_events", endpoint="hook-full")


def counted(hub, outcome: str) -> float:
    return metric(hub, "ferrohub_endpoint_deliveries_total", endpoint="hook-full", outcome=outcome)


def in_builtin(hub) -> list[int]:
    return [json.loads(base64.b64decode(e["body"]))["n"] for e in hub.events_of(DEVICE)]


def posted(receiver: Receiver) -> list[int]:
    seen = []
    for p in receiver.received():
        n = json.loads(p["body"])["n"]
        if n not in seen:  # at least once: a repeat is not a new message
            seen.append(n)
    return seen


def test_a_full_endpoint_sends_to_the_fallback_or_drops_then_delivers_its_backlog(sdk_hub, tmp_path):
    receiver = Receiver(tmp_path / "hook")
    receiver.status = 503
    key = base64.b64encode(os.urandom(32)).decode()
    put_webhook_endpoint(sdk_hub, "hook-full", webhook(receiver, key, deadLetterAfterSeconds=3600), partitions=1)
    put_route(sdk_hub, "to-full", "kind = 'backlog'", ["hook-full"])
    client = device(sdk_hub, DEVICE)
    try:
        # Up to the limit the endpoint stores what its receiver refuses.
        send(client, 0, LIMIT)
        wait_for(lambda: backlog(sdk_hub), lambda b: b == LIMIT)
        assert wait_for(lambda: health(sdk_hub)["hook-full"]["healthStatus"],
                        lambda s: s == "unhealthy")
        # At the limit it reads full within a check: what routes send it then goes to events.
        sent = LIMIT
        while counted(sdk_hub, "sent_to_fallback") == 0:
            assert sent < LIMIT + 50, "the endpoint never read full"
            send(client, sent, 1)
            sent += 1
            time.sleep(0.1)
        send(client, sent, 10)
        sent += 10
        # What it stored is the first messages; the rest went to the built-in endpoint, each
        # counted; nothing is in both, nothing is missing.
        stored = int(wait_for(lambda: (backlog(sdk_hub), counted(sdk_hub, "sent_to_fallback")),
                              lambda v: v[0] + v[1] == sent)[0])
        assert LIMIT <= stored < sent - 10, stored
        diverted = wait_for(lambda: in_builtin(sdk_hub), lambda d: len(d) >= sent - stored)
        assert sorted(diverted) == list(range(stored, sent)), diverted
        assert counted(sdk_hub, "sent_to_fallback") == sent - stored
        assert counted(sdk_hub, "dropped") == 0

        # With the fallback route off, they are dropped and counted.
        r = sdk_hub.request("PUT", "/routing/fallback", sdk_hub.token(), json={"isEnabled": False})
        assert r.status_code in (200, 204), r.text
        send(client, sent, 5)
        sent += 5
        wait_for(lambda: counted(sdk_hub, "dropped"), lambda c: c == 5)
        assert backlog(sdk_hub) == stored
        assert sorted(in_builtin(sdk_hub)) == sorted(diverted)

        # The receiver back: the backlog is delivered in order, and the endpoint drains.
        receiver.status = 200
        got = wait_for(lambda: posted(receiver), lambda p: len(p) >= stored, timeout=90)
        assert got == list(range(stored)), got
        # The router hears an endpoint drained before its gauge reads so: once it reads 0,
        # what follows is delivered, not diverted or dropped.
        wait_for(lambda: backlog(sdk_hub), lambda b: b == 0)
        send(client, sent, 3)
        got = wait_for(lambda: posted(receiver), lambda p: len(p) >= stored + 3)
        assert got == list(range(stored)) + [sent, sent + 1, sent + 2], got
        assert counted(sdk_hub, "dropped") == 5
        assert counted(sdk_hub, "sent_to_fallback") == len(diverted)
        assert wait_for(lambda: health(sdk_hub)["hook-full"]["healthStatus"],
                        lambda s: s in ("healthy", "degraded"))
    finally:
        client.shutdown()
        sdk_hub.request("PUT", "/routing/fallback", sdk_hub.token(), json={"isEnabled": True})
        drop_routing(sdk_hub, ["to-full"], ["hook-full"])
        receiver.close()
