"""Online backup of a running single node: under telemetry (MQTT, QoS 1), twin patches, C2D
sends with a device completing them and registry writes, a backup is taken twice: by the CLI
against the running hub (`ferrohub backup`, through the hub's control socket) and by the REST
API (`POST /backups`). Each is copied to a fresh directory and served; every operation the hub
acknowledged before the backup began is in it, and its CA is the original's."""

import base64
import shutil
import subprocess
import threading
import time

import crashmatrix as cm
from hubkit import Hub, binary


def start_load(hub):
    for d in ("tel-1", "tel-2", "twin-1", "c2d-1"):
        hub.create_device(d)
    ledger, stop = cm.Ledger(), threading.Event()
    threads = [
        threading.Thread(target=cm.mqtt_telemetry, args=(hub, ledger, stop, "tel-1")),
        threading.Thread(target=cm.mqtt_telemetry, args=(hub, ledger, stop, "tel-2")),
        threading.Thread(target=cm.twin_patches, args=(hub, ledger, stop, "twin-1")),
        threading.Thread(target=cm.c2d_sender, args=(hub, ledger, stop, "c2d-1")),
        threading.Thread(target=cm.c2d_receiver, args=(hub, ledger, stop, "c2d-1")),
        threading.Thread(target=cm.registry_writer, args=(hub, ledger, stop, "reg")),
    ]
    for t in threads:
        t.start()
    return ledger, stop, threads


def snapshot(ledger):
    with ledger.lock:
        return {
            "telemetry": set(ledger.telemetry_acked),
            "twin": ledger.twin_acked,
            "c2d": set(ledger.c2d_acked),
            "devices": set(ledger.devices_acked),
        }


def check_restored(tmp_path, name, backup_dir, before, completed_by_then, original_ca):
    restored_dir = tmp_path / f"restored-{name}"
    shutil.copytree(backup_dir, restored_dir)
    assert (restored_dir / "tls" / "ca.pem").read_bytes() == original_ca, "the TLS identity is kept"
    hub = Hub(restored_dir).start()
    try:
        bodies = set()
        for d in ("tel-1", "tel-2"):
            bodies |= {base64.b64decode(e["body"]).decode() for e in hub.events_of(d)}
        missing = before["telemetry"] - bodies
        assert not missing, f"{len(missing)} acknowledged telemetry messages missing, e.g. {sorted(missing)[:3]}"
        desired = hub.request("GET", "/twins/twin-1", hub.token()).json()["properties"]["desired"]
        if before["twin"]:
            assert desired["a"] == desired["b"] >= before["twin"], (desired, before["twin"])
        absent = [d for d in before["devices"]
                  if hub.request("GET", f"/devices/{d}", hub.token()).status_code != 200]
        assert not absent, f"acknowledged devices missing: {absent[:5]}"
        queued = cm.drain_c2d(hub, "c2d-1")
        lost = before["c2d"] - completed_by_then - queued
        assert not lost, f"acknowledged C2D messages neither completed nor queued: {sorted(lost)[:5]}"
        # The restored hub takes writes.
        hub.create_device("after-restore")
        return {k: len(v) if isinstance(v, set) else v for k, v in before.items()}
    finally:
        hub.stop()


def test_online_backups_under_load_lose_nothing_acknowledged(tmp_path):
    hub = Hub(tmp_path / "hub").start()
    original_ca = (tmp_path / "hub" / "tls" / "ca.pem").read_bytes()
    ledger, stop, threads = start_load(hub)
    try:
        time.sleep(2)
        # 1. The CLI against the running hub.
        before_cli = snapshot(ledger)
        out = subprocess.run([binary(), "backup", "--data-dir", str(hub.data_dir), "--to", str(tmp_path / "cli-backup")],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        assert "online" in out.stderr
        with ledger.lock:
            completed_cli = set(ledger.c2d_completed)
        time.sleep(1)
        # 2. The REST API, by a policy with RegistryWrite; one without it is refused.
        refused = hub.request("POST", "/backups", hub.token("registryRead"), json={"name": "nope"})
        assert refused.status_code == 401, refused.text
        before_rest = snapshot(ledger)
        r = hub.request("POST", "/backups", hub.token(), json={"name": "rest-1"})
        assert r.status_code == 200, r.text
        made = r.json()
        with ledger.lock:
            completed_rest = set(ledger.c2d_completed)
        assert made["name"] == "rest-1" and made["includesTlsIdentity"] is True and made["sizeBytes"] > 0
        again = hub.request("POST", "/backups", hub.token(), json={"name": "rest-1"})
        assert again.status_code == 409, again.text
        bad = hub.request("POST", "/backups", hub.token(), json={"name": "../escape"})
        assert bad.status_code == 400, bad.text
        listed = hub.request("GET", "/backups", hub.token()).json()
        assert [b["name"] for b in listed] == ["rest-1"]
        time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert before_cli["telemetry"] and before_rest["telemetry"], "the load ran"
    hub.stop()
    counts = check_restored(tmp_path, "cli", tmp_path / "cli-backup", before_cli, completed_cli, original_ca)
    assert counts["telemetry"] > 0 and counts["devices"] > 0
    check_restored(tmp_path, "rest", tmp_path / "hub" / "backups" / "rest-1", before_rest, completed_rest, original_ca)
