"""MQT-4 and D2C-1 when a device's packets reach the hub together: the telemetry of one read
burst is appended as one write, and still every QoS 1 PUBLISH gets its own PUBACK, in the order
sent, with other answers (a twin GET's response) in their place between them; the events are in
the partition in the same order, read back with the Event Hubs consumer; a burst beyond the
in-flight limit is answered in full; a burst cut short by the daily quota acknowledges what was
admitted before the refusal, and only that is stored.

A raw client writes each burst with one `sendall`, so the hub reads it at once."""

import base64
import struct

import ehkit
from hubkit import Hub
from mqttraw import PUBACK, PUBLISH, connect_device, packet, _str


def publish_bytes(topic: str, payload: bytes, qos: int, pkid: int = 0) -> bytes:
    body = _str(topic) + (struct.pack("!H", pkid) if qos else b"") + payload
    return packet(PUBLISH, qos << 1, body)


def telemetry(device: str, body: str, qos: int = 1, pkid: int = 0) -> bytes:
    return publish_bytes(f"devices/{device}/messages/events/seq={body}", body.encode(), qos, pkid)


def read_answer(client):
    """('puback', pkid) or ('publish', topic)."""
    ptype, _, body = client.read(15)
    if ptype == PUBACK:
        return ("puback", struct.unpack("!H", body)[0])
    assert ptype == PUBLISH, f"unexpected packet type {ptype}"
    (n,) = struct.unpack("!H", body[:2])
    return ("publish", body[2:2 + n].decode())


def bodies_in_order(hub, device: str) -> list:
    """The device's event bodies as the Event Hubs consumer reads them, by sequence number,
    with a check that they sit in one partition at consecutive sequence numbers."""
    got = ehkit.read(hub, None, starting_position="-1")
    mine = [(pid, e) for pid, e in got.events if ehkit.device_of(e) == device]
    assert len({pid for pid, _ in mine}) <= 1, "one device's events share a partition"
    mine.sort(key=lambda pe: pe[1].sequence_number)
    seqs = [e.sequence_number for _, e in mine]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    return [e.body_as_str() for _, e in mine]


def test_a_burst_is_answered_in_order_with_a_twin_response_in_its_place(hub):
    device = "burst-dev"
    hub.create_device(device)
    c = connect_device(hub, device)
    try:
        c.subscribe([("$iothub/twin/res/#", 0)])
        burst = b"".join(telemetry(device, f"m{i}", 1, i) for i in range(1, 6))
        burst += publish_bytes("$iothub/twin/GET/?$rid=r1", b"", 0)
        burst += b"".join(telemetry(device, f"m{i}", 1, i) for i in range(6, 9))
        burst += telemetry(device, "m9", 0)
        burst += telemetry(device, "m10", 1, 10)
        c.send(burst)
        answers = [read_answer(c) for _ in range(10)]
        assert answers == (
            [("puback", i) for i in range(1, 6)]
            + [("publish", "$iothub/twin/res/200/?$rid=r1")]
            + [("puback", i) for i in (6, 7, 8, 10)]
        )
    finally:
        c.close()
    assert bodies_in_order(hub, device) == [f"m{i}" for i in range(1, 11)]


def stored_bodies(hub, device: str) -> list:
    """The device's event bodies through the hub's partition read API, by sequence number:
    with `max_wait_time` set, the Event Hubs SDK's receive callback hands out only one or two
    events a second while fewer than its prefetch are buffered, too slow for hundreds."""
    events = sorted(hub.events_of(device), key=lambda e: e["sequenceNumber"])
    seqs = [e["sequenceNumber"] for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    return [base64.b64decode(e["body"]).decode() for e in events]


def test_a_burst_beyond_the_in_flight_limit_is_answered_in_full_in_few_writes(hub):
    device = "long-burst-dev"
    hub.create_device(device)
    c = connect_device(hub, device)
    n = 300
    try:
        commits_before = hub.metric("ferrohub_commits_total")
        c.send(b"".join(telemetry(device, f"b{i}", 1, i) for i in range(1, n + 1)))
        assert [read_answer(c) for _ in range(n)] == [("puback", i) for i in range(1, n + 1)]
        commits = hub.metric("ferrohub_commits_total") - commits_before
    finally:
        c.close()
    # One write per burst (at most 64 messages each, the in-flight limit), not one per message.
    assert 0 < commits <= n / 8, f"{commits} commits for {n} messages sent together"
    assert stored_bodies(hub, device) == [f"b{i}" for i in range(1, n + 1)]


def test_a_burst_cut_short_by_the_daily_quota_acknowledges_what_came_before(tmp_path):
    config = tmp_path / "hub.toml"
    config.write_text('[throttling]\ntier = "s1"\ndaily_messages = 3\n')
    hub = Hub(tmp_path / "hub").start(["--config", str(config)])
    try:
        device = "quota-burst-dev"
        hub.create_device(device)
        c = connect_device(hub, device)
        c.send(b"".join(telemetry(device, f"q{i}", 1, i) for i in range(1, 6)))
        assert [read_answer(c) for _ in range(3)] == [("puback", i) for i in (1, 2, 3)]
        assert c.wait_closed(10), "the fourth message is over the quota: the connection closes"
        c.close()
        assert bodies_in_order(hub, device) == ["q1", "q2", "q3"]
    finally:
        hub.kill()
