"""packaging/compose.yaml (docs/container.md, "A cluster in one compose file"): podman-compose
brings up three nats-servers, three hub nodes of the ferrohub image and HAProxy in a network
namespace this module makes; the official SDKs work through the balancer, and the hub goes on
with nothing acknowledged lost when the writer's container is SIGKILLed. `--full` only.

The nats-server and HAProxy images are built here from the pinned nats-server and Debian's
HAProxy (scripts/build-compose-images.sh), since no registry is reachable. Skipped, saying why,
where podman cannot run a container."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from azure.iot.device import IoTHubDeviceClient
from azure.iot.hub import IoTHubRegistryManager
from azure.iot.hub.models import Twin

import containerkit
import ehkit
from containerkit import Compose, NetworkNamespace, podman
from hubkit import binary

pytestmark = pytest.mark.timeout(600)

WAIT = 60


@pytest.fixture(scope="module")
def images():
    why = containerkit.unavailable() or (None if shutil.which("podman-compose") else
                                         "podman-compose is not installed (scripts/lib.sh: ensure_container_tools)")
    if why:
        pytest.skip(why)
    images = {"FERROHUB_IMAGE": f"localhost/ferrohub-e2e-cluster:{os.getpid()}"}
    try:
        containerkit.build_image(images["FERROHUB_IMAGE"], binary())
        why = containerkit.cannot_run(images["FERROHUB_IMAGE"])
        if why:
            pytest.skip(why)
        images.update(containerkit.build_compose_images())
        yield images
    finally:
        podman("rmi", "--force", *images.values(), check=False)


@pytest.fixture(scope="module")
def cluster(images, tmp_path_factory):
    with NetworkNamespace():
        c = Compose(tmp_path_factory.mktemp("compose"), f"fhe2e{os.getpid()}", images)
        try:
            yield c.up()
        finally:
            c.down()


@pytest.fixture
def registry(cluster, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", cluster.ca)
    mgr = IoTHubRegistryManager.from_connection_string(cluster.cli("connection-string"))
    mgr.protocol.config.connection.verify = cluster.ca
    return mgr


def device_client(cluster, device_cs):
    return IoTHubDeviceClient.create_from_connection_string(device_cs, server_verification_cert=open(cluster.ca).read())


def bodies_of(cluster, device_id: str, n: int) -> list[str]:
    events = ehkit.read(cluster, n, timeout=WAIT, starting_position="-1").events
    return [e.body_as_str() for _, e in sorted(events, key=lambda pe: pe[1].sequence_number)
            if ehkit.device_of(e) == device_id]


def test_every_node_serves_the_same_hub(cluster):
    owners = {cluster.cli("connection-string", node=n) for n in ("hub1", "hub2", "hub3")}
    assert len(owners) == 1
    assert cluster.writer() in ("hub1", "hub2", "hub3")


def test_the_writer_killed_loses_nothing_acknowledged(cluster, registry):
    registry.create_device_with_sas("boxed", None, None, "enabled")
    registry.update_twin("boxed", Twin(tags={"site": "b"}), "*")
    client = device_client(cluster, cluster.cli("connection-string", "--device", "boxed"))
    first = cluster.writer()
    try:
        client.connect()
        for i in range(20):
            client.send_message(f"m{i}")  # returns once PUBACKed: acknowledged
        cluster.kill(first)
        killed_at = time.time()
        second = cluster.wait_for_writer(WAIT, other_than=first)
        print(f"failover {first} -> {second}: {time.time() - killed_at:.1f} s")
        # The SDK reconnects through the balancer by itself and goes on sending.
        client.send_message("after-failover")
    finally:
        client.shutdown()

    assert registry.get_twin("boxed").tags == {"site": "b"}
    bodies = bodies_of(cluster, "boxed", 21)
    assert bodies[:20] == [f"m{i}" for i in range(20)]
    assert "after-failover" in bodies
    # The killed node's container starts again on its volume and serves as a follower.
    cluster.start(first)
    cluster.wait_serving(first, WAIT)
