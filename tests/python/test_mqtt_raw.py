"""MQT-2..MQT-8, MQT-13, SEC-4, SEC-6 with a raw MQTT client: exact packets, exact answers."""

import base64
import json
import time

import pytest

from hubkit import sas_token
from mqttraw import Closed, RawMqtt, connect_device


@pytest.fixture
def dev(hub):
    hub.create_device("dev1")
    return "dev1"


def refused(hub, client_id, username, password):
    c = RawMqtt(hub.mqtt_port, hub.ca)
    try:
        _, rc = c.connect(client_id, username, password)
        return rc, c.wait_closed(5)
    finally:
        c.close()


def test_bad_credentials_are_refused(hub, dev):
    user = "localhost/dev1/?api-version=2021-04-12"
    good = hub.device_token("dev1")
    other_key = sas_token("localhost/devices/dev1", base64.b64encode(b"k" * 32).decode())
    assert refused(hub, "dev1", user, other_key) == (5, True)
    assert refused(hub, "dev1", user, hub.device_token("dev1", expiry=int(time.time()) - 10)) == (5, True)
    assert refused(hub, "dev1", "localhost/dev2/?api-version=2021-04-12", good) == (4, True)
    assert refused(hub, "dev1", "otherhub/dev1/?api-version=2021-04-12", good) == (4, True)
    assert refused(hub, "dev2", user, good) == (4, True)
    assert refused(hub, "dev1", None, good)[0] == 4
    assert refused(hub, "ghost", "localhost/ghost/?api-version=2021-04-12", good) == (5, True)
    # A token for another device, valid in itself, does not open this one.
    hub.create_device("dev2")
    assert refused(hub, "dev1", user, hub.device_token("dev2")) == (5, True)
    # The good token works, and a hub policy with DeviceConnect scoped to the device works too.
    assert refused(hub, "dev1", user, good)[0] == 0
    policy = sas_token("localhost/devices/dev1", hub.policy_key("device"), policy="device")
    assert refused(hub, "dev1", user, policy)[0] == 0
    not_device_connect = sas_token("localhost/devices/dev1", hub.policy_key("registryReadWrite"), policy="registryReadWrite")
    assert refused(hub, "dev1", user, not_device_connect) == (5, True)


def test_wrong_protocol_level(hub, dev):
    c = RawMqtt(hub.mqtt_port, hub.ca)
    _, rc = c.connect("dev1", "localhost/dev1/?api-version=2021-04-12", hub.device_token("dev1"), level=3)
    assert rc == 1
    c.close()


def test_qos2_publish_closes(hub, dev):
    c = connect_device(hub, "dev1")
    c.publish("devices/dev1/messages/events/", b"x", qos=2, pkid=5)
    assert c.wait_closed(5)
    assert hub.events_of("dev1") == []


def test_subscribe_qos2_is_granted_qos1_and_unknown_filters_get_0x80(hub, dev):
    c = connect_device(hub, "dev1")
    codes = c.subscribe([("devices/dev1/messages/devicebound/#", 2), ("$iothub/twin/res/#", 0),
                         ("some/random/topic", 1), ("devices/dev2/messages/devicebound/#", 1), ("#", 1)])
    assert codes == [1, 0, 0x80, 0x80, 0x80]
    c.ping()
    c.close()


def test_publishing_to_another_devices_topic_closes(hub, dev):
    hub.create_device("dev2")
    c = connect_device(hub, "dev1")
    c.publish("devices/dev2/messages/events/", b"spoof", qos=1, pkid=1)
    assert c.wait_closed(5)
    assert hub.events_of("dev2") == [] and hub.events_of("dev1") == []


def test_unknown_publish_topic_closes(hub, dev):
    c = connect_device(hub, "dev1")
    c.publish("not/an/iothub/topic", b"x", qos=1, pkid=1)
    assert c.wait_closed(5)


def test_second_connection_closes_the_first(hub, dev):
    first = connect_device(hub, "dev1")
    second = connect_device(hub, "dev1")
    assert first.wait_closed(5)
    second.ping()
    second.publish("devices/dev1/messages/events/", b"still here", qos=1, pkid=9)
    assert second.expect_puback(9)


def test_retain_becomes_a_property(hub, dev):
    c = connect_device(hub, "dev1")
    c.publish("devices/dev1/messages/events/k=v", b"retained", qos=1, pkid=3, retain=True)
    assert c.expect_puback(3)
    c.close()
    (event,) = hub.events_of("dev1")
    assert event["properties"] == {"k": "v", "x-opt-retain": "true", "mqtt-retain": "true"}


def test_will_on_abrupt_close_not_after_disconnect(hub, dev):
    will = ("devices/dev1/messages/events/reason=gone", b"last words", 1, False)
    c = connect_device(hub, "dev1", will=will)
    c.close()  # no DISCONNECT
    deadline = time.time() + 10
    while not hub.events_of("dev1") and time.time() < deadline:
        time.sleep(0.1)
    (event,) = hub.events_of("dev1")
    assert base64.b64decode(event["body"]) == b"last words"
    assert event["properties"] == {"reason": "gone", "iothub-MessageType": "Will"}
    d = connect_device(hub, "dev1", will=will)
    d.disconnect()
    time.sleep(1)
    assert len(hub.events_of("dev1")) == 1


def test_disabling_refuses_and_closes(hub, dev):
    c = connect_device(hub, "dev1")
    etag = hub.request("GET", "/devices/dev1", hub.token()).json()["etag"]
    r = hub.request("PUT", "/devices/dev1", hub.token(), headers={"If-Match": f'"{etag}"'},
                    json={"deviceId": "dev1", "status": "disabled", "statusReason": "test"})
    assert r.status_code == 200
    assert c.wait_closed(5)
    assert refused(hub, "dev1", "localhost/dev1/?api-version=2021-04-12", hub.device_token("dev1")) == (5, True)


def test_bad_percent_encoding_is_refused_without_harm(hub, dev):
    c = connect_device(hub, "dev1")
    c.publish("devices/dev1/messages/events/a=%zz", b"x", qos=1, pkid=1)
    assert c.wait_closed(5)
    # The hub is fine and serves the next connection.
    d = connect_device(hub, "dev1")
    d.publish("devices/dev1/messages/events/a=%41", b"ok", qos=1, pkid=2)
    assert d.expect_puback(2)
    assert [e["properties"] for e in hub.events_of("dev1")] == [{"a": "A"}]


def test_oversized_message_closes(hub, dev):
    c = connect_device(hub, "dev1")
    c.publish("devices/dev1/messages/events/", b"x" * (256 * 1024 + 1), qos=1, pkid=1)
    assert c.wait_closed(10)
    assert hub.events_of("dev1") == []


def test_stamps_overwrite_spoofed_properties_and_connection_state(hub, dev):
    before = hub.request("GET", "/devices/dev1", hub.token()).json()
    assert before["connectionState"] == "Disconnected"
    c = connect_device(hub, "dev1")
    assert hub.request("GET", "/devices/dev1", hub.token()).json()["connectionState"] == "Connected"
    bag = "%24.mid=m1&iothub-connection-device-id=evil&iothub-connection-auth-method=forged&app=1"
    c.publish(f"devices/dev1/messages/events/{bag}", b"{}", qos=1, pkid=4)
    assert c.expect_puback(4)
    c.disconnect()
    time.sleep(0.5)
    after = hub.request("GET", "/devices/dev1", hub.token()).json()
    assert after["connectionState"] == "Disconnected"
    assert after["connectionStateUpdatedTime"] != "0001-01-01T00:00:00Z"
    assert after["etag"] == before["etag"]
    (event,) = hub.events_of("dev1")
    sp = event["systemProperties"]
    assert sp["iothub-connection-device-id"] == "dev1"
    assert sp["message-id"] == "m1"
    assert sp["iothub-connection-auth-generation-id"] == before["generationId"]
    assert json.loads(sp["iothub-connection-auth-method"]) == {"scope": "device", "type": "sas", "issuer": "iothub", "acceptingIpFilterRule": None}
    assert sp["iothub-message-source"] == "Telemetry"
    assert event["properties"] == {"app": "1"}


def test_persistent_session_survives_reconnect_and_restart(hub, dev):
    c = connect_device(hub, "dev1")
    assert c.subscribe([("devices/dev1/messages/devicebound/#", 1), ("$iothub/methods/POST/#", 1)]) == [1, 1]
    c.disconnect()
    c2 = RawMqtt(hub.mqtt_port, hub.ca)
    present, rc = c2.connect("dev1", "localhost/dev1/?api-version=2021-04-12", hub.device_token("dev1"))
    assert (present, rc) == (True, 0)
    c2.disconnect()
    hub.stop()
    hub.start()
    c3 = RawMqtt(hub.mqtt_port, hub.ca)
    present, rc = c3.connect("dev1", "localhost/dev1/?api-version=2021-04-12", hub.device_token("dev1"))
    assert (present, rc) == (True, 0)
    c3.disconnect()
    # CleanSession=1 drops it.
    c4 = RawMqtt(hub.mqtt_port, hub.ca)
    assert c4.connect("dev1", "localhost/dev1/?api-version=2021-04-12", hub.device_token("dev1"), clean=True) == (False, 0)
    c4.disconnect()
    c5 = RawMqtt(hub.mqtt_port, hub.ca)
    assert c5.connect("dev1", "localhost/dev1/?api-version=2021-04-12", hub.device_token("dev1")) == (False, 0)
    c5.close()


def test_module_identity(hub, dev):
    hub.create_module("dev1", "mod1")
    c = connect_device(hub, "dev1", module_id="mod1")
    c.publish("devices/dev1/modules/mod1/messages/events/%24.on=out1", b"m", qos=1, pkid=1)
    assert c.expect_puback(1)
    c.publish("devices/dev1/messages/events/", b"not mine", qos=1, pkid=2)
    assert c.wait_closed(5)
    (event,) = hub.events_of("dev1")
    assert event["systemProperties"]["iothub-connection-module-id"] == "mod1"
    assert event["systemProperties"]["iothub-outputname"] == "out1"


def test_garbage_bytes_do_not_take_the_hub_down(hub, dev):
    c = RawMqtt(hub.mqtt_port, hub.ca)
    c.send(b"\x10\xff\xff\xff\xff\x7f garbage")
    assert c.wait_closed(5)
    d = connect_device(hub, "dev1")
    d.ping()
    d.close()
