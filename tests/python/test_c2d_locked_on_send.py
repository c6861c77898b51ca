"""A C2D send to a device whose MQTT connection is receiving and whose queue is empty locks the
message for that connection in the send's own commit and hands it over (issue 19: one commit
instead of a send and the connection's receive). Driven through raw MQTT and the HTTPS
service API, with the hub's own counter (`ferrohub_c2d_locked_on_send_total`) telling which
path a message took: what a device sees, and the queue it leaves, must not depend on it."""

import struct
import time

import pytest

from hubkit import Hub
from mqttraw import connect_device, packet
from test_c2d import bag, puback, read_publish, receive, send

LOCKED = "ferrohub_c2d_locked_on_send_total"
UNSUBSCRIBE, UNSUBACK = 10, 11


def start(tmp_path, lock_timeout):
    config = tmp_path / "hub.toml"
    config.write_text(f'[c2d]\nlock_timeout = "{lock_timeout}"\nmax_delivery_count = 3\n')
    return Hub(tmp_path / "hub").start(["--config", str(config)])


@pytest.fixture
def hub(tmp_path):
    h = start(tmp_path, "60s")
    yield h
    if h.proc and h.proc.poll() is None:
        h.kill()


def subscribed(hub, device_id, clean=False):
    c = connect_device(hub, device_id, clean=clean)
    assert c.subscribe([(f"devices/{device_id}/messages/devicebound/#", 1)]) == [1]
    return c


def unsubscribe(c, topic, pkid=7):
    body = struct.pack("!H", pkid) + struct.pack("!H", len(topic)) + topic.encode()
    c.send(packet(UNSUBSCRIBE, 2, body))
    while True:
        ptype, _, rest = c.read()
        if ptype == UNSUBACK:
            assert struct.unpack("!H", rest[:2])[0] == pkid
            return


def wait_empty(hub, device_id, timeout=10):
    """The queue holds nothing (a device's PUBACK completes asynchronously)."""
    deadline = time.time() + timeout
    while hub.request("GET", f"/devices/{device_id}", hub.token()).json()["cloudToDeviceMessageCount"]:
        assert time.time() < deadline, "the acknowledged messages stay queued"
        time.sleep(0.05)


def test_an_empty_queue_is_locked_on_send_and_a_message_behind_one_in_flight_is_fetched(hub):
    hub.create_device("d1")
    c = subscribed(hub, "d1")
    before = hub.metric(LOCKED)
    send(hub, "d1", b"one", iothub_messageid="1")
    topic1, pkid1, payload = read_publish(c)
    assert payload == b"one" and bag(topic1)["$.mid"] == "1"
    assert hub.metric(LOCKED) - before == 1
    # "one" is in flight (locked, unacknowledged): "two" queues behind it and is fetched.
    send(hub, "d1", b"two", iothub_messageid="2")
    topic2, pkid2, payload = read_publish(c)
    assert payload == b"two" and bag(topic2)["$.mid"] == "2" and pkid2 != pkid1
    assert hub.metric(LOCKED) - before == 1
    puback(c, pkid1)
    puback(c, pkid2)
    wait_empty(hub, "d1")
    # Empty again: locked on send again; the PUBACK completes it as any message.
    send(hub, "d1", b"three")
    _, pkid3, payload = read_publish(c)
    assert payload == b"three"
    assert hub.metric(LOCKED) - before == 2
    puback(c, pkid3)
    wait_empty(hub, "d1")
    assert receive(hub, "d1").status_code == 204
    c.disconnect()


def test_no_lock_on_send_without_a_receiving_subscription(hub):
    hub.create_device("d2")
    before = hub.metric(LOCKED)
    # Connected, never subscribed (a clean session): the message waits in the queue unlocked,
    # and the device's HTTPS receive gets it at once.
    c = connect_device(hub, "d2", clean=True)
    send(hub, "d2", b"queued")
    r = receive(hub, "d2")
    assert r.status_code == 200 and r.content == b"queued"
    assert r.headers["iothub-deliverycount"] == "1"
    c.disconnect()
    # Subscribed, then unsubscribed: the same.
    c = subscribed(hub, "d2", clean=True)
    unsubscribe(c, "devices/d2/messages/devicebound/#")
    send(hub, "d2", b"after unsubscribe")
    time.sleep(0.3)
    r2 = receive(hub, "d2")
    assert r2.status_code == 200 and r2.content == b"after unsubscribe"
    assert hub.metric(LOCKED) == before
    c.disconnect()


def test_a_message_locked_on_send_is_not_held_by_a_connection_that_ends(hub):
    """The lock is a minute long; the unacknowledged message still reaches the device's next
    connection at once, and counts the first delivery."""
    hub.create_device("d3")
    c = subscribed(hub, "d3")
    before = hub.metric(LOCKED)
    send(hub, "d3", b"once", iothub_messageid="x")
    _, _, payload = read_publish(c)
    assert payload == b"once" and hub.metric(LOCKED) - before == 1
    c.sock.close()  # no PUBACK
    c2 = connect_device(hub, "d3")  # the persistent session still subscribes
    started = time.time()
    topic, pkid, payload = read_publish(c2, timeout=10)
    assert payload == b"once" and time.time() - started < 10
    puback(c2, pkid)
    wait_empty(hub, "d3")
    c2.disconnect()


def test_many_sends_to_receiving_devices_all_arrive_once_in_order(hub):
    """Sends racing PUBACKs: each message takes one path or the other, none is lost, none
    delivered twice, and every queue ends empty."""
    devices = [f"r{i}" for i in range(4)]
    clients = {}
    for d in devices:
        hub.create_device(d)
        clients[d] = subscribed(hub, d)
    for n in range(12):
        for d in devices:
            send(hub, d, f"{d}-{n}".encode(), iothub_messageid=str(n))
    for d, c in clients.items():
        got = []
        while len(got) < 12:
            topic, pkid, payload = read_publish(c)
            got.append(payload.decode())
            puback(c, pkid)
        assert got == [f"{d}-{n}" for n in range(12)]
        with pytest.raises(TimeoutError):
            read_publish(c, timeout=0.5)
    for d in devices:
        wait_empty(hub, d)
        clients[d].disconnect()


def test_sends_racing_reconnects_lose_nothing_and_hold_nothing(hub):
    """Sends while the device's connection keeps dropping and coming back, some without
    acknowledging: every message still arrives, and the queue empties well within the
    one-minute lock, so no message locked on send was left holding a lock nobody would
    publish."""
    import threading

    hub.create_device("race")
    total = 120
    sent = threading.Event()

    def sender():
        for n in range(total):
            assert send(hub, "race", f"m{n}".encode(), iothub_messageid=str(n)).status_code == 204
            time.sleep(0.002)
        sent.set()

    t = threading.Thread(target=sender)
    seen = set()
    deadline = time.time() + 30
    c = subscribed(hub, "race")
    t.start()
    drops = 0
    while (not sent.is_set() or len(seen) < total) and time.time() < deadline:
        try:
            _, pkid, payload = read_publish(c, timeout=0.2)
        except TimeoutError:
            continue
        seen.add(payload.decode())
        if len(seen) % 9 == 0 and drops < 12:
            # Drop the connection with this message unacknowledged, then come back.
            drops += 1
            c.sock.close()
            c = connect_device(hub, "race")
            continue
        puback(c, pkid)
    t.join()
    assert seen == {f"m{n}" for n in range(total)}, sorted({f"m{n}" for n in range(total)} - seen)[:10]
    # Redeliveries of the dropped ones are acknowledged until the queue is empty, long before
    # any lock (60 s) could expire.
    end = time.time() + 15
    while hub.request("GET", "/devices/race", hub.token()).json()["cloudToDeviceMessageCount"]:
        assert time.time() < end, "a message stayed locked"
        try:
            _, pkid, _ = read_publish(c, timeout=0.2)
            puback(c, pkid)
        except TimeoutError:
            pass
    assert hub.metric(LOCKED) > 0
    c.disconnect()
