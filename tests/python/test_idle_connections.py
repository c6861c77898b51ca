"""An MQTT connection that has been quiet for a second gives back its read and write buffers
(issue 19: an idle device should hold no buffer), and the next packets in either direction,
larger than the buffers' starting size, still pass whole. The hub's counter
`ferrohub_mqtt_idle_buffer_releases_total` tells that a release happened."""

import time

import pytest

from hubkit import Hub
from test_c2d import puback, read_publish, send
from test_c2d_locked_on_send import subscribed

RELEASES = "ferrohub_mqtt_idle_buffer_releases_total"


@pytest.fixture
def hub(tmp_path):
    h = Hub(tmp_path / "hub").start()
    yield h
    if h.proc and h.proc.poll() is None:
        h.kill()


def wait_releases(hub, at_least, timeout=10):
    deadline = time.time() + timeout
    while hub.metric(RELEASES) < at_least:
        assert time.time() < deadline, f"no idle release: {hub.metric(RELEASES)} < {at_least}"
        time.sleep(0.1)


def test_a_quiet_connection_releases_its_buffers_and_serves_on(hub):
    hub.create_device("idle1")
    c = subscribed(hub, "idle1")
    before = hub.metric(RELEASES)
    wait_releases(hub, before + 1)
    # Device to hub after the release: a packet many times the buffers' starting size.
    body = bytes(range(256)) * 40
    c.publish("devices/idle1/messages/events/", body, qos=1, pkid=11)
    c.expect_puback(11)
    # Hub to device: a C2D message as large.
    assert send(hub, "idle1", body).status_code == 204
    _, pkid, payload = read_publish(c)
    assert payload == body
    puback(c, pkid)
    # Quiet again: released again; a ping still answers.
    wait_releases(hub, before + 2)
    c.ping()
    c.disconnect()


def test_a_busy_connection_keeps_its_buffers(hub):
    """A device that sends more often than once a second is never quiet long enough."""
    hub.create_device("busy1")
    c = subscribed(hub, "busy1")
    wait_releases(hub, hub.metric(RELEASES) + 1)
    before = hub.metric(RELEASES)
    for i in range(12):
        c.publish("devices/busy1/messages/events/", b"tick", qos=1, pkid=100 + i)
        c.expect_puback(100 + i)
        time.sleep(0.25)
    assert hub.metric(RELEASES) == before
    c.disconnect()
