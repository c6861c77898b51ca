"""CLU: a three-node cluster on a three-server NATS JetStream cluster, behind HAProxy on the
SDKs' fixed ports (scripts/run-cluster.sh): the official SDKs work through it unchanged, every
node's replica follows the writer, and the hub survives SIGKILL of the writer node and of a NATS
server with nothing acknowledged lost; with two NATS servers down writes are refused and every
node stops serving within the lease, nothing is corrupted, and service resumes when they return. NATS lets in only the
hubs' users over verified TLS, a node it refuses stops with the reason, and NATS stores no
private key in clear.

One cluster for the module (fixed ports); the tests run in order and each leaves every process
running again."""

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from azure.iot.device import IoTHubDeviceClient, Message, MethodResponse
from azure.iot.hub import IoTHubRegistryManager
from azure.iot.hub.models import CloudToDeviceMethod, Twin

import ehkit
from clusterkit import Cluster
from hubkit import Hub, binary
from mqttraw import RawMqtt

WAIT = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster")).start()
    yield c
    c.stop()


@pytest.fixture
def registry(cluster, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", cluster.ca)
    mgr = IoTHubRegistryManager.from_connection_string(cluster.connection_string("iothubowner", with_port=False))
    mgr.protocol.config.connection.verify = cluster.ca
    return mgr


def device_client(cluster, device_id):
    return IoTHubDeviceClient.create_from_connection_string(
        cluster.device_connection_string(device_id), server_verification_cert=open(cluster.ca).read())


def telemetry_of(cluster, device_id, n, timeout=WAIT):
    """The bodies of `device_id`'s events, read with the Event Hubs SDK through the cluster,
    once at least `n` are there and every partition then fell idle (so extra events would
    show). The balancer may send the reader to a follower whose replica applies the writer's
    entries a moment later: reading until the first idle spell could end before they arrive."""
    client = ehkit.consumer(cluster)
    partitions = set(client.get_partition_ids())
    collector = ehkit.Collector()
    ehkit.receive_in_background(client, collector, starting_position="-1")

    def mine(c):
        return [e.body_as_str() for _, e in c.events if ehkit.device_of(e) == device_id]

    try:
        collector.wait_for(lambda c: len(mine(c)) >= n, timeout)
        collector.wait_for(lambda c: c.idle_partitions >= partitions, timeout)
        bodies = mine(collector)
    finally:
        client.close()
    assert len(bodies) >= n, f"{len(bodies)} of {n} events of {device_id}; errors {collector.errors}"
    return bodies


def test_replicas_follow_the_writer(cluster):
    cluster.create_device("replicated")
    for node in ("hub1", "hub2", "hub3"):
        cluster.wait_node_has_device(node, "replicated")
    # Settings and policies came through the log too: every node prints the same credentials.
    owners = {cluster.node_cli(node, "connection-string") for node in ("hub1", "hub2", "hub3")}
    assert len(owners) == 1 and "SharedAccessKeyName=iothubowner" in owners.pop()


def test_sdks_work_through_the_cluster(cluster, registry):
    cluster.create_device("sdk-dev")
    client = device_client(cluster, "sdk-dev")
    patches, c2d = [], []
    got_patch, got_c2d = threading.Event(), threading.Event()

    def on_patch(p):
        patches.append(p)
        got_patch.set()

    def on_message(m):
        c2d.append(m.data.decode())
        got_c2d.set()

    def on_method(request):
        client.send_method_response(MethodResponse.create_from_method_request(request, 200, {"echo": request.payload}))

    try:
        client.connect()
        client.on_twin_desired_properties_patch_received = on_patch
        client.on_message_received = on_message
        client.on_method_request_received = on_method
        for i in range(5):
            client.send_message(Message(json.dumps({"i": i}), content_encoding="utf-8", content_type="application/json"))
        client.patch_twin_reported_properties({"fw": "1.0"})

        registry.update_twin("sdk-dev", Twin(properties={"desired": {"interval": 7}}), "*")
        assert got_patch.wait(WAIT), "desired patch never reached the device"
        assert patches[-1]["interval"] == 7

        result = registry.invoke_device_method("sdk-dev", CloudToDeviceMethod(method_name="ping", payload={"n": 1}, response_timeout_in_seconds=10))
        assert result.status == 200 and result.payload == {"echo": {"n": 1}}

        r = cluster.request("POST", "/devices/sdk-dev/messages/deviceBound", cluster.token(), data=b"to-device")
        assert r.status_code == 204, r.text
        assert got_c2d.wait(WAIT) and c2d == ["to-device"]

        twin = registry.get_twin("sdk-dev")
        assert twin.properties.reported["fw"] == "1.0"
    finally:
        client.shutdown()
    assert telemetry_of(cluster, "sdk-dev", 5) == [json.dumps({"i": i}) for i in range(5)]


def test_writer_killed_loses_nothing_acknowledged(cluster, registry):
    first = cluster.wait_for_writer()
    cluster.create_device("before-kill")
    registry.update_twin("before-kill", Twin(tags={"site": "a"}, properties={"desired": {"v": 1}}), "*")
    client = device_client(cluster, "before-kill")
    try:
        client.connect()
        for i in range(20):
            client.send_message(f"m{i}")  # returns once PUBACKed: acknowledged
        cluster.kill_node(first)
        killed_at = time.time()
        second = cluster.wait_for_writer(timeout=60, other_than=first)
        failover = time.time() - killed_at
        print(f"failover {first} -> {second}: {failover:.1f} s")
        # The device SDK reconnects by itself, to the new writer, and goes on sending.
        client.send_message("after-failover")
    finally:
        client.shutdown()

    r = cluster.request("GET", "/twins/before-kill", cluster.token())
    assert r.status_code == 200, r.text
    assert r.json()["tags"] == {"site": "a"} and r.json()["properties"]["desired"]["v"] == 1
    bodies = telemetry_of(cluster, "before-kill", 21)
    assert bodies[:20] == [f"m{i}" for i in range(20)]
    assert "after-failover" in bodies
    cluster.create_device("after-kill")

    # The killed node comes back as a follower and catches up.
    cluster.start_node(first)
    cluster.wait_node_has_device(first, "after-kill")
    assert cluster.writer() == second


def test_a_nats_server_killed_changes_nothing_for_clients(cluster):
    cluster.kill_node("nats1")
    try:
        # The stream and lease keep a majority; a write may wait out a leader election. An
        # election longer than the lease also stops the followers serving (no node can show it
        # holds the log's end meanwhile), and a write forwarded by one then ends in a 503 whose
        # outcome is unknown, as IoT Hub's 503s are: its retry may find the device created.
        deadline, unknown_outcome = time.time() + WAIT, False
        while True:
            try:
                r = cluster.request("PUT", "/devices/nats-down", cluster.token(), json={"deviceId": "nats-down"})
            except OSError as e:
                assert time.time() < deadline, e
                unknown_outcome = True
                time.sleep(0.5)
                continue
            if r.status_code == 200 or (r.status_code == 409 and unknown_outcome):
                break
            assert r.status_code == 503 and time.time() < deadline, (r.status_code, r.text)
            unknown_outcome = True
            time.sleep(0.5)
            cluster.wait_for_writer()
        assert cluster.request("GET", "/devices/before-kill", cluster.token()).status_code == 200
    finally:
        cluster.start_node("nats1")
    for node in ("hub1", "hub2", "hub3"):
        cluster.wait_node_has_device(node, "nats-down")


def test_two_nats_servers_down_refuse_writes_then_recover(cluster):
    """Without a majority of NATS servers the log takes nothing and no node can know it holds
    the log's end: writes are refused, and within the lease every node stops serving rather
    than answer from state that may be stale (docs/cluster.md, "Standing")."""
    cluster.wait_for_writer()
    cluster.kill_node("nats2")
    cluster.kill_node("nats3")
    try:
        try:
            r = cluster.request("PUT", "/devices/no-quorum", cluster.token(), json={"deviceId": "no-quorum"})
            assert r.status_code == 503 and "ServiceUnavailable" in r.text, (r.status_code, r.text)
        except OSError:
            pass  # the writer's lease ran out while the append waited: it closed the connection
        deadline, states = time.time() + 15, None
        while True:
            states = {n: cluster.standing(n) for n in ("hub1", "hub2", "hub3")}
            if not any(s and s["serving"] for s in states.values()):
                break
            assert time.time() < deadline, f"nodes still serving without a NATS majority: {states}"
            time.sleep(0.2)
        # Through the balancer: no answer at all, never a stale one.
        with pytest.raises(OSError):
            cluster.request("GET", "/devices/before-kill", cluster.token())
    finally:
        cluster.start_node("nats2")
        cluster.start_node("nats3")
    deadline = time.time() + 90
    while True:
        try:
            cluster.wait_for_writer(timeout=10)
            r = cluster.request("PUT", "/devices/quorum-back", cluster.token(), json={"deviceId": "quorum-back"})
            if r.status_code == 200:
                break
        except (AssertionError, OSError) as e:
            r = e
        assert time.time() < deadline, f"writes did not resume: {r}\n{cluster.logs()}"
        time.sleep(1)
    # Nothing acknowledged before was lost.
    assert cluster.request("GET", "/devices/after-kill", cluster.token()).status_code == 200
    for node in ("hub1", "hub2", "hub3"):
        cluster.wait_node_has_device(node, "quorum-back")
    # The refused write's outcome is unknown to its client (as any 503's), but every replica
    # agrees on it: the log decided.
    held = {cluster.node_has_device(node, "no-quorum") for node in ("hub1", "hub2", "hub3")}
    assert len(held) == 1


def stray_node(cluster, tmp_path, data_dir, section: str, timeout: float = 120):
    """Runs `ferrohub serve` for one more node (on 127.0.0.5) with `section` as its `[cluster]`;
    returns once it exits."""
    config = tmp_path / "stray.toml"
    config.write_text('[listeners]\nhttps = "127.0.0.5:0"\nmqtt = "127.0.0.5:0"\namqp = "127.0.0.5:0"\n'
                      'mqtt_quic = "127.0.0.5:0"\nmetrics = "127.0.0.5:0"\n' + section)
    return subprocess.run([binary(), "serve", "--data-dir", str(data_dir), "--config", str(config)],
                          capture_output=True, text=True, timeout=timeout)


def nats_handshake(host: str, ca: str, user: str | None = None, password: str | None = None) -> str:
    """Speaks the NATS client protocol to `host`:4222 as far as the server's answer to CONNECT
    and PING (after the TLS upgrade the server asks for, verified with `ca`); returns what it
    said."""
    import socket
    import ssl
    with socket.create_connection((host, 4222), timeout=10) as raw:
        info = raw.recv(4096).decode()
        assert info.startswith("INFO "), info
        assert json.loads(info[5:])["tls_required"], "the server lets clients in without TLS"
        ctx = ssl.create_default_context(cafile=ca)
        with ctx.wrap_socket(raw, server_hostname=host) as s:
            connect = {"verbose": False, "pedantic": False, "tls_required": True, "name": "test"}
            if user is not None:
                connect.update(user=user, **{"pass": password})
            s.sendall(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
            said = b""
            while b"\r\n" not in said:
                chunk = s.recv(4096)
                if not chunk:
                    break
                said += chunk
            return said.decode(errors="replace")


def test_nats_lets_in_only_the_hubs_users_over_tls(cluster):
    """Whoever reaches NATS reaches every key the hub holds: the servers take TLS only, and only
    the hubs' users."""
    ca = str(cluster.secrets / "nats-ca.pem")
    for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        assert "Authorization Violation" in nats_handshake(host, ca)
        assert "Authorization Violation" in nats_handshake(host, ca, "hub1", "not-the-password")
        password = (cluster.secrets / "hub1.password").read_text().strip()
        assert "PONG" in nats_handshake(host, ca, "hub1", password)
    # The routes between the servers verify each other's certificates too.
    config = (cluster.root / "conf" / "nats1.conf").read_text()
    assert "verify: true" in config.split("cluster {")[1]


def test_a_node_refused_by_nats_stops_with_the_reason(cluster, tmp_path):
    """Wrong credentials, NATS certificates signed by a CA the node was not given, or a cluster
    secret other than the one the material was sealed with: the node stops at once and says
    why, instead of retrying for ever or serving with other material."""
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    other_secret = tmp_path / "other.secret"
    other_secret.write_text("ab" * 32 + "\n")
    cases = [
        ("password", cluster.cluster_section("stray", password_file=wrong), "NATS refused this node"),
        # The hub's own CA is a real CA, but not the one that signed the NATS servers' certificates.
        ("ca", cluster.cluster_section("stray", ca_file=Path(cluster.ca)), "no verified TLS connection to NATS"),
        ("secret", cluster.cluster_section("stray", secret_file=other_secret), "sealed with another cluster secret"),
    ]
    for name, section, reason in cases:
        started = time.time()
        out = stray_node(cluster, tmp_path, tmp_path / f"data-{name}", section, timeout=60)
        assert out.returncode != 0, name
        assert reason in out.stderr, f"{name}: {out.stderr[-2000:]}"
        assert time.time() - started < 30, f"{name}: the node retried instead of stopping"
    assert cluster.request("GET", "/devices", cluster.token()).status_code == 200


def test_nats_stores_no_private_key_in_clear(cluster):
    """What the NATS servers store (the commit log, the lease and the shared TLS material)
    holds the hub's private keys only sealed with the cluster's secret."""
    keys = [p for p in (cluster.root / "hub1" / "tls").glob("*key.pem")]
    assert keys, "the hub has private keys"
    # The lines of each key's base64 body: any one of them found in clear is a leak.
    bodies = [line.encode() for k in keys for line in k.read_text().splitlines() if "-----" not in line and len(line) > 20]
    sealed = 0
    for n in (1, 2, 3):
        for f in (cluster.root / f"nats{n}").rglob("*"):
            if not f.is_file():
                continue
            data = f.read_bytes()
            assert b"PRIVATE KEY" not in data, f"a private key in clear in {f}"
            assert not any(b in data for b in bodies), f"a private key's body in clear in {f}"
            sealed += data.count(b"ferrohub-sealed-v1")
    assert sealed >= 3, "every NATS server holds the sealed TLS material (the scan read its files)"


def test_nats_taking_smaller_messages_than_a_log_entry_is_refused(cluster, tmp_path):
    """A nats-server's stock max_payload (1 MB) is below the commit log's largest entry: the
    node says so at start instead of failing its first large commit group."""
    import os
    import socket
    nats = Path(os.environ.get("FERROHUB_NATS", Path.home() / ".cache" / "ferrohub" / "nats")) / "bin" / "nats-server"
    conf = tmp_path / "small.conf"
    conf.write_text(f'listen: 127.0.0.6:4222\nmax_payload: 1MB\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n')
    server = subprocess.Popen([str(nats), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.6", 4222), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "the small nats-server does not listen"
                time.sleep(0.1)
        section = ('[cluster]\nnats = ["nats://127.0.0.6:4222"]\nnode = "small"\nreplicas = 1\n'
                   f'secret_file = "{cluster.secrets / "cluster.secret"}"\n')
        out = stray_node(cluster, tmp_path, tmp_path / "data", section, timeout=60)
        assert out.returncode != 0
        assert "set max_payload to at least 8MB" in out.stderr, out.stderr[-2000:]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_single_nodes_directory_cannot_join(cluster, tmp_path):
    """A hub served as a single node holds state that is in no log: joining would split the
    replicas, so the node refuses with a clear error and changes nothing."""
    single = Hub(tmp_path / "single").start()
    single.create_device("only-here")
    single.stop()
    out = stray_node(cluster, tmp_path, single.data_dir, cluster.cluster_section("stray"))
    assert out.returncode != 0
    assert "cannot join a cluster" in out.stderr, out.stderr[-2000:]
    assert cluster.request("GET", "/devices/only-here", cluster.token()).status_code == 404
    again = Hub(single.data_dir).start()
    try:
        assert again.request("GET", "/devices/only-here", again.token()).status_code == 200
    finally:
        again.stop()
