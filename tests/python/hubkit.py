"""Starts and stops real ferrohub processes for the end-to-end suites.

Every hub gets its own temporary data directory and an ephemeral HTTPS port on loopback, so
suites can run in parallel. The binary is FERROHUB_BIN, or target/release/ferrohub under
CARGO_TARGET_DIR (or the workspace's own target/).
"""

import base64
import hashlib
import hmac
import os
import re
import signal
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]

# Every hub (and cluster) started in this pytest process, in order: conftest.py adds the log
# tails of the ones a failed test used to its report.
STARTED: list = []


def binary() -> str:
    if os.environ.get("FERROHUB_BIN"):
        return os.environ["FERROHUB_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return str(target / "release" / "ferrohub")


def sas_token(resource: str, key_b64: str, ttl: int = 3600, policy: str | None = None,
              expiry: int | None = None, encode_sr: bool = True) -> str:
    """A SAS token as the SDKs build it: HMAC over sr exactly as it appears in the token."""
    se = str(expiry if expiry is not None else int(time.time()) + ttl)
    sr = urllib.parse.quote(resource, safe="") if encode_sr else resource
    mac = hmac.new(base64.b64decode(key_b64), f"{sr}\n{se}".encode(), hashlib.sha256)
    sig = urllib.parse.quote(base64.b64encode(mac.digest()).decode(), safe="")
    token = f"SharedAccessSignature sr={sr}&sig={sig}&se={se}"
    if policy:
        token += f"&skn={policy}"
    return token


def parse_cs(cs: str) -> dict:
    return dict(part.split("=", 1) for part in cs.split(";"))


class Hub:
    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.proc = None
        self.port = None
        self.mqtt_port = None
        self.https_addr = "127.0.0.1:0"
        self.mqtt_addr = "127.0.0.1:0"
        self.amqp_addr = "127.0.0.1:0"
        self.amqp_port = None
        self.quic_addr = "127.0.0.1:0"
        self.quic_port = None
        self.metrics_addr = "127.0.0.1:0"
        self.metrics_port = None
        self.startup_lines: list[str] = []
        self.trust: str | None = None
        self.stderr_path = self.data_dir.parent / (self.data_dir.name + ".stderr.log")

    # -- process control -------------------------------------------------------------------
    def start(self, extra_args=(), timeout: float = 60) -> "Hub":
        STARTED.append(self)
        self.startup_lines = []
        err = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(
            [binary(), "serve", "--data-dir", str(self.data_dir), "--https-addr", self.https_addr,
             "--mqtt-addr", self.mqtt_addr, "--amqp-addr", self.amqp_addr,
             "--metrics-addr", self.metrics_addr, "--mqtt-quic-addr", self.quic_addr, *extra_args],
            stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1,
        )
        deadline = time.time() + timeout
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"hub exited before listening; stderr in {self.stderr_path}:\n"
                                   + self.stderr_path.read_text()[-3000:])
            line = line.rstrip("\n")
            self.startup_lines.append(line)
            m = re.match(r"listening mqtt=.*:(\d+)$", line)
            if m:
                self.mqtt_port = int(m.group(1))
            m = re.match(r"listening metrics=.*:(\d+)$", line)
            if m:
                self.metrics_port = int(m.group(1))
            m = re.match(r"listening amqp=.*:(\d+)$", line)
            if m:
                self.amqp_port = int(m.group(1))
            m = re.match(r"listening mqtt-quic=.*:(\d+)$", line)
            if m:
                self.quic_port = int(m.group(1))
            m = re.match(r"listening https=.*:(\d+)$", line)
            if m:
                self.port = int(m.group(1))
                break
            if time.time() > deadline:
                raise RuntimeError("hub did not report its listener in time")
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        return self

    @staticmethod
    def _drain(proc):
        for _ in proc.stdout:
            pass

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the hub's log, headed by its path."""
        try:
            text = self.stderr_path.read_text(errors="replace").splitlines()
        except OSError as e:
            return f"== {self.stderr_path}: {e}"
        return f"== {self.stderr_path} (last {min(lines, len(text))} of {len(text)} lines)\n" + \
            "\n".join(t[:400] for t in text[-lines:])

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)

    # -- credentials -------------------------------------------------------------------------
    def cli(self, *args) -> str:
        out = subprocess.run([binary(), *args, "--data-dir", str(self.data_dir)],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"ferrohub {' '.join(args)} failed: {out.stderr}")
        return out.stdout.strip()

    def metrics_base(self) -> str:
        """The operations listener's base URL."""
        return f"http://127.0.0.1:{self.metrics_port}"

    def metric(self, name: str) -> float:
        """An unlabelled sample from the operations listener's /metrics (0 when absent)."""
        r = requests.get(f"{self.metrics_base()}/metrics", timeout=10)
        r.raise_for_status()
        for line in r.text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == name:
                return float(parts[1])
        return 0.0

    def connection_string(self, policy: str = "iothubowner", with_port: bool = True) -> str:
        cs = self.cli("connection-string", "--policy", policy)
        if with_port:
            cs = cs.replace("HostName=localhost;", f"HostName=localhost:{self.port};", 1)
        return cs

    def policy_key(self, policy: str) -> str:
        return parse_cs(self.connection_string(policy))["SharedAccessKey"]

    def token(self, policy: str = "iothubowner", **kw) -> str:
        return sas_token(f"localhost:{self.port}", self.policy_key(policy), policy=policy, **kw)

    @property
    def ca(self) -> str:
        """What clients trust: the hub's own CA, or `trust` when the hub serves another PKI's
        certificate (`[tls]`)."""
        return self.trust or str(self.data_dir / "tls" / "ca.pem")

    # -- HTTP --------------------------------------------------------------------------------
    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"https://localhost:{self.port}{path}{sep}api-version=2021-04-12"

    def request(self, method: str, path: str, token: str | None = None, **kw) -> requests.Response:
        headers = dict(kw.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = token
        return requests.request(method, self.url(path), headers=headers, verify=self.ca, timeout=30, **kw)

    # -- devices and events ----------------------------------------------------------------
    def create_device(self, device_id: str, **body) -> dict:
        r = self.request("PUT", f"/devices/{urllib.parse.quote(device_id, safe='')}", self.token(), json={"deviceId": device_id, **body})
        assert r.status_code == 200, r.text
        return r.json()

    def create_module(self, device_id: str, module_id: str, **body) -> dict:
        r = self.request("PUT", f"/devices/{device_id}/modules/{module_id}", self.token(), json={"moduleId": module_id, **body})
        assert r.status_code == 200, r.text
        return r.json()

    def set_tags(self, device_id: str, tags: dict) -> dict:
        """Merges `tags` into a device twin's tags (twin PATCH); returns the twin."""
        r = self.request("PATCH", f"/twins/{urllib.parse.quote(device_id, safe='')}", self.token(), json={"tags": tags})
        assert r.status_code == 200, r.text
        return r.json()

    def device_key(self, device_id: str) -> str:
        return self.request("GET", f"/devices/{device_id}", self.token()).json()["authentication"]["symmetricKey"]["primaryKey"]

    def device_token(self, device_id: str, module_id: str | None = None, **kw) -> str:
        if module_id:
            key = self.request("GET", f"/devices/{device_id}/modules/{module_id}", self.token()).json()["authentication"]["symmetricKey"]["primaryKey"]
            return sas_token(f"localhost/devices/{device_id}/modules/{module_id}", key, **kw)
        return sas_token(f"localhost/devices/{device_id}", self.device_key(device_id), **kw)

    def device_connection_string(self, device_id: str, module_id: str | None = None) -> str:
        args = ["connection-string", "--device", device_id] + (["--module", module_id] if module_id else [])
        return self.cli(*args)

    def partitions(self) -> list:
        r = self.request("GET", "/events/partitions", self.token("service"))
        assert r.status_code == 200, r.text
        return r.json()

    def read_partition(self, partition: int, group: str = "$Default", endpoint: str = "events", **query) -> list:
        """Every event of a partition from the start (or the given position); `endpoint` names
        a custom endpoint (read under /endpoints/{name}) or the built-in `events`."""
        events = []
        params = {"max": 1000, **query}
        token = self.token("service")
        prefix = "/events" if endpoint == "events" else f"/endpoints/{urllib.parse.quote(endpoint, safe='')}"
        while True:
            qs = "&".join(f"{k}={urllib.parse.quote(str(v), safe='')}" for k, v in params.items())
            r = self.request("GET", f"{prefix}/consumergroups/{urllib.parse.quote(group, safe='')}/partitions/{partition}/messages?{qs}", token)
            assert r.status_code == 200, r.text
            batch = r.json()["events"]
            if not batch:
                return events
            events.extend(batch)
            params = {"max": 1000, "sequenceNumber": batch[-1]["sequenceNumber"] + 1}

    def read_endpoint(self, endpoint: str) -> list:
        """Every event of every partition of an endpoint (`events` or a custom one)."""
        prefix = "/events" if endpoint == "events" else f"/endpoints/{urllib.parse.quote(endpoint, safe='')}"
        r = self.request("GET", f"{prefix}/partitions", self.token("service"))
        assert r.status_code == 200, r.text
        return [e for p in r.json() for e in self.read_partition(int(p["partitionId"]), endpoint=endpoint)]

    def all_events(self) -> list:
        return [e for p in self.partitions() for e in self.read_partition(int(p["partitionId"]))]

    def events_of(self, device_id: str) -> list:
        return [e for e in self.all_events() if e["systemProperties"].get("iothub-connection-device-id") == device_id]
