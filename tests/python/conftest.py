import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hubkit import Hub, binary  # noqa: E402


def pytest_sessionstart(session):
    if not os.path.exists(binary()):
        raise pytest.UsageError(f"ferrohub binary not found at {binary()}; run cargo build --release first")


@pytest.fixture
def hub(tmp_path):
    h = Hub(tmp_path / "hub").start()
    yield h
    if h.proc and h.proc.poll() is None:
        h.kill()


@pytest.fixture
def owner(hub):
    """An iothubowner token for the hub."""
    return hub.token("iothubowner")


@pytest.fixture(scope="module")
def sdk_hub(tmp_path_factory):
    """A hub on the fixed ports the official SDKs use (8883, 443, 5671): one per test module,
    so modules that use it run one after another. With FERROHUB_TEST_CLUSTER=1 it is a
    three-node cluster behind HAProxy on those ports instead (clusterkit, docs/cluster.md)."""
    if os.environ.get("FERROHUB_TEST_CLUSTER") == "1":
        from clusterkit import Cluster

        c = Cluster(tmp_path_factory.mktemp("sdk-cluster")).start()
        yield c
        c.stop()
        return
    h = Hub(tmp_path_factory.mktemp("sdk") / "hub")
    h.https_addr, h.mqtt_addr, h.amqp_addr = "127.0.0.1:443", "127.0.0.1:8883", "127.0.0.1:5671"
    h.start()
    yield h
    h.stop()
