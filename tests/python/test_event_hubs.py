"""AMQ-4, D2C-6: the built-in endpoint read by the unmodified Event Hubs SDK (`azure-eventhub`
`EventHubConsumerClient`): what device SDK clients sent arrives on every partition, in order per
device, with IoT Hub's system properties; starting positions by offset, sequence number and
enqueued time return exactly the expected events; the `$management` node's hub and partition
properties agree with what was sent; owner levels, bad credentials and unknown names are
refused the way the SDK recognises.

Devices use the official device SDK, which needs the fixed MQTT port, so the suite runs on the
module's `sdk_hub`.
"""

import datetime
import json
import threading
import time

import pytest
from azure.core.credentials import AzureSasCredential
from azure.eventhub import EventHubConsumerClient, TransportType
from azure.eventhub.exceptions import AuthenticationError, EventHubError
from azure.iot.device import IoTHubDeviceClient, IoTHubModuleClient, Message

import ehkit
from ehkit import Collector, consumer, device_of, module_of, prop, read, receive_in_background
from hubkit import parse_cs, sas_token

DEVICES = ["eh-dev-a", "eh-dev-b", "eh-dev-c"]
PER_DEVICE = 12


def send(client, sender: str, n: int):
    for i in range(n):
        msg = Message(json.dumps({"i": i, "from": sender}))
        msg.message_id = f"{sender}-{i}"
        msg.content_type = "application/json"
        msg.content_encoding = "utf-8"
        msg.custom_properties["i"] = str(i)
        msg.custom_properties["sender"] = sender
        client.send_message(msg)


@pytest.fixture(scope="module")
def sent(sdk_hub):
    """Three devices and one module send through the device SDK; returns what each sent."""
    hub = sdk_hub
    ca = open(hub.ca).read()
    for d in DEVICES:
        hub.create_device(d)
    hub.create_module(DEVICES[0], "eh-mod")
    for d in DEVICES:
        c = IoTHubDeviceClient.create_from_connection_string(
            hub.device_connection_string(d), server_verification_cert=ca)
        c.connect()
        send(c, d, PER_DEVICE)
        c.shutdown()
    m = IoTHubModuleClient.create_from_connection_string(
        hub.device_connection_string(DEVICES[0], "eh-mod"), server_verification_cert=ca)
    m.connect()
    send(m, f"{DEVICES[0]}/eh-mod", 4)
    m.shutdown()
    return {d: PER_DEVICE for d in DEVICES} | {f"{DEVICES[0]}/eh-mod": 4}


def total(sent):
    return sum(sent.values())


def by_sender(events):
    out = {}
    for _, e in events:
        out.setdefault(prop(e, "sender"), []).append(e)
    return out


def test_receive_reads_everything_in_order_with_iot_hub_properties(sdk_hub, sent):
    started = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=10)
    got = read(sdk_hub, total(sent), starting_position="-1")
    assert not got.errors
    assert len(got.events) == total(sent), "no event twice"
    groups = by_sender(got.events)
    assert {k: len(v) for k, v in groups.items()} == sent
    for sender, events in groups.items():
        device, _, module = sender.partition("/")
        assert [prop(e, "i") for e in events] == [str(i) for i in range(sent[sender])], "in order per device"
        assert len({pid for pid, e in got.events if prop(e, "sender") == sender}) == 1, "one partition per device"
        for i, e in enumerate(events):
            assert device_of(e) == device
            assert module_of(e) == (module or None)
            assert json.loads(e.body_as_str()) == {"i": i, "from": sender}
            assert e.message_id == f"{sender}-{i}"
            assert e.content_type == "application/json"
            sp = e.system_properties
            assert sp[b"iothub-message-source"] == b"Telemetry"
            assert json.loads(sp[b"iothub-connection-auth-method"])["type"] == "sas"
            assert sp[b"iothub-connection-auth-generation-id"]
            assert sp[b"content-encoding"] == b"utf-8"
            assert started < e.enqueued_time < datetime.datetime.now(datetime.timezone.utc)
            # iothub-enqueuedtime is the same instant, as a timestamp (ms).
            assert sp[b"iothub-enqueuedtime"] == sp[b"x-opt-enqueued-time"]
        seqs = [e.sequence_number for e in events]
        assert seqs == sorted(seqs)


def test_receive_batch_reads_the_same(sdk_hub, sent):
    client = consumer(sdk_hub)
    batches = []
    collector = Collector()

    def on_batch(ctx, events):
        for e in events:
            collector.on_event(ctx, e)
        batches.append(len(events))

    t = threading.Thread(target=client.receive_batch, kwargs=dict(
        on_event_batch=on_batch, on_error=collector.on_error, starting_position="-1",
        max_batch_size=5, max_wait_time=1), daemon=True)
    t.start()
    try:
        assert collector.wait_for(lambda c: len(c.events) >= total(sent)), collector.errors
    finally:
        client.close()
        t.join(10)
    assert max(batches) <= 5 and max(batches) > 1
    assert {k: len(v) for k, v in by_sender(collector.events).items()} == sent


def test_hub_and_partition_properties_agree_with_what_was_sent(sdk_hub, sent):
    got = read(sdk_hub, total(sent), starting_position="-1")
    client = consumer(sdk_hub)
    try:
        props = client.get_eventhub_properties()
        assert props["eventhub_name"] == "ferrohub"
        partitions = sdk_hub.partitions()
        assert props["partition_ids"] == [str(p["partitionId"]) for p in partitions]
        assert props["created_at"] < datetime.datetime.now(datetime.timezone.utc)
        for pid in props["partition_ids"]:
            info = client.get_partition_properties(pid)
            mine = [e for p, e in got.events if p == pid]
            assert info["id"] == pid and info["eventhub_name"] == "ferrohub"
            if not mine:
                assert info["is_empty"]
                continue
            assert not info["is_empty"]
            last = max(mine, key=lambda e: e.sequence_number)
            assert info["beginning_sequence_number"] == min(e.sequence_number for e in mine)
            assert info["last_enqueued_sequence_number"] == last.sequence_number
            assert info["last_enqueued_offset"] == last.offset
            assert info["last_enqueued_time_utc"] == last.enqueued_time
    finally:
        client.close()


def device_events(hub, device):
    got = read(hub, None, starting_position="-1")
    events = [(pid, e) for pid, e in got.events if prop(e, "sender") == device]
    assert len(events) == PER_DEVICE
    return events


def test_starting_positions_return_exactly_the_expected_events(sdk_hub, sent):
    device = DEVICES[1]
    events = device_events(sdk_hub, device)
    pid = events[0][0]
    all_in_partition = [e for p, e in read(sdk_hub, None, partition_id=pid, starting_position="-1").events]
    pivot = next(i for i, e in enumerate(all_in_partition) if e.sequence_number == events[5][1].sequence_number)
    after = [e.sequence_number for e in all_in_partition[pivot + 1:]]
    from_pivot = [e.sequence_number for e in all_in_partition[pivot:]]
    target = all_in_partition[pivot]

    def seqs(**kw):
        return [e.sequence_number for _, e in read(sdk_hub, None, partition_id=pid, **kw).events]

    assert seqs(starting_position=target.offset) == after
    assert seqs(starting_position=target.offset, starting_position_inclusive=True) == from_pivot
    assert seqs(starting_position=target.sequence_number) == after
    assert seqs(starting_position=target.sequence_number, starting_position_inclusive=True) == from_pivot
    # Enqueued time: events enqueued at or after the instant (several may share a millisecond).
    at = target.enqueued_time
    want = [e.sequence_number for e in all_in_partition if e.enqueued_time >= at]
    assert seqs(starting_position=at, starting_position_inclusive=True) == want
    assert seqs(starting_position=at) == [e.sequence_number for e in all_in_partition if e.enqueued_time > at]
    # "@latest": nothing old, only what arrives after the link attached.
    client = consumer(sdk_hub)
    collector = Collector()
    thread = receive_in_background(client, collector, partition_id=pid, starting_position="@latest")
    try:
        assert collector.wait_for(lambda c: c.idle > 0)
        assert collector.events == []
        c = IoTHubDeviceClient.create_from_connection_string(
            sdk_hub.device_connection_string(device), server_verification_cert=open(sdk_hub.ca).read())
        c.connect()
        msg = Message("late")
        msg.custom_properties["sender"] = "late"
        c.send_message(msg)
        c.shutdown()
        assert collector.wait_for(lambda c: len(c.events) >= 1), collector.errors
        time.sleep(1)
        assert [e.body_as_str() for _, e in collector.events] == ["late"]
        assert collector.events[0][1].sequence_number == all_in_partition[-1].sequence_number + 1
    finally:
        client.close()
        thread.join(10)


def test_a_higher_owner_level_takes_the_partition(sdk_hub, sent):
    pid = "0"
    # In a cluster, each reader on its own node: the rules hold across the nodes.
    low_node, high_node, retry_node = (["hub1", "hub2", "hub3"] if hasattr(sdk_hub, "node_request")
                                       else [None, None, None])
    low_client, high_client = consumer(sdk_hub, node=low_node), consumer(sdk_hub, node=high_node)
    low, high = Collector(), Collector()
    low_thread = receive_in_background(low_client, low, partition_id=pid, starting_position="-1", owner_level=1)
    try:
        assert low.wait_for(lambda c: c.idle > 0)
        high_thread = receive_in_background(high_client, high, partition_id=pid, starting_position="-1",
                                            owner_level=2)
        assert high.wait_for(lambda c: c.idle > 0)
        assert low.wait_for(lambda c: c.errors), "the lower owner level was not told"
        _, error = low.errors[0]
        assert isinstance(error, EventHubError)
        assert "owner level 2" in str(error)
        assert not high.errors
        # A lower level (or none) cannot take it back while the owner reads.
        retry_client, retry = consumer(sdk_hub, node=retry_node), Collector()
        retry_thread = receive_in_background(retry_client, retry, partition_id=pid, starting_position="-1",
                                             owner_level=1)
        assert retry.wait_for(lambda c: c.errors)
        assert "higher owner level 2" in str(retry.errors[0][1])
        retry_client.close()
        retry_thread.join(10)
    finally:
        low_client.close()
        high_client.close()
        low_thread.join(10)


def test_bad_credentials_and_unknown_names_are_refused(sdk_hub, sent):
    cs = ehkit.event_hubs_connection_string(sdk_hub)
    parts = parse_cs(cs)
    wrong = cs.replace(parts["SharedAccessKey"], "AAAA" + parts["SharedAccessKey"][4:])
    client = consumer(sdk_hub, connection_string=wrong, retry_total=0)
    with pytest.raises(AuthenticationError, match="401"):
        client.get_eventhub_properties()
    client.close()
    # A token that has expired.
    expired = sas_token("sb://localhost/ferrohub", parts["SharedAccessKey"], ttl=-60, policy="service")
    client = EventHubConsumerClient(
        "localhost", "ferrohub", "$Default", AzureSasCredential(expired),
        custom_endpoint_address=f"amqps://localhost:{sdk_hub.amqp_port}", connection_verify=sdk_hub.ca,
        transport_type=TransportType.Amqp, retry_total=0)
    with pytest.raises(AuthenticationError, match="expired"):
        client.get_eventhub_properties()
    client.close()
    # A policy without ServiceConnect.
    client = consumer(sdk_hub, connection_string=ehkit.event_hubs_connection_string(sdk_hub, "registryRead"),
                      retry_total=0)
    with pytest.raises(EventHubError, match="ServiceConnect"):
        client.get_eventhub_properties()
    client.close()
    # Unknown entity, partition and consumer group.
    client = consumer(sdk_hub, connection_string=cs.replace("EntityPath=ferrohub", "EntityPath=nothing"),
                      retry_total=0)
    with pytest.raises(EventHubError, match="could not be found"):
        client.get_eventhub_properties()
    client.close()
    client = consumer(sdk_hub, retry_total=0)
    with pytest.raises(EventHubError, match="does not exist"):
        client.get_partition_properties("99")
    client.close()
    client, collector = consumer(sdk_hub, group="nobody", retry_total=0), Collector()
    thread = receive_in_background(client, collector, partition_id="0", starting_position="-1")
    try:
        assert collector.wait_for(lambda c: c.errors)
        assert "consumer group" in str(collector.errors[0][1]) and "nobody" in str(collector.errors[0][1])
    finally:
        client.close()
        thread.join(10)


def test_consumer_groups_from_rest_are_readable(sdk_hub, sent):
    svc = sdk_hub.token("service")
    assert sdk_hub.request("PUT", "/events/consumergroups/eh-analytics", svc).status_code == 201
    client, collector = consumer(sdk_hub, group="EH-Analytics"), Collector()
    thread = receive_in_background(client, collector, starting_position="-1")
    try:
        assert collector.wait_for(lambda c: len(c.events) >= total(sent)), collector.errors
        assert collector.wait_for(lambda c: c.idle_partitions >= set(client.get_partition_ids()))
    finally:
        client.close()
        thread.join(10)
    # The @latest test (same hub) may have added one event of its own.
    counts = {k: len(v) for k, v in by_sender(collector.events).items() if k != "late"}
    assert counts == sent
    assert sdk_hub.request("DELETE", "/events/consumergroups/eh-analytics", svc).status_code == 204
    client, collector = consumer(sdk_hub, group="eh-analytics", retry_total=0), Collector()
    thread = receive_in_background(client, collector, partition_id="0", starting_position="-1")
    try:
        assert collector.wait_for(lambda c: c.errors)
    finally:
        client.close()
        thread.join(10)
