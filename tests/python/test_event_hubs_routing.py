"""AMQ-4 with routing: seed 004's non-telemetry events routed to the built-in endpoint reach an
unmodified `azure-eventhub` consumer with their properties and body, and a custom routing
endpoint is an Event Hubs entity of its own (read under its name, with its own partitions).
The first-start banner and `ferrohub connection-string --event-hubs` print the Event Hubs form.
"""

import json

from azure.eventhub.exceptions import EventHubError

import ehkit
from ehkit import consumer, device_of, prop, read
from hubkit import parse_cs
from routingkit import HUB_NAME, put_endpoint, put_route, send_http, twin_write


def test_routed_non_telemetry_events_arrive_with_seed_004_properties(hub):
    put_route(hub, "life", "DeviceLifecycleEvents", "true", ["events"])
    put_route(hub, "twin", "TwinChangeEvents", "true", ["events"])
    put_route(hub, "telemetry", "DeviceMessages", "true", ["events"])
    hub.create_device("eh-nt")
    twin_write(hub, "eh-nt", {"tags": {"plant": "north"}})
    send_http(hub, "eh-nt", b'{"t": 1}', mid="eh-nt-1", props={"k": "v"})

    got = read(hub, 3, starting_position="-1")
    events = [e for _, e in got.events if device_of(e) == "eh-nt"]
    sources = [e.system_properties[b"iothub-message-source"].decode() for e in events]
    assert sources == ["deviceLifecycleEvents", "twinChangeEvents", "Telemetry"], "in the order produced"

    life, twin, telemetry = events
    assert prop(life, "opType") == "createDeviceIdentity"
    assert prop(life, "iothub-message-schema") == "deviceLifecycleNotification"
    assert prop(life, "hubName") == HUB_NAME
    assert prop(life, "deviceId") == "eh-nt"
    assert life.content_type == "application/json"
    assert life.system_properties[b"content-encoding"] == b"utf-8"
    assert life.system_properties[b"user-id"] == HUB_NAME.encode()
    assert json.loads(life.body_as_str())["deviceId"] == "eh-nt"

    assert prop(twin, "opType") == "updateTwin"
    assert prop(twin, "iothub-message-schema") == "twinChangeNotification"
    assert json.loads(twin.body_as_str())["tags"] == {"plant": "north"}
    assert twin.enqueued_time >= life.enqueued_time

    assert telemetry.message_id == "eh-nt-1"
    assert prop(telemetry, "k") == "v"
    assert telemetry.body_as_str() == '{"t": 1}'


def test_a_custom_endpoint_is_an_entity_of_its_own(hub):
    put_endpoint(hub, "eh-alerts", 2)
    put_route(hub, "alerts", "DeviceMessages", "level = 'high'", ["eh-alerts"])
    for d in ["eh-r1", "eh-r2", "eh-r3"]:
        hub.create_device(d)
        send_http(hub, d, b"calm", props={"level": "low"})
        send_http(hub, d, b"alarm", props={"level": "high"})

    cs = ehkit.event_hubs_connection_string(hub).replace(f"EntityPath={HUB_NAME}", "EntityPath=eh-alerts")
    client = consumer(hub, connection_string=cs)
    try:
        props = client.get_eventhub_properties()
        assert props["eventhub_name"] == "eh-alerts"
        assert props["partition_ids"] == ["0", "1"]
        with_events = [p for p in props["partition_ids"] if not client.get_partition_properties(p)["is_empty"]]
        assert with_events
    finally:
        client.close()

    collector = ehkit.Collector()
    client = consumer(hub, connection_string=cs)
    thread = ehkit.receive_in_background(client, collector, starting_position="-1")
    try:
        assert collector.wait_for(lambda c: len(c.events) >= 3), collector.errors
        assert collector.wait_for(lambda c: c.idle_partitions >= {"0", "1"})
    finally:
        client.close()
        thread.join(10)
    assert sorted(device_of(e) for _, e in collector.events) == ["eh-r1", "eh-r2", "eh-r3"]
    assert {e.body_as_str() for _, e in collector.events} == {"alarm"}
    assert {pid for pid, _ in collector.events} <= {"0", "1"}

    # A partition the endpoint does not have is refused by name.
    client = consumer(hub, connection_string=cs, retry_total=0)
    try:
        try:
            client.get_partition_properties("2")
            raise AssertionError("partition 2 of a 2-partition endpoint was answered")
        except EventHubError as e:
            assert "does not exist" in str(e)
    finally:
        client.close()


def test_the_event_hubs_connection_string_is_printed(hub):
    banner = [line for line in hub.startup_lines if line.startswith("Event Hubs-compatible endpoint: ")]
    assert len(banner) == 1
    printed = banner[0].split(": ", 1)[1]
    assert printed == hub.cli("connection-string", "--policy", "service", "--event-hubs")
    parts = parse_cs(printed)
    assert parts["Endpoint"] == "sb://localhost/"
    assert parts["SharedAccessKeyName"] == "service"
    assert parts["SharedAccessKey"] == hub.policy_key("service")
    assert parts["EntityPath"] == HUB_NAME
    owner_cs = parse_cs(hub.cli("connection-string", "--policy", "iothubowner", "--event-hubs"))
    assert owner_cs["SharedAccessKeyName"] == "iothubowner"
