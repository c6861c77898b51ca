"""A hub's host names: chosen at first start, changed later by `ferrohub host-name set` (the
server certificate re-issued from the same CA, keys kept), several served at once, and a
`serve --host-name` that names another refused with how to change it. An official SDK device
that trusted the hub's CA before the change connects by the new name after it.

The device SDK always connects to port 8883 of the connection string's host name, so the hub
listens on the fixed ports (this module runs alone in its group's network namespace) and the
test process resolves the new name to loopback (as a DNS record would on a real network)."""

import base64
import json
import socket
import ssl
import subprocess
import time

import pytest
from azure.iot.device import IoTHubDeviceClient, Message

from hubkit import Hub, binary, parse_cs, sas_token

NEW_NAME = "hub.example.test"
NEW_IP = "127.0.0.9"


@pytest.fixture
def resolve_new_name(monkeypatch):
    """NEW_NAME resolves to 127.0.0.1 in this process, as its DNS record would."""
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kw):
        return real("127.0.0.1" if host == NEW_NAME else host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def fixed_port_hub(path):
    h = Hub(path)
    h.https_addr, h.mqtt_addr, h.amqp_addr = "127.0.0.1:443", "127.0.0.1:8883", "127.0.0.1:5671"
    return h


def run_cli(*args):
    return subprocess.run([binary(), *args], capture_output=True, text=True, timeout=60)


def handshake(port, server_hostname, cafile):
    ctx = ssl.create_default_context(cafile=cafile)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
            return tls.getpeercert()


def test_host_name_set_keeps_keys_and_ca_and_a_device_connects_by_the_new_name(tmp_path, resolve_new_name):
    hub = fixed_port_hub(tmp_path / "hub").start()
    try:
        hub.create_device("d1")
        before = parse_cs(hub.device_connection_string("d1"))
        assert before["HostName"] == "localhost"
        ca_before = (tmp_path / "hub" / "tls" / "ca.pem").read_bytes()
        policy_key = hub.policy_key("iothubowner")
        # While it runs the names cannot change (the data directory is in use).
        busy = run_cli("host-name", "set", "--data-dir", str(hub.data_dir), NEW_NAME)
        assert busy.returncode != 0 and "stop it first" in busy.stderr, busy.stderr
    finally:
        hub.stop()

    changed = run_cli("host-name", "set", "--data-dir", str(hub.data_dir), NEW_NAME,
                      "--also", f"{NEW_IP},localhost")
    assert changed.returncode == 0, changed.stderr
    assert f"localhost -> {NEW_NAME},{NEW_IP},localhost" in changed.stderr
    assert "re-issued" in changed.stderr
    shown = run_cli("host-name", "show", "--data-dir", str(hub.data_dir))
    assert shown.stdout.split() == [NEW_NAME, NEW_IP, "localhost"]
    assert (tmp_path / "hub" / "tls" / "ca.pem").read_bytes() == ca_before, "the CA is kept"

    # A start naming another host is refused, and says how to change it.
    wrong = fixed_port_hub(tmp_path / "hub")
    with pytest.raises(RuntimeError) as refused:
        wrong.start(extra_args=["--host-name", "other.example.test"])
    assert "host-name set" in str(refused.value) and NEW_NAME in str(refused.value)

    hub = fixed_port_hub(tmp_path / "hub").start(extra_args=["--host-name", NEW_NAME])
    try:
        after = parse_cs(hub.device_connection_string("d1"))
        assert after["HostName"] == NEW_NAME
        assert after["SharedAccessKey"] == before["SharedAccessKey"], "device keys are kept"
        assert hub.policy_key("iothubowner") == policy_key, "policy keys are kept"
        log = hub.stderr_path.read_text()
        assert "serving certificate" in log and NEW_NAME in log

        # The re-issued certificate covers every name and chains to the CA devices had.
        for name in (NEW_NAME, NEW_IP, "localhost"):
            handshake(443, name, str(tmp_path / "hub" / "tls" / "ca.pem"))
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake(443, "other.example.test", str(tmp_path / "hub" / "tls" / "ca.pem"))

        # Tokens for any of the names are accepted, for another host refused.
        for audience, status in ((NEW_NAME, 200), (NEW_IP, 200), ("other.example.test", 401)):
            token = sas_token(audience, policy_key, policy="iothubowner")
            r = hub.request("GET", "/devices/d1", token)
            assert r.status_code == status, (audience, r.text)

        # An SDK device given the new connection string and the CA it trusted before.
        client = IoTHubDeviceClient.create_from_connection_string(
            hub.device_connection_string("d1"), server_verification_cert=ca_before.decode())
        client.connect()
        try:
            client.send_message(Message(json.dumps({"by": NEW_NAME})))
        finally:
            client.shutdown()
        deadline = time.time() + 30
        while not (events := hub.events_of("d1")) and time.time() < deadline:
            time.sleep(0.2)
        assert [json.loads(base64.b64decode(e["body"])) for e in events] == [{"by": NEW_NAME}]
    finally:
        hub.stop()


def test_a_new_hub_takes_several_names_and_info_reports_them(tmp_path):
    hub = Hub(tmp_path / "hub").start(extra_args=["--host-name", f"localhost,{NEW_IP}"])
    try:
        handshake(hub.port, NEW_IP, hub.ca)
        info = run_cli("info", "--data-dir", str(hub.data_dir))
        assert info.returncode == 0, info.stderr
        lines = dict(line.split(": ", 1) for line in info.stdout.splitlines() if ": " in line)
        assert lines["host name"] == "localhost"
        assert lines["other host names"] == NEW_IP
        assert lines["hub name"] == "ferrohub"
        hub.create_device("counted")
        assert run_cli("info", "--data-dir", str(hub.data_dir)).stdout.count("devices: 1") == 1
        der = ssl.PEM_cert_to_DER_cert(open(hub.ca).read())
        import hashlib
        expected = ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())
        assert lines["CA SHA-256 fingerprint"] == expected
        assert int(lines["storage size"].split()[0]) > 0
        assert NEW_IP in lines["server certificate names"]
    finally:
        hub.stop()


def test_bad_host_names_are_refused_and_change_nothing(tmp_path):
    hub = Hub(tmp_path / "hub").start()
    hub.stop()
    for bad in (["hub_1.example"], ["hub.example", "--also", "hub.example"], ["a b"]):
        out = run_cli("host-name", "set", "--data-dir", str(hub.data_dir), *bad)
        assert out.returncode != 0, bad
    assert run_cli("host-name", "show", "--data-dir", str(hub.data_dir)).stdout.split() == ["localhost"]
    out = run_cli("serve", "--data-dir", str(tmp_path / "fresh"), "--host-name", "bad_name")
    assert out.returncode != 0 and "bad_name" in out.stderr
