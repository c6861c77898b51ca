"""NATS JetStream and MQTT broker endpoints (issue 68, point 3; docs/routing.md, "Endpoints
outside the hub"): a custom endpoint with a `nats` or `mqtt` target has its routed events
published to a broker outside the hub, the device's id in the subject or topic.

Real brokers (brokerkit: the pinned nats-server with JetStream, Debian's Mosquitto, each with a
user and password), read by real clients (nats-py, paho-mqtt over MQTT 5); devices send with
the official Python SDK. Checked here:
- a JetStream stream stores each routed message in order, under `hub.{deviceId}.telemetry` with
  the device id kept one token, its properties as NATS headers; the configuration shows the
  target without its password;
- while the NATS server is down nothing is lost: the endpoint reads `unhealthy`, and once the
  server is back every message is stored, in order, once;
- an MQTT broker that refuses the endpoint's credentials gets nothing and the endpoint reads
  `unhealthy`; with the credentials put right every held message arrives, in order, with its
  content type and properties as MQTT 5 user properties;
- bad targets are refused 400 naming the field; a path naming another kind is 404;
- a target in the configuration file reads its password from a file.

Against a cluster (FERROHUB_TEST_CLUSTER=1) the same module runs on the SDKs' fixed ports behind
HAProxy: the writer publishes.
"""

import asyncio
import json
import os
import threading

import nats
import paho.mqtt.client as paho
import pytest
from azure.iot.device import IoTHubDeviceClient, Message

from brokerkit import Mosquitto, NatsServer
from deliverykit import device, drop_routing, health, metric, put_route, wait_for

CLUSTER = os.environ.get("FERROHUB_TEST_CLUSTER") == "1"


def put_endpoint(hub, name: str, body: dict) -> dict:
    r = hub.request("PUT", f"/routing/endpoints/{name}", hub.token(), json={"partitionCount": 2, **body})
    assert r.status_code == 201, r.text
    return r.json()


def send(client: IoTHubDeviceClient, kind: str, n: int, start: int = 0):
    for i in range(start, start + n):
        m = Message(json.dumps({"kind": kind, "n": i}))
        m.content_type, m.content_encoding = "application/json", "utf-8"
        m.custom_properties.update({"kind": kind, "unit": "°C"})
        client.send_message(m)


# -- NATS ------------------------------------------------------------------------------------

def nats_call(server: NatsServer, work):
    async def run():
        nc = await nats.connect(server.url, user=server.user, password=server.password,
                                connect_timeout=5, max_reconnect_attempts=0)
        try:
            return await work(nc.jetstream())
        finally:
            await nc.close()
    return asyncio.run(run())


def stream_messages(server: NatsServer, stream: str) -> list[dict]:
    async def read(js):
        info = await js.stream_info(stream)
        out = []
        if info.state.messages == 0:
            return out
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            m = await js.get_msg(stream, seq)
            out.append({"subject": m.subject, "headers": dict(m.headers or {}), "body": json.loads(m.data)})
        return out
    return nats_call(server, read)


def test_a_nats_stream_stores_each_routed_message_in_order_through_an_outage(sdk_hub, tmp_path):
    with NatsServer(tmp_path / "nats", user="hub", password="nats-pw") as server:
        nats_call(server, lambda js: js.add_stream(name="FERRO", subjects=["hub.>"]))
        answer = put_endpoint(sdk_hub, "nats-out", {"nats": {
            "url": server.url, "subject": "hub.{deviceId}.telemetry", "username": "hub",
            "password": "nats-pw", "timeoutSeconds": 2}})
        assert answer["nats"]["subject"] == "hub.{deviceId}.telemetry" and "password" not in answer["nats"]
        put_route(sdk_hub, "to-nats", "kind = 'nats'", ["nats-out", "events"])
        client = device(sdk_hub, "br.nats-1")
        try:
            send(client, "nats", 5)
            stored = wait_for(lambda: stream_messages(server, "FERRO"), lambda m: len(m) >= 5)
            assert [m["body"]["n"] for m in stored] == [0, 1, 2, 3, 4]
            for m in stored:
                # The device id's '.' would split the subject: it is escaped into one token.
                assert m["subject"] == "hub.br%2Enats-1.telemetry"
                h = m["headers"]
                assert h["iothub-connection-device-id"] == "br.nats-1"
                assert h["x-property-kind"] == "nats" and h["x-property-unit"] == "%C2%B0C"
                assert h["Content-Type"] == "application/json"
                assert h["x-ferrohub-endpoint"] == "nats-out"
            shown = [e for e in sdk_hub.request("GET", "/routing", sdk_hub.token()).json()["endpoints"]
                     if e["name"] == "nats-out"][0]
            assert shown["nats"]["username"] == "hub" and "password" not in shown["nats"]
            assert wait_for(lambda: health(sdk_hub)["nats-out"]["healthStatus"], lambda s: s == "healthy")

            # The server goes away: the device's sends are unaffected, the endpoint holds them.
            server.stop()
            send(client, "nats", 5, start=5)
            wait_for(lambda: health(sdk_hub)["nats-out"]["healthStatus"], lambda s: s == "unhealthy")
            server.start()
            stored = wait_for(lambda: stream_messages(server, "FERRO"), lambda m: len(m) >= 10, timeout=90)
            # Once each (the publish carries Nats-Msg-Id, so a repeat inside the stream's
            # duplicate window is not stored again), in the order sent.
            assert [m["body"]["n"] for m in stored] == list(range(10))
            wait_for(lambda: health(sdk_hub)["nats-out"]["healthStatus"], lambda s: s in ("healthy", "degraded"))
            if not CLUSTER:  # the writer counts; HAProxy's metrics port reaches any node
                assert metric(sdk_hub, "ferrohub_route_matched_total", route="to-nats") >= 10
                assert metric(sdk_hub, "ferrohub_endpoint_deliveries_total",
                              endpoint="nats-out", outcome="delivered") >= 10
                assert metric(sdk_hub, "ferrohub_endpoint_deliveries_total",
                              endpoint="nats-out", outcome="failed_attempts") >= 1
        finally:
            client.shutdown()
            drop_routing(sdk_hub, ["to-nats"], ["nats-out"])


# -- MQTT ------------------------------------------------------------------------------------

class Subscriber:
    """A paho MQTT 5 client subscribed to `topic` with QoS 1, recording what arrives."""

    def __init__(self, port: int, user: str, password: str, topic: str):
        self.got: list[dict] = []
        self.lock = threading.Lock()
        subscribed = threading.Event()
        self.client = paho.Client(client_id="routing-test-subscriber", protocol=paho.MQTTv5)
        self.client.username_pw_set(user, password)

        def on_connect(client, _userdata, _flags, _rc, _props=None):
            client.subscribe(topic, qos=1)

        def on_message(_client, _userdata, msg):
            props = msg.properties
            with self.lock:
                self.got.append({"topic": msg.topic, "body": json.loads(msg.payload),
                                 "user": dict(getattr(props, "UserProperty", None) or []),
                                 "content_type": getattr(props, "ContentType", None)})

        self.client.on_connect = on_connect
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.on_message = on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert subscribed.wait(10), "the subscriber did not get its SUBACK"

    def received(self) -> list[dict]:
        with self.lock:
            return list(self.got)

    def close(self):
        self.client.loop_stop()
        self.client.disconnect()


def firsts(got: list[dict]) -> list[int]:
    """The numbers received, each at its first arrival: at least once allows a repeat (a
    PUBACK later than the timeout makes the hub publish again), order is of first arrivals."""
    out = []
    for m in got:
        if m["body"]["n"] not in out:
            out.append(m["body"]["n"])
    return out


def test_an_mqtt_broker_gets_the_held_messages_once_the_credentials_are_right(sdk_hub, tmp_path):
    with Mosquitto(tmp_path / "mosq", user="hub", password="mqtt-pw") as broker:
        subscriber = Subscriber(broker.port, "hub", "mqtt-pw", "hub/+/telemetry")
        target = {"url": f"mqtt://127.0.0.1:{broker.port}", "topic": "hub/{deviceId}/telemetry",
                  "username": "hub", "password": "wrong", "timeoutSeconds": 2}
        put_endpoint(sdk_hub, "mqtt-out", {"mqtt": target})
        put_route(sdk_hub, "to-mqtt", "kind = 'mqtt'", ["mqtt-out"])
        client = device(sdk_hub, "br-mqtt-1")
        try:
            send(client, "mqtt", 4)
            refused = wait_for(lambda: health(sdk_hub)["mqtt-out"], lambda h: h["healthStatus"] == "unhealthy")
            assert refused["lastKnownError"], refused
            assert subscriber.received() == []
            # Put right through the target's own path: the held messages go out, in order.
            r = sdk_hub.request("PUT", "/routing/endpoints/mqtt-out/mqtt", sdk_hub.token(),
                                json={**target, "password": "mqtt-pw"})
            assert r.status_code == 200, r.text
            assert r.json()["mqtt"]["topic"] == "hub/{deviceId}/telemetry" and "password" not in r.json()["mqtt"]
            got = wait_for(subscriber.received, lambda g: len(firsts(g)) >= 4, timeout=60)
            assert firsts(got) == [0, 1, 2, 3]
            for m in got:
                assert m["topic"] == "hub/br-mqtt-1/telemetry"
                assert m["content_type"] == "application/json"
                assert m["user"]["iothub-connection-device-id"] == "br-mqtt-1"
                assert m["user"]["x-property-kind"] == "mqtt"
            send(client, "mqtt", 2, start=4)
            got = wait_for(subscriber.received, lambda g: len(firsts(g)) >= 6)
            assert firsts(got) == list(range(6))
            assert wait_for(lambda: health(sdk_hub)["mqtt-out"]["healthStatus"], lambda s: s in ("healthy", "degraded"))
        finally:
            client.shutdown()
            subscriber.close()
            drop_routing(sdk_hub, ["to-mqtt"], ["mqtt-out"])


# -- Refusals --------------------------------------------------------------------------------

@pytest.mark.parametrize("body, field", [
    ({"nats": {"url": "nats://127.0.0.1:4222", "subject": "hub.telemetry"}}, "nats.subject"),
    ({"nats": {"url": "nats://127.0.0.1:4222"}}, "nats.subject"),
    ({"nats": {"url": "nats://127.0.0.1:4222", "subject": "hub.*.{deviceId}"}}, "nats.subject"),
    ({"nats": {"url": "http://127.0.0.1:4222", "subject": "hub.{deviceId}"}}, "nats.url"),
    ({"nats": {"url": "nats://u:p@127.0.0.1:4222", "subject": "hub.{deviceId}"}}, "nats.url"),
    ({"nats": {"url": "nats://127.0.0.1:4222", "subject": "$JS.API.STREAM.DELETE.{deviceId}"}}, "nats.subject"),
    ({"mqtt": {"url": "mqtt://127.0.0.1:99999", "topic": "hub/{deviceId}"}}, "mqtt.url"),
    ({"mqtt": {"url": "mqtt://127.0.0.1", "topic": "hub/{deviceId}", "caCertificate": "x"}}, "mqtt.caCertificate"),
    ({"mqtt": {"url": "mqtt://127.0.0.1:1883", "topic": "hub/#/{deviceId}"}}, "mqtt.topic"),
    ({"mqtt": {"url": "https://127.0.0.1", "topic": "hub/{deviceId}"}}, "mqtt.url"),
    ({"mqtt": {"url": "mqtts://127.0.0.1", "topic": "hub/{deviceId}", "caCertificate": "nope"}},
     "mqtt.caCertificate"),
    ({"mqtt": {"url": "mqtt://127.0.0.1", "topic": "hub/{deviceId}", "timeoutSeconds": 0}},
     "mqtt.timeoutSeconds"),
    ({"mqtt": {"url": "mqtt://b", "topic": "t/{deviceId}"}, "nats": {"url": "nats://b", "subject": "{deviceId}"}},
     "one target"),
])
def test_bad_broker_targets_are_refused_with_the_field_named(sdk_hub, body, field):
    r = sdk_hub.request("PUT", "/routing/endpoints/bad-broker", sdk_hub.token(), json={"partitionCount": 1, **body})
    assert r.status_code == 400, r.text
    assert field in r.text, r.text
    names = [e["name"] for e in sdk_hub.request("GET", "/routing", sdk_hub.token()).json()["endpoints"]]
    assert "bad-broker" not in names


def test_a_target_is_removed_only_through_its_own_kind(sdk_hub):
    put_endpoint(sdk_hub, "kinds", {"nats": {"url": "nats://127.0.0.1:1", "subject": "k.{deviceId}"}})
    try:
        assert sdk_hub.request("DELETE", "/routing/endpoints/kinds/mqtt", sdk_hub.token()).status_code == 404
        assert sdk_hub.request("PUT", "/routing/endpoints/kinds/kafka", sdk_hub.token(),
                               json={"url": "x"}).status_code == 404
        assert sdk_hub.request("DELETE", "/routing/endpoints/kinds/nats", sdk_hub.token()).status_code == 204
        shown = [e for e in sdk_hub.request("GET", "/routing", sdk_hub.token()).json()["endpoints"]
                 if e["name"] == "kinds"][0]
        assert "nats" not in shown and shown["partitionCount"] == 2
    finally:
        drop_routing(sdk_hub, [], ["kinds"])


@pytest.mark.skipif(CLUSTER, reason="a hub of its own, started with a configuration file")
def test_an_mqtt_target_from_the_configuration_file_reads_its_password_from_a_file(tmp_path):
    from hubkit import Hub
    from routingkit import send_http

    with Mosquitto(tmp_path / "mosq", user="filed", password="filed-pw") as broker:
        subscriber = Subscriber(broker.port, "filed", "filed-pw", "filed/#")
        (tmp_path / "mqtt.password").write_text("filed-pw\n")
        config = tmp_path / "hub.toml"
        config.write_text(f"""
[[routing.endpoints]]
name = "filed-mqtt"
partitions = 1
[routing.endpoints.mqtt]
url = "mqtt://127.0.0.1:{broker.port}"
topic = "filed/{{deviceId}}"
username = "filed"
password_file = "{tmp_path / 'mqtt.password'}"
timeout = "3s"

[[routing.routes]]
name = "to-filed-mqtt"
source = "DeviceMessages"
condition = "true"
endpoints = ["filed-mqtt"]
""")
        hub = Hub(tmp_path / "hub").start(["--config", str(config)])
        try:
            hub.create_device("filed-1")
            send_http(hub, "filed-1", b'{"kind": "filed", "n": 0}')
            got = wait_for(subscriber.received, lambda g: len(g) >= 1)
            assert got[0]["topic"] == "filed/filed-1" and got[0]["body"] == {"kind": "filed", "n": 0}
            shown = [e for e in hub.request("GET", "/routing", hub.token()).json()["endpoints"]
                     if e["name"] == "filed-mqtt"][0]["mqtt"]
            assert shown["username"] == "filed" and "password" not in shown and shown["timeoutSeconds"] == 3
        finally:
            hub.stop()
            subscriber.close()
