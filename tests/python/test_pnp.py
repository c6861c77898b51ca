"""PNP-1..PNP-5, IoT Plug and Play through the official SDKs (fixed ports: one `sdk_hub`):

- The Python device SDK (`product_info="dtmi:...;N"`) and the Node device SDK (`modelId`)
  connect as Plug and Play devices: `modelId` shows on the twin, the identity and in a query;
  a later connection with another model id replaces it, one without leaves it; a malformed DTMI
  refuses the CONNECT and stores nothing.
- `azure-iot-hub`'s and `azure-iothub`'s `DigitalTwinClient` read the digital twin, patch it
  (the device receives the desired patch), and invoke root and component commands the device
  answers.
- Telemetry of a Plug and Play device carries `dt-dataschema` and, for a component,
  `dt-subject`, to Event Hubs readers and to routing conditions.
- A `DigitalTwinChangeEvents` route delivers JSON Patch events to an `azure-eventhub` consumer;
  a device without a model id produces none.
- Bad input to each digital twin endpoint gets IoT Hub's status and error body and leaves the
  twin as it was.
"""

import json
import os
import re
import subprocess
import threading
import time
import urllib.parse

import pytest
from azure.iot.device import IoTHubDeviceClient, Message, MethodResponse
from azure.iot.hub import DigitalTwinClient, IoTHubRegistryManager

import ehkit
from ehkit import device_of, prop
from hubkit import REPO
from mqttquic import QuicMqtt
from routingkit import HUB_NAME, put_endpoint, put_route
from test_node_event_hubs import node_env

MODEL = "dtmi:com:example:TemperatureController;1"
OTHER_MODEL = "dtmi:com:example:Thermostat;2"
ISO7 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{7}Z$")
PNP_JS = str(REPO / "tests" / "node" / "pnp.js")


def device(hub, device_id, model=None, **kw):
    extra = {"product_info": model} if model else {}
    return IoTHubDeviceClient.create_from_connection_string(
        hub.device_connection_string(device_id), server_verification_cert=open(hub.ca).read(),
        connection_retry=False, **extra, **kw)


@pytest.fixture
def service(sdk_hub, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", sdk_hub.ca)
    cs = sdk_hub.connection_string("iothubowner", with_port=False)
    registry = IoTHubRegistryManager.from_connection_string(cs)
    twins = DigitalTwinClient.from_connection_string(cs)
    for client in (registry, twins):
        client.protocol.config.connection.verify = sdk_hub.ca
    return registry, twins


def twin(hub, device_id):
    r = hub.request("GET", f"/twins/{urllib.parse.quote(device_id, safe='')}", hub.token())
    assert r.status_code == 200, r.text
    return r.json()


def query(hub, text):
    r = hub.request("POST", "/devices/query", hub.token(), json={"query": text})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_model_id_is_stored_shown_and_queried(sdk_hub):
    hub = sdk_hub
    hub.create_device("pnp-model")
    hub.create_device("pnp-plain")
    c = device(hub, "pnp-model", MODEL)
    c.connect()
    c.shutdown()
    plain = device(hub, "pnp-plain")
    plain.connect()
    plain.shutdown()
    assert twin(hub, "pnp-model")["modelId"] == MODEL
    assert twin(hub, "pnp-plain")["modelId"] == ""
    assert hub.request("GET", "/devices/pnp-model", hub.token()).json()["modelId"] == MODEL
    rows = query(hub, f"SELECT deviceId, modelId FROM devices WHERE modelId = '{MODEL}'")
    assert rows == [{"deviceId": "pnp-model", "modelId": MODEL}]

    # A connection without a model id leaves it; one with another replaces it.
    c = device(hub, "pnp-model")
    c.connect()
    c.shutdown()
    assert twin(hub, "pnp-model")["modelId"] == MODEL
    c = device(hub, "pnp-model", OTHER_MODEL)
    c.connect()
    c.shutdown()
    assert twin(hub, "pnp-model")["modelId"] == OTHER_MODEL
    assert query(hub, f"SELECT deviceId FROM devices WHERE modelId = '{MODEL}'") == []

    # A malformed DTMI refuses the CONNECT and stores nothing.
    etag = twin(hub, "pnp-model")["etag"]
    for bad in ["dtmi:com:example:NoVersion", "dtmi:com:1bad:T;1", "dtmi:com:example:T;0"]:
        c = device(hub, "pnp-model", bad)
        with pytest.raises(Exception):
            c.connect()
        c.shutdown()
        t = twin(hub, "pnp-model")
        assert (t["modelId"], t["etag"]) == (OTHER_MODEL, etag), bad
    assert "is not a DTMI" in hub.stderr_path.read_text()


@pytest.mark.skipif(os.environ.get("FERROHUB_TEST_CLUSTER") == "1",
                    reason="MQTT over QUIC (UDP) is not behind the cluster's TCP balancer")
def test_the_model_id_over_websocket_and_quic(sdk_hub):
    hub = sdk_hub
    hub.create_device("pnp-ws")
    hub.create_device("pnp-quic")
    c = device(hub, "pnp-ws", MODEL, websockets=True)
    c.connect()
    c.shutdown()
    assert twin(hub, "pnp-ws")["modelId"] == MODEL

    def quic_connect(model):
        q = QuicMqtt(hub.quic_port, hub.ca)
        try:
            username = f"localhost/pnp-quic/?api-version=2020-09-30&model-id={urllib.parse.quote(model, safe='')}"
            return q.connect("pnp-quic", username=username, password=hub.device_token("pnp-quic"))[1]
        finally:
            q.close()

    assert quic_connect(OTHER_MODEL) == 0
    assert twin(hub, "pnp-quic")["modelId"] == OTHER_MODEL
    assert quic_connect("dtmi:not a model;1") == 4, "a malformed DTMI is CONNACK 4"
    assert twin(hub, "pnp-quic")["modelId"] == OTHER_MODEL


class Thermostat:
    """A Plug and Play device on the Python SDK: root command `reboot`, component
    `thermostat1` with a command and a writable property it acknowledges."""

    def __init__(self, hub, device_id):
        self.client = device(hub, device_id, MODEL)
        self.patches = []
        self.cond = threading.Condition()

        def on_method(request):
            if request.name == "reboot":
                answer = (200, {"rebooted": True, "delay": request.payload["delay"]})
            elif request.name == "thermostat1*getMaxMinReport":
                answer = (201, {"maxTemp": 30.5, "since": request.payload})
            else:
                answer = (404, {"unknown": request.name})
            self.client.send_method_response(MethodResponse.create_from_method_request(request, *answer))

        def on_patch(patch):
            with self.cond:
                self.patches.append(patch)
                self.cond.notify_all()

        self.client.connect()
        self.client.on_method_request_received = on_method
        self.client.on_twin_desired_properties_patch_received = on_patch

    def wait_patch(self, timeout=15):
        with self.cond:
            assert self.cond.wait_for(lambda: self.patches, timeout), "no desired patch arrived"
            return self.patches.pop(0)


def test_digital_twin_client_reads_patches_and_commands(sdk_hub, service):
    hub, (_, twins) = sdk_hub, service
    hub.create_device("pnp-py")
    dev = Thermostat(hub, "pnp-py")
    try:
        dev.client.patch_twin_reported_properties(
            {"serialNumber": "py-1", "thermostat1": {"__t": "c", "maxTempSinceLastReboot": 25.3}})
        dt = twins.get_digital_twin("pnp-py")
        assert dt["$dtId"] == "pnp-py"
        assert dt["$metadata"]["$model"] == MODEL
        assert dt["serialNumber"] == "py-1"
        assert ISO7.match(dt["$metadata"]["serialNumber"]["lastUpdateTime"])
        assert dt["thermostat1"]["maxTempSinceLastReboot"] == 25.3
        assert ISO7.match(dt["thermostat1"]["$metadata"]["maxTempSinceLastReboot"]["lastUpdateTime"])
        assert "__t" not in dt["thermostat1"]

        assert twins.update_digital_twin(
            "pnp-py", [{"op": "add", "path": "/thermostat1/targetTemperature", "value": 21.8}]) is None
        patch = dev.wait_patch()
        assert patch["thermostat1"] == {"__t": "c", "targetTemperature": 21.8}
        version = patch["$version"]
        dev.client.patch_twin_reported_properties({"thermostat1": {"__t": "c", "targetTemperature": {
            "value": 21.8, "ac": 200, "av": version, "ad": "Successfully executed patch"}}})
        meta = twins.get_digital_twin("pnp-py")["thermostat1"]["$metadata"]["targetTemperature"]
        assert {k: v for k, v in meta.items() if k != "lastUpdateTime"} == {
            "desiredValue": 21.8, "desiredVersion": version, "ackVersion": version, "ackCode": 200,
            "ackDescription": "Successfully executed patch"}
        assert twins.get_digital_twin("pnp-py")["thermostat1"]["targetTemperature"] == 21.8

        # A root property, and a whole component with the etag just read (If-Match).
        etag = hub.request("GET", "/digitaltwins/pnp-py", hub.token()).headers["ETag"]
        twins.update_digital_twin("pnp-py", [
            {"op": "add", "path": "/fanSpeed", "value": 2},
            {"op": "replace", "path": "/thermostat1", "value": {"mode": "eco", "$metadata": {}}},
        ], etag=etag)
        patch = dev.wait_patch()
        assert patch["fanSpeed"] == 2
        assert patch["thermostat1"] == {"__t": "c", "mode": "eco", "targetTemperature": None}

        assert twins.invoke_command("pnp-py", "reboot", {"delay": 1}, 5, 10) == {"rebooted": True, "delay": 1}
        assert twins.invoke_component_command("pnp-py", "thermostat1", "getMaxMinReport", "2026-01-01", None, 10) \
            == {"maxTemp": 30.5, "since": "2026-01-01"}
        # The device's status reaches the caller in a header (the Python SDK returns the body).
        r = hub.request("POST", "/digitaltwins/pnp-py/components/thermostat1/commands/getMaxMinReport",
                        hub.token(), json="x")
        assert r.status_code == 200 and r.json() == {"maxTemp": 30.5, "since": "x"}
        assert r.headers["x-ms-command-statuscode"] == "201" and r.headers["x-ms-request-id"]
    finally:
        dev.client.shutdown()


def test_node_device_and_digital_twin_client(sdk_hub):
    hub = sdk_hub
    hub.create_device("pnp-node")
    config = {"deviceConnectionString": hub.device_connection_string("pnp-node"),
              "serviceConnectionString": hub.connection_string("iothubowner", with_port=False),
              "deviceId": "pnp-node", "modelId": MODEL, "timeoutMs": 60000}
    done = subprocess.run(["node", PNP_JS], input=json.dumps(config), capture_output=True, text=True,
                          timeout=120, env=node_env(hub))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    dt = out["digitalTwin"]
    assert dt["$dtId"] == "pnp-node" and dt["$metadata"]["$model"] == MODEL
    assert dt["serialNumber"] == "node-1" and dt["thermostat1"]["maxTemp"] == 25
    assert out["etag"], "the digital twin's ETag, sent back as If-Match by updateDigitalTwin"
    assert out["desired"]["thermostat1"] == {"__t": "c", "targetTemperature": 23.5}
    assert out["root"]["status"] == 200 and out["root"]["body"] == {"rebooted": True, "delay": 3}
    assert out["root"]["requestId"]
    assert out["component"]["status"] == 201
    assert out["component"]["body"] == {"maxTemp": 30.5, "since": "2026-11-27T00:00:00Z"}
    assert twin(hub, "pnp-node")["modelId"] == MODEL


def error_of(r):
    body = r.json()
    return body.get("errorCode"), body.get("Message", "")


def test_bad_digital_twin_requests_change_nothing(sdk_hub):
    hub = sdk_hub
    hub.create_device("pnp-bad")
    token = hub.token()
    r = hub.request("PATCH", "/digitaltwins/pnp-bad", token, json=[{"op": "add", "path": "/c1", "value": {"x": 1, "$metadata": {}}}])
    assert r.status_code == 202, r.text
    before = twin(hub, "pnp-bad")

    bad_patches = [
        ({"op": "add", "path": "/a", "value": 1}, 400),
        ([], 400),
        ([{"op": "move", "from": "/a", "path": "/b"}], 400),
        ([{"op": "add", "path": "/$metadata/a", "value": 1}], 400),
        ([{"op": "add", "path": "/$dtId", "value": "x"}], 400),
        ([{"op": "add", "path": "no-slash", "value": 1}], 400),
        ([{"op": "add", "path": "/a"}], 400),
        ([{"op": "add", "path": "/c1", "value": 5}], 400),
        # A path a million characters deep is refused before anything is built from it.
        ([{"op": "add", "path": "/a" * 500_000, "value": 1}], 400),
        ([{"op": "add", "path": f"/p{i}", "value": i} for i in range(1001)], 400),
    ]
    for patch, status in bad_patches:
        r = hub.request("PATCH", "/digitaltwins/pnp-bad", token, json=patch)
        assert r.status_code == status, (patch, r.status_code, r.text)
        assert error_of(r)[0] == 400004 and "ArgumentInvalid" in error_of(r)[1], r.text
    r = hub.request("PATCH", "/digitaltwins/pnp-bad", token, data="[{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and error_of(r)[0] == 400006, r.text
    r = hub.request("PATCH", "/digitaltwins/pnp-bad", token, headers={"If-Match": '"not-the-etag"'},
                    json=[{"op": "add", "path": "/a", "value": 1}])
    assert r.status_code == 412 and error_of(r)[0] == 412001, r.text
    assert twin(hub, "pnp-bad") == before, "no bad request changed the twin"

    for method, path, body in [("GET", "/digitaltwins/nobody", None),
                               ("PATCH", "/digitaltwins/nobody", [{"op": "add", "path": "/a", "value": 1}]),
                               ("POST", "/digitaltwins/nobody/commands/reboot", {})]:
        r = hub.request(method, path, token, json=body)
        assert r.status_code == 404 and error_of(r)[0] == 404001, (path, r.text)

    # Commands: an offline device, timeouts that are not numbers or out of range.
    r = hub.request("POST", "/digitaltwins/pnp-bad/commands/reboot?connectTimeoutInSeconds=0", token, json={})
    assert r.status_code == 404 and r.json()["errorCode"] == 404103, r.text
    for query in ["responseTimeoutInSeconds=abc", "responseTimeoutInSeconds=1", "connectTimeoutInSeconds=-1"]:
        r = hub.request("POST", f"/digitaltwins/pnp-bad/components/c1/commands/x?{query}", token, json={})
        assert r.status_code == 400 and error_of(r)[0] == 400004, (query, r.text)
    r = hub.request("POST", "/digitaltwins/pnp-bad/commands/reboot", token, data="{bad", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and error_of(r)[0] == 400006, r.text

    # Permissions: reading needs RegistryRead or ServiceConnect; writing and commands ServiceConnect.
    assert hub.request("GET", "/digitaltwins/pnp-bad", hub.token("registryRead")).status_code == 200
    r = hub.request("PATCH", "/digitaltwins/pnp-bad", hub.token("registryRead"), json=[{"op": "add", "path": "/a", "value": 1}])
    assert r.status_code == 401, r.text
    r = hub.request("POST", "/digitaltwins/pnp-bad/commands/x", hub.token("registryRead"), json={})
    assert r.status_code == 401, r.text
    r = hub.request("GET", "/digitaltwins/pnp-bad", hub.device_token("pnp-bad"))
    assert r.status_code == 401, r.text
    assert twin(hub, "pnp-bad") == before


def custom_consumer_events(hub, endpoint, n, timeout=30):
    cs = ehkit.event_hubs_connection_string(hub).replace(f"EntityPath={HUB_NAME}", f"EntityPath={endpoint}")
    collector = ehkit.Collector()
    client = ehkit.consumer(hub, connection_string=cs)
    thread = ehkit.receive_in_background(client, collector, starting_position="-1")
    try:
        assert collector.wait_for(lambda c: len(c.events) >= n, timeout), (len(collector.events), collector.errors)
        assert collector.wait_for(lambda c: c.idle_partitions >= {"0"}, timeout)
    finally:
        client.close()
        thread.join(10)
    return [e for _, e in collector.events]


def test_telemetry_and_digital_twin_change_events(sdk_hub, service):
    hub, (_, twins) = sdk_hub, service
    put_endpoint(hub, "dt-changes", 1)
    put_endpoint(hub, "dt-components", 1)
    put_route(hub, "dt", "DigitalTwinChangeEvents", "true", ["dt-changes"])
    put_route(hub, "components", "DeviceMessages", "$dt-subject = 'thermostat1'", ["dt-components"])
    put_route(hub, "all", "DeviceMessages", "true", ["events"])
    hub.create_device("pnp-events")
    hub.create_device("pnp-events-plain")

    c = device(hub, "pnp-events", MODEL)
    c.connect()
    try:
        root = Message(json.dumps({"workingSet": 100}), content_type="application/json", content_encoding="utf-8")
        root.message_id = "root"
        c.send_message(root)
        comp = Message(json.dumps({"temperature": 21.5}), content_type="application/json", content_encoding="utf-8")
        comp.message_id = "comp"
        comp.custom_properties["$.sub"] = "thermostat1"
        c.send_message(comp)
        c.patch_twin_reported_properties({"serialNumber": "ev-1"})
        c.patch_twin_reported_properties({"serialNumber": "ev-2", "thermostat1": {"__t": "c", "maxTemp": 20}})
        twins.update_digital_twin("pnp-events", [{"op": "add", "path": "/thermostat1/targetTemperature", "value": 19}])
    finally:
        c.shutdown()
    plain = device(hub, "pnp-events-plain")
    plain.connect()
    plain.patch_twin_reported_properties({"serialNumber": "plain"})
    plain.send_message(Message("plain"))
    plain.shutdown()

    got = ehkit.read(hub, 3, starting_position="-1")
    telemetry = {e.message_id: e for _, e in got.events if device_of(e) == "pnp-events"}
    assert telemetry["root"].system_properties[b"dt-dataschema"] == MODEL.encode()
    assert b"dt-subject" not in telemetry["root"].system_properties
    assert telemetry["comp"].system_properties[b"dt-dataschema"] == MODEL.encode()
    assert telemetry["comp"].system_properties[b"dt-subject"] == b"thermostat1"
    assert not any(b"dt-dataschema" in e.system_properties for _, e in got.events if device_of(e) == "pnp-events-plain")
    routed = custom_consumer_events(hub, "dt-components", 1)
    assert [e.message_id for e in routed] == ["comp"], "the routing condition reads $dt-subject"

    events = custom_consumer_events(hub, "dt-changes", 3)
    assert {device_of(e) for e in events} == {"pnp-events"}, "a device without a model id emits none"
    assert len(events) == 3
    for e in events:
        assert e.system_properties[b"iothub-message-source"] == b"digitalTwinChangeEvents"
        assert e.system_properties[b"content-type"] == b"application/json-patch+json"
        assert e.system_properties[b"content-encoding"] == b"utf-8"
        assert e.system_properties[b"user-id"] == HUB_NAME.encode()
        assert prop(e, "hubName") == HUB_NAME and prop(e, "deviceId") == "pnp-events"
        assert prop(e, "iothub-message-schema") == "digitalTwinChangeNotification"
        assert prop(e, "opType") == "updateTwin"
        assert prop(e, "dt-dataschema") == MODEL
        assert ISO7.match(prop(e, "operationTimestamp"))
    first, second, third = [json.loads(e.body_as_str()) for e in events]
    assert {"op": "add", "path": "/serialNumber", "value": "ev-1"} in first
    added_meta = next(op for op in first if op["path"] == "/$metadata/serialNumber")
    assert added_meta["op"] == "add" and ISO7.match(added_meta["value"]["lastUpdateTime"])
    assert {"op": "replace", "path": "/serialNumber", "value": "ev-2"} in second
    component = next(op for op in second if op["path"] == "/thermostat1")
    assert component["op"] == "add" and component["value"]["maxTemp"] == 20
    assert component["value"]["$metadata"]["maxTemp"]["lastUpdateTime"]
    desired = next(op for op in third if op["path"] == "/thermostat1/$metadata/targetTemperature")
    assert desired["value"]["desiredValue"] == 19 and desired["value"]["desiredVersion"] >= 2
