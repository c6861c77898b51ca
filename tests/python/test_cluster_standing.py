"""CLU: a node serves only in good standing, and follows only the log its replica came from. Every node has a health endpoint (role, lease,
applied sequence, lag behind the log, NATS reachable) that HAProxy checks over HTTP; a writer
cut off from NATS stops serving (its device connections closed, new ones refused) before any
other node writes, so no read anywhere answers from the state it had; once back it serves
again only after catching up (docs/cluster.md, "Standing").

The partition is real: the writer's process goes into a cgroup of its own and an iptables rule
in the test's network namespace drops its packets to the NATS servers' client port, so its
connections hang as they would behind a cut link (no reset), while its clients and health
endpoint stay reachable.

A replica refuses to follow a commit log made anew (NATS storage wiped), and commands that
write refuse a cluster node's directory while the read-only ones keep working.

One cluster for the module (fixed ports); the last test wipes NATS's storage."""

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import requests

from clusterkit import Cluster, node_ip
from hubkit import binary
from mqttraw import RawMqtt

NODES = ("hub1", "hub2", "hub3")
LEASE = 5.0
WAIT = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster-standing")).start()
    yield c
    c.stop()


def ready(node):
    try:
        return requests.get(f"http://{node_ip(node)}:9464/health/ready", timeout=1).status_code
    except requests.RequestException as e:
        return type(e).__name__


def desired_v(response):
    assert response.status_code == 200, (response.status_code, response.text)
    return response.json()["properties"]["desired"].get("v")


def takes_tls(node, port):
    ctx = ssl.create_default_context(cafile=None)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((node_ip(node), port), timeout=2) as s, \
                ctx.wrap_socket(s, server_hostname="localhost"):
            return True
    except (OSError, ssl.SSLError):
        return False


def nats_connections_of(pid):
    """(local port, server address) of `pid`'s established connections to NATS servers."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", "( dport = :4222 )"],
                         check=True, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        if f"pid={pid}," in line:
            local, peer = line.split()[2:4]
            found.append((local.rsplit(":", 1)[1], peer.rsplit(":", 1)[0]))
    return found


class NatsCut:
    """Drops one process's packets to the NATS client port, without a reset: a rule for each
    connection it has (by local port), and one for any it opens later (iptables matches a
    socket's cgroup as it was when the socket was made, so the process goes into a cgroup (v2)
    of its own first)."""

    ROOT = Path("/sys/fs/cgroup/unified")

    def __init__(self, pid):
        self.pid = pid
        self.group = self.ROOT / f"ferrohub-cut-{os.getpid()}-{pid}"
        self.rules = []

    def _drop(self, *match):
        rule = ["OUTPUT", "-p", "tcp", "--dport", "4222", *match, "-j", "DROP"]
        subprocess.run(["iptables", "-A", *rule], check=True)
        self.rules.append(rule)

    def __enter__(self):
        self.group.mkdir()
        try:
            (self.group / "cgroup.procs").write_text(str(self.pid))
            self._drop("-m", "cgroup", "--path", "/" + self.group.name)
            connections = nats_connections_of(self.pid)
            assert connections, "the node has no NATS connection to cut"
            for port, server in connections:
                self._drop("-d", server, "--sport", port)
        except BaseException:
            self.__exit__()
            raise
        return self

    def heal(self):
        for rule in self.rules:
            subprocess.run(["iptables", "-D", *rule], check=True)
        self.rules = []

    def __exit__(self, *exc):
        self.heal()
        try:
            (self.ROOT / "cgroup.procs").write_text(str(self.pid))
        except OSError:
            pass  # the process is gone
        self.group.rmdir()


def test_every_node_reports_its_standing(cluster):
    w = cluster.wait_for_writer()
    cluster.create_device("standing")
    for node in NODES:
        cluster.wait_node_has_device(node, "standing")
    deadline = time.time() + WAIT
    while True:
        standings = {n: cluster.standing(n) for n in NODES}
        # The log's size comes with each node's next read of the log's state (every third
        # of the lease), not with the entries it applies.
        if all(s and s["serving"] and s["lag"] == 0 and s["log_bytes"] > 0 for s in standings.values()):
            break
        assert time.time() < deadline, standings
        time.sleep(0.2)
    for node, s in standings.items():
        assert s["node"] == node and s["nats_reachable"], s
        assert s["role"] == ("writer" if node == w else "follower"), s
        assert s["lease_held"] == (node == w), s
        assert s["applied"] >= 1 and s["log_end"] >= s["applied"] and s["log_bytes"] > 0, s
        assert ready(node) == 200, node
        metrics = requests.get(f"http://{node_ip(node)}:9464/metrics", timeout=5).text
        for name in ("ferrohub_cluster_applied_sequence", "ferrohub_cluster_lag_entries",
                     "ferrohub_cluster_log_bytes", "ferrohub_cluster_nats_reachable",
                     "ferrohub_cluster_writer"):
            assert f"\n{name} " in metrics, (node, name)
        # The hub's own metrics come from whichever role serves.
        assert "ferrohub_connected_devices" in metrics, node
        # Every node serves the cluster's one CA.
        assert requests.get(f"http://{node_ip(node)}:9464/ca.pem", timeout=5).text == open(cluster.ca).read(), node
    writer_metrics = requests.get(f"http://{node_ip(w)}:9464/metrics", timeout=5).text
    assert "ferrohub_cluster_append_seconds_count" in writer_metrics


@pytest.mark.skipif(shutil.which("iptables") is None or os.geteuid() != 0 or not NatsCut.ROOT.is_dir(),
                    reason="the partition needs root, iptables (scripts/lib.sh installs it) and the "
                           "cgroup v2 hierarchy at /sys/fs/cgroup/unified (a hybrid host)")
def test_a_writer_cut_off_from_nats_serves_nothing_before_another_writes(cluster):
    w = cluster.wait_for_writer()
    others = [n for n in NODES if n != w]
    token = cluster.token()
    cluster.create_device("cut-dev")
    r = cluster.node_request(w, "PATCH", "/twins/cut-dev", token, json={"properties": {"desired": {"v": 1}}})
    assert r.status_code == 200, r.text
    for node in others:
        cluster.wait_node_has_device(node, "cut-dev")
    # A device connected to the writer itself, kept open across the cut.
    device = RawMqtt(8883, cluster.ca, host=node_ip(w))
    _, rc = device.connect("cut-dev", "localhost/cut-dev/?api-version=2021-04-12", cluster.device_token("cut-dev"))
    assert rc == 0
    try:
        with NatsCut(cluster.pid(w)) as cut:
            cut_at = time.time()
            # Sample until another node writes: the old writer must have stopped serving first.
            new, closed_at, samples = None, None, []
            while new is None:
                assert time.time() < cut_at + WAIT, f"no other writer\n{samples[-5:]}\n{cluster.logs()}"
                if closed_at is None and device.wait_closed(timeout=0.05):
                    closed_at = time.time()
                old_ready = ready(w)
                for node in others:
                    s = cluster.standing(node)
                    if s and s["role"] == "writer" and s["serving"]:
                        new = node
                samples.append((round(time.time() - cut_at, 2), old_ready, new))
                if new is not None:
                    assert old_ready != 200, f"{w} still ready when {new} writes: {samples[-5:]}"
            assert closed_at is not None and closed_at - cut_at < LEASE, (closed_at, cut_at, samples[-5:])
            assert not takes_tls(w, 8883) and not takes_tls(w, 443) and not takes_tls(w, 5671)
            # It serves nothing from the moment it closed; its role reads follower once its
            # writer task has wound down, a moment after (never serving in between).
            deadline = time.time() + LEASE
            while True:
                standing = cluster.standing(w)
                assert standing and not standing["serving"], standing
                if standing["role"] != "writer" or time.time() > deadline:
                    break
                time.sleep(0.1)
            assert standing["role"] != "writer", standing
            # The new writer acknowledges a write; the old one answers nothing, the third node
            # answers it once applied, and the balancer never reaches the old writer.
            r = cluster.node_request(new, "PATCH", "/twins/cut-dev", token, json={"properties": {"desired": {"v": 2}}})
            assert r.status_code == 200, r.text
            with pytest.raises(requests.RequestException):
                cluster.node_request(w, "GET", "/twins/cut-dev", token)
            third = next(n for n in others if n != new)
            assert desired_v(cluster.node_request(new, "GET", "/twins/cut-dev", token)) == 2
            # The third node follows in good standing, at most a moment behind.
            deadline, seen = time.time() + 5, []
            while not seen or seen[-1] != 2:
                assert time.time() < deadline, seen
                seen.append(desired_v(cluster.node_request(third, "GET", "/twins/cut-dev", token)))
            assert set(seen) <= {1, 2}, seen
            for _ in range(12):
                assert desired_v(cluster.request("GET", "/twins/cut-dev", token)) == 2
            still_cut = time.time() + 2
            while time.time() < still_cut:
                assert ready(w) != 200 and not takes_tls(w, 443)
                time.sleep(0.2)
            standing = cluster.standing(w)
            assert standing and not standing["nats_reachable"], standing
            cut.heal()
            # Back on NATS, the old writer serves again only once caught up: every answer it
            # gives is the new value.
            deadline, answers = time.time() + 60, []
            while len(answers) < 5:
                assert time.time() < deadline, f"{w} does not serve again: {cluster.standing(w)}\n{cluster.logs()}"
                try:
                    answers.append(desired_v(cluster.node_request(w, "GET", "/twins/cut-dev", token)))
                except requests.RequestException:
                    time.sleep(0.1)
            assert answers == [2] * 5, answers
            assert (cluster.standing(w) or {}).get("role") == "follower", cluster.standing(w)
    finally:
        device.close()
    cluster.wait_for_writer()


def test_commands_that_write_refuse_a_cluster_nodes_directory(cluster, tmp_path):
    w = cluster.wait_for_writer()
    node = next(n for n in NODES if n != w)
    cluster.create_device("dir-guard")
    cluster.wait_node_has_device(node, "dir-guard")
    cluster.kill_node(node, signal.SIGTERM)
    data = cluster.root / node
    try:
        added = subprocess.run([binary(), "ca", "add", "--data-dir", str(data), "--name", "x",
                                "--pem", cluster.ca], capture_output=True, text=True, timeout=60)
        assert added.returncode != 0 and "cluster node's replica" in added.stderr, added.stderr
        config = tmp_path / "single.toml"
        config.write_text('[listeners]\nhttps = "127.0.0.5:0"\nmqtt = "127.0.0.5:0"\namqp = "127.0.0.5:0"\n'
                          'mqtt_quic = "127.0.0.5:0"\nmetrics = "127.0.0.5:0"\n')
        served = subprocess.run([binary(), "serve", "--data-dir", str(data), "--config", str(config)],
                                capture_output=True, text=True, timeout=60)
        assert served.returncode != 0 and "cluster node's replica" in served.stderr, served.stderr[-2000:]
        assert "export" in served.stderr and "[cluster]" in served.stderr, served.stderr[-2000:]
        # Reading and copying out still work.
        assert cluster.node_has_device(node, "dir-guard")
        backup = subprocess.run([binary(), "backup", "--data-dir", str(data), "--to", str(tmp_path / "b")],
                                capture_output=True, text=True, timeout=120)
        assert backup.returncode == 0, backup.stderr
    finally:
        cluster.start_node(node)
    cluster.wait_node_serves(node)
    # Nothing was written outside the log: the node follows on.
    cluster.create_device("dir-guard-after")
    cluster.wait_node_has_device(node, "dir-guard-after")


def test_a_node_refuses_a_commit_log_made_anew(cluster):
    """NATS's storage wiped on every server: the stream the first node makes again is another
    log, and a node whose replica came from the old one refuses it and says what to do."""
    cluster.wait_for_writer()
    for n in NODES:
        cluster.kill_node(n)
    for n in ("nats1", "nats2", "nats3"):
        cluster.kill_node(n)
        shutil.rmtree(cluster.root / n)
    for n in ("nats1", "nats2", "nats3"):
        cluster.start_node(n)
    cluster.start_node("hub1")
    deadline = time.time() + 60
    while cluster.alive("hub1"):
        assert time.time() < deadline, f"hub1 follows a log made anew\n{cluster.logs()}"
        time.sleep(0.2)
    log = (cluster.root / "logs" / "hub1.log").read_text()
    assert "cannot follow the commit log" in log and "NATS now holds" in log, log[-3000:]
    assert "Backup and restore of a cluster" in log
    assert ready("hub1") != 200
