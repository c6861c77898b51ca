"""The DPS benchmark's crowd (bench/dps_register.py driving bench/src/bin/dpscrowd.rs) does what
its figures claim, at a small size: every device of a symmetric-key group and of an X.509 group
registers over HTTPS and ends assigned, the same devices then connect straight to the hub over
MQTT, and the hub holds exactly one device per registration afterwards. Speed is the benchmark's
business (docs/provisioning.md); this checks that what it counts happened."""

import json
import subprocess
import sys
from pathlib import Path

from hubkit import REPO, binary

DEVICES = 40


def test_the_rust_crowd_registers_x509_and_symmetric_key_devices_and_connects_them(tmp_path):
    crowd = Path(binary()).parent / "dpscrowd"
    assert crowd.exists(), f"{crowd} is built with the workspace"
    work = tmp_path / "bench"
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "dps_register.py"), "--bin", binary(), "--work", str(work),
         "--devices", str(DEVICES), "--concurrency", "16", "--modes", "dps,x509,hub", "--limit", "120"],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["generator"] == "rust"
    for mode in ("dps", "x509"):
        r = report[mode]
        assert r["generator"] == "rust", r
        assert (r["assigned"], r["failures"]) == (DEVICES, 0), r
        assert r["registrations_per_s"] > 0 and r["time_to_assigned"]["p50_ms"] > 0, r
    hub = report["hub"]
    assert (hub["connected"], hub["failures"]) == (DEVICES, 0), hub
    # The hub the script started (and stopped) holds one device per registration.
    info = subprocess.run([binary(), "info", "--data-dir", str(work / "hub")], capture_output=True, text=True,
                          timeout=60)
    assert info.returncode == 0, info.stderr
    assert f"devices: {2 * DEVICES}" in info.stdout, info.stdout


def test_the_crowd_reports_a_device_whose_credential_is_refused(tmp_path):
    """A crowd counts what the hub refused as failures, with the hub's answer: it would not
    report a rate for registrations that never happened."""
    from hubkit import Hub, parse_cs

    hub = Hub(tmp_path / "hub").start()
    try:
        scope = hub.cli("connection-string", "--id-scope")
        host = parse_cs(hub.connection_string(with_port=False))["HostName"]
        job = {"mode": "register", "host": host, "connect_to": "127.0.0.1", "port": hub.port, "ca": str(hub.ca),
               "scope": scope, "concurrency": 2, "limit_s": 60,
               "devices": [{"id": "nobody-1", "token": "SharedAccessSignature sr=x&sig=y&se=1"},
                           {"id": "nobody-2"}]}
        run = subprocess.run([str(Path(binary()).parent / "dpscrowd")], input=json.dumps(job),
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
        assert (report["done"], report["failures"]) == (0, 2), report
        assert all("register: 401" in e for e in report["failure_examples"]), report
    finally:
        hub.kill()
