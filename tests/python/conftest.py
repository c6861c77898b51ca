import os
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import hubkit  # noqa: E402
from hubkit import Hub, binary  # noqa: E402

# How many hubs had been started when the current test's set-up began.
_HUBS_BEFORE = pytest.StashKey[int]()


def pytest_report_header(config):
    seed = os.environ.get("FERROHUB_TEST_SEED")
    return f"test seed: {seed} (FERROHUB_TEST_SEED)" if seed else None


_EXIT_STATUS = [0]


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS[0] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The run is reported (terminal summary, JUnit file); a thread a test left blocked in an SDK
    call that never returns must not keep the process from exiting: it would hold its whole
    group until the group's time limit. Such threads are named, then left behind."""
    stray = [t.name for t in threading.enumerate()
             if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if stray:
        print(f"\nconftest: {len(stray)} non-daemon threads still running at exit, not waited for: "
              f"{', '.join(stray[:10])}", flush=True)
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[0])


def pytest_sessionstart(session):
    if not os.path.exists(binary()):
        raise pytest.UsageError(f"ferrohub binary not found at {binary()}; run cargo build --release first")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_HUBS_BEFORE] = len(hubkit.STARTED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report ends with the log tails of the hubs it used: those started during
    it, and those still running (a module's shared hub or cluster)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    before = item.stash.get(_HUBS_BEFORE, len(hubkit.STARTED))
    used = [h for i, h in enumerate(hubkit.STARTED) if i >= before or h.running()]
    tails = []
    for h in dict.fromkeys(used):
        try:
            tails.append(h.log_tail())
        except Exception as e:  # a report must never fail for want of a log
            tails.append(f"== {h!r}: no log tail ({e})")
    if tails:
        report.sections.append(("hub log tails", "\n".join(tails)))


@pytest.fixture
def hub(tmp_path):
    h = Hub(tmp_path / "hub").start()
    yield h
    if h.proc and h.proc.poll() is None:
        h.kill()


@pytest.fixture
def owner(hub):
    """An iothubowner token for the hub."""
    return hub.token("iothubowner")


@pytest.fixture(scope="module")
def sdk_hub(request, tmp_path_factory):
    """A hub on the fixed ports the official SDKs use (8883, 443, 5671): one per test module,
    so modules that use it run one after another. With FERROHUB_TEST_CLUSTER=1 it is a
    three-node cluster behind HAProxy on those ports instead (clusterkit, docs/cluster.md).
    A module's `HUB_CONFIG` (configuration file text, sections other than [hub], [listeners]
    and [cluster]) is given to the hub, or to every node of the cluster."""
    extra = getattr(request.module, "HUB_CONFIG", "")
    if os.environ.get("FERROHUB_TEST_CLUSTER") == "1":
        from clusterkit import Cluster

        c = Cluster(tmp_path_factory.mktemp("sdk-cluster")).start(cluster_config=extra)
        yield c
        c.stop()
        return
    root = tmp_path_factory.mktemp("sdk")
    h = Hub(root / "hub")
    h.https_addr, h.mqtt_addr, h.amqp_addr = "127.0.0.1:443", "127.0.0.1:8883", "127.0.0.1:5671"
    args = []
    if extra:
        (root / "hub.toml").write_text(extra)
        args = ["--config", str(root / "hub.toml")]
    h.start(args)
    yield h
    h.stop()
