"""A three-node ferrohub cluster behind HAProxy, started by scripts/run-cluster.sh (three
nats-servers on 127.0.0.2-4, three hub nodes, HAProxy on the SDKs' fixed ports of 127.0.0.1).

`Cluster` is a `hubkit.Hub` whose address is HAProxy's and whose data directory is the current
writer's, so the helpers (tokens, REST calls, connection strings) work unchanged against it.
"""

from __future__ import annotations

import os
import signal
import threading
import socket
import ssl
import subprocess
import time
from pathlib import Path

import requests

from hubkit import Hub, binary

SCRIPT = str(Path(__file__).resolve().parents[2] / "scripts" / "run-cluster.sh")
NAMES = ["nats1", "nats2", "nats3", "hub1", "hub2", "hub3", "haproxy"]


def node_ip(name: str) -> str:
    return f"127.0.0.{int(name[-1]) + 1}"


def c2d_inbox(client):
    """Makes a device SDK client collect its C2D messages: returns the list of
    (message id, body) it fills and an event set at each arrival."""
    got, arrived = [], threading.Event()

    def on_message(m):
        got.append((m.message_id, m.data.decode()))
        arrived.set()

    client.on_message_received = on_message
    return got, arrived


class Cluster(Hub):
    def __init__(self, root: Path):
        self.root = Path(root)
        super().__init__(self.root / "hub1")
        self.port, self.mqtt_port, self.amqp_port = 443, 8883, 5671
        self.metrics_port = 9464

    # -- processes ---------------------------------------------------------------------------
    def start(self, timeout: float = 240, seed: Path | None = None, cluster_config: str = "") -> "Cluster":
        """Starts the cluster; with `seed` (a data directory outside any cluster) a new cluster
        holding that directory's hub; `cluster_config`: more lines for every node's file, after
        its `[cluster]` lines (more `[cluster]` keys, then any other sections)."""
        from hubkit import STARTED

        STARTED.append(self)
        args = ["--seed", str(seed)] if seed else []
        env = {**os.environ, "FERROHUB_CLUSTER_EXTRA": cluster_config}
        out = subprocess.run(["bash", SCRIPT, *args, str(self.root)], capture_output=True, text=True,
                             timeout=timeout, env=env)
        if out.returncode != 0:
            logs = self.logs()
            self.stop()  # what did start (HAProxy, say) must not outlive the failure
            raise RuntimeError(f"run-cluster.sh failed:\n{out.stdout}\n{out.stderr}\n{logs}")
        self.wait_for_writer()
        return self

    def stop(self, *_args, **_kw) -> int:
        subprocess.run(["bash", SCRIPT, "--stop", str(self.root)], capture_output=True, timeout=120)
        return 0

    def kill(self) -> int:
        return self.stop()

    def running(self) -> bool:
        return any(self.alive(n) for n in NAMES)

    def log_tail(self, lines: int = 40) -> str:
        return f"== cluster in {self.root}\n" + self.logs(lines)

    def pid(self, name: str) -> int | None:
        p = self.root / "pids" / f"{name}.pid"
        return int(p.read_text()) if p.exists() else None

    def alive(self, name: str) -> bool:
        pid = self.pid(name)
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # A zombie (killed, not yet reaped by the shell that started it) is gone too.
        try:
            return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
        except OSError:
            return False

    def kill_node(self, name: str, sig=signal.SIGKILL) -> None:
        """Kills one process (SIGKILL by default) and waits until it is gone."""
        os.kill(self.pid(name), sig)
        deadline = time.time() + 30
        while self.alive(name):
            assert time.time() < deadline, f"{name} did not die"
            time.sleep(0.05)
        (self.root / "pids" / f"{name}.pid").unlink()

    def start_node(self, name: str) -> None:
        subprocess.run(["bash", SCRIPT, "--start", name, str(self.root)], check=True, capture_output=True, timeout=60)

    def standing(self, node: str) -> dict | None:
        """The node's `/health/cluster` (role, serving, applied, lag, lease); `None` when its
        health endpoint does not answer."""
        try:
            return requests.get(f"http://{node_ip(node)}:9464/health/cluster", timeout=1).json()
        except (requests.RequestException, ValueError):
            return None

    def writer(self) -> str | None:
        """The node serving as the writer, by its health endpoint."""
        for n in ("hub1", "hub2", "hub3"):
            s = self.standing(n)
            if s and s["role"] == "writer" and s["serving"]:
                return n
        return None

    def wait_for_writer(self, timeout: float = 60, other_than: str | None = None) -> str:
        """Waits until a node (not `other_than`) serves as the writer and HAProxy reaches it;
        points the data directory at it. Returns its name."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            w = self.writer()
            if w and w != other_than:
                self.data_dir = self.root / w
                if self.reachable_through_balancer():
                    return w
            time.sleep(0.1)
        raise AssertionError(f"no writer within {timeout} s\n{self.logs()}")

    def reachable_through_balancer(self) -> bool:
        """A TLS handshake succeeds through HAProxy on every port (its backends are checked
        on separate timers, and one without a server accepts and closes at once)."""
        return self.handshakes_on("127.0.0.1")

    def handshakes_on(self, host: str) -> bool:
        """A TLS handshake succeeds on `host` on each of the SDKs' ports."""
        ctx = ssl.create_default_context(cafile=self.ca)
        for port in (443, 8883, 5671):
            try:
                with socket.create_connection((host, port), timeout=5) as s, \
                        ctx.wrap_socket(s, server_hostname="localhost"):
                    pass
            except (OSError, ssl.SSLError):
                return False
        return True

    def wait_node_serves(self, node: str, timeout: float = 90) -> None:
        """Waits until a (re)started node's own listeners take TLS connections: it opens them
        only once it has opened its replica and found the hub there, a while after its
        process started (its data directory may be read before that)."""
        deadline = time.time() + timeout
        while not self.handshakes_on(node_ip(node)):
            assert time.time() < deadline, f"{node} does not serve after {timeout} s\n{self.logs()}"
            time.sleep(0.2)

    @property
    def stderr_path(self) -> Path:
        """The writer's log (suites read the hub's log from here)."""
        return self.root / "logs" / f"{self.data_dir.name}.log"

    @stderr_path.setter
    def stderr_path(self, _value) -> None:
        pass

    def logs(self, lines: int = 15) -> str:
        out = []
        for f in sorted((self.root / "logs").glob("*.log")):
            text = f.read_text(errors="replace").splitlines()
            keep = [t for t in text if "migration" not in t][-lines:]
            out.append(f"== {f.name}\n" + "\n".join(k[:300] for k in keep))
        return "\n".join(out)

    # -- NATS: who may reach it -------------------------------------------------------------
    @property
    def secrets(self) -> Path:
        """The cluster's secret, the hubs' NATS passwords and the NATS servers' CA (made by
        scripts/run-cluster.sh)."""
        return self.root / "secrets"

    def cluster_section(self, node: str, user: str = "hub3", password_file: Path | None = None,
                        ca_file: Path | None = None, secret_file: Path | None = None) -> str:
        """A `[cluster]` section for one more node `node` of this cluster, with `user`'s
        credentials (each item replaceable, to try wrong ones)."""
        s = self.secrets
        return "\n".join([
            "[cluster]",
            'nats = ["nats://127.0.0.2:4222", "nats://127.0.0.3:4222", "nats://127.0.0.4:4222"]',
            f'node = "{node}"',
            f'secret_file = "{secret_file or s / "cluster.secret"}"',
            f'nats_user = "{user}"',
            f'nats_password_file = "{password_file or s / f"{user}.password"}"',
            f'nats_ca_file = "{ca_file or s / "nats-ca.pem"}"',
            "",
        ])

    # -- what each node holds ------------------------------------------------------------------
    def node_has_device(self, node: str, device_id: str) -> bool:
        out = subprocess.run([binary(), "connection-string", "--data-dir", str(self.root / node), "--device", device_id],
                             capture_output=True, text=True, timeout=60)
        return out.returncode == 0

    def node_cli(self, node: str, *args) -> str:
        out = subprocess.run([binary(), *args, "--data-dir", str(self.root / node)], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"ferrohub {' '.join(args)} on {node} failed: {out.stderr}")
        return out.stdout.strip()

    def wait_node_has_device(self, node: str, device_id: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while not self.node_has_device(node, device_id):
            assert time.time() < deadline, f"{node}'s replica never got {device_id}\n{self.logs()}"
            time.sleep(0.2)

    # -- one node's own address (a follower forwards to the writer) ---------------------------
    def node_request(self, node: str, method: str, path: str, token: str | None = None, **kw) -> requests.Response:
        """A REST call to `node`'s own address instead of the balancer's."""
        headers = dict(kw.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = token
        sep = "&" if "?" in path else "?"
        url = f"https://{node_ip(node)}:443{path}{sep}api-version=2021-04-12"
        return requests.request(method, url, headers=headers, verify=self.ca, timeout=30, **kw)

    def device_connection_string_via(self, node: str, device_id: str) -> str:
        """A device connection string whose client connects to `node` (IoT Edge's
        `GatewayHostName`: the SDK connects there and still signs for the hub's host name)."""
        return self.device_connection_string(device_id) + f";GatewayHostName={node_ip(node)}"

    # -- overrides of Hub for the cluster's addresses ----------------------------------------
    @property
    def ca(self) -> str:
        return str(self.root / "tls" / "ca.pem")

    def metrics_base(self) -> str:
        return f"http://{node_ip(self.writer())}:9464"
