"""THR-1 and THR-2 on the device side (issue 16): D2C sends over the hub budget are slowed, then
the connection is closed and its CONNECT refused (CONNACK 3); twin operations over their
throttle are answered 429 on the twin response topic; the daily quota answers 403002; one
flooding device cannot starve 99 quiet ones (fair share)."""

import time

import pytest
from azure.iot.device import IoTHubDeviceClient, Message
from azure.iot.device.exceptions import ClientError, OperationCancelled

from hubkit import Hub
from d2cload import Flooder, Quiet
from mqttraw import RawMqtt, connect_device


def start_hub(tmp_path, throttling: str, sdk_ports: bool) -> Hub:
    config = tmp_path / "hub.toml"
    config.write_text("[throttling]\n" + throttling)
    h = Hub(tmp_path / "hub")
    if sdk_ports:  # the device SDK connects to 8883
        h.https_addr, h.mqtt_addr, h.amqp_addr = "127.0.0.1:443", "127.0.0.1:8883", "127.0.0.1:5671"
    return h.start(["--config", str(config)])


@pytest.fixture
def hub_factory(tmp_path):
    started = []

    def make(throttling, sdk_ports=False):
        h = start_hub(tmp_path, throttling, sdk_ports)
        started.append(h)
        return h

    yield make
    for h in started:
        h.kill()


def sdk_client(hub, device_id):
    return IoTHubDeviceClient.create_from_connection_string(
        hub.device_connection_string(device_id), server_verification_cert=open(hub.ca).read(), connection_retry=False
    )


def test_a_device_sdk_over_the_d2c_budget_is_slowed_then_refused(hub_factory):
    hub = hub_factory('tier = "s1"\nd2c_sends_per_second = 20\nfair_share_hold = "2s"\n', sdk_ports=True)
    hub.create_device("flood-sdk")
    client = sdk_client(hub, "flood-sdk")
    client.connect()
    sent, error = 0, None
    started = time.time()
    try:
        while time.time() - started < 30:
            client.send_message(Message(f"m{sent}"))
            sent += 1
    except (ClientError, OperationCancelled) as e:
        error = e
    elapsed = time.time() - started
    client.shutdown()
    assert error is not None, f"{sent} messages in {elapsed:.1f} s and never refused"
    # A second's burst (20) passes at once; the rest came at the budget's pace, then the refusal.
    assert sent >= 20, sent
    assert elapsed >= (sent - 20) / 20 * 0.8, (sent, elapsed)
    # The refused device is kept away for a while: its CONNECT is answered "server unavailable".
    c = RawMqtt(hub.mqtt_port, hub.ca)
    try:
        _, rc = c.connect("flood-sdk", "localhost/flood-sdk/?api-version=2021-04-12", hub.device_token("flood-sdk"))
    finally:
        c.close()
    assert rc == 3, rc
    # What the hub acknowledged is stored, and nothing more: every acknowledged send is there.
    time.sleep(0.5)
    stored = [e for e in hub.events_of("flood-sdk")]
    assert len(stored) >= sent, (len(stored), sent)
    # After the hold the device is served again.
    time.sleep(2.5)
    again = sdk_client(hub, "flood-sdk")
    again.connect()
    again.send_message(Message("after"))
    again.shutdown()


def test_twin_operations_over_their_throttle_are_answered_429(hub_factory):
    hub = hub_factory('tier = "s1"\ntwin_updates_per_second = 2\ntwin_reads_per_second = 2\n', sdk_ports=True)
    hub.create_device("twin-thr")
    client = sdk_client(hub, "twin-thr")
    client.connect()
    refused = None
    done = 0
    for i in range(20):
        try:
            client.patch_twin_reported_properties({"n": i})
            done += 1
        except ClientError as e:
            # The sync client wraps the pipeline's ServiceError("... status 429").
            refused = e.__cause__ or e
            break
    assert refused is not None and "429" in str(refused), (done, refused)
    assert 2 <= done <= 6, done
    # The refused patch changed nothing; after a pause the device is served again.
    time.sleep(1.5)
    twin = client.get_twin()
    assert twin["reported"]["n"] == done - 1
    client.shutdown()


def test_the_daily_quota_counts_4kb_chunks_and_answers_403002(hub_factory):
    hub = hub_factory('tier = "s1"\ndaily_messages = 5\n')
    hub.create_device("quota-dev")
    token = hub.device_token("quota-dev")
    # 9 KB: three chunks of the five.
    r = hub.request("POST", "/devices/quota-dev/messages/events", token, data=b"x" * 9 * 1024)
    assert r.status_code == 204, r.text
    r = hub.request("POST", "/devices/quota-dev/messages/events", token, data=b"small")
    assert r.status_code == 204, r.text
    r = hub.request("POST", "/devices/quota-dev/messages/events", token, data=b"x" * 5000)
    assert r.status_code == 403, r.text
    body = r.json()
    assert body["errorCode"] == 403002 and "IotHubQuotaExceeded" in body["Message"], body
    r = hub.request("POST", "/devices/quota-dev/messages/events", token, data=b"last")
    assert r.status_code == 204, r.text
    # The quota is used up: MQTT telemetry closes the connection (MQTT 3.1.1 cannot refuse a
    # PUBLISH), and a C2D send from the back-end is refused too.
    c = connect_device(hub, "quota-dev")
    c.publish("devices/quota-dev/messages/events/", b"over", qos=1, pkid=7)
    assert c.wait_closed(10)
    c.close()
    r = hub.request("POST", "/devices/quota-dev/messages/deviceBound", hub.token(), data=b"c2d")
    assert r.status_code == 403 and r.json()["errorCode"] == 403002, r.text
    # Refused messages were not stored.
    assert len(hub.events_of("quota-dev")) == 3


def test_one_flooding_device_cannot_starve_99_quiet_ones(hub_factory):
    rate = 120
    hub = hub_factory(f'tier = "s1"\nd2c_sends_per_second = {rate}\nregistry_per_minute = 5000\nfair_share_hold = "3s"\n')
    quiet_ids = [f"quiet-{i}" for i in range(99)]
    for d in quiet_ids + ["flooder"]:
        hub.create_device(d)
    duration = 12
    until = time.time() + duration
    quiet = [Quiet(hub, d, until) for d in quiet_ids]
    flooder = Flooder(hub, "flooder", until)
    for t in quiet:
        t.start()
    flooder.start()
    for t in quiet + [flooder]:
        t.join(duration + 30)
    latencies = [x for t in quiet for x in t.latencies]
    failures = [f for t in quiet for f in t.failures]
    sends = len(latencies) + len(failures)
    within = sum(1 for x in latencies if x <= 1.0)
    assert sends >= 99 * (duration - 2), sends
    assert within >= 0.99 * sends, (within, sends, failures[:5], sorted(latencies)[-5:])
    # The flooder was held back: never more than what the quiet devices left of the budget
    # (plus the first second's burst), and refused at least once.
    assert flooder.acked <= rate * duration - len(latencies) + rate, (flooder.acked, len(latencies))
    assert flooder.disconnects >= 1 and flooder.refused_connects >= 1, vars(flooder)
