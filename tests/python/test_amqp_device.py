"""AMQ-5 to AMQ-8: devices and modules over AMQP with the unmodified official Node device SDK
(azure-iot-device 1.18.4 with azure-iot-device-amqp 1.14.4, pinned in tests/node/package-lock.json),
the service side on azure-iothub and the REST API, on the fixed ports (`sdk_hub`: one hub, or the
three-node cluster behind HAProxy with FERROHUB_TEST_CLUSTER=1). The SDK runs in
tests/node/amqp_device.js.

Covered:
- A device with its SAS key over `Amqp` (TLS, 5671) and `AmqpWs` (wss://…:443/$iothub/websocket):
  CBS put-token, open; the service sees it Connected while it is and Disconnected after close.
  Telemetry with message id, correlation id, content type and encoding and application
  properties arrives with them (and the SAS auth method) in the built-in endpoint. Three C2D
  messages (ack "full") sent by the service: completed, rejected, abandoned then completed on
  redelivery, with Success / Message rejected / Success feedback and nothing left queued. Twin:
  get, reported patch (read back by the service), a desired patch from the service pushed to the
  device. A direct method answered with the device's status and payload.
- A module (`ModuleClient`) over Amqp: telemetry with `iothub-connection-module-id`, its twin
  (get, reported, desired push), a module method.
- An X.509 device (self-signed, thumbprint registered): TLS client certificate only, telemetry
  with the x509Certificate auth method, its twin.
- Refusals: a connection string naming one device with another device's key, and an expired
  SharedAccessSignature, fail `open()` with UnauthorizedError while a good device on its own
  connection keeps being served; neither refused device is recorded connected or sends anything.
- The built-in endpoint redirect exactly as @azure/event-hubs's sample iothubConnectionString.js
  does it (rhea-promise, SASL PLAIN with a policy token, receiver on
  `amqps://{host}/messages/events/$management`, `amqp:link:redirect`), then an
  `EventHubConsumerClient` on the resulting connection string reads the device's AMQP telemetry
  with its properties.

Not covered: module inputs (nothing is routed to them yet), SASL PLAIN device authentication
(the SDK never uses SASL), CA-signed X.509 over AMQP, token renewal (45 min in the SDK),
hub-initiated closes (the SDK stalls ~45 s on them).
"""

import base64
import json
import subprocess
import time

from certs import self_signed, thumbprint
from hubkit import REPO, parse_cs, sas_token
from routingkit import HUB_NAME
from test_node_event_hubs import node_env
from test_sdk_c2d import feedback_records

AMQP_DEVICE_JS = str(REPO / "tests" / "node" / "amqp_device.js")
WAIT = 20


def hub_log(hub, lines=40):
    """The hub's recent log lines (every node's in a cluster; the AMQP library's own noise
    left out), for failure messages."""
    if hasattr(hub, "logs"):
        return hub.logs(lines)
    try:
        text = hub.stderr_path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(no hub log: {e})"
    return "\n".join([t for t in text if "fe2o3_amqp" not in t][-lines:])


def run(hub, request, timeout_ms=60000):
    """Runs amqp_device.js with `request`; returns its JSON line (asserting exit 0)."""
    request = dict(request, timeoutMs=timeout_ms)
    done = subprocess.run(["node", AMQP_DEVICE_JS], input=json.dumps(request), capture_output=True,
                          text=True, timeout=timeout_ms / 1000 + 30, env=node_env(hub))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    out = json.loads(lines[-1]) if lines else None
    assert done.returncode == 0, (f"exit {done.returncode}; result {out}\nstderr:\n{done.stderr[-3000:]}"
                                  f"\nhub log:\n{hub_log(hub)}")
    return out


def service_cs(hub):
    return hub.connection_string("iothubowner", with_port=False)


def host(hub):
    return parse_cs(service_cs(hub))["HostName"]


def device(hub, device_id):
    return hub.request("GET", f"/devices/{device_id}", hub.token()).json()


def wait_state(hub, device_id, state, timeout=WAIT):
    deadline = time.time() + timeout
    while (got := device(hub, device_id)["connectionState"]) != state:
        assert time.time() < deadline, f"{device_id} is {got}, not {state}\nhub log:\n{hub_log(hub)}"
        time.sleep(0.2)


def wait_events(hub, device_id, n, timeout=WAIT):
    deadline = time.time() + timeout
    while len(events := hub.events_of(device_id)) < n:
        assert time.time() < deadline, f"{len(events)} of {n} events of {device_id}"
        time.sleep(0.2)
    return events


def rest_twin(hub, device_id, module_id=None):
    path = f"/twins/{device_id}" + (f"/modules/{module_id}" if module_id else "")
    r = hub.request("GET", path, hub.token("service"))
    assert r.status_code == 200, r.text
    return r.json()


def telemetry(tag):
    return {"body": json.dumps({"temp": 21.5, "from": tag}), "messageId": f"{tag}-m1",
            "correlationId": f"{tag}-c1", "contentType": "application/json", "contentEncoding": "utf-8",
            "properties": {"color": "blue", "n": "7"}}


def check_event(event, sent, device_id, auth_type, module_id=None):
    sp = event["systemProperties"]
    assert base64.b64decode(event["body"]).decode() == sent["body"]
    assert event["properties"] == sent["properties"], event
    assert sp["message-id"] == sent["messageId"], sp
    assert sp["correlation-id"] == sent["correlationId"], sp
    assert sp["content-type"] == sent["contentType"], sp
    assert sp["content-encoding"] == sent["contentEncoding"], sp
    assert sp["iothub-connection-device-id"] == device_id
    assert sp.get("iothub-connection-module-id") == module_id, sp
    assert json.loads(sp["iothub-connection-auth-method"])["type"] == auth_type, sp


def no_client_errors(out):
    assert [e for e in out["events"] if e["event"] == "error"] == [], out["events"]


def test_device_over_amqp_and_amqp_ws(sdk_hub):
    """Both transports, one after the other: telemetry, C2D, twin, methods, connection state."""
    hub = sdk_hub
    for transport in ("Amqp", "AmqpWs"):
        tag = f"amqp-dev-{transport.lower()}"
        hub.create_device(tag)
        sent = telemetry(tag)
        c2d = [
            {"messageId": f"{tag}-c2d-1", "body": "complete me", "properties": {"k": "1"}, "plan": ["complete"]},
            {"messageId": f"{tag}-c2d-2", "body": "reject me", "properties": {"k": "2"}, "plan": ["reject"]},
            {"messageId": f"{tag}-c2d-3", "body": "abandon me once", "properties": {"k": "3"},
             "plan": ["abandon", "complete"]},
        ]
        out = run(hub, {
            "op": "device", "transport": transport, "connectionString": hub.device_connection_string(tag),
            "deviceId": tag, "serviceConnectionString": service_cs(hub), "connectionState": True,
            "telemetry": [sent], "c2d": c2d,
            "twin": {"reported": {"firmware": "1.2.3", "transport": transport}, "desired": {"interval": 17}},
            "method": {"name": "reboot", "payload": {"delay": 2}, "status": 201, "response": {"rebooted": tag}},
        })
        assert out.get("opened") and out.get("closed"), out
        no_client_errors(out)
        assert out["connectionState"] == "Connected", "the service sees the AMQP device connected"
        wait_state(hub, tag, "Disconnected")

        assert out["sent"] == [{"messageId": sent["messageId"], "result": "MessageEnqueued"}]
        (event,) = wait_events(hub, tag, 1)
        check_event(event, sent, tag, "sas")

        got = [(m["messageId"], m["body"], m["properties"], m["action"], m.get("error")) for m in out["c2d"]]
        assert got == [
            (c2d[0]["messageId"], "complete me", {"k": "1"}, "complete", None),
            (c2d[1]["messageId"], "reject me", {"k": "2"}, "reject", None),
            (c2d[2]["messageId"], "abandon me once", {"k": "3"}, "abandon", None),
            (c2d[2]["messageId"], "abandon me once", {"k": "3"}, "complete", None),
        ], "delivered in order, one at a time; the abandoned message came back once"
        records = feedback_records(hub, tag, {m["messageId"] for m in c2d})
        assert sorted((x["OriginalMessageId"], x["StatusCode"], x["Description"]) for x in records) == [
            (c2d[0]["messageId"], 0, "Success"),
            (c2d[1]["messageId"], 3, "Message rejected"),
            (c2d[2]["messageId"], 0, "Success"),
        ]
        assert device(hub, tag)["cloudToDeviceMessageCount"] == 0

        twin = out["twin"]
        assert isinstance(twin["initial"]["desired"]["$version"], int), twin
        assert isinstance(twin["initial"]["reported"]["$version"], int), twin
        assert twin["serviceReported"]["firmware"] == "1.2.3"
        assert twin["serviceReported"]["transport"] == transport
        reported = rest_twin(hub, tag)["properties"]["reported"]
        assert (reported["firmware"], reported["transport"]) == ("1.2.3", transport)
        assert twin["desiredPatch"]["interval"] == 17
        assert twin["desiredPatch"]["$version"] == rest_twin(hub, tag)["properties"]["desired"]["$version"]

        assert out["method"]["request"] == {"methodName": "reboot", "payload": {"delay": 2}}
        assert out["method"]["result"] == {"status": 201, "payload": {"rebooted": tag}}


def test_module_over_amqp(sdk_hub):
    hub = sdk_hub
    d, m = "amqp-edge", "amqp-mod"
    hub.create_device(d)
    hub.create_module(d, m)
    sent = telemetry(f"{d}-{m}")
    out = run(hub, {
        "op": "device", "transport": "Amqp", "module": True,
        "connectionString": hub.device_connection_string(d, m), "deviceId": d, "moduleId": m,
        "serviceConnectionString": service_cs(hub), "telemetry": [sent],
        "twin": {"reported": {"moduleVersion": "4.5"}, "desired": {"mode": "eco"}},
        "method": {"name": "flush", "payload": "now", "status": 200, "response": ["flushed", 3]},
    })
    assert out.get("opened") and out.get("closed"), out
    no_client_errors(out)
    assert out["sent"] == [{"messageId": sent["messageId"], "result": "MessageEnqueued"}]
    (event,) = wait_events(hub, d, 1)
    check_event(event, sent, d, "sas", module_id=m)

    twin = out["twin"]
    assert isinstance(twin["initial"]["desired"]["$version"], int), twin
    assert twin["serviceReported"]["moduleVersion"] == "4.5"
    assert rest_twin(hub, d, m)["properties"]["reported"]["moduleVersion"] == "4.5"
    assert "moduleVersion" not in rest_twin(hub, d)["properties"]["reported"], "the module's twin, not the device's"
    assert twin["desiredPatch"]["mode"] == "eco"
    assert out["method"]["request"] == {"methodName": "flush", "payload": "now"}
    assert out["method"]["result"] == {"status": 200, "payload": ["flushed", 3]}


def test_x509_self_signed_device_over_amqp(sdk_hub, tmp_path):
    hub = sdk_hub
    d = "amqp-x509"
    cert, key = self_signed(tmp_path, d)
    hub.create_device(d, authentication={"type": "selfSigned",
                                         "x509Thumbprint": {"primaryThumbprint": thumbprint(cert)}})
    sent = telemetry(d)
    out = run(hub, {
        "op": "device", "transport": "Amqp", "connectionString": f"HostName={host(hub)};DeviceId={d};x509=true",
        "x509": {"certFile": str(cert), "keyFile": str(key)}, "deviceId": d,
        "serviceConnectionString": service_cs(hub), "connectionState": True, "telemetry": [sent],
        "twin": {"reported": {"cert": "self-signed"}},
    })
    assert out.get("opened") and out.get("closed"), out
    no_client_errors(out)
    assert out["connectionState"] == "Connected"
    assert out["sent"] == [{"messageId": sent["messageId"], "result": "MessageEnqueued"}]
    (event,) = wait_events(hub, d, 1)
    check_event(event, sent, d, "x509Certificate")
    assert isinstance(out["twin"]["initial"]["desired"]["$version"], int), out["twin"]
    assert out["twin"]["serviceReported"]["cert"] == "self-signed"
    wait_state(hub, d, "Disconnected")


def test_wrong_and_expired_tokens_are_refused_while_a_good_device_is_served(sdk_hub):
    hub = sdk_hub
    for d in ("amqp-good", "amqp-victim", "amqp-other"):
        hub.create_device(d)
    h = host(hub)
    wrong_key = f"HostName={h};DeviceId=amqp-victim;SharedAccessKey={hub.device_key('amqp-other')}"
    expired = sas_token(f"{h}/devices/amqp-victim", hub.device_key("amqp-victim"), expiry=int(time.time()) - 600)
    out = run(hub, {
        "op": "refusals", "transport": "Amqp", "good": hub.device_connection_string("amqp-good"),
        "bad": [{"name": "another device's key", "connectionString": wrong_key},
                {"name": "expired token", "sharedAccessSignature": expired}],
    })
    for bad in out["bad"]:
        assert not bad["opened"], bad
        assert bad["error"]["name"] == "UnauthorizedError", bad
    assert out["goodSent"] == "MessageEnqueued" and out["goodClosed"]
    assert [base64.b64decode(e["body"]) for e in wait_events(hub, "amqp-good", 1)] == [b"still served"]
    assert hub.events_of("amqp-victim") == [] and hub.events_of("amqp-other") == []
    for d in ("amqp-victim", "amqp-other"):
        assert device(hub, d)["connectionState"] == "Disconnected", d


def test_event_hubs_sample_follows_the_redirect_and_reads_amqp_telemetry(sdk_hub):
    hub = sdk_hub
    d = "amqp-redirect"
    hub.create_device(d)
    sent = telemetry(d)
    out = run(hub, {
        "op": "redirect", "iothubConnectionString": hub.connection_string("service", with_port=False),
        "deviceConnectionString": hub.device_connection_string(d), "telemetry": sent,
    })
    assert out["sent"] == [{"messageId": sent["messageId"], "result": "MessageEnqueued"}]
    redirect = out["redirect"]
    assert redirect["condition"] == "amqp:link:redirect", redirect
    info = redirect["info"]
    assert info["hostname"] == host(hub) and info["port"] == 5671, info
    assert info["address"] == f"amqps://{host(hub)}:5671/{HUB_NAME}/$management", info
    assert out["eventHubsConnectionString"] == (
        f"Endpoint=sb://{host(hub)}/;EntityPath={HUB_NAME};SharedAccessKeyName=service;SharedAccessKey=<key>")
    event = out["event"]
    assert event["body"] == sent["body"] or event["body"] == json.loads(sent["body"]), event
    assert event["messageId"] == sent["messageId"] and event["correlationId"] == sent["correlationId"]
    assert event["contentType"] == "application/json"
    assert event["properties"] == sent["properties"]
    assert event["systemProperties"]["iothub-connection-device-id"] == d
