"""Backups and exports keep the hub's TLS identity: a hub restored from an export (written to a
plain directory path) or from a backup has the original CA, and an official SDK device that
trusted the original connects to it unchanged. An export made with --exclude-tls says loudly,
at restore and at first start, that a new CA is made; the old trust then fails.

The device SDK always connects to port 8883, so these hubs listen on the fixed ports (one at a
time; this module runs alone in its group's network namespace)."""

import json
import subprocess
import time

import pytest
from azure.iot.device import IoTHubDeviceClient, Message

from hubkit import Hub, binary


def fixed_port_hub(path):
    h = Hub(path)
    h.https_addr, h.mqtt_addr, h.amqp_addr = "127.0.0.1:443", "127.0.0.1:8883", "127.0.0.1:5671"
    return h


def cli(*args):
    out = subprocess.run([binary(), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"ferrohub {' '.join(args)}: {out.stderr}"
    return out


def send_one(hub, device, trusted_ca, n):
    client = IoTHubDeviceClient.create_from_connection_string(
        hub.device_connection_string(device), server_verification_cert=trusted_ca, connection_retry=False)
    try:
        client.connect()
        client.send_message(Message(json.dumps({"n": n})))
    finally:
        client.shutdown()


def wait_events(hub, device, count):
    deadline = time.time() + 30
    while len(events := hub.events_of(device)) < count and time.time() < deadline:
        time.sleep(0.2)
    return events


def test_restored_hubs_keep_their_ca_and_sdk_devices_connect(tmp_path):
    original = fixed_port_hub(tmp_path / "original").start()
    try:
        original.create_device("keeper")
        trusted = open(original.ca).read()
        send_one(original, "keeper", trusted, 1)
        assert len(wait_events(original, "keeper", 1)) == 1
    finally:
        original.stop()

    # An export to a plain directory path (not a URI) carries the TLS identity.
    export_dir = tmp_path / "export"
    cli("export", "--data-dir", str(original.data_dir), "--to", str(export_dir))
    assert json.loads((export_dir / "hub.json").read_text())["tlsIdentity"], "hub.json holds the TLS identity"
    restored = cli("restore", "--data-dir", str(tmp_path / "from-export"), "--from", str(export_dir))
    assert "restored the hub's TLS identity" in restored.stderr
    assert (tmp_path / "from-export" / "tls" / "ca.pem").read_text() == trusted

    # An offline backup carries it too.
    cli("backup", "--data-dir", str(original.data_dir), "--to", str(tmp_path / "backup"))
    assert (tmp_path / "backup" / "tls" / "ca.pem").read_text() == trusted

    for path in (tmp_path / "from-export", tmp_path / "backup"):
        hub = fixed_port_hub(path).start()
        try:
            send_one(hub, "keeper", trusted, 2)
            assert "NEW certificate authority" not in hub.stderr_path.read_text()
        finally:
            hub.stop()


def test_an_export_without_tls_warns_at_restore_and_first_start(tmp_path):
    original = fixed_port_hub(tmp_path / "original").start()
    try:
        original.create_device("keeper")
        trusted = open(original.ca).read()
    finally:
        original.stop()
    export_dir = tmp_path / "export"
    exported = cli("export", "--data-dir", str(original.data_dir), "--to", f"file://{export_dir}", "--exclude-tls")
    assert "WARNING" in exported.stderr
    assert "tlsIdentity" not in json.loads((export_dir / "hub.json").read_text())
    restored = cli("restore", "--data-dir", str(tmp_path / "new-ca"), "--from", str(export_dir))
    assert "WARNING" in restored.stderr and "NEW certificate authority" in restored.stderr

    hub = fixed_port_hub(tmp_path / "new-ca").start()
    try:
        assert "NEW certificate authority" in hub.stderr_path.read_text()
        assert open(hub.ca).read() != trusted
        with pytest.raises(Exception):
            send_one(hub, "keeper", trusted, 3)
        send_one(hub, "keeper", open(hub.ca).read(), 4)
        assert [json.loads(__import__("base64").b64decode(e["body"]))["n"] for e in wait_events(hub, "keeper", 1)] == [4]
    finally:
        hub.stop()
