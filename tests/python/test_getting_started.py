"""docs/getting-started.md, run as written: every block marked `<!-- snippet: NAME -->` is saved
under the file name its first comment line gives and run with the command of the block marked
`<!-- run: NAME -->` (Python with this venv's interpreter, Node with the SDKs of
FERROHUB_NODE, the shell snippet with bash), in the environment the page's step 2 sets
(FERROHUB_CA, FERROHUB_SERVICE_CONNECTION_STRING, FERROHUB_EVENT_HUBS_CONNECTION_STRING,
FERROHUB_DEVICE_ID, FERROHUB_DEVICE_CONNECTION_STRING) and nothing else to trust the hub's CA:
what a run command sets itself (REQUESTS_CA_BUNDLE, SSL_CERT_FILE, NODE_EXTRA_CA_CERTS) is
all a snippet gets.

Each snippet must exit 0 and leave its effect in the hub: the device it created exists with
the key it printed; the device's five telemetry messages are in the hub's partitions with their
JSON bodies and content type; the device printed the C2D message and the method call the
service snippet sent, its queue is empty and the service printed the device's answer; the Event
Hubs readers printed the events a device sent. A snippet the page no longer has fails
`test_the_page_has_every_snippet`.

The SDKs use the fixed ports (443, 8883, 5671): the hub is `sdk_hub`, a cluster with
FERROHUB_TEST_CLUSTER=1 (reads go through its balancer, so reads of what was just written are
retried until they show it)."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hubkit import REPO, sas_token

DOC = REPO / "docs" / "getting-started.md"
NODE_DIR = Path(os.environ.get("FERROHUB_NODE", Path.home() / ".cache" / "ferrohub" / "node"))

REQUIRED = {
    "rest-create-device",
    "python-create-device", "python-device", "python-service", "python-event-hubs",
    "node-create-device", "node-device", "node-service", "node-event-hubs",
}
# How a snippet's CA trust may reach it: only through its run command.
TRUST_VARS = ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE")
WAIT = 60
TELEMETRY = [{"temperature": 20 + i} for i in range(5)]


@dataclass
class Snippet:
    name: str
    lang: str
    code: str
    run: str | None = None

    @property
    def file_name(self) -> str:
        """The file name the first comment line gives (`# device.py`, `// device.js`)."""
        m = re.match(r"(?:#|//)\s*(\S+\.(?:py|js))\s*$", self.code.splitlines()[0])
        assert m, f"snippet {self.name} does not start with a comment naming its file"
        return m.group(1)


def parse(text: str) -> dict[str, Snippet]:
    snippets: dict[str, Snippet] = {}
    runs: dict[str, str] = {}
    for kind, name, lang, body in re.findall(
            r"^<!-- (snippet|run): ([\w-]+) -->\n```(\w+)\n(.*?)^```$", text, re.M | re.S):
        if kind == "snippet":
            assert name not in snippets, f"snippet {name} twice"
            snippets[name] = Snippet(name, lang, body)
        else:
            assert lang == "sh", f"run block of {name} is not sh"
            runs[name] = body.strip()
    for name, command in runs.items():
        assert name in snippets, f"a run block for {name}, which has no snippet"
        snippets[name].run = command
    return snippets


@pytest.fixture(scope="module")
def snippets() -> dict[str, Snippet]:
    return parse(DOC.read_text())


def test_the_page_has_every_snippet(snippets):
    assert set(snippets) == REQUIRED, \
        f"missing: {sorted(REQUIRED - set(snippets))}; not run by any test: {sorted(set(snippets) - REQUIRED)}"
    for s in snippets.values():
        expected = {"rest-create-device": "sh"}.get(s.name, s.name.split("-")[0])
        assert s.lang == {"node": "js"}.get(expected, expected), f"{s.name} is a {s.lang} block"
        if s.lang != "sh":
            assert s.run, f"{s.name} has no run block"
            assert s.file_name in s.run, f"{s.name}'s run block does not run {s.file_name}"


# -- running snippets ----------------------------------------------------------------------------

def base_env(hub, device_id: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TRUST_VARS}
    env.update(
        FERROHUB_CA=hub.ca,
        FERROHUB_SERVICE_CONNECTION_STRING=hub.cli("connection-string"),
        FERROHUB_EVENT_HUBS_CONNECTION_STRING=hub.cli("connection-string", "--event-hubs"),
        FERROHUB_DEVICE_ID=device_id,
    )
    return env


def command(snippet: Snippet, env: dict[str, str], workdir: Path) -> tuple[list[str], dict[str, str]]:
    """The snippet saved in `workdir`, and the argv and environment of its run command."""
    if snippet.lang == "sh":
        path = workdir / f"{snippet.name}.sh"
        path.write_text(snippet.code)
        return ["bash", "-e", str(path)], dict(env)
    (workdir / snippet.file_name).write_text(snippet.code)
    words = shlex.split(snippet.run)
    env = dict(env)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        name, value = words.pop(0).split("=", 1)
        # "$FERROHUB_CA" and the like, from the snippet's environment
        env[name] = re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], value)
    assert words == [{"python": "python", "js": "node"}[snippet.lang], snippet.file_name], \
        f"unexpected run command for {snippet.name}: {snippet.run}"
    if snippet.lang == "js":
        modules = NODE_DIR / "node_modules"
        assert modules.is_dir(), f"the Node SDKs are not installed in {NODE_DIR}: run scripts/test-all.sh"
        env["NODE_PATH"] = str(modules)
        return ["node", snippet.file_name], env
    return [sys.executable, snippet.file_name], env


def workdir_for(tmp_path: Path, snippet: Snippet) -> Path:
    d = tmp_path / snippet.lang
    d.mkdir(exist_ok=True)
    return d


def run(snippet: Snippet, env: dict[str, str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    workdir = workdir_for(tmp_path, snippet)
    argv, env = command(snippet, env, workdir)
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, \
        f"{snippet.name} exited {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    return done


def start(snippet: Snippet, env: dict[str, str], tmp_path: Path) -> subprocess.Popen:
    workdir = workdir_for(tmp_path, snippet)
    argv, env = command(snippet, env, workdir)
    return subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def eventually(read, ok, what: str, timeout: float = WAIT, proc: subprocess.Popen | None = None):
    """`read()` until `ok` holds of its value (through a cluster's balancer a read may reach a
    node a moment behind); fails when `proc` exits first."""
    deadline = time.time() + timeout
    while True:
        value = read()
        if ok(value):
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"{what}: the snippet exited {proc.returncode} first\nstdout:\n{out}\nstderr:\n{err[-3000:]}")
        assert time.time() < deadline, f"{what}: not within {timeout} s; last {value!r}"
        time.sleep(0.2)


def get_device(hub, device_id: str):
    r = hub.request("GET", f"/devices/{device_id}", hub.token())
    return r.json() if r.status_code == 200 else None


# -- the tests -----------------------------------------------------------------------------------

def test_rest_create_device(sdk_hub, tmp_path, snippets):
    device_id = "gs-rest"
    done = run(snippets["rest-create-device"], base_env(sdk_hub, device_id), tmp_path)
    assert json.loads(done.stdout)["deviceId"] == device_id
    device = eventually(lambda: get_device(sdk_hub, device_id), bool, "the device the REST snippet created")
    assert device["authentication"]["symmetricKey"]["primaryKey"]


@pytest.mark.parametrize("lang", ["python", "node"])
def test_device_and_service(sdk_hub, tmp_path, snippets, lang):
    hub = sdk_hub
    device_id = f"gs-{lang}"
    env = base_env(hub, device_id)

    created = run(snippets[f"{lang}-create-device"], env, tmp_path)
    device = eventually(lambda: get_device(hub, device_id), bool, "the device the create snippet made")
    key = device["authentication"]["symmetricKey"]["primaryKey"]
    assert f"created {device_id} with primary key {key}" in created.stdout, created.stdout

    env["FERROHUB_DEVICE_CONNECTION_STRING"] = hub.device_connection_string(device_id)
    device_proc = start(snippets[f"{lang}-device"], env, tmp_path)
    try:
        events = eventually(lambda: hub.events_of(device_id), lambda e: len(e) >= len(TELEMETRY),
                            "the device snippet's telemetry", proc=device_proc)
        service = run(snippets[f"{lang}-service"], env, tmp_path)
        out, err = device_proc.communicate(timeout=WAIT + 30)
    finally:
        if device_proc.poll() is None:
            device_proc.kill()
            device_proc.communicate()
    assert device_proc.returncode == 0, f"the device snippet exited {device_proc.returncode}\n{out}\n{err[-3000:]}"

    # Telemetry: five JSON messages, in order, marked as JSON.
    assert [json.loads(base64.b64decode(e["body"])) for e in events] == TELEMETRY
    for e in events:
        assert e["systemProperties"]["content-type"] == "application/json"
        assert e["systemProperties"]["content-encoding"] == "utf-8"
    # C2D: the device printed the service's message and took it off its queue.
    assert f"sent a cloud-to-device message to {device_id}" in service.stdout, service.stdout
    assert "cloud-to-device message: hello from the back-end" in out, out
    eventually(lambda: get_device(hub, device_id), lambda d: d and d["cloudToDeviceMessageCount"] == 0,
               "the device's C2D queue empty")
    # Method: the device saw the call and its payload; the service got the device's answer.
    assert re.search(r"method reboot called with .*delay", out), out
    assert re.search(r"reboot returned 200 .*rebooted", service.stdout, re.I), service.stdout


def send_telemetry(hub, device_id: str, bodies: list[dict]) -> None:
    key = hub.create_device(device_id)["authentication"]["symmetricKey"]["primaryKey"]
    token = sas_token(f"localhost/devices/{device_id}", key)
    for body in bodies:
        r = hub.request("POST", f"/devices/{device_id}/messages/events", token, data=json.dumps(body),
                        headers={"Content-Type": "application/json", "Content-Encoding": "utf-8"})
        assert r.status_code == 204, r.text


@pytest.mark.parametrize("lang", ["python", "node"])
def test_event_hubs_reader(sdk_hub, tmp_path, snippets, lang):
    hub = sdk_hub
    device_id = f"gs-eh-{lang}"
    bodies = [{"reading": i, "reader": lang} for i in range(3)]
    send_telemetry(hub, device_id, bodies)
    eventually(lambda: hub.events_of(device_id), lambda e: len(e) == len(bodies), "the telemetry in the partitions")

    done = run(snippets[f"{lang}-event-hubs"], base_env(hub, device_id), tmp_path)
    read = []
    partitions = {p["partitionId"] for p in hub.partitions()}
    for line in done.stdout.splitlines():
        partition, device, body = line.split(" ", 2)
        assert partition in partitions, line
        if device == device_id:
            read.append(json.loads(body))
    assert read == bodies, done.stdout
