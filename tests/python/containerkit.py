"""The ferrohub container image under podman, for tests/python/test_container.py: why podman
cannot run here (so the tests skip), the image built by scripts/build-image.sh, a network
namespace of the test's own, and hub containers on named volumes.

podman runs as scripts/lib.sh runs it (PODMAN there): rootful, runc and cgroupfs, netavark.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import requests

import hubkit

REPO = Path(__file__).resolve().parents[2]
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--network-backend", "netavark"]
# podman's default open-files limit is above this machine's hard limit, which runc refuses;
# the hub needs about 20,000 descriptors at most (docs/config.sample.toml).
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
# The SDKs' fixed ports and the health listener, published on the namespace's loopback only.
PORTS = {"https": 443, "mqtt": 8883, "amqp": 5671, "metrics": 9464}
CLONE_NEWNET = 0x40000000


def podman(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def unavailable() -> str | None:
    """Why this machine cannot build and run the image, or None."""
    if os.geteuid() != 0:
        return "needs root: rootful podman, and a network namespace of the test's own"
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/lib.sh: ensure_container_tools)"
    info = podman("info", "--format", "{{.Store.GraphDriverName}}", check=False, timeout=60)
    if info.returncode != 0:
        return f"podman cannot open its storage here: {info.stderr.strip()[-500:]}"
    return None


def build_image(tag: str, binary: str) -> None:
    out = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "--tag", tag, "--binary", binary],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    if out.returncode != 0:
        raise RuntimeError(f"scripts/build-image.sh failed:\n{out.stdout}\n{out.stderr}")


def cannot_run(image: str) -> str | None:
    """Why podman cannot start a container here (the runtime, cgroups, limits), or None. It
    runs the image's busybox, not the hub, so a broken hub image fails its tests instead."""
    out = podman("run", "--rm", *ULIMITS, "--network", "none", "--entrypoint", "/usr/bin/busybox", image, "true",
                 check=False, timeout=120)
    if out.returncode != 0:
        return f"podman cannot run a container here: {out.stderr.strip()[-500:]}"
    return None


def image_config(image: str) -> dict:
    return json.loads(podman("image", "inspect", image).stdout)[0]


def already_isolated() -> bool:
    """Whether this process runs in a network namespace other than the machine's (init's).

    scripts/e2e.py runs each group in network and PID namespaces of its own and says so
    (FERROHUB_OWN_NETNS=1): there /proc/1 is the group's own init, in the same network
    namespace, so comparing with it would say "not isolated", and the test would move its main
    thread alone into a new namespace while the SDKs' threads, started by an earlier module of
    the group, stayed behind (their connections to the published ports were refused)."""
    if os.environ.get("FERROHUB_OWN_NETNS") == "1":
        return True
    return os.stat("/proc/thread-self/ns/net").st_ino != os.stat("/proc/1/ns/net").st_ino


class NetworkNamespace:
    """Moves the calling thread (and the processes and threads it starts from then on) into a
    new network namespace with its loopback up; back out on exit. podman's bridge, its port
    forwarding rules and the containers' addresses all live in it and go with it.

    A process already in a namespace of its own (scripts/e2e.py runs each group in one) stays
    there: the SDKs keep threads for the whole process, made by whichever module used them
    first, and those would still connect from the old namespace."""

    def __enter__(self) -> "NetworkNamespace":
        self._moved = not already_isolated()
        if not self._moved:
            return self
        libc = ctypes.CDLL(None, use_errno=True)
        self._libc = libc
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        if libc.unshare(CLONE_NEWNET) != 0:
            os.close(self._home)
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)
        return self

    def __exit__(self, *_exc) -> None:
        if not self._moved:
            return
        if self._libc.setns(self._home, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back to the test's network namespace")
        os.close(self._home)


class Volume:
    """A named podman volume: the hub's data directory outlives its containers here."""

    def __init__(self, name: str):
        self.name = name
        podman("volume", "create", name)

    @property
    def path(self) -> Path:
        """Where the volume lives on this machine (root reads the hub's files there)."""
        return Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}", self.name).stdout.strip())

    def remove(self) -> None:
        podman("volume", "rm", "--force", self.name, check=False)


class HubContainer:
    """A hub container with the SDKs' ports published on 127.0.0.1; quacks like hubkit.Hub where
    the shared helpers need it (`cli`, `ca`, `amqp_port`), for ehkit's Event Hubs reads."""

    amqp_port = PORTS["amqp"]

    def __init__(self, image: str, name: str, volume: Volume, env: dict[str, str], ca: Path):
        self.image, self.name, self.volume, self.env = image, name, volume, env
        self.ca = str(ca)

    def run(self, timeout: float = 60) -> "HubContainer":
        publish = [a for port in PORTS.values() for a in ("--publish", f"127.0.0.1:{port}:{port}")]
        env = [a for k, v in self.env.items() for a in ("--env", f"{k}={v}")]
        hubkit.STARTED.append(self)  # a failed test's report ends with the container's log
        podman("run", "--detach", "--name", self.name, *ULIMITS, *publish, *env,
               "--volume", f"{self.volume.name}:/data", "--stop-timeout", "30", self.image)
        self.wait_ready(timeout)
        # The CA as a client gets it: from the volume.
        shutil.copyfile(self.volume.path / "tls" / "ca.pem", self.ca)
        return self

    def wait_ready(self, timeout: float) -> None:
        """Until the published health port says ready (every listener bound)."""
        deadline = time.time() + timeout
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{PORTS['metrics']}/health/ready", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            state = podman("inspect", "--format", "{{.State.Status}}", self.name, check=False).stdout.strip()
            if state not in ("created", "running") or time.time() > deadline:
                raise AssertionError(f"container {self.name} not ready ({state}) after {timeout} s:\n{self.logs()[-3000:]}")
            time.sleep(0.2)

    def running(self) -> bool:
        state = podman("inspect", "--format", "{{.State.Status}}", self.name, check=False).stdout.strip()
        return state == "running"

    def logs(self) -> str:
        out = podman("logs", self.name, check=False)
        return out.stdout + out.stderr

    def log_tail(self, lines: int = 40) -> str:
        return f"== container {self.name}\n" + "\n".join(self.logs().splitlines()[-lines:])

    def exec(self, *args: str) -> str:
        return podman("exec", self.name, *args).stdout.strip()

    def cli(self, *args: str) -> str:
        """`ferrohub ARGS --data-dir /data` inside the running container."""
        return self.exec("ferrohub", *args, "--data-dir", "/data")

    def health(self) -> tuple[int, str]:
        """Runs the image's health check now: its exit status and the state podman records."""
        rc = podman("healthcheck", "run", self.name, check=False).returncode
        return rc, podman("inspect", "--format", "{{.State.Health.Status}}", self.name).stdout.strip()

    def stop(self) -> int:
        """SIGTERM (the image's stop signal), up to 30 s to drain; the hub's exit status."""
        podman("stop", "--time", "30", self.name, timeout=60)
        return int(podman("inspect", "--format", "{{.State.ExitCode}}", self.name).stdout.strip())

    def remove(self) -> None:
        podman("rm", "--force", "--time", "0", self.name, check=False)


def build_compose_images() -> dict[str, str]:
    """The nats-server and HAProxy images for packaging/compose.yaml (no registry here): the
    NATS_IMAGE and HAPROXY_IMAGE variables."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "build-compose-images.sh")],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    if out.returncode != 0:
        raise RuntimeError(f"scripts/build-compose-images.sh failed:\n{out.stdout}\n{out.stderr}")
    pairs = (line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return {k: v for k, v in pairs if k in ("NATS_IMAGE", "HAPROXY_IMAGE")}


class Compose:
    """packaging/compose.yaml under podman-compose, from a copy in `root` with secrets of its own
    (packaging/compose/make-secrets.sh), the balancer published on 127.0.0.1. Quacks like
    hubkit.Hub where ehkit needs it (`cli`, `ca`, `amqp_port`)."""

    amqp_port = PORTS["amqp"]
    NODES = ("hub1", "hub2", "hub3")

    def __init__(self, root: Path, project: str, images: dict[str, str]):
        self.root, self.project = Path(root), project
        shutil.copy(REPO / "packaging" / "compose.yaml", self.root / "compose.yaml")
        shutil.copytree(REPO / "packaging" / "compose", self.root / "compose",
                        ignore=shutil.ignore_patterns("secrets"))
        self.env = {**os.environ, **images, "FERROHUB_PUBLISH": "127.0.0.1"}
        self.ca = str(self.root / "ca.pem")

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        cmd = ["podman-compose", "--podman-args", " ".join(PODMAN[1:]), "--podman-run-args", " ".join(ULIMITS),
               "-p", self.project, "-f", str(self.root / "compose.yaml"), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env, cwd=self.root)
        if check and out.returncode != 0:
            raise RuntimeError(f"podman-compose {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out

    def container(self, service: str) -> str:
        """podman-compose's name for a service's container."""
        return f"{self.project}_{service}_1"

    def up(self, timeout: float = 180) -> "Compose":
        subprocess.run(["bash", str(self.root / "compose" / "make-secrets.sh")], check=True,
                       capture_output=True, timeout=60)
        hubkit.STARTED.append(self)
        self.compose("up", "-d")
        first = self.wait_for_writer(timeout)
        ca = podman("exec", self.container(first), "cat", "/data/tls/ca.pem").stdout
        Path(self.ca).write_text(ca)
        self.wait_for_writer(timeout)
        for node in self.NODES:
            self.wait_serving(node, timeout)
        return self

    def down(self) -> None:
        self.compose("down", "--volumes", timeout=300, check=False)
        # What a failed start left behind: every container, volume and network of the project.
        names = podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
        mine = [n for n in names if n.startswith(f"{self.project}_")]
        if mine:
            podman("rm", "--force", "--time", "0", *mine, check=False)
        volumes = podman("volume", "ls", "--format", "{{.Name}}", check=False).stdout.split()
        for v in (v for v in volumes if v.startswith(f"{self.project}_")):
            podman("volume", "rm", "--force", v, check=False)
        podman("network", "rm", "--force", f"{self.project}_default", check=False)

    def running(self) -> bool:
        names = podman("ps", "--format", "{{.Names}}", check=False).stdout.split()
        return any(n.startswith(f"{self.project}_") for n in names)

    def log_tail(self, lines: int = 40) -> str:
        parts = []
        for service in self.NODES + ("haproxy",):
            out = podman("logs", "--tail", str(lines), self.container(service), check=False)
            parts.append(f"== {self.container(service)}\n{out.stdout}{out.stderr}")
        return "\n".join(parts)

    def standing(self, node: str) -> dict | None:
        """The node's /health/cluster, asked inside its container; None when it does not answer."""
        out = podman("exec", self.container(node), "wget", "-q", "-O", "-",
                     f"http://127.0.0.1:{PORTS['metrics']}/health/cluster", check=False, timeout=30)
        try:
            return json.loads(out.stdout) if out.returncode == 0 else None
        except ValueError:
            return None

    def writer(self) -> str | None:
        for node in self.NODES:
            s = self.standing(node)
            if s and s.get("role") == "writer" and s.get("serving"):
                return node
        return None

    def balancer_serves(self) -> bool:
        """A TLS handshake with the hub's identity succeeds through HAProxy on every SDK port."""
        if not Path(self.ca).exists():
            return False
        ctx = ssl.create_default_context(cafile=self.ca)
        for port in (PORTS["https"], PORTS["mqtt"], PORTS["amqp"]):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s, \
                        ctx.wrap_socket(s, server_hostname="localhost"):
                    pass
            except (OSError, ssl.SSLError):
                return False
        return True

    def wait_for_writer(self, timeout: float, other_than: str | None = None) -> str:
        """Until a node (not `other_than`) serves as the writer and, once the CA is known, the
        balancer reaches the hub on every port."""
        deadline = time.time() + timeout
        while True:
            w = self.writer()
            if w and w != other_than and (not Path(self.ca).exists() or self.balancer_serves()):
                return w
            if time.time() > deadline:
                raise AssertionError(f"no writer (other than {other_than}) within {timeout} s\n{self.log_tail(15)}")
            time.sleep(0.5)

    def wait_serving(self, node: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while not (self.standing(node) or {}).get("serving"):
            assert time.time() < deadline, f"{node} does not serve after {timeout} s\n{self.log_tail(15)}"
            time.sleep(0.5)

    def cli(self, *args: str, node: str | None = None) -> str:
        """`ferrohub ARGS --data-dir /data` in a node's container (the writer's by default)."""
        node = node or self.writer() or "hub1"
        return podman("exec", self.container(node), "ferrohub", *args, "--data-dir", "/data").stdout.strip()

    def kill(self, node: str) -> None:
        podman("kill", "--signal", "KILL", self.container(node))

    def start(self, node: str) -> None:
        """Starts the node's container again, unless its restart policy already did."""
        state = podman("inspect", "--format", "{{.State.Status}}", self.container(node)).stdout.strip()
        if state != "running":
            podman("start", self.container(node))
