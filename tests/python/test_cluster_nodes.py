"""CLU: any node serves any client. Each case puts its clients on chosen nodes' own addresses
(127.0.0.2-4, not the balancer): a device on node A with the official device SDK (IoT Edge's
`GatewayHostName`, so it signs for the hub's host name and connects to the node), back-end
calls on node B or C over REST, an Event Hubs consumer on node C. A follower holds its own
clients' sessions and sends their writes to the writer over NATS, and live traffic (methods,
C2D wake-ups, desired patches, takeovers) crosses nodes over NATS too (docs/cluster.md), so
every case crosses nodes.

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
from hubkit import sas_token
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


def read_events_on(cluster, node, done):
    """Reads every partition from the start with an Event Hubs consumer on `node`'s own address
    until `done(collector)` holds (asserted within WAIT); the collector."""
    consumer = EventHubConsumerClient.from_connection_string(
        ehkit.event_hubs_connection_string(cluster), consumer_group="$Default",
        custom_endpoint_address=f"amqps://{node_ip(node)}:5671", connection_verify=cluster.ca)
    collector = ehkit.Collector()
    thread = ehkit.receive_in_background(consumer, collector, starting_position="-1")
    try:
        assert collector.wait_for(done, WAIT), collector.errors
    finally:
        consumer.close()
        thread.join(10)
    return collector


def test_event_hubs_consumer_on_c_reads_devices_on_a_and_b_in_order(cluster, roles):
    # The consumer reads a follower's own replica; the devices' telemetry reaches it through
    # the log, one device on the writer and one on the other follower.
    w, a, b = roles
    sent = {}
    for node, device in ((w, "eh-a"), (a, "eh-b")):
        cluster.create_device(device)
        client = device_on(cluster, node, device)
        try:
            client.connect()
            sent[device] = [json.dumps({"d": device, "i": i}) for i in range(15)]
            for body in sent[device]:
                client.send_message(Message(body))  # returns once PUBACKed
        finally:
            client.shutdown()
    collector = read_events_on(
        cluster, b, lambda c: sum(1 for _, e in c.events if ehkit.device_of(e) in sent) >= 30)
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


def test_a_follower_answers_with_its_own_writes_applied(cluster, roles):
    """Read-your-writes: a write made on a follower is on that follower's replica by the time
    the follower answers it."""
    _, a, _ = roles
    for i in range(20):
        device = f"ryw-{i}"
        r = cluster.node_request(a, "PUT", f"/devices/{device}", cluster.token(), json={"deviceId": device})
        assert r.status_code == 200, r.text
        got = cluster.node_request(a, "GET", f"/devices/{device}", cluster.token())
        assert got.status_code == 200, (i, got.text)
        patched = cluster.node_request(a, "PATCH", f"/twins/{device}", cluster.token(),
                                       json={"tags": {"n": i}})
        assert patched.status_code == 200, patched.text
        twin = cluster.node_request(a, "GET", f"/twins/{device}", cluster.token())
        assert twin.status_code == 200 and twin.json()["tags"] == {"n": i}, (i, twin.text)
        assert twin.json()["etag"] == patched.json()["etag"]


def test_a_write_through_one_node_is_read_through_any_other(cluster, roles):
    """Reads are consistent across nodes, as IoT Hub's are: a client that writes through one
    node and reads at once through another (a balancer spreading its new connections) reads its
    write. Each follower asks the log's end before a read and applies that far first. Writes on
    the writer and on a follower; reads on the other follower."""
    w, a, b = roles
    token = cluster.token()
    for i in range(20):
        writer_node, reader_node = (w, b) if i % 2 else (a, b)
        device = f"across-{i}"
        r = cluster.node_request(writer_node, "PUT", f"/devices/{device}", token, json={"deviceId": device})
        assert r.status_code == 200, r.text
        got = cluster.node_request(reader_node, "GET", f"/devices/{device}", token)
        assert got.status_code == 200, (i, writer_node, reader_node, got.text)
        patched = cluster.node_request(writer_node, "PATCH", f"/twins/{device}", token, json={"tags": {"n": i}})
        assert patched.status_code == 200, patched.text
        queried = cluster.node_request(reader_node, "POST", "/devices/query", token,
                                       json={"query": f"SELECT * FROM devices WHERE deviceId = '{device}'"})
        assert queried.status_code == 200 and [t["tags"] for t in queried.json()] == [{"n": i}], (i, queried.text)


def connection_state_on(cluster, node, device_id):
    r = cluster.node_request(node, "GET", f"/devices/{device_id}", cluster.token())
    assert r.status_code == 200, r.text
    return r.json()["connectionState"]


def test_a_lost_followers_devices_read_disconnected(cluster, roles):
    """A follower killed with its devices connected cannot record their ends; the writer finds
    the node gone (the roll call, docs/cluster.md) and records them "Disconnected", on every
    node. The killed node then starts again and serves."""
    w, a, b = roles
    cluster.create_device("orphan")
    client = raw_device_on(cluster, a, "orphan")
    try:
        client.ping()
        deadline = time.time() + WAIT
        while connection_state_on(cluster, w, "orphan") != "Connected":
            assert time.time() < deadline, "the connection was never recorded"
            time.sleep(0.2)
        cluster.kill_node(a)
        deadline = time.time() + 60
        while connection_state_on(cluster, w, "orphan") != "Disconnected":
            assert time.time() < deadline, "the lost node's device still reads Connected"
            time.sleep(0.5)
        deadline = time.time() + WAIT
        while connection_state_on(cluster, b, "orphan") != "Disconnected":
            assert time.time() < deadline, "the other follower never applied it"
            time.sleep(0.2)
    finally:
        client.close()
        cluster.start_node(a)
        cluster.wait_node_has_device(a, "orphan")
        cluster.wait_node_serves(a)


def test_a_followers_sessions_live_through_the_writers_loss(cluster, roles):
    """A follower holds its devices' sessions itself: killing the writer does not drop them.
    Each follower holds one raw MQTT device; once another node writes, the device on the
    follower that stayed a follower is still connected on the same socket, and its next
    message is acknowledged (appended by the new writer) and read back."""
    w, a, b = roles
    devices = {a: "stay-a", b: "stay-b"}
    clients = {}
    for node, device in devices.items():
        cluster.create_device(device)
        clients[node] = raw_device_on(cluster, node, device)
        clients[node].publish(f"devices/{device}/messages/events/", b"before", qos=1, pkid=1)
        clients[node].expect_puback(1)
    try:
        cluster.kill_node(w)
        new_writer = cluster.wait_for_writer(other_than=w)
        stayed = b if new_writer == a else a
        device = devices[stayed]
        client = clients[stayed]
        client.publish(f"devices/{device}/messages/events/", b"after", qos=1, pkid=2)
        client.expect_puback(2, timeout=WAIT)
        client.ping()
        read_events_on(cluster, stayed, lambda c: [
            e.body_as_str() for _, e in c.events if ehkit.device_of(e) == device] == ["before", "after"])
    finally:
        for c in clients.values():
            c.close()
        cluster.start_node(w)
        cluster.wait_node_has_device(w, "stay-a")
        cluster.wait_node_serves(w)


def test_each_node_charts_what_its_own_devices_did(cluster, roles):
    """The console's history (`/console/api/history`) is each node's own: messages a device
    sends through a follower are in that follower's points, and the console's provisioning
    overview names the same ID scope on every node."""
    _, a, _ = roles
    token = cluster.token()

    def sent_on(node):
        r = cluster.node_request(node, "GET", "/console/api/history?minutes=60", token)
        assert r.status_code == 200, (node, r.text)
        body = r.json()
        assert body["node"] == node
        return sum(p["deviceMessages"] for p in body["points"])

    before = sent_on(a)
    cluster.create_device("charted-on-a")
    client = device_on(cluster, a, "charted-on-a")
    try:
        client.connect()
        for n in range(12):
            client.send_message(Message(f"m{n}"))
    finally:
        client.shutdown()
    assert sent_on(a) - before == 12

    scopes = {cluster.node_request(n, "GET", "/console/api/provisioning", token).json()["idScope"] for n in NODES}
    assert len(scopes) == 1 and scopes == {cluster.cli("connection-string", "--id-scope")}, scopes


def test_a_policy_changed_through_one_node_signs_on_every_node(cluster, roles):
    """Shared access policies change while the cluster serves: a policy added through a
    follower signs there at once (that node holds the change before it answers) and on every
    other node within seconds (each reads its replica every second); removed through another
    node, it signs nowhere."""
    w, a, b = roles
    owner = cluster.token()
    r = cluster.node_request(a, "PUT", "/console/api/policies/fleet-ops", owner, json={"rights": ["RegistryRead"]})
    assert r.status_code == 200, r.text
    keys = cluster.node_request(a, "GET", "/console/api/policies/fleet-ops/keys", owner).json()
    signed = sas_token(f"localhost:{cluster.port}", keys["primaryKey"], policy="fleet-ops")
    cluster.create_device("policy-everywhere")
    assert cluster.node_request(a, "GET", "/devices/policy-everywhere", signed).status_code == 200

    def status_everywhere(expected):
        deadline = time.time() + 15
        while True:
            got = {n: cluster.node_request(n, "GET", "/devices/policy-everywhere", signed).status_code for n in NODES}
            if all(s == expected for s in got.values()) or time.time() > deadline:
                return got
            time.sleep(0.25)

    assert status_everywhere(200) == {n: 200 for n in NODES}
    r = cluster.node_request(b, "DELETE", "/console/api/policies/fleet-ops", owner)
    assert r.status_code == 200, r.text
    assert cluster.node_request(b, "GET", "/devices/policy-everywhere", signed).status_code == 401
    assert status_everywhere(401) == {n: 401 for n in NODES}
