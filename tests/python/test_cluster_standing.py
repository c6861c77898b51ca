"""CLU: a node serves only in good standing. Every node has a health endpoint (role, lease,
applied sequence, lag behind the log, NATS reachable) that HAProxy checks over HTTP; a writer
cut off from NATS stops serving (its device connections closed, new ones refused) before any
other node writes, so no read anywhere answers from the state it had; once back it serves
again only after catching up (docs/cluster.md, "Standing").

The partition is real: the writer's process goes into a cgroup of its own and an iptables rule
in the test's network namespace drops its packets to the NATS servers' client port, so its
connections hang as they would behind a cut link (no reset), while its clients and health
endpoint stay reachable.

One cluster for the module (fixed ports)."""

import os
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import requests

from clusterkit import Cluster, node_ip
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


def nats_ports_of(pid):
    """The local ports of `pid`'s established connections to a NATS server's client port."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", "( dport = :4222 )"],
                         check=True, capture_output=True, text=True).stdout
    ports = []
    for line in out.splitlines():
        if f"pid={pid}," in line:
            local = line.split()[2]
            ports.append(local.rsplit(":", 1)[1])
    return ports


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
        (self.group / "cgroup.procs").write_text(str(self.pid))
        self._drop("-m", "cgroup", "--path", "/" + self.group.name)
        ports = nats_ports_of(self.pid)
        assert ports, "the node has no NATS connection to cut"
        for port in ports:
            self._drop("--sport", port)
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
        if all(s and s["serving"] and s["lag"] == 0 for s in standings.values()):
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
    writer_metrics = requests.get(f"http://{node_ip(w)}:9464/metrics", timeout=5).text
    assert "ferrohub_cluster_append_seconds_count" in writer_metrics


@pytest.mark.skipif(shutil.which("iptables") is None or os.geteuid() != 0,
                    reason="the partition needs root and iptables (scripts/lib.sh installs it)")
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
            standing = cluster.standing(w)
            assert standing["role"] != "writer" and not standing["serving"], standing
            # The new writer acknowledges a write; the old one answers nothing, the third node
            # answers it once applied, and the balancer never reaches the old writer.
            r = cluster.node_request(new, "PATCH", "/twins/cut-dev", token, json={"properties": {"desired": {"v": 2}}})
            assert r.status_code == 200, r.text
            with pytest.raises(requests.RequestException):
                cluster.node_request(w, "GET", "/twins/cut-dev", token)
            third = next(n for n in others if n != new)
            end = cluster.standing(new)["applied"]
            deadline = time.time() + WAIT
            while cluster.standing(third)["applied"] < end:
                assert time.time() < deadline, cluster.standing(third)
                time.sleep(0.05)
            for node in (new, third):
                assert desired_v(cluster.node_request(node, "GET", "/twins/cut-dev", token)) == 2, node
            for _ in range(12):
                assert desired_v(cluster.request("GET", "/twins/cut-dev", token)) == 2
            still_cut = time.time() + 2
            while time.time() < still_cut:
                assert ready(w) != 200 and not takes_tls(w, 443)
                time.sleep(0.2)
            assert not cluster.standing(w)["nats_reachable"], cluster.standing(w)
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
            assert cluster.standing(w)["role"] == "follower"
    finally:
        device.close()
    cluster.wait_for_writer()
