"""CLU: restoring a cluster. A hub backed up from a single node (`ferrohub backup`, the whole
database) or restored from an export starts a new cluster: its node seeds the empty commit log
with the hub, the other nodes apply it, and devices and back-ends carry on with the same keys,
twins, queued C2D messages and stored events. `scripts/run-cluster.sh --seed FROM DIR`."""

import subprocess

import pytest
from azure.iot.device import IoTHubDeviceClient

import ehkit
from clusterkit import Cluster, c2d_inbox
from hubkit import Hub, binary, sas_token

WAIT = 30


def dev_token(hub, device_id):
    return sas_token(f"localhost/devices/{device_id}", hub.device_key(device_id))


@pytest.fixture(scope="module")
def backed_up(tmp_path_factory):
    """A single node's hub, used and stopped, then backed up; returns (backup dir, what it held)."""
    root = tmp_path_factory.mktemp("single")
    single = Hub(root / "hub").start()
    try:
        for i in range(5):
            single.create_device(f"r-{i}")
            single.set_tags(f"r-{i}", {"site": "old", "n": i})
        r = single.request("POST", "/devices/r-0/messages/deviceBound", single.token(), data=b"queued-before",
                           headers={"iothub-messageid": "before-1"})
        assert r.status_code == 204, r.text
        for i in range(3):
            r = single.request("POST", "/devices/r-1/messages/events", dev_token(single, "r-1"), data=f"e{i}".encode())
            assert r.status_code == 204, r.text
        held = {
            "owner": single.connection_string("iothubowner", with_port=False),
            "device": single.device_connection_string("r-0"),
        }
    finally:
        single.stop()
    done = subprocess.run([binary(), "backup", "--data-dir", str(root / "hub"), "--to", str(root / "backup")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return root / "backup", held


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, backed_up):
    backup, _ = backed_up
    c = Cluster(tmp_path_factory.mktemp("restored")).start(seed=backup)
    yield c
    c.stop()


def test_the_restored_cluster_is_the_same_hub(cluster, backed_up):
    _, held = backed_up
    assert cluster.writer() == "hub1", "the seeded node writes first"
    # Same policies and keys: the old connection strings work against the cluster.
    assert cluster.connection_string("iothubowner", with_port=False) == held["owner"]
    for i in range(5):
        r = cluster.request("GET", f"/twins/r-{i}", cluster.token())
        assert r.status_code == 200, r.text
        assert r.json()["tags"] == {"site": "old", "n": i}
    # Every node's replica got the hub from the seed.
    for node in ("hub2", "hub3"):
        cluster.wait_node_has_device(node, "r-4")
    stats = cluster.request("GET", "/statistics/devices", cluster.token()).json()
    assert stats["totalDeviceCount"] == 5


def test_devices_carry_on_with_their_old_credentials_and_queue(cluster, backed_up):
    _, held = backed_up
    client = IoTHubDeviceClient.create_from_connection_string(held["device"], server_verification_cert=open(cluster.ca).read())
    got, arrived = c2d_inbox(client)
    try:
        client.connect()
        assert arrived.wait(WAIT), "the message queued before the backup never arrived"
        assert got == [("before-1", "queued-before")]
    finally:
        client.shutdown()


def test_stored_events_and_new_writes(cluster):
    collector = ehkit.read(cluster, 3, starting_position="-1")
    bodies = [e.body_as_str() for _, e in collector.events if ehkit.device_of(e) == "r-1"]
    assert bodies == ["e0", "e1", "e2"]
    cluster.create_device("after-restore")
    for node in ("hub1", "hub2", "hub3"):
        cluster.wait_node_has_device(node, "after-restore")
