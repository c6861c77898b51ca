"""JOB-5: a hub with 10,000 devices (SAS and X.509 identities, modules, twins with tags, desired
and reported properties, a registered CA) is exported with `ferrohub export`, restored into an
empty data directory with `ferrohub restore`, and is the same hub: service-side gets are equal
field by field (etags, generation ids, versions and $metadata included), the original service
token works, and the official device SDK connects with the original key or certificate and
reads the original twin. Uses the SDKs' fixed ports (one hub at a time)."""

import base64
import os
import subprocess

from azure.iot.device import IoTHubDeviceClient, X509

import certs
from hubkit import Hub, binary
from jobkit import file_uri, wait_job, write_lines

N = 10_000
# Only these differ after a restore: nothing is connected to a restored hub yet.
CONNECTION_FIELDS = {"connectionState", "connectionStateUpdatedTime"}


def fixed_ports(hub):
    hub.https_addr, hub.mqtt_addr, hub.amqp_addr = "127.0.0.1:443", "127.0.0.1:8883", "127.0.0.1:5671"
    return hub


def key(i):
    return base64.b64encode(i.to_bytes(4, "big") * 8).decode()


def without(d, fields):
    return {k: v for k, v in d.items() if k not in fields}


def device_client(hub, device_id, k):
    return IoTHubDeviceClient.create_from_connection_string(
        f"HostName=localhost;DeviceId={device_id};SharedAccessKey={k}",
        server_verification_cert=open(hub.ca).read(), connection_retry=False)


def x509_client(hub, device_id, cert, keyfile):
    return IoTHubDeviceClient.create_from_x509_certificate(
        x509=X509(cert_file=str(cert), key_file=str(keyfile)), hostname="localhost", device_id=device_id,
        server_verification_cert=open(hub.ca).read(), connection_retry=False)


def snapshot(hub, token, ids):
    out = {}
    for d in ids:
        dev = hub.request("GET", f"/devices/{d}", token)
        twin = hub.request("GET", f"/twins/{d}", token)
        mods = hub.request("GET", f"/devices/{d}/modules", token)
        assert dev.status_code == twin.status_code == mods.status_code == 200, (d, dev.text)
        out[d] = (without(dev.json(), CONNECTION_FIELDS), without(twin.json(), CONNECTION_FIELDS),
                  [without(m, CONNECTION_FIELDS) for m in mods.json()])
    return out


def run_cli(*args):
    done = subprocess.run([binary(), *args], capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr


def test_export_restore_is_the_same_hub(tmp_path):
    self_cert, self_key = certs.self_signed(tmp_path, "x509-self")
    ca_cert, ca_key = certs.ca(tmp_path, "fleet")
    ca_dev_cert, ca_dev_key = certs.signed_by(tmp_path, "x509-ca", ca_cert, ca_key)

    original = fixed_ports(Hub(tmp_path / "original")).start()
    try:
        token = original.token()
        assert any("Initialised hub" in l for l in original.startup_lines)
        assert original.request("PUT", "/certificates/fleet", token, json={"certificate": ca_cert.read_text()}).status_code == 200
        lines = []
        for i in range(N - 2):
            lines.append({"id": f"sas-{i:05d}", "importMode": "create",
                          "authentication": {"type": "sas", "symmetricKey": {"primaryKey": key(i), "secondaryKey": key(i + N)}},
                          "status": "disabled" if i % 500 == 7 else "enabled",
                          "tags": {"site": f"plant-{i % 7}", "n": i}, "properties": {"desired": {"interval": i % 60}}})
            if i % 100 == 0:
                lines.append({"id": f"sas-{i:05d}", "moduleId": "edge", "importMode": "create",
                              "authentication": {"type": "sas", "symmetricKey": {"primaryKey": key(i + 2 * N), "secondaryKey": key(i + 3 * N)}}})
        lines.append({"id": "x509-self", "importMode": "create", "authentication": {
            "type": "selfSigned", "x509Thumbprint": {"primaryThumbprint": certs.thumbprint(self_cert)}}})
        lines.append({"id": "x509-ca", "importMode": "create", "authentication": {"type": "certificateAuthority"}})
        write_lines(tmp_path / "seed" / "devices.txt", lines)
        r = original.request("POST", "/jobs/create", token, json={
            "type": "import", "inputBlobContainerUri": file_uri(tmp_path / "seed"),
            "outputBlobContainerUri": file_uri(tmp_path / "seed-out")})
        job = wait_job(lambda j: original.request("GET", f"/jobs/{j}", token).json(), r.json()["jobId"], timeout=300)
        assert job["status"] == "completed", job
        assert (tmp_path / "seed-out" / "importErrors.log").read_text() == ""
        # Twin changes from both sides: service desired/tags patches, device reported patches.
        assert original.request("PATCH", "/twins/sas-00042", token, headers={"If-Match": "*"},
                                json={"properties": {"desired": {"mode": {"eco": True}}}}).status_code == 200
        client = device_client(original, "sas-00042", key(42))
        client.connect()
        client.patch_twin_reported_properties({"fw": "1.2.3", "battery": {"level": 97}})
        original_twin = client.get_twin()
        client.shutdown()
        client = x509_client(original, "x509-self", self_cert, self_key)
        client.connect()
        client.patch_twin_reported_properties({"cert": "self"})
        client.shutdown()

        sample = ["sas-00042", "sas-00007", "sas-00500", "x509-self", "x509-ca"] + [f"sas-{i:05d}" for i in range(0, N - 2, 33)]
        before = snapshot(original, token, sample)
        stats_before = original.request("GET", "/statistics/devices", token).json()
        certificates_before = original.request("GET", "/certificates", token).json()
        assert stats_before["totalDeviceCount"] == N
        code, err = run_cli("export", "--data-dir", str(original.data_dir), "--to", file_uri(tmp_path / "export"))
        assert code != 0 and "in use" in err, "a running hub's data directory is refused"
    finally:
        original.stop()

    code, err = run_cli("export", "--data-dir", str(original.data_dir), "--to", file_uri(tmp_path / "export"))
    assert code == 0, err
    assert "export:" in err and f"{N}/{N}" in err, "progress lines"
    code, err = run_cli("restore", "--data-dir", str(tmp_path / "restored"), "--from", file_uri(tmp_path / "export"))
    assert code == 0, err
    # The export carries the hub's TLS identity: the restored hub has the same CA.
    assert "restored the hub's TLS identity" in err
    assert (tmp_path / "restored" / "tls" / "ca.pem").read_bytes() == (original.data_dir / "tls" / "ca.pem").read_bytes()

    restored = fixed_ports(Hub(tmp_path / "restored")).start()
    try:
        assert not any("Initialised hub" in l for l in restored.startup_lines), "not a new hub"
        # The original iothubowner token (made with the original key) is accepted.
        assert restored.request("GET", "/statistics/devices", token).json() == stats_before
        assert restored.request("GET", "/certificates", token).json() == certificates_before
        after = snapshot(restored, token, sample)
        for d in sample:
            assert after[d] == before[d], d
        client = device_client(restored, "sas-00042", key(42))
        client.connect()
        twin = client.get_twin()
        client.shutdown()
        assert twin == original_twin
        assert twin["reported"]["fw"] == "1.2.3" and twin["desired"]["mode"] == {"eco": True}
        for device_id, cert, keyfile in [("x509-self", self_cert, self_key), ("x509-ca", ca_dev_cert, ca_dev_key)]:
            client = x509_client(restored, device_id, cert, keyfile)
            client.connect()
            client.get_twin()
            client.shutdown()
    finally:
        restored.stop()


def test_backup_keeps_what_an_export_cannot(tmp_path):
    """`ferrohub backup` copies the whole data directory: a queued C2D message and D2C events,
    which an export does not hold, are there when the copy is served."""
    hub = Hub(tmp_path / "hub").start()
    try:
        hub.create_device("keeper")
        r = hub.request("POST", "/devices/keeper/messages/deviceBound", hub.token(), data=b"queued for later",
                        headers={"iothub-messageid": "c2d-1"})
        assert r.status_code == 204, r.text
        for i in range(3):
            r = hub.request("POST", "/devices/keeper/messages/events", hub.device_token("keeper"), data=f"event {i}".encode())
            assert r.status_code == 204, r.text
        events_before = [e["body"] for e in hub.events_of("keeper")]
        assert len(events_before) == 3
        key_before = hub.device_key("keeper")
        # While the hub runs, the backup is made by the hub (online); the same again, stopped.
        code, err = run_cli("backup", "--data-dir", str(hub.data_dir), "--to", str(tmp_path / "online"))
        assert code == 0 and "online" in err, err
    finally:
        hub.stop()
    code, err = run_cli("backup", "--data-dir", str(hub.data_dir), "--to", str(tmp_path / "online"))
    assert code != 0 and "exists" in err, "a backup never overwrites"
    code, err = run_cli("backup", "--data-dir", str(hub.data_dir), "--to", str(tmp_path / "copy"))
    assert code == 0, err
    code, err = run_cli("export", "--data-dir", str(hub.data_dir), "--to", file_uri(tmp_path / "export"))
    assert code == 0, err
    assert "queued for later" not in (tmp_path / "export" / "devices.txt").read_text()

    copy = Hub(tmp_path / "copy").start()
    try:
        assert [e["body"] for e in copy.events_of("keeper")] == events_before
        r = copy.request("GET", "/devices/keeper/messages/deviceBound", copy.device_token("keeper"))
        assert r.status_code == 200 and r.content == b"queued for later"
        assert r.headers["iothub-messageid"] == "c2d-1"
        # The original device key works: the copy is the same hub.
        assert copy.device_key("keeper") == key_before
    finally:
        copy.stop()
