"""packaging/ferrohub.service: systemd accepts the unit as written (`systemd-analyze verify`), and
the binary runs the way the unit starts it: its ExecStart command line with the example
configuration, as an unprivileged user holding only CAP_NET_BIND_SERVICE, with no new
privileges, the unit's umask and file limit. The hub binds a privileged port, keeps its files
private, maps no memory both writable and executable (MemoryDenyWriteExecute), logs JSON lines,
survives SIGHUP (`systemctl reload`) still serving, and exits 0 on SIGTERM within the unit's
TimeoutStopSec. Without systemd as PID 1 nothing here applies the unit's sandbox itself."""

import json
import os
import pwd
import re
import resource
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
import requests

import hubkit
from hubkit import REPO, binary, parse_cs, sas_token

UNIT = REPO / "packaging" / "ferrohub.service"
CONFIG = REPO / "packaging" / "ferrohub.toml"
INSTALLED_BINARY = "/usr/local/bin/ferrohub"


def unit_settings(text: str) -> dict:
    """The unit file's settings: {section: [(key, value), ...]} in order, comments dropped and
    continued lines joined as systemd joins them."""
    sections: dict = {}
    section, pending = None, None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(("#", ";")) or (not line and pending is None):
            continue
        if pending is not None:
            line = f"{pending} {line}"
            pending = None
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            sections.setdefault(section, [])
            continue
        key, sep, value = line.partition("=")
        assert sep and section, f"not a setting: {raw!r}"
        sections[section].append((key.strip(), value.strip()))
    return sections


def setting(sections: dict, key: str, section: str = "Service") -> str:
    values = [v for k, v in sections.get(section, []) if k == key]
    assert values, f"{UNIT.name} sets no {key}= in [{section}]"
    return values[-1]


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)\s*(s|sec|min|m)?", value)
    assert m, f"a time span this test does not read: {value!r}"
    return int(m.group(1)) * (60 if m.group(2) in ("min", "m") else 1)


def test_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package; scripts/lib.sh "
                    "ensure_test_packages installs it)")
    text = UNIT.read_text()
    # verify checks that the ExecStart binary exists and is executable: point it at the build.
    unit_text, count = re.subn(rf"^ExecStart={re.escape(INSTALLED_BINARY)}(?= )",
                               f"ExecStart={binary()}", text, flags=re.M)
    assert count == 1, f"{UNIT.name}: no ExecStart={INSTALLED_BINARY} ... line"
    unit = tmp_path / UNIT.name
    unit.write_text(unit_text)
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    output = (done.stderr + done.stdout).splitlines()
    ours = [l for l in output if UNIT.name in l or str(unit) in l]
    assert done.returncode == 0 and not ours, (
        f"systemd-analyze verify exited {done.returncode}; about {UNIT.name}:\n" + "\n".join(ours)
        + "\n-- all of its output:\n" + "\n".join(output))


class UnitProcess:
    """The hub as the unit starts it; conftest.py adds its log tail to a failed test's report."""

    def __init__(self, proc: subprocess.Popen, stderr_path: Path):
        self.proc = proc
        self.stderr_path = stderr_path

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        text = self.stderr_path.read_text(errors="replace").splitlines()
        return f"== {self.stderr_path} (last {min(lines, len(text))} of {len(text)} lines)\n" + \
            "\n".join(t[:400] for t in text[-lines:])


def privileged_port() -> int:
    """443 where it is free (a test group's own network namespace), else a free port below 1024."""
    for port in [443, *range(1023, 600, -1)]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    pytest.fail("no free port below 1024 on 127.0.0.1")


def install_like_the_docs(root: Path, uid: int, gid: int, state_dir: str, state_mode: int) -> None:
    """The binary in usr/local/bin, the example configuration in etc/ferrohub (0640, the hub's
    group), and the state directory as StateDirectory= makes it, all under `root`."""
    os.chmod(root, 0o755)
    bin_dir = root / "usr/local/bin"
    bin_dir.mkdir(parents=True)
    shutil.copy(binary(), bin_dir / "ferrohub")
    os.chmod(bin_dir / "ferrohub", 0o755)
    etc = root / "etc/ferrohub"
    etc.mkdir(parents=True)
    shutil.copy(CONFIG, etc / "ferrohub.toml")
    os.chown(etc / "ferrohub.toml", 0, gid)
    os.chmod(etc / "ferrohub.toml", 0o640)
    data = root / "var/lib" / state_dir
    data.mkdir(parents=True)
    os.chown(data, uid, gid)
    os.chmod(data, state_mode)
    for d in [root / "usr", root / "usr/local", bin_dir, root / "etc", etc, root / "var", root / "var/lib"]:
        os.chmod(d, 0o755)


def proc_status(pid: int) -> dict:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(l.split(":", 1) for l in lines if ":" in l)


def test_hub_runs_as_the_unit_starts_it(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("starting the hub as the unit's unprivileged user with CAP_NET_BIND_SERVICE "
                    "needs root")
    unit = unit_settings(UNIT.read_text())
    argv = shlex.split(setting(unit, "ExecStart"))
    assert argv[0] == INSTALLED_BINARY, argv
    state_dir = setting(unit, "StateDirectory")
    data_arg = argv[argv.index("--data-dir") + 1]
    assert data_arg == f"/var/lib/{state_dir}", "the data directory is not StateDirectory's"
    assert argv[argv.index("--config") + 1] == "/etc/ferrohub/ferrohub.toml", argv
    caps = setting(unit, "AmbientCapabilities").split()
    assert caps == setting(unit, "CapabilityBoundingSet").split() == ["CAP_NET_BIND_SERVICE"], caps
    assert setting(unit, "NoNewPrivileges") == "yes"
    umask = int(setting(unit, "UMask"), 8)
    nofile = int(setting(unit, "LimitNOFILE"))
    stop_timeout = seconds(setting(unit, "TimeoutStopSec"))
    assert setting(unit, "KillSignal") == "SIGTERM"
    assert setting(unit, "ExecReload") == "/bin/kill -HUP $MAINPID"

    # The unit's user does not exist here: nobody stands in for it.
    user = pwd.getpwnam("nobody")
    uid, gid = user.pw_uid, user.pw_gid
    root = Path(tempfile.mkdtemp(prefix="ferrohub-unit-", dir="/tmp"))
    proc = None
    try:
        install_like_the_docs(root, uid, gid, state_dir, int(setting(unit, "StateDirectoryMode"), 8))
        data = root / data_arg.lstrip("/")
        command = [str(root / a.lstrip("/")) if a.startswith("/") else a for a in argv]
        https_port = privileged_port()
        # Loopback ports, so that this runs beside other tests; HTTPS on a privileged one, so the
        # capability is what lets it bind.
        command += ["--https-addr", f"127.0.0.1:{https_port}", "--mqtt-addr", "127.0.0.1:0",
                    "--amqp-addr", "127.0.0.1:0", "--mqtt-quic-addr", "127.0.0.1:0",
                    "--metrics-addr", "127.0.0.1:0"]
        cap = caps[0].removeprefix("CAP_").lower()
        # LimitNOFILE= is set by systemd with every capability; a container without
        # CAP_SYS_RESOURCE cannot raise its own hard limit, so there the limit is what it allows.
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard != resource.RLIM_INFINITY and hard < nofile:
            print(f"LimitNOFILE={nofile}: {hard} here, this process's hard limit")
            nofile = hard
        launcher = ["prlimit", f"--nofile={nofile}:{nofile}", "--",
                    "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                    f"--inh-caps=-all,+{cap}", f"--ambient-caps=-all,+{cap}",
                    f"--bounding-set=-all,+{cap}", "--no-new-privs", "--"]
        # systemd's environment for a service with User=: PATH and the user's names, nothing else.
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": str(data), "USER": "ferrohub", "LOGNAME": "ferrohub", "SHELL": "/usr/sbin/nologin"}
        stderr_path = tmp_path / "hub.stderr.log"
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(launcher + command, stdout=subprocess.PIPE, stderr=err, text=True,
                                    bufsize=1, env=env, cwd="/", umask=umask)
        hub = UnitProcess(proc, stderr_path)
        hubkit.STARTED.append(hub)

        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("listening https="):
                break
        assert lines and lines[-1].startswith("listening https="), \
            f"the hub ended (status {proc.wait()}) before listening:\n" + "\n".join(lines) + "\n" + hub.log_tail()
        assert lines[-1] == f"listening https=127.0.0.1:{https_port}", lines[-1]
        threading.Thread(target=hubkit.Hub._drain, args=(proc,), daemon=True).start()
        metrics_port = int(next(l for l in lines if l.startswith("listening metrics=")).rsplit(":", 1)[1])
        owner = parse_cs(next(l for l in lines if "SharedAccessKeyName=iothubowner;" in l))

        # What the launcher was to set up holds, so the rest means what it says.
        status = proc_status(proc.pid)
        assert os.path.realpath(f"/proc/{proc.pid}/exe") == str(root / "usr/local/bin/ferrohub")
        assert status["Uid"].split()[:2] == [str(uid)] * 2, status["Uid"]
        assert int(status["CapEff"], 16) == 1 << 10, status["CapEff"]  # CAP_NET_BIND_SERVICE only
        assert status["NoNewPrivs"].strip() == "1"

        deadline = time.time() + 60
        while requests.get(f"http://127.0.0.1:{metrics_port}/health/ready", timeout=10).status_code != 200:
            assert time.time() < deadline, "not ready within 60 s\n" + hub.log_tail()
            time.sleep(0.2)

        # MemoryDenyWriteExecute=yes refuses a mapping both writable and executable (under systemd
        # only); a snapshot of the ready hub's mappings shows whether it makes any.
        maps = Path(f"/proc/{proc.pid}/maps").read_text().splitlines()
        wx = [m for m in maps if "w" in m.split()[1] and "x" in m.split()[1]]
        assert not wx, "mappings both writable and executable:\n" + "\n".join(wx)

        # UMask=0077: what the hub made in its directory is its user's alone.
        loose = []
        for path in [data, *data.rglob("*")]:
            st = os.lstat(path)
            if st.st_uid != uid or (path != data and stat.S_IMODE(st.st_mode) & 0o077):
                loose.append(f"{oct(stat.S_IMODE(st.st_mode))} uid {st.st_uid} {path.relative_to(data)}")
        assert not loose, "files in the data directory not private to the hub's user:\n" + "\n".join(loose)

        ca = str(data / "tls" / "ca.pem")
        token = sas_token(f"localhost:{https_port}", owner["SharedAccessKey"], policy="iothubowner")

        def registry(method, device_id, **kw):
            url = f"https://localhost:{https_port}/devices/{urllib.parse.quote(device_id)}?api-version=2021-04-12"
            # A new connection, and so a new TLS handshake, every time: requests without a session.
            return requests.request(method, url, headers={"Authorization": token}, verify=ca, timeout=30, **kw)

        r = registry("PUT", "unit-dev", json={"deviceId": "unit-dev"})
        assert r.status_code == 200, r.text

        # systemctl reload: the hub re-reads its certificate and goes on serving.
        proc.send_signal(signal.SIGHUP)
        for _ in range(3):
            try:
                r = registry("GET", "unit-dev")
            except requests.ConnectionError as e:
                try:
                    code = proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"the hub runs but no longer answers after SIGHUP: {e}") from e
                pytest.fail(f"SIGHUP ended the hub (status {code}"
                            f"{', killed by SIGHUP' if code == -signal.SIGHUP else ''}): "
                            f"`systemctl reload` would stop the service\n{hub.log_tail()}")
            assert r.status_code == 200 and r.json()["deviceId"] == "unit-dev", r.text
        assert proc.poll() is None, f"the hub ended after SIGHUP (status {proc.returncode})"

        # systemctl stop: SIGTERM, and a clean exit before systemd would SIGKILL it.
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {stop_timeout} s after SIGTERM (TimeoutStopSec): systemd would SIGKILL it")
        assert code == 0, f"exit status {code} after SIGTERM\n{hub.log_tail()}"
        print(f"stopped in {time.monotonic() - started:.1f} s")

        # --log-format json: the journal gets one JSON object per line.
        log = stderr_path.read_text().splitlines()
        assert log, "nothing logged"
        not_json = []
        for l in log:
            try:
                json.loads(l)
            except ValueError:
                not_json.append(l)
        assert not not_json, "log lines that are not JSON:\n" + "\n".join(not_json[:20])
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)
