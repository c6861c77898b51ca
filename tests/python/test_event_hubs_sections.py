"""Issue 48: an event's AMQP sections are present only when they carry something, as Event Hubs
and IoT Hub send them. A device (the official Python device SDK) sends a bare string, a string
with only a content type, and a full message; `azure-eventhub` (over AMQP and AMQP over
WebSocket) sees no properties section on the first and exactly the set fields on the others,
`@azure/event-hubs` (which cannot tell a missing section from an empty one) no field set on the
first and exactly the set fields on the others, and a reader that decodes `content_type` whenever the properties
section exists processes all three without error.
"""

import json
import threading

from azure.eventhub import EventHubConsumerClient, TransportType
from azure.iot.device import IoTHubDeviceClient, Message

from ehkit import event_hubs_connection_string
from test_node_event_hubs import node_read

DEVICE = "sections-dev"


def send_three(hub):
    hub.create_device(DEVICE)
    client = IoTHubDeviceClient.create_from_connection_string(
        hub.device_connection_string(DEVICE), server_verification_cert=open(hub.ca).read())
    client.connect()
    try:
        client.send_message("hello")
        typed = Message("typed")
        typed.content_type = "text/plain"
        client.send_message(typed)
        full = Message(json.dumps({"t": 21}))
        full.message_id = "m-full"
        full.correlation_id = "c-full"
        full.content_type = "application/json"
        full.content_encoding = "utf-8"
        full.custom_properties["k"] = "v"
        client.send_message(full)
    finally:
        client.shutdown()


def careful_reader(hub, transport, address, expected=3, timeout=30):
    """Reads with the pattern of reader code written against the real service: decode
    `content_type` whenever the properties section is there. Returns (events, errors)."""
    endpoint = {"custom_endpoint_address": address} if address else {}
    client = EventHubConsumerClient.from_connection_string(
        event_hubs_connection_string(hub), consumer_group="$Default", transport_type=transport,
        connection_verify=hub.ca, **endpoint)
    seen, errors, done = [], [], threading.Event()

    def on_event(_partition, event):
        if event is None:
            return
        body = b"".join(event.body).decode()
        properties = event.message.properties
        content_type = properties.content_type.decode() if properties else None
        raw = event.raw_amqp_message
        seen.append({
            "body": body,
            "has_properties": raw.properties is not None,
            "has_application_properties": bool(raw.application_properties),
            "has_header": raw.header is not None,
            # The SDK shows a missing footer as {} (a header as None).
            "has_footer": bool(raw.footer),
            "content_type": content_type,
            "properties": None if raw.properties is None else {
                k: v for k, v in {
                    "message_id": raw.properties.message_id,
                    "correlation_id": raw.properties.correlation_id,
                    "content_type": raw.properties.content_type,
                    "content_encoding": raw.properties.content_encoding,
                    "user_id": raw.properties.user_id,
                    "to": raw.properties.to,
                    "subject": raw.properties.subject,
                    "reply_to": raw.properties.reply_to,
                    "absolute_expiry_time": raw.properties.absolute_expiry_time,
                    "creation_time": raw.properties.creation_time,
                    "group_id": raw.properties.group_id,
                }.items() if v is not None},
            "device": event.system_properties.get(b"iothub-connection-device-id"),
        })
        if len(seen) >= expected:
            done.set()

    def on_error(_partition, error):
        errors.append(error)
        done.set()

    thread = threading.Thread(target=client.receive, daemon=True, kwargs=dict(
        on_event=on_event, on_error=on_error, starting_position="-1", max_wait_time=1))
    thread.start()
    done.wait(timeout)
    client.close()
    thread.join(10)
    return seen, errors


def check_python(seen):
    by_body = {e["body"]: e for e in seen}
    assert set(by_body) == {"hello", "typed", '{"t": 21}'}, seen
    bare, typed, full = by_body["hello"], by_body["typed"], by_body['{"t": 21}']
    assert not bare["has_properties"] and bare["content_type"] is None
    assert not bare["has_application_properties"]
    assert typed["properties"] == {"content_type": b"text/plain"}
    assert typed["content_type"] == "text/plain"
    assert full["properties"] == {"message_id": b"m-full", "correlation_id": b"c-full",
                                  "content_type": b"application/json", "content_encoding": b"utf-8"}
    assert full["has_application_properties"]
    for e in seen:
        assert not e["has_header"] and not e["has_footer"], e
        assert e["device"] in (DEVICE, DEVICE.encode()), e


def test_sections_are_sent_only_when_set(sdk_hub):
    hub = sdk_hub
    send_three(hub)

    seen, errors = careful_reader(hub, TransportType.Amqp, f"amqps://localhost:{hub.amqp_port}")
    assert errors == [], errors
    check_python(seen)

    # The hub is on 443, where the SDK's WebSocket transport goes by itself.
    seen, errors = careful_reader(hub, TransportType.AmqpOverWebsocket, None)
    assert errors == [], errors
    check_python(seen)

    events, errors = node_read(hub, 3, exitOnError=True)
    assert errors == [], errors
    by_body = {e["body"]: e for e in events}
    bare, typed, full = by_body["hello"], by_body["typed"], by_body['{"t": 21}']
    # The Node SDK (through rhea) always hands out a properties and a header object, so a
    # section left out shows there as one with no field set.
    assert bare["rawSections"]["properties"] == {}, bare
    assert bare["rawSections"]["applicationProperties"] is None, bare
    assert bare["contentType"] is None and bare["messageId"] is None
    assert typed["rawSections"]["properties"] == {"contentType": "text/plain"}, typed
    assert full["rawSections"]["properties"] == {
        "messageId": "m-full", "correlationId": "c-full", "contentType": "application/json",
        "contentEncoding": "utf-8"}, full
    assert full["properties"] == {"k": "v"}
    for e in events:
        assert e["rawSections"]["header"] == {} and e["rawSections"]["footer"] is None, e
