"""AMQ-2, AMQ-3 with the unmodified official Node service SDK (azure-iothub 1.16.6, pinned in
tests/node/package-lock.json and installed by scripts/lib.sh): `Client.send` over AMQP on the
fixed port 5671 delivers to a device, and `getFeedbackReceiver` receives feedback records for
completed, expired, dead and rejected messages with the seed's status codes; an abandoned
feedback message comes back.

The SDK runs in its own node process (tests/node/service.js); it trusts the hub's CA through
NODE_EXTRA_CA_CERTS.
"""

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from hubkit import REPO

NODE_DIR = Path(os.environ.get("FERROHUB_NODE", Path.home() / ".cache" / "ferrohub" / "node"))


SERVICE_JS = str(REPO / "tests" / "node" / "service.js")


def node_env(hub):
    modules = NODE_DIR / "node_modules"
    assert modules.is_dir(), f"the Node SDKs are not installed in {NODE_DIR}: run scripts/test-all.sh"
    return dict(os.environ, NODE_PATH=str(modules), NODE_EXTRA_CA_CERTS=hub.ca)


def node(hub, request, timeout=120):
    request = dict(request, connectionString=hub.connection_string("iothubowner", with_port=False))
    done = subprocess.run(["node", SERVICE_JS], input=json.dumps(request),
                          capture_output=True, text=True, timeout=timeout, env=node_env(hub))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def device_receive(hub, device_id):
    return hub.request("GET", f"/devices/{device_id}/messages/deviceBound", hub.device_token(device_id))


def device_settle(hub, device_id, lock, how):
    path = f"/devices/{device_id}/messages/deviceBound/{lock}"
    if how == "abandon":
        r = hub.request("POST", path + "/abandon", hub.device_token(device_id))
    else:
        r = hub.request("DELETE", path + ("?reject" if how == "reject" else ""), hub.device_token(device_id))
    assert r.status_code == 204, (r.status_code, r.text)


def test_client_send_delivers_and_refusals_are_errors(sdk_hub):
    hub = sdk_hub
    hub.create_device("node-d")
    result = node(hub, {"op": "send", "sends": [
        {"deviceId": "node-d", "body": "hello from node", "messageId": "node-1", "properties": {"k": "v"}},
        {"deviceId": "node-nobody", "body": "lost"},
    ]})
    assert result["sends"][0] is None
    assert result["sends"][1], "a send to an unknown device succeeded"
    r = device_receive(hub, "node-d")
    assert r.status_code == 200, r.text
    assert r.content == b"hello from node"
    assert r.headers["iothub-messageid"] == "node-1"
    assert r.headers.get("iothub-app-k") == "v"


def test_feedback_receiver_gets_every_status_and_abandoned_feedback_returns(sdk_hub):
    hub = sdk_hub
    device = "node-fb"
    hub.create_device(device)
    expiry = int((time.time() + 1.5) * 1000)
    sent = node(hub, {"op": "send", "sends": [
        {"deviceId": device, "body": "ok", "messageId": "n-ok", "ack": "full"},
        {"deviceId": device, "body": "expires", "messageId": "n-exp", "ack": "full", "expiryTimeUtc": expiry},
        {"deviceId": device, "body": "rejected", "messageId": "n-rej", "ack": "full"},
        {"deviceId": device, "body": "dead", "messageId": "n-dead", "ack": "full"},
    ]})
    assert sent["sends"] == [None] * 4
    time.sleep(2)  # n-exp's expiry passes before the device looks
    settle_as = {"n-ok": "complete", "n-rej": "reject", "n-dead": "abandon"}
    deadline = time.time() + 30
    while time.time() < deadline:
        r = device_receive(hub, device)
        if r.status_code == 204:
            break
        mid = r.headers["iothub-messageid"]
        assert mid != "n-exp", "an expired message was delivered"
        device_settle(hub, device, r.headers["etag"].strip('"'), settle_as[mid])
    else:
        raise AssertionError("the device queue never emptied")

    got = node(hub, {"op": "feedback", "originalIds": ["n-ok", "n-exp", "n-rej", "n-dead"],
                     "abandonFirst": True, "timeoutMs": 30000})
    batches = got["batches"]
    assert not got.get("timedOut"), batches
    assert batches[0]["settled"] == "abandon"
    completed = [r for b in batches if b.get("settled") == "complete" for r in b["records"]]
    status = {r["OriginalMessageId"]: (r["StatusCode"], r["Description"]) for r in completed}
    assert status == {
        "n-ok": (0, "Success"),
        "n-exp": (1, "Message expired"),
        "n-dead": (2, "Message delivery count exceeded"),
        "n-rej": (3, "Message rejected"),
    }, status
    # What was abandoned came back and was completed.
    abandoned = {r["OriginalMessageId"] for r in batches[0]["records"]}
    assert abandoned <= set(status)


def drain_queue(hub, device_id):
    """Every message id in a device's queue, completing each."""
    ids = []
    while True:
        r = device_receive(hub, device_id)
        if r.status_code == 204:
            return ids
        assert r.status_code == 200, (r.status_code, r.text)
        ids.append(r.headers["iothub-messageid"])
        device_settle(hub, device_id, r.headers["etag"].strip('"'), "complete")


def test_every_accepted_send_survives_sigkill_mid_burst(sdk_hub):
    hub = sdk_hub
    devices = [f"burst-{i:02d}" for i in range(20)]
    for d in devices:
        hub.create_device(d)
    request = {"op": "burst", "devices": devices, "count": 900, "inflight": 8,
               "connectionString": hub.connection_string("iothubowner", with_port=False)}
    proc = subprocess.Popen(["node", SERVICE_JS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=node_env(hub))
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        proc.stdin.write(json.dumps(request))
        proc.stdin.close()
        accepted = set()
        for line in proc.stdout:
            event = json.loads(line)
            assert "failed" not in event, event
            if "accepted" in event:
                accepted.add(event["accepted"])
            if len(accepted) >= 300:
                break
        assert len(accepted) >= 300, f"only {len(accepted)} sends were accepted before the burst ended"
        hub.kill()  # SIGKILL, with sends in flight
        # Sends the hub accepted just before it died may still be on their way to the client.
        for line in proc.stdout:
            event = json.loads(line)
            if "accepted" in event:
                accepted.add(event["accepted"])
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
    hub.start()
    stored = [mid for d in devices for mid in drain_queue(hub, d)]
    assert len(stored) == len(set(stored)), "a message is stored twice"
    missing = accepted - set(stored)
    assert not missing, f"{len(missing)} accepted messages were lost: {sorted(missing)[:10]}"
