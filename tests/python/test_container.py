"""The container image (docs/container.md): scripts/build-image.sh builds it from the release
binary, podman runs it in a network namespace of the test's own (the e2e group's, or one this
module makes), with the SDKs' ports published
on that namespace's loopback, and the official SDKs use it as they would IoT Hub: telemetry
sent and read back, twins patched from both sides, and all of it still there in a new container
on the same volume. The image itself: under 100 MB, labelled, not root, healthy.

Skipped, saying why, where podman cannot run a container (not root, no podman, no runtime)."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest
import requests
from azure.iot.device import IoTHubDeviceClient, Message
from azure.iot.hub import IoTHubRegistryManager
from azure.iot.hub.models import Twin, TwinProperties

import containerkit
import ehkit
from containerkit import HubContainer, NetworkNamespace, Volume, podman
from hubkit import REPO, binary, parse_cs

# Building the image and two hub starts take well under a minute; the SDKs' first connections
# and the Event Hubs reads add seconds each.
pytestmark = pytest.mark.timeout(300)

APP_UID = "10001"
MESSAGES = 20
# Configured through the environment, as the image documents it.
ENV = {"FERROHUB_HOST_NAME": "localhost", "FERROHUB_HUB_NAME": "e2e-hub", "FERROHUB_LOG_FORMAT": "json"}


@pytest.fixture(scope="module")
def image():
    why = containerkit.unavailable()
    if why:
        pytest.skip(why)
    tag = f"localhost/ferrohub-e2e:{os.getpid()}"
    containerkit.build_image(tag, binary())
    try:
        why = containerkit.cannot_run(tag)
        if why:
            pytest.skip(why)
        yield tag
    finally:
        podman("rmi", "--force", tag, check=False)


@pytest.fixture(scope="module")
def hub(image, tmp_path_factory):
    """A hub container on a fresh volume, in a network namespace of this module's own."""
    with NetworkNamespace():
        volume = Volume(f"ferrohub-e2e-{os.getpid()}")
        h = HubContainer(image, f"ferrohub-e2e-{os.getpid()}", volume, ENV, tmp_path_factory.mktemp("ca") / "ca.pem")
        try:
            yield h.run()
        finally:
            h.remove()
            volume.remove()


@pytest.fixture
def registry(hub, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", hub.ca)
    mgr = IoTHubRegistryManager.from_connection_string(hub.cli("connection-string"))
    mgr.protocol.config.connection.verify = hub.ca
    return mgr


def test_image_is_small_labelled_and_unprivileged(image):
    cfg = containerkit.image_config(image)
    size_mb = cfg["Size"] / 1e6
    print(f"image {image}: {size_mb:.1f} MB")
    assert size_mb < 100
    labels = cfg["Labels"]
    version = subprocess.run([binary(), "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    assert labels["org.opencontainers.image.version"] == version
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    assert labels["org.opencontainers.image.revision"].startswith(head)
    config = cfg["Config"]
    assert config["User"] == f"{APP_UID}:{APP_UID}"
    assert "/data" in config["Volumes"]
    assert {"443/tcp", "8883/tcp", "5671/tcp", "14567/udp", "9464/tcp"} <= set(config["ExposedPorts"])
    assert config["StopSignal"] == "SIGTERM"
    assert cfg["Healthcheck"]["Test"] == ["CMD", "/usr/local/bin/ferrohub-healthcheck"]


def test_first_start_configured_by_the_environment(hub):
    logs = hub.logs()
    assert 'Initialised hub "e2e-hub" in /data' in logs
    # The banner's connection strings are the ones the CLI prints later, inside the container.
    owner = hub.cli("connection-string")
    assert owner.startswith("HostName=localhost;SharedAccessKeyName=iothubowner;")
    assert owner in logs.splitlines()
    assert hub.cli("connection-string", "--policy", "service", "--event-hubs").endswith(";EntityPath=e2e-hub")
    # FERROHUB_LOG_FORMAT=json: every log line (stderr) is a JSON object.
    records = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    assert any(r.get("message") == "listening" for r in records), logs[-2000:]
    # The hub is not root in its container, yet bound the SDKs' port 443 there.
    assert f"Uid:\t{APP_UID}\t" in hub.exec("cat", "/proc/1/status")
    assert "listening https=[::]:443" in logs
    # The CA run() copied from the volume is the hub's own (the SDK calls below trust it).
    assert open(hub.ca).read().strip() == hub.exec("cat", "/data/tls/ca.pem")
    # And the one served over HTTP on the published health port.
    served = requests.get(f"http://127.0.0.1:{containerkit.PORTS['metrics']}/ca.pem", timeout=5)
    assert served.status_code == 200 and served.text.strip() == open(hub.ca).read().strip()


def test_health_check_reports_healthy(hub):
    assert hub.health() == (0, "healthy")


def device_client(hub, device_cs: str) -> IoTHubDeviceClient:
    return IoTHubDeviceClient.create_from_connection_string(device_cs, server_verification_cert=open(hub.ca).read())


def send_telemetry(client: IoTHubDeviceClient) -> None:
    for i in range(MESSAGES):
        m = Message(json.dumps({"i": i}))
        m.message_id = f"c-{i}"
        m.custom_properties["n"] = str(i)
        client.send_message(m)


def read_back(hub, device_id: str) -> list:
    """The device's events, read from the start with the Event Hubs SDK (about 15 s here: the
    SDK's links take their time, as in test_event_hubs.py)."""
    events = [e for _, e in ehkit.read(hub, MESSAGES, starting_position="-1").events if ehkit.device_of(e) == device_id]
    return sorted(events, key=lambda e: e.sequence_number)


def check_events(events: list) -> None:
    assert [json.loads(e.body_as_str()) for e in events] == [{"i": i} for i in range(MESSAGES)]
    assert [ehkit.prop(e, "n") for e in events] == [str(i) for i in range(MESSAGES)]


def test_telemetry_and_twins_outlive_the_container(hub, registry):
    device = registry.create_device_with_sas("box-1", None, None, "enabled")
    keys = device.authentication.symmetric_key
    device_cs = hub.cli("connection-string", "--device", "box-1")
    assert parse_cs(device_cs)["SharedAccessKey"] == keys.primary_key

    client = device_client(hub, device_cs)
    patches, patched = [], threading.Event()

    def on_patch(patch):
        patches.append(patch)
        if "interval" in patch:
            patched.set()

    client.on_twin_desired_properties_patch_received = on_patch
    try:
        client.connect()
        send_telemetry(client)
        client.patch_twin_reported_properties({"firmware": "1.2.3"})
        registry.update_twin("box-1", Twin(tags={"site": "north"}, properties=TwinProperties(desired={"interval": 5})), "*")
        assert patched.wait(30), f"the desired patch never reached the device: {patches}"
        assert patches[-1]["interval"] == 5
    finally:
        client.shutdown()

    # A new container from the image on the same volume: what upgrading the image looks like.
    # Every send above was acknowledged, so all of it must be read back from the new one.
    assert hub.stop() == 0, hub.logs()[-3000:]
    assert "store closed" in hub.logs()
    hub.remove()
    hub.run()
    assert hub.logs().count("Initialised hub") == 0
    assert hub.health() == (0, "healthy")

    assert registry.get_device("box-1").authentication.symmetric_key.primary_key == keys.primary_key
    twin = registry.get_twin("box-1")
    assert twin.tags == {"site": "north"}
    assert twin.properties.desired["interval"] == 5
    assert twin.properties.reported["firmware"] == "1.2.3"
    check_events(read_back(hub, "box-1"))
    # The device connects to the new container with the same credentials.
    client = device_client(hub, device_cs)
    try:
        client.connect()
        assert client.get_twin()["reported"]["firmware"] == "1.2.3"
    finally:
        client.shutdown()
