"""Webhook endpoints (issue 68, point 2; docs/routing.md, "Endpoints outside the hub"): a custom
endpoint with a webhook target has its routed events POSTed to a receiver outside the hub.

A real HTTPS receiver (Python's http.server over TLS, its certificate from a CA of the test's
own that the endpoint names) records every POST. Devices send with the official Python SDK
over MQTT. Checked here:
- each POST carries the body, the system properties under their wire names, the application
  properties as `x-property-*` (percent-encoded), and `x-ferrohub-signature` that verifies with
  the endpoint's key;
- through a receiver outage (503s, then the receiver gone and back) nothing is lost and each
  device's messages arrive in the order sent (repeats allowed: at least once);
- an endpoint whose receiver stays down neither holds back another webhook endpoint nor the
  built-in endpoint, and `GET /routing/endpointsHealth` reads `unhealthy` for it and
  `healthy` for the other, as IoT Hub's routingEndpointsHealth does; after its
  dead-letter time it reads `dead` and later events move again;
- a SIGKILL of the hub (of the cluster's writer, against a cluster) in the middle of deliveries
  loses nothing a route matched;
- bad targets are refused 400 with the field named.

Against a cluster (FERROHUB_TEST_CLUSTER=1) the same module runs on the SDKs' fixed ports behind
HAProxy: the writer delivers.
"""

import base64
import hashlib
import hmac
import json
import os
import time
import urllib.parse

import pytest
from azure.iot.device import IoTHubDeviceClient, Message

from deliverykit import device, drop_routing, health, put_route, wait_for
from webhookkit import Receiver, put_webhook_endpoint, webhook

CLUSTER = os.environ.get("FERROHUB_TEST_CLUSTER") == "1"


def send(client: IoTHubDeviceClient, kind: str, n: int, start: int = 0, **props):
    for i in range(start, start + n):
        m = Message(json.dumps({"kind": kind, "n": i}))
        m.content_type, m.content_encoding = "application/json", "utf-8"
        m.custom_properties.update({"kind": kind, **props})
        client.send_message(m)


def sequence_of(posts: list[dict], device_id: str, kind: str) -> list[int]:
    out = []
    for p in posts:
        if p["headers"].get("iothub-connection-device-id") != device_id:
            continue
        b = json.loads(p["body"])
        if b.get("kind") == kind:
            out.append(b["n"])
    return out


def in_order_without_gaps(seen: list[int], n: int) -> bool:
    """At least once and in order: once repeats are taken out where they restart, every
    number 0..n-1 appears, each first seen after the one before it."""
    firsts = []
    for x in seen:
        if x not in firsts:
            firsts.append(x)
    return firsts == list(range(n))


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(tmp_path / "hook")
    yield r
    r.close()


def test_posts_carry_body_properties_and_a_signature_that_verifies(sdk_hub, receiver):
    key = base64.b64encode(os.urandom(32)).decode()
    answer = put_webhook_endpoint(sdk_hub, "hook-a", webhook(receiver, key))
    assert answer["webhook"]["signingKey"] == key and answer["webhook"]["url"] == receiver.url
    put_route(sdk_hub, "to-hook-a", "kind = 'signed'", ["hook-a", "events"])
    # An enrichment for the webhook endpoint alone: its posts carry it, the built-in copies not.
    r = sdk_hub.request("PUT", "/routing/enrichments/site", sdk_hub.token(),
                        json={"value": "lab-7", "endpointNames": ["hook-a"]})
    assert r.status_code == 200, r.text
    try:
        client = device(sdk_hub, "wh-signed")
        try:
            send(client, "signed", 3, unit="°C / s")
        finally:
            client.shutdown()
        posts = wait_for(receiver.received, lambda p: len(sequence_of(p, "wh-signed", "signed")) >= 3)
        for p in posts:
            h = p["headers"]
            expected = "sha256=" + hmac.new(base64.b64decode(key), p["body"], hashlib.sha256).hexdigest()
            assert h["x-ferrohub-signature"] == expected
            assert h["content-type"] == "application/json"
            assert h["iothub-content-encoding"] == "utf-8"
            assert h["iothub-connection-device-id"] == "wh-signed"
            assert h["x-ferrohub-endpoint"] == "hook-a"
            assert int(h["x-ferrohub-sequence-number"]) >= 0
            assert h["x-property-kind"] == "signed"
            assert urllib.parse.unquote(h["x-property-unit"]) == "°C / s"
            assert h["x-property-site"] == "lab-7"
            assert "iothub-enqueuedtime" in h
        assert sequence_of(posts, "wh-signed", "signed")[:3] == [0, 1, 2]
        builtin = wait_for(lambda: sdk_hub.events_of("wh-signed"), lambda e: len(e) >= 3)
        assert all(e["properties"].get("kind") == "signed" and "site" not in e["properties"] for e in builtin)
        # The configuration shows the target but not its key.
        shown = [e for e in sdk_hub.request("GET", "/routing", sdk_hub.token()).json()["endpoints"]
                 if e["name"] == "hook-a"][0]
        assert shown["webhook"]["url"] == receiver.url and "signingKey" not in shown["webhook"]
        # A forged body would not verify.
        assert hmac.new(base64.b64decode(key), posts[0]["body"] + b" ", hashlib.sha256).hexdigest() not in \
            posts[0]["headers"]["x-ferrohub-signature"]
        assert health(sdk_hub)["hook-a"]["healthStatus"] == "healthy"
    finally:
        sdk_hub.request("DELETE", "/routing/enrichments/site", sdk_hub.token())
        drop_routing(sdk_hub, ["to-hook-a"], ["hook-a"])


def test_an_outage_loses_nothing_and_keeps_each_devices_order(sdk_hub, tmp_path):
    work = tmp_path / "outage"
    receiver = Receiver(work)
    port = receiver.port
    key = base64.b64encode(os.urandom(32)).decode()
    put_webhook_endpoint(sdk_hub, "hook-b", webhook(receiver, key))
    put_route(sdk_hub, "to-hook-b", "kind = 'outage'", ["hook-b"])
    a, b = device(sdk_hub, "wh-out-a"), device(sdk_hub, "wh-out-b")
    try:
        send(a, "outage", 5)
        send(b, "outage", 5)
        wait_for(receiver.received, lambda p: len(sequence_of(p, "wh-out-a", "outage")) >= 5
                 and len(sequence_of(p, "wh-out-b", "outage")) >= 5)
        # The receiver answers 503: the hub retries, the devices' sends are unaffected.
        receiver.status = 503
        send(a, "outage", 10, start=5)
        send(b, "outage", 10, start=5)
        wait_for(lambda: health(sdk_hub)["hook-b"]["healthStatus"], lambda s: s == "unhealthy")
        assert "503" in health(sdk_hub)["hook-b"]["lastKnownError"]
        # Then it is gone altogether for a while, and comes back on the same port.
        receiver.close()
        send(a, "outage", 5, start=15)
        send(b, "outage", 5, start=15)
        time.sleep(2)
        earlier = receiver.received()
        receiver = Receiver(work, port=port)
        receiver.posts = earlier
        posts = wait_for(receiver.received,
                         lambda p: in_order_without_gaps(sequence_of(p, "wh-out-a", "outage"), 20)
                         and in_order_without_gaps(sequence_of(p, "wh-out-b", "outage"), 20), timeout=90)
        for d in ("wh-out-a", "wh-out-b"):
            assert in_order_without_gaps(sequence_of(posts, d, "outage"), 20), sequence_of(posts, d, "outage")
        assert wait_for(lambda: health(sdk_hub)["hook-b"]["healthStatus"],
                        lambda s: s in ("degraded", "healthy")) in ("degraded", "healthy")
    finally:
        a.shutdown()
        b.shutdown()
        receiver.close()
        drop_routing(sdk_hub, ["to-hook-b"], ["hook-b"])


def test_a_dead_endpoint_holds_back_no_other_and_reads_unhealthy_then_dead(sdk_hub, receiver):
    key = base64.b64encode(os.urandom(32)).decode()
    closed = Receiver(receiver.ca_cert.parent)  # the same CA; closed at once: nothing listens
    dead_url = closed.url
    closed.close()
    put_webhook_endpoint(sdk_hub, "hook-live", webhook(receiver, key))
    dead = {**webhook(receiver, key), "url": dead_url, "deadLetterAfterSeconds": 10}
    put_webhook_endpoint(sdk_hub, "hook-dead", dead, partitions=1)
    put_route(sdk_hub, "to-both", "kind = 'split'", ["hook-live", "hook-dead", "events"])
    client = device(sdk_hub, "wh-split")
    try:
        started = time.time()
        send(client, "split", 20)
        sent_in = time.time() - started
        posts = wait_for(receiver.received, lambda p: len(sequence_of(p, "wh-split", "split")) >= 20)
        assert in_order_without_gaps(sequence_of(posts, "wh-split", "split"), 20)
        # The built-in endpoint has them too.
        events = wait_for(lambda: [e for e in sdk_hub.events_of("wh-split")], lambda e: len(e) >= 20)
        assert len(events) >= 20
        states = wait_for(lambda: health(sdk_hub), lambda h: h["hook-dead"]["healthStatus"] == "unhealthy")
        assert states["hook-live"]["healthStatus"] == "healthy"
        assert states["hook-dead"]["lastKnownError"]
        assert states["hook-dead"]["lastSuccessfulSendAttemptTime"] is None
        # Sends were not slowed by the dead endpoint: 20 acknowledged sends in well under its
        # first retry period would not hold if each waited for it.
        assert sent_in < 10, sent_in
        # Past its dead-letter time the endpoint reads dead; its events were counted, not kept.
        wait_for(lambda: health(sdk_hub)["hook-dead"]["healthStatus"], lambda s: s == "dead", timeout=60)
    finally:
        client.shutdown()
        drop_routing(sdk_hub, ["to-both"], ["hook-live", "hook-dead"])


def test_a_sigkill_in_the_middle_of_deliveries_loses_nothing_matched(sdk_hub, receiver):
    key = base64.b64encode(os.urandom(32)).decode()
    put_webhook_endpoint(sdk_hub, "hook-kill", webhook(receiver, key))
    put_route(sdk_hub, "to-hook-kill", "kind = 'kill'", ["hook-kill"])
    client = device(sdk_hub, "wh-kill")
    try:
        send(client, "kill", 10)
        wait_for(receiver.received, lambda p: len(sequence_of(p, "wh-kill", "kill")) >= 10)
        receiver.status = 503  # then deliveries pile up behind the receiver...
        send(client, "kill", 20, start=10)
        client.shutdown()
        wait_for(lambda: health(sdk_hub)["hook-kill"]["healthStatus"], lambda s: s == "unhealthy")
        # ...and the node that delivers dies with them accepted but undelivered.
        if CLUSTER:
            writer = sdk_hub.wait_for_writer()
            sdk_hub.kill_node(writer)
            sdk_hub.wait_for_writer(other_than=writer, timeout=90)
            sdk_hub.start_node(writer)
        else:
            sdk_hub.kill()
            sdk_hub.start()
        receiver.status = 200
        posts = wait_for(receiver.received,
                         lambda p: in_order_without_gaps(sequence_of(p, "wh-kill", "kill"), 30), timeout=120)
        assert in_order_without_gaps(sequence_of(posts, "wh-kill", "kill"), 30)
    finally:
        drop_routing(sdk_hub, ["to-hook-kill"], ["hook-kill"])


@pytest.mark.parametrize("hook,field", [
    ({"url": "ftp://x/"}, "webhook.url"),
    ({"url": "https://x/", "signingKey": "c2hvcnQ="}, "webhook.signingKey"),
    ({"url": "https://x/", "timeoutSeconds": 0}, "webhook.timeoutSeconds"),
    ({"url": "https://x/", "deadLetterAfterSeconds": 1}, "webhook.deadLetterAfterSeconds"),
    ({"url": "https://x/", "caCertificate": "not a certificate"}, "webhook.caCertificate"),
])
def test_bad_targets_are_refused_with_the_field_named(sdk_hub, hook, field):
    r = sdk_hub.request("PUT", "/routing/endpoints/hook-bad", sdk_hub.token(),
                        json={"partitionCount": 1, "webhook": hook})
    assert r.status_code == 400 and field in r.text, (r.status_code, r.text)
    names = [e["name"] for e in sdk_hub.request("GET", "/routing", sdk_hub.token()).json()["endpoints"]]
    assert "hook-bad" not in names


def test_a_target_is_set_and_removed_on_an_existing_endpoint(sdk_hub, receiver):
    r = sdk_hub.request("PUT", "/routing/endpoints/hook-later", sdk_hub.token(), json={"partitionCount": 1})
    assert r.status_code == 201, r.text
    put_route(sdk_hub, "to-hook-later", "kind = 'later'", ["hook-later"])
    client = device(sdk_hub, "wh-later")
    try:
        send(client, "later", 2)  # held in the endpoint before it has a target
        key = base64.b64encode(os.urandom(24)).decode()
        r = sdk_hub.request("PUT", "/routing/endpoints/hook-later/webhook", sdk_hub.token(), json=webhook(receiver, key))
        assert r.status_code == 200 and r.json()["webhook"]["signingKey"] == key, r.text
        wait_for(receiver.received, lambda p: sequence_of(p, "wh-later", "later")[:2] == [0, 1])
        assert sdk_hub.request("DELETE", "/routing/endpoints/hook-later/webhook", sdk_hub.token()).status_code == 204
        time.sleep(2)  # the delivery tasks follow within a second
        before = len(receiver.received())
        send(client, "later", 2, start=2)
        time.sleep(3)
        assert len(receiver.received()) == before
        assert "hook-later" not in health(sdk_hub)
        missing = sdk_hub.request("PUT", "/routing/endpoints/nothing-here/webhook", sdk_hub.token(),
                                  json=webhook(receiver, key))
        assert missing.status_code == 404, missing.text
    finally:
        client.shutdown()
        drop_routing(sdk_hub, ["to-hook-later"], ["hook-later"])


@pytest.mark.skipif(CLUSTER, reason="a hub of its own, started with a configuration file, then exported and restored")
def test_a_webhook_from_the_configuration_file_survives_export_and_restore(tmp_path, receiver):
    import subprocess

    from hubkit import Hub, binary
    from routingkit import send_http

    key = base64.b64encode(os.urandom(32)).decode()
    (tmp_path / "hook.key").write_text(key + "\n")
    config = tmp_path / "hub.toml"
    config.write_text(f"""
[[routing.endpoints]]
name = "filed"
partitions = 1
[routing.endpoints.webhook]
url = "{receiver.url}"
signing_key_file = "{tmp_path / 'hook.key'}"
ca_file = "{receiver.ca_cert}"
timeout = "3s"
dead_letter_after = "10m"

[[routing.routes]]
name = "to-filed"
source = "DeviceMessages"
condition = "true"
endpoints = ["filed", "events"]
""")

    def verified(posts, device_id):
        return [p for p in posts if p["headers"].get("iothub-connection-device-id") == device_id
                and p["headers"]["x-ferrohub-signature"] ==
                "sha256=" + hmac.new(base64.b64decode(key), p["body"], hashlib.sha256).hexdigest()]

    original = Hub(tmp_path / "original").start(["--config", str(config)])
    try:
        original.create_device("filed-1")
        send_http(original, "filed-1", b"before")
        wait_for(lambda: verified(receiver.received(), "filed-1"), lambda v: len(v) == 1)
        hook = [e for e in original.request("GET", "/routing", original.token()).json()["endpoints"]
                if e["name"] == "filed"][0]["webhook"]
        assert (hook["url"], hook["timeoutSeconds"], hook["deadLetterAfterSeconds"]) == (receiver.url, 3, 600)
    finally:
        original.stop()
    export = tmp_path / "export"
    for args in (["export", "--data-dir", str(original.data_dir), "--to", str(export)],
                 ["restore", "--data-dir", str(tmp_path / "restored"), "--from", str(export)]):
        run = subprocess.run([binary(), *args], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    restored = Hub(tmp_path / "restored").start()
    try:
        send_http(restored, "filed-1", b"after")
        posts = wait_for(lambda: verified(receiver.received(), "filed-1"), lambda v: len(v) == 2)
        assert [p["body"] for p in posts] == [b"before", b"after"]
    finally:
        restored.kill()


def test_a_configuration_file_with_a_bad_webhook_stops_the_start(tmp_path):
    from hubkit import Hub

    if CLUSTER:
        pytest.skip("a hub of its own")
    config = tmp_path / "hub.toml"
    config.write_text('[[routing.endpoints]]\nname = "filed"\npartitions = 1\n[routing.endpoints.webhook]\n'
                      f'url = "https://127.0.0.1:1/"\nsigning_key_file = "{tmp_path / "missing.key"}"\n')
    hub = Hub(tmp_path / "hub")
    with pytest.raises(Exception):
        hub.start(["--config", str(config)], timeout=20)
    assert "missing.key" in hub.log_tail(40)


def test_an_endpoint_deleted_and_made_again_at_once_delivers_all_its_partitions(sdk_hub, receiver):
    """Deleted and made again within the delivery tasks' reconcile period, with the same target
    but another partition count: every partition of the new endpoint delivers."""
    key = base64.b64encode(os.urandom(32)).decode()
    put_webhook_endpoint(sdk_hub, "hook-again", webhook(receiver, key), partitions=1)
    put_route(sdk_hub, "to-hook-again", "kind = 'again'", ["hook-again"])
    clients = [device(sdk_hub, f"wh-again-{i}") for i in range(6)]
    try:
        send(clients[0], "again", 1)
        wait_for(receiver.received, lambda p: sequence_of(p, "wh-again-0", "again") == [0])
        drop_routing(sdk_hub, ["to-hook-again"], ["hook-again"])
        put_webhook_endpoint(sdk_hub, "hook-again", webhook(receiver, key), partitions=4)
        put_route(sdk_hub, "to-hook-again", "kind = 'again'", ["hook-again"])
        for c in clients:
            send(c, "again", 3, start=1)
        posts = wait_for(receiver.received, lambda p: all(
            {1, 2, 3} <= set(sequence_of(p, f"wh-again-{i}", "again")) for i in range(6)), timeout=30)
        for i in range(6):
            assert {1, 2, 3} <= set(sequence_of(posts, f"wh-again-{i}", "again")), i
        partitions = {int(p["headers"]["x-ferrohub-partition"]) for p in posts
                      if json.loads(p["body"]).get("n", 0) >= 1}
        assert len(partitions) > 1, partitions
    finally:
        for c in clients:
            c.shutdown()
        drop_routing(sdk_hub, ["to-hook-again"], ["hook-again"])
