"""P-2, P-3, P-7: first start, connection strings, restart and crash persistence."""

import re
import signal

import pytest

from hubkit import Hub, parse_cs

OWNER_CS = re.compile(r"^HostName=localhost;SharedAccessKeyName=iothubowner;SharedAccessKey=[A-Za-z0-9+/]{43}=$")


def test_first_start_prints_owner_connection_string_and_cli_repeats_it(tmp_path):
    hub = Hub(tmp_path / "fresh").start()
    try:
        printed = [l for l in hub.startup_lines if OWNER_CS.match(l)]
        assert len(printed) == 1, hub.startup_lines
        # The CLI works while the hub is serving the same directory.
        assert hub.cli("connection-string") == printed[0]
        for policy in ["service", "device", "registryRead", "registryReadWrite"]:
            cs = parse_cs(hub.cli("connection-string", "--policy", policy))
            assert cs["SharedAccessKeyName"] == policy and cs["HostName"] == "localhost"
            assert any(l.startswith(f"HostName=localhost;SharedAccessKeyName={policy};") for l in hub.startup_lines)
        assert (tmp_path / "fresh" / "tls" / "ca.pem").read_text().startswith("-----BEGIN CERTIFICATE-----")
    finally:
        assert hub.stop() == 0
    # A second start does not initialise again, and keeps the same keys.
    hub.start()
    try:
        assert not any(OWNER_CS.match(l) for l in hub.startup_lines)
        assert hub.cli("connection-string") == printed[0]
    finally:
        hub.stop()


def test_device_and_module_connection_strings(hub, owner):
    assert hub.request("PUT", "/devices/dev-cs", owner, json={"deviceId": "dev-cs"}).status_code == 200
    assert hub.request("PUT", "/devices/dev-cs/modules/m1", owner, json={"moduleId": "m1"}).status_code == 200
    key = hub.request("GET", "/devices/dev-cs", owner).json()["authentication"]["symmetricKey"]["primaryKey"]
    assert hub.cli("connection-string", "--device", "dev-cs") == f"HostName=localhost;DeviceId=dev-cs;SharedAccessKey={key}"
    mkey = hub.request("GET", "/devices/dev-cs/modules/m1", owner).json()["authentication"]["symmetricKey"]["primaryKey"]
    assert hub.cli("connection-string", "--device", "dev-cs", "--module", "m1") == \
        f"HostName=localhost;DeviceId=dev-cs;ModuleId=m1;SharedAccessKey={mkey}"


def test_unknown_policy_is_an_error(hub):
    with pytest.raises(RuntimeError, match="no policy named"):
        hub.cli("connection-string", "--policy", "nobody")


def snapshot(hub, owner):
    devices = hub.request("GET", "/devices", owner).json()
    modules = {d["deviceId"]: hub.request("GET", f"/devices/{d['deviceId']}/modules", owner).json() for d in devices}
    return devices, modules


def test_sigterm_restart_keeps_every_identity_key_and_etag(hub, owner):
    for i in range(20):
        assert hub.request("PUT", f"/devices/keep-{i}", owner, json={"deviceId": f"keep-{i}"}).status_code == 200
    assert hub.request("PUT", "/devices/keep-0/modules/mod", owner, json={}).status_code == 200
    before = snapshot(hub, owner)
    owner_cs = hub.connection_string()
    assert hub.stop(signal.SIGTERM) == 0
    hub.start()
    assert hub.connection_string() .split(";")[1:] == owner_cs.split(";")[1:]
    after = snapshot(hub, hub.token())
    assert after == before


def test_sigkill_right_after_a_200_keeps_that_identity(hub, owner):
    for i in range(5):
        r = hub.request("PUT", f"/devices/crash-{i}", owner, json={})
        assert r.status_code == 200
        if i == 4:
            created = r.json()
            hub.kill()
    hub.start()
    got = hub.request("GET", "/devices/crash-4", hub.token())
    assert got.status_code == 200
    assert got.json()["etag"] == created["etag"]
    assert got.json()["authentication"] == created["authentication"]


def test_readme_run_command_starts_a_hub(tmp_path):
    """The README's first command (scripts/run-hub.sh) builds, initialises and serves."""
    import os
    import subprocess
    import threading
    from hubkit import REPO
    env = dict(os.environ, FERROHUB_DATA_DIR=str(tmp_path / "data"))
    proc = subprocess.Popen([str(REPO / "scripts" / "run-hub.sh"), "--https-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0",
                             "--amqp-addr", "127.0.0.1:0"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines = []
    timer = threading.Timer(900, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("listening https="):
                break
        assert any(OWNER_CS.match(l) for l in lines), lines
        assert (tmp_path / "data" / "tls" / "ca.pem").exists()
    finally:
        timer.cancel()
        proc.terminate()
        proc.wait(30)


def test_ca_cli_registers_cas_for_a_stopped_hub(tmp_path):
    """SEC-3: `ferrohub ca add|list|remove` manage CAs offline; the REST API sees the result."""
    import certs
    hub = Hub(tmp_path / "hub").start()
    hub.stop()
    ca_cert, ca_key = certs.ca(tmp_path, "cli")
    assert hub.cli("ca", "add", "--name", "cli-ca", "--pem", str(ca_cert)) == "registered CA cli-ca"
    assert hub.cli("ca", "list") == f"cli-ca\t{certs.thumbprint(ca_cert)}"
    leaf, _ = certs.signed_by(tmp_path, "leaf", ca_cert, ca_key)
    with pytest.raises(RuntimeError, match="not a CA"):
        hub.cli("ca", "add", "--name", "leaf", "--pem", str(leaf))
    hub.start()
    try:
        listed = hub.request("GET", "/certificates", hub.token()).json()
        assert [(c["name"], c["thumbprint"]) for c in listed] == [("cli-ca", certs.thumbprint(ca_cert))]
        # While the hub runs, the CLI cannot write and says where to go instead.
        with pytest.raises(RuntimeError, match="REST API"):
            hub.cli("ca", "remove", "--name", "cli-ca")
        assert hub.request("DELETE", "/certificates/cli-ca", hub.token()).status_code == 204
        assert hub.request("GET", "/certificates", hub.token()).json() == []
        assert hub.request("DELETE", "/certificates/cli-ca", hub.token()).status_code == 404
        assert hub.request("PUT", "/certificates/x", hub.token("registryRead"), json={"certificate": ca_cert.read_text()}).status_code == 401
        assert hub.request("PUT", "/certificates/x", hub.token(), json={"certificate": "not a pem"}).status_code == 400
    finally:
        hub.stop()
