"""A server certificate from the operator's own PKI (`[tls] certificate`, `key`): an official SDK
device that trusts only that PKI's root connects; the files replaced (a renewal from another
root) are served after SIGHUP, and after a change alone (the file watch), without a restart and
without dropping the connection already open; a broken pair keeps the previous one served.

The device SDK always connects to port 8883, so the hub listens on the fixed ports (this module
runs alone in its group's network namespace)."""

import json
import shutil
import signal
import socket
import ssl
import time

import pytest
from azure.iot.device import IoTHubDeviceClient, Message

import certs
from hubkit import Hub


def handshake(port, cafile, server_hostname="localhost"):
    ctx = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
            return tls.getpeercert()


def verifies(port, cafile) -> bool:
    try:
        handshake(port, cafile)
        return True
    except ssl.SSLCertVerificationError:
        return False


def wait_until(predicate, timeout=30.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def install(pki_dir, live_dir, leaf, key, chain=()):
    """Puts a certificate (leaf first, then `chain`) and its key where the hub reads them, each
    written whole and renamed into place, as a renewal tool does."""
    for src_parts, name in (((leaf, *chain), "server.pem"), ((key,), "server.key")):
        tmp = live_dir / (name + ".new")
        tmp.write_text("".join(p.read_text() for p in src_parts))
        tmp.replace(live_dir / name)


@pytest.fixture
def pki(tmp_path):
    d = tmp_path / "pki"
    d.mkdir()
    root_a, root_a_key = certs.ca(d, "root-a")
    inter_a, inter_a_key = certs.intermediate(d, "inter-a", root_a, root_a_key)
    leaf_a, leaf_a_key = certs.server_signed_by(d, "leaf-a", ["localhost", "127.0.0.1"], inter_a, inter_a_key)
    root_b, root_b_key = certs.ca(d, "root-b")
    leaf_b, leaf_b_key = certs.server_signed_by(d, "leaf-b", ["localhost", "127.0.0.1"], root_b, root_b_key)
    return {
        "dir": d,
        "a": (root_a, leaf_a, leaf_a_key, (inter_a,)),
        "b": (root_b, leaf_b, leaf_b_key, ()),
    }


def test_own_certificate_served_and_reloaded(tmp_path, pki):
    live = tmp_path / "live"
    live.mkdir()
    root_a, leaf_a, key_a, chain_a = pki["a"]
    root_b, leaf_b, key_b, chain_b = pki["b"]
    install(pki["dir"], live, leaf_a, key_a, chain_a)
    config = tmp_path / "ferrohub.toml"
    config.write_text(f'[tls]\ncertificate = "{live / "server.pem"}"\nkey = "{live / "server.key"}"\n'
                      'check_interval = "1s"\n')
    hub = Hub(tmp_path / "hub")
    hub.https_addr, hub.mqtt_addr, hub.amqp_addr = "127.0.0.1:443", "127.0.0.1:8883", "127.0.0.1:5671"
    # The test's own REST calls trust both roots, whichever is served at the moment.
    both = tmp_path / "both-roots.pem"
    both.write_text(root_a.read_text() + root_b.read_text())
    hub.trust = str(both)
    hub.start(extra_args=["--config", str(config)])
    try:
        # Served on every TLS listener: the PKI's root verifies it, the hub's own CA does not.
        own_ca = tmp_path / "hub" / "tls" / "ca.pem"
        for port in (443, 8883, 5671):
            assert verifies(port, root_a), port
            assert not verifies(port, own_ca), port
        hub.create_device("own-pki")
        client = IoTHubDeviceClient.create_from_connection_string(
            hub.device_connection_string("own-pki"), server_verification_cert=root_a.read_text())
        client.connect()
        client.send_message(Message(json.dumps({"n": 1})))

        # A renewal from another root, announced by SIGHUP: served at once, the hub still up,
        # the connection made before it still sending.
        install(pki["dir"], live, leaf_b, key_b, chain_b)
        hub.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: verifies(443, root_b), what="the renewed certificate after SIGHUP")
        assert hub.running()
        assert not verifies(8883, root_a) and verifies(8883, root_b)
        client.send_message(Message(json.dumps({"n": 2})))
        client.shutdown()

        client = IoTHubDeviceClient.create_from_connection_string(
            hub.device_connection_string("own-pki"), server_verification_cert=root_b.read_text())
        client.connect()
        client.send_message(Message(json.dumps({"n": 3})))
        client.shutdown()

        # A key that is not the certificate's: refused, the previous pair still served.
        install(pki["dir"], live, leaf_a, key_b, chain_a)
        hub.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "not reloaded" in hub.stderr_path.read_text(), what="the refusal logged")
        assert verifies(443, root_b) and hub.running()

        # Files changed with no signal: the watch notices within its interval.
        install(pki["dir"], live, leaf_a, key_a, chain_a)
        wait_until(lambda: verifies(443, root_a), what="the file watch")
        events = hub.events_of("own-pki")
        assert [json.loads(__import__("base64").b64decode(e["body"]))["n"] for e in events] == [1, 2, 3]
    finally:
        hub.stop()


def test_a_certificate_without_its_key_is_refused_at_start(tmp_path, pki):
    root_a, leaf_a, key_a, chain_a = pki["a"]
    config = tmp_path / "ferrohub.toml"
    config.write_text(f'[tls]\ncertificate = "{leaf_a}"\n')
    hub = Hub(tmp_path / "hub")
    with pytest.raises(RuntimeError) as refused:
        hub.start(extra_args=["--config", str(config)])
    assert "certificate and key are set together" in str(refused.value)
    _, leaf_b, key_b, _ = pki["b"]
    config.write_text(f'[tls]\ncertificate = "{leaf_a}"\nkey = "{key_b}"\n')
    with pytest.raises(RuntimeError) as mismatched:
        Hub(tmp_path / "hub2").start(extra_args=["--config", str(config)])
    assert "not the key of" in str(mismatched.value)
