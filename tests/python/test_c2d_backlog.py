"""A device with a backlog of C2D messages (issue 19): each PUBACK completes its message and
locks the next ones in one commit when the connection's last fetch came back full. Driven
through raw MQTT and the HTTPS service API; the hub's counter
(`ferrohub_c2d_completed_with_fetch_total`) shows the combined path was taken, and what the
device receives must be what it always was: every message once, in order, the queue empty
after the last PUBACK."""

import pytest

from test_c2d import puback, read_publish, send
from test_c2d_locked_on_send import hub, subscribed, wait_empty  # noqa: F401 (fixture)

COMBINED = "ferrohub_c2d_completed_with_fetch_total"


def test_a_backlog_drains_in_order_with_completions_and_fetches_combined(hub):  # noqa: F811
    hub.create_device("b1")
    for n in range(40):
        assert send(hub, "b1", f"m{n}".encode(), iothub_messageid=str(n)).status_code == 204
    before = hub.metric(COMBINED)
    c = subscribed(hub, "b1")
    got = []
    while len(got) < 40:
        _, pkid, payload = read_publish(c)
        got.append(payload.decode())
        puback(c, pkid)
    assert got == [f"m{n}" for n in range(40)]
    with pytest.raises(TimeoutError):
        read_publish(c, timeout=0.5)
    wait_empty(hub, "b1")
    assert hub.metric(COMBINED) - before >= 1
    c.disconnect()


def test_a_backlog_behind_an_unacknowledged_window_waits_for_it(hub):  # noqa: F811
    """The window (16) is full and unacknowledged: nothing more arrives until PUBACKs free it,
    and a PUBACK for a packet id that is not in flight completes nothing."""
    hub.create_device("b2")
    for n in range(20):
        send(hub, "b2", f"m{n}".encode())
    c = subscribed(hub, "b2")
    window = [read_publish(c) for _ in range(16)]
    with pytest.raises(TimeoutError):
        read_publish(c, timeout=0.5)
    puback(c, 60000)
    with pytest.raises(TimeoutError):
        read_publish(c, timeout=0.5)
    rest = []
    for _, pkid, _ in window:
        puback(c, pkid)
    while len(rest) < 4:
        _, pkid, payload = read_publish(c)
        rest.append(payload.decode())
        puback(c, pkid)
    assert [p.decode() for _, _, p in window] + rest == [f"m{n}" for n in range(20)]
    wait_empty(hub, "b2")
    c.disconnect()
