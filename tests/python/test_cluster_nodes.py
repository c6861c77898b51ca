"""CLU: any node serves any client. Each case puts its clients on chosen nodes' own addresses
(127.0.0.2-4, not the balancer): a device on node A with the official device SDK (IoT Edge's
`GatewayHostName`, so it signs for the hub's host name and connects to the node), back-end
calls on node B or C over REST, an Event Hubs consumer on node C. Followers forward their
connections to the writer (docs/cluster.md), so every case also crosses nodes.

One cluster for the module (fixed ports)."""

import json
import threading
import time
import urllib.parse

import pytest
from azure.eventhub import EventHubConsumerClient
from azure.iot.device import IoTHubDeviceClient, Message, MethodResponse

import ehkit
from clusterkit import Cluster, c2d_inbox, node_ip
from mqttraw import RawMqtt

WAIT = 30
NODES = ("hub1", "hub2", "hub3")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster-nodes")).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def roles(cluster):
    """(writer, follower, follower): the cases name nodes by role, so each one crosses from a
    follower to the writer and from one follower to the other."""
    w = cluster.wait_for_writer()
    followers = [n for n in NODES if n != w]
    return w, followers[0], followers[1]


def device_on(cluster, node, device_id):
    return IoTHubDeviceClient.create_from_connection_string(
        cluster.device_connection_string_via(node, device_id), server_verification_cert=open(cluster.ca).read())


def test_every_node_accepts_every_service(cluster):
    cluster.create_device("everywhere")
    for node in NODES:
        r = cluster.node_request(node, "GET", "/devices/everywhere", cluster.token())
        assert r.status_code == 200 and r.json()["deviceId"] == "everywhere", (node, r.status_code, r.text)


def test_method_from_another_node(cluster, roles):
    _, a, b = roles
    cluster.create_device("m-dev")
    client = device_on(cluster, a, "m-dev")
    client.on_method_request_received = lambda req: client.send_method_response(
        MethodResponse.create_from_method_request(req, 200, {"echo": req.payload, "name": req.name}))
    try:
        client.connect()
        r = cluster.node_request(b, "POST", "/twins/m-dev/methods", cluster.token(),
                                 json={"methodName": "ping", "payload": {"n": 7}, "responseTimeoutInSeconds": 10})
        assert r.status_code == 200, r.text
        assert r.json() == {"status": 200, "payload": {"echo": {"n": 7}, "name": "ping"}}
    finally:
        client.shutdown()


def test_c2d_sent_on_b_completed_on_a_feedback_on_c(cluster, roles):
    w, a, b = roles
    cluster.create_device("c2d-dev")
    client = device_on(cluster, a, "c2d-dev")
    got, arrived = c2d_inbox(client)
    try:
        client.connect()
        r = cluster.node_request(b, "POST", "/devices/c2d-dev/messages/deviceBound", cluster.token(),
                                 data=b"cross", headers={"iothub-messageid": "x-1", "iothub-ack": "full"})
        assert r.status_code == 204, r.text
        assert arrived.wait(WAIT), "the device never got the message"
        assert got == [("x-1", "cross")]
    finally:
        client.shutdown()
    # MQTT's PUBACK completed it: positive feedback, read and completed on the third node.
    deadline, records = time.time() + WAIT, []
    while not records:
        assert time.time() < deadline, "no feedback"
        r = cluster.node_request(w, "GET", "/messages/serviceBound/feedback", cluster.token("service"))
        if r.status_code == 204:
            time.sleep(0.2)
            continue
        assert r.status_code == 200, r.text
        records = [x for x in r.json() if x["DeviceId"] == "c2d-dev"]
        lock = urllib.parse.quote(r.headers["ETag"].strip('"'), safe="")
        d = cluster.node_request(w, "DELETE", f"/messages/serviceBound/feedback/{lock}", cluster.token("service"))
        assert d.status_code == 204, d.text
    assert [(x["OriginalMessageId"], x["Description"]) for x in records] == [("x-1", "Success")]


def test_twin_patch_on_b_notifies_device_on_a(cluster, roles):
    _, a, b = roles
    cluster.create_device("t-dev")
    patches = []
    got = threading.Event()
    client = device_on(cluster, a, "t-dev")

    def on_patch(p):
        # The SDK may report the twin's current version first ({"$version": 1}).
        patches.append(p)
        if "rate" in p:
            got.set()

    client.on_twin_desired_properties_patch_received = on_patch
    try:
        client.connect()
        client.patch_twin_reported_properties({"fw": "2"})
        r = cluster.node_request(b, "PATCH", "/twins/t-dev", cluster.token(), json={"properties": {"desired": {"rate": 3}}})
        assert r.status_code == 200, r.text
        assert got.wait(WAIT), "the desired patch never reached the device"
        assert patches[-1].get("rate") == 3, patches
    finally:
        client.shutdown()
    # The device's reported write, made through A, reads back on B at once.
    r = cluster.node_request(b, "GET", "/twins/t-dev", cluster.token())
    assert r.json()["properties"]["reported"]["fw"] == "2"


def test_if_match_race_across_nodes_has_one_winner(cluster, roles):
    _, a, b = roles
    cluster.create_device("race")
    for round_ in range(5):
        etag = cluster.node_request(a, "GET", "/twins/race", cluster.token()).json()["etag"]
        barrier = threading.Barrier(2)
        results = {}

        def patch(node):
            barrier.wait()
            r = cluster.node_request(node, "PATCH", "/twins/race", cluster.token(),
                                     json={"tags": {"winner": node, "round": round_}},
                                     headers={"If-Match": f'"{etag}"'})
            results[node] = r.status_code

        threads = [threading.Thread(target=patch, args=(n,)) for n in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert sorted(results.values()) == [200, 412], results
        winner = next(n for n, s in results.items() if s == 200)
        tags = cluster.node_request(b, "GET", "/twins/race", cluster.token()).json()["tags"]
        assert tags == {"winner": winner, "round": round_}


def raw_device_on(cluster, node, device_id):
    c = RawMqtt(8883, cluster.ca, host=node_ip(node))
    _, rc = c.connect(device_id, f"localhost/{device_id}/?api-version=2021-04-12", cluster.device_token(device_id))
    assert rc == 0, f"CONNACK {rc}"
    return c


def test_device_reconnecting_to_b_closes_its_a_connection(cluster, roles):
    _, a, b = roles
    cluster.create_device("moving")
    first = raw_device_on(cluster, a, "moving")
    try:
        first.ping()
        second = raw_device_on(cluster, b, "moving")
        try:
            assert first.wait_closed(WAIT), "the older connection on the first node stayed open"
            second.ping()
        finally:
            second.close()
    finally:
        first.close()


def test_event_hubs_consumer_on_c_reads_devices_on_a_and_b_in_order(cluster, roles):
    w, a, b = roles
    sent = {}
    for node, device in ((a, "eh-a"), (b, "eh-b")):
        cluster.create_device(device)
        client = device_on(cluster, node, device)
        try:
            client.connect()
            sent[device] = [json.dumps({"d": device, "i": i}) for i in range(15)]
            for body in sent[device]:
                client.send_message(Message(body))  # returns once PUBACKed
        finally:
            client.shutdown()
    consumer = EventHubConsumerClient.from_connection_string(
        ehkit.event_hubs_connection_string(cluster), consumer_group="$Default",
        custom_endpoint_address=f"amqps://{node_ip(w)}:5671", connection_verify=cluster.ca)
    collector = ehkit.Collector()
    thread = ehkit.receive_in_background(consumer, collector, starting_position="-1")
    try:
        assert collector.wait_for(
            lambda c: sum(1 for _, e in c.events if ehkit.device_of(e) in sent) >= 30, WAIT), collector.errors
    finally:
        consumer.close()
        thread.join(10)
    for device, bodies in sent.items():
        read = [e.body_as_str() for _, e in collector.events if ehkit.device_of(e) == device]
        assert read == bodies, device


def test_statistics_and_queries_agree_on_every_node(cluster):
    for i in range(6):
        cluster.create_device(f"q-{i}")
        cluster.set_tags(f"q-{i}", {"site": "north" if i % 2 else "south"})
    answers = []
    for node in NODES:
        stats = cluster.node_request(node, "GET", "/statistics/devices", cluster.token())
        assert stats.status_code == 200, stats.text
        q = cluster.node_request(node, "POST", "/devices/query", cluster.token(),
                                 json={"query": "SELECT deviceId FROM devices WHERE tags.site = 'north'"})
        assert q.status_code == 200, q.text
        answers.append((stats.json()["totalDeviceCount"], sorted(d["deviceId"] for d in q.json())))
    assert answers[0][1] == ["q-1", "q-3", "q-5"]
    assert answers.count(answers[0]) == 3, answers
