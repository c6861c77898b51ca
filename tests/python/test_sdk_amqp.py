"""AMQ-1, AMQ-2 with the unmodified official service SDK (azure-iot-hub 2.7.0, which sends C2D
over AMQP on the fixed port 5671, or AMQP over WebSocket on 443; `compat` §B5): a message sent
with `send_c2d_message` reaches an unmodified device SDK client with its body and every
property; a send the hub refuses raises in the SDK and stores nothing.

The SDK has no CA option: it trusts OpenSSL's defaults, so SSL_CERT_FILE points at the hub's CA.
It runs in a child process (see amqpsend.py).
"""

import threading
import time

import pytest
from azure.iot.device import IoTHubDeviceClient

from amqpsend import send_all

WAIT = 20


def queue_depth(hub, device_id):
    return hub.request("GET", f"/devices/{device_id}", hub.token()).json()["cloudToDeviceMessageCount"]


class Inbox:
    def __init__(self):
        self.messages = []
        self.cond = threading.Condition()

    def handler(self, message):
        with self.cond:
            self.messages.append(message)
            self.cond.notify_all()

    def wait(self, n, timeout=WAIT):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.messages) >= n, timeout), \
                f"the device got {len(self.messages)} of {n} messages"
            return list(self.messages)


def receiving_device(hub, device_id, inbox, connection_string=None):
    """An SDK device client, connected, whose C2D messages go to `inbox`."""
    device = IoTHubDeviceClient.create_from_connection_string(
        connection_string or hub.device_connection_string(device_id),
        server_verification_cert=open(hub.ca).read())
    device.on_message_received = inbox.handler
    device.connect()
    return device


@pytest.mark.parametrize("websockets", [False, True], ids=["amqp", "amqp-ws"])
def test_send_c2d_message_reaches_the_device_sdk(sdk_hub, websockets):
    hub = sdk_hub
    device_id = f"amqp-c2d-{'ws' if websockets else 'tls'}"
    hub.create_device(device_id)
    inbox = Inbox()
    device = receiving_device(hub, device_id, inbox)
    try:
        expiry_ms = int((time.time() + 600) * 1000)
        results = send_all(hub, [
            (device_id, '{"temp": 21}', {
                "messageId": "amqp-m1",
                "correlationId": "amqp-c1",
                "contentType": "application/json",
                "contentEncoding": "utf-8",
                "expiryTimeUtc": expiry_ms,
                "iothub-ack": "full",
                "custom": "v1",
                "num": 5,
            }),
            (device_id, "second, with no id", None),
        ], websockets=websockets)
        assert results == [None, None]
        first, second = inbox.wait(2)
    finally:
        device.shutdown()
    assert first.data == b'{"temp": 21}'
    assert first.message_id == "amqp-m1"
    assert first.correlation_id == "amqp-c1"
    assert first.content_type == "application/json"
    assert first.content_encoding == "utf-8"
    assert first.custom_properties == {"custom": "v1", "num": "5"}
    assert first.ack == "full"
    assert second.data == b"second, with no id"
    # The SDK gives every message an id when none is set (a uuid4 string).
    assert second.message_id and second.message_id != first.message_id


def test_a_send_to_the_receiving_sdk_device_is_locked_on_send_and_completed_by_its_puback(sdk_hub):
    """Issue 19: with the device SDK connected and receiving and its queue empty, the service
    SDK's send locks the message for the device in the send's own commit (the hub's counter
    says so; in a cluster also when the device is on another node than the send); the SDK's
    PUBACK completes it like any other."""
    hub = sdk_hub
    # In a cluster, one device on each node: the service's link is on one of them, so at least
    # two receive from a node the send was not made on.
    nodes = ["hub1", "hub2", "hub3"] if hasattr(hub, "device_connection_string_via") else [None]
    for node in nodes:
        device_id = f"amqp-locked-on-send-{node or 'single'}"
        hub.create_device(device_id)
        inbox = Inbox()
        if node is not None:
            hub.wait_node_has_device(node, device_id)
        cs = hub.device_connection_string_via(node, device_id) if node else None
        device = receiving_device(hub, device_id, inbox, connection_string=cs)
        try:
            # The SDK subscribes in the background: a first message proves the subscription.
            assert send_all(hub, [(device_id, "warm-up", None)]) == [None]
            inbox.wait(1)
            wait_depth(hub, device_id, 0)
            before = hub.metric("ferrohub_c2d_locked_on_send_total")
            for n in range(3):
                assert send_all(hub, [(device_id, f"m{n}", {"messageId": f"m{n}"})]) == [None]
                inbox.wait(2 + n)
                wait_depth(hub, device_id, 0)
            assert hub.metric("ferrohub_c2d_locked_on_send_total") - before == 3, node
        finally:
            device.shutdown()
        assert [m.data for m in inbox.messages] == [b"warm-up", b"m0", b"m1", b"m2"]


def wait_depth(hub, device_id, depth, timeout=WAIT):
    deadline = time.time() + timeout
    while queue_depth(hub, device_id) != depth:
        assert time.time() < deadline, f"the queue never came to {depth}"
        time.sleep(0.05)


def test_refused_sends_raise_and_store_nothing(sdk_hub):
    hub = sdk_hub
    hub.create_device("amqp-full")
    hub.create_device("amqp-large")
    results = send_all(hub, [("amqp-nobody", "lost", None)]
                       + [("amqp-full", f"m{i}", None) for i in range(50)]
                       + [("amqp-full", "one too many", None),
                          ("amqp-large", "x" * (64 * 1024 + 1), None),
                          ("amqp-large", "fine", None)])
    unknown, fifty, full, large, fine = results[0], results[1:51], results[51], results[52], results[53]
    assert unknown and "C2D message send failure" in unknown, unknown
    assert hub.request("GET", "/devices/amqp-nobody", hub.token()).status_code == 404
    assert fifty == [None] * 50
    assert full and "C2D message send failure" in full, full
    assert queue_depth(hub, "amqp-full") == 50
    assert large, "a message over 64 KB was accepted"
    # The connection still serves sends after refusals.
    assert fine is None
    assert queue_depth(hub, "amqp-large") == 1


def test_a_policy_without_service_connect_or_a_wrong_key_is_refused(sdk_hub):
    hub = sdk_hub
    hub.create_device("amqp-auth")
    # registryRead has no ServiceConnect: the token is valid, the C2D link is not allowed.
    read_only = hub.connection_string("registryRead", with_port=False)
    assert send_all(hub, [("amqp-auth", "nope", None)], connection_string=read_only) != [None]
    cs = hub.connection_string("iothubowner", with_port=False)
    key = hub.policy_key("iothubowner")
    wrong = cs.replace(key, "A" * (len(key) - 1) + "=")
    assert send_all(hub, [("amqp-auth", "nope", None)], connection_string=wrong) != [None]
    assert queue_depth(hub, "amqp-auth") == 0
