"""What a new operator meets first (issue 16, part 7; OPS-1 logs): the README's `ferrohub`
commands run exactly as written in a fresh shell; a hub started with the default listeners
serves TLS on ::1 and on 127.0.0.1; a log written to a file has no escape codes;
`--log-format json` writes one JSON object per line; no key, signature or token a test used
ever appears in the logs, even at debug level."""

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.parse

import pytest

from hubkit import REPO, Hub, binary

README = (REPO / "README.md").read_text()


def readme_commands(prefix):
    """The README's indented command lines that start with `prefix`, in order."""
    return [l.strip() for l in README.splitlines() if l.startswith("    " + prefix)]


def fresh_shell(command, cwd):
    """`command` in a new bash with a clean environment, as a user would type it."""
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_readme_commands_work_as_written(tmp_path):
    if os.path.realpath(shutil.which("ferrohub", path="/usr/local/bin") or "") != os.path.realpath(binary()):
        pytest.fail("ferrohub is not on PATH as the README says: run scripts/test-all.sh or scripts/run-hub.sh")
    hub = Hub(tmp_path / "data").start()
    try:
        hub.create_device("dev1")
        hub.create_module("dev1", "m1")
        printing = readme_commands("ferrohub connection-string")
        assert len(printing) >= 5, printing
        for command in printing:  # while the hub runs, as the README says
            done = fresh_shell(command, tmp_path)
            assert done.returncode == 0, (command, done.stderr)
            line = done.stdout.strip()
            if command.endswith("--id-scope"):
                assert re.fullmatch(r"0ne[0-9A-F]{8}", line), (command, line)
            else:
                assert line.startswith("HostName=") or line.startswith("Endpoint=sb://"), (command, line)
        assert fresh_shell("ferrohub serve --help", tmp_path).returncode == 0
    finally:
        hub.stop()
    offline = readme_commands("ferrohub export") + readme_commands("ferrohub restore") + readme_commands("ferrohub backup")
    assert len(offline) == 3, offline
    for command in offline:
        done = fresh_shell(command, tmp_path)
        assert done.returncode == 0, (command, done.stderr)
    assert (tmp_path / "data2" / "db").is_dir() and (tmp_path / "data-backup" / "db").is_dir()


def tls_handshake(host, port, ca):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False
    with socket.create_connection((host, port), timeout=10) as raw:
        with ctx.wrap_socket(raw) as tls:
            return tls.version()


def test_default_listeners_serve_ipv6_and_ipv4(tmp_path):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    data = tmp_path / "hub"
    proc = subprocess.Popen([binary(), "serve", "--data-dir", str(data)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        listening = {}
        for line in proc.stdout:
            m = re.match(r"listening ([\w-]+)=(.*)$", line.strip())
            if m:
                listening[m.group(1)] = m.group(2)
            if "https" in listening:
                break
        assert listening == {"metrics": "127.0.0.1:9464", "mqtt": "[::]:8883", "amqp": "[::]:5671",
                             "mqtt-quic": "[::]:14567", "https": "[::]:443"}, listening
        ca = str(data / "tls" / "ca.pem")
        for port in (443, 8883, 5671):
            for host in ("::1", "127.0.0.1"):
                assert tls_handshake(host, port, ca) in ("TLSv1.2", "TLSv1.3"), (host, port)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_log_file_has_no_escape_codes(hub):
    hub.create_device("quiet")
    hub.request("GET", "/devices/nobody", hub.token())
    text = hub.stderr_path.read_text()
    assert "listening" in text or "Initialised" in text or "INFO" in text, text[:500]
    assert "\x1b[" not in text


def secrets_of(hub, device_ids):
    """Every policy key and the devices' keys."""
    out = {hub.policy_key(p) for p in ("iothubowner", "service", "device", "registryRead", "registryReadWrite")}
    for d in device_ids:
        keys = hub.request("GET", f"/devices/{d}", hub.token()).json()["authentication"]["symmetricKey"]
        out.update([keys["primaryKey"], keys["secondaryKey"]])
    return out


def signature_forms(token):
    sig = urllib.parse.parse_qs(token.split(" ", 1)[1])["sig"][0]
    return {sig, urllib.parse.quote_plus(sig), urllib.parse.quote(sig, safe="")}


def test_json_logs_parse_and_carry_no_secrets(tmp_path):
    hub = Hub(tmp_path / "hub")
    env_before = os.environ.get("FERROHUB_LOG")
    os.environ["FERROHUB_LOG"] = "debug"
    try:
        hub.start(["--log-format", "json"])
    finally:
        if env_before is None:
            del os.environ["FERROHUB_LOG"]
        else:
            os.environ["FERROHUB_LOG"] = env_before
    used_tokens = []
    try:
        hub.create_device("secretive")
        token = hub.token()
        used_tokens.append(token)
        device_token = hub.device_token("secretive")
        used_tokens.append(device_token)
        assert hub.request("POST", "/devices/secretive/messages/events", device_token, data=b"hi").status_code == 204
        # Refused credentials: a wrong signature, a token for another device, a bad policy key.
        forged = token.replace("sig=", "sig=AAAA")
        used_tokens.append(forged)
        assert hub.request("GET", "/devices", forged).status_code == 401
        assert hub.request("POST", "/devices/other/messages/events", device_token, data=b"x").status_code in (401, 404)
        # A job whose container SAS carries a signature: it fails (no such account), unlogged.
        sas_sig = "c2VjcmV0LXNpZ25hdHVyZS1ub3QtdG8tbG9n"
        r = hub.request("POST", "/jobs/create", token, json={
            "type": "export", "outputBlobContainerUri": f"http://127.0.0.1:9/devstoreaccount1/c?sv=2023-11-03&sp=rw&sig={sas_sig}"})
        assert r.status_code == 200, r.text
        deadline = time.time() + 60
        while hub.request("GET", f"/jobs/{r.json()['jobId']}", token).json()["status"] not in ("failed", "completed"):
            assert time.time() < deadline
            time.sleep(0.1)
        secrets = secrets_of(hub, ["secretive"]) | {sas_sig}
        for t in used_tokens:
            secrets |= signature_forms(t)
    finally:
        hub.stop()
    text = hub.stderr_path.read_text()
    lines = [l for l in text.splitlines() if l.strip()]
    assert len(lines) > 5
    for line in lines:
        record = json.loads(line)
        assert record["level"] in ("TRACE", "DEBUG", "INFO", "WARN", "ERROR"), record
        assert "timestamp" in record and "target" in record, record
    records = [json.loads(l) for l in lines]
    assert any(r.get("message") == "import/export job finished" for r in records)
    refused = [r for r in records if r.get("message") == "request refused"]
    assert any(r.get("number") == 401002 and r.get("status") == 401 for r in refused), refused
    for secret in secrets:
        assert secret not in text, f"a secret ({secret[:6]}...) appears in the log"
