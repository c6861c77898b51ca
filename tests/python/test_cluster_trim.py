"""CLU: the commit log is trimmed once its entries are older than `log_keeps_absent_nodes_for`
and every node holds them, so it does not grow without bound; a node away for longer no longer
holds trimming back, refuses to start with a clear error once the log was trimmed past it, and
is brought back from a backup of another node's directory. Short settings (trim every second,
keep 30 s) so the case runs in about two minutes."""

import shutil
import signal
import subprocess
import time

import pytest

from clusterkit import Cluster
from hubkit import binary

WAIT = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster-trim")).start(
        cluster_config='log_trim_interval = "1s"\nlog_keeps_absent_nodes_for = "30s"')
    yield c
    c.stop()


def node_log(cluster, node) -> str:
    return (cluster.root / "logs" / f"{node}.log").read_text(errors="replace")


def test_the_log_is_trimmed_while_every_node_follows(cluster):
    writer = cluster.wait_for_writer()
    for i in range(5):
        cluster.create_device(f"all-up-{i}")
    deadline = time.time() + WAIT
    while "trimmed the commit log" not in node_log(cluster, writer):
        assert time.time() < deadline, f"no trim\n{cluster.logs()}"
        time.sleep(0.5)
    # Trimming took nothing anyone needed: every node still follows.
    cluster.create_device("after-trim")
    for node in ("hub1", "hub2", "hub3"):
        cluster.wait_node_has_device(node, "after-trim")


def test_a_node_left_behind_is_restored_from_another_nodes_backup(cluster):
    writer = cluster.wait_for_writer()
    away, donor = [n for n in ("hub1", "hub2", "hub3") if n != writer]
    cluster.kill_node(away)
    # Writes go on past the absent node's entries; after 30 s it no longer holds trimming back,
    # and they are old enough to drop.
    for i in range(36):
        cluster.create_device(f"while-away-{i}")
        time.sleep(1)
    cluster.wait_node_has_device(donor, "while-away-35")
    # Its entries are gone from the log: it says so and stops, changing nothing.
    cluster.start_node(away)
    deadline = time.time() + WAIT
    while cluster.alive(away):
        assert time.time() < deadline, f"{away} kept running behind a trimmed log\n{cluster.logs()}"
        time.sleep(0.2)
    assert "were trimmed while it was away" in node_log(cluster, away), node_log(cluster, away)[-2000:]

    # A backup of the donor's directory, taken stopped, brings it back.
    cluster.kill_node(donor, signal.SIGTERM)
    shutil.rmtree(cluster.root / away)
    done = subprocess.run([binary(), "backup", "--data-dir", str(cluster.root / donor), "--to", str(cluster.root / away)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    cluster.start_node(donor)
    cluster.start_node(away)
    cluster.create_device("back-again")
    for node in ("hub1", "hub2", "hub3"):
        cluster.wait_node_has_device(node, "back-again")
    assert cluster.node_has_device(away, "while-away-35")
