"""Issue 70, point 5: two sessions of one AMQP connection attach the same device identity's link
at the same instant. The connection, its other identities and one of the two links survive; the
other link is detached with an error (IoT Hub's `amqp:link:stolen` is expected; any condition is
accepted, and the conditions seen are printed). Before the fix both attaches could find the
identity unregistered and both register it; the second registration kicked the first, and a kick
closes the whole connection (a close frame with no error condition).

The client is tests/node/amqp_concurrent_attach.js: rhea (the AMQP client under the Node device
SDK) speaking as that SDK does: TLS with no SASL, device SAS tokens put on `$cbs` for devices A
and B, then session 1 and session 2 each attach A's link and session 3 B's telemetry link, all
in one TLS write before any answer. Every race is on a connection of its own (20 in a row, all
left open), each with its own A and B, so a race that only sometimes goes wrong is caught and a
failure names its race. The window is the first attach's registration (its connection-state
write, a few hundred microseconds): with the attaches in one write the second reaches the hub
inside it in about half of the races (the hub's debug log, `ferrohub_server::amqp=debug`).

- C2D receivers (`/devices/A/messages/devicebound`): the connection stays open; exactly one of
  A's links is attached, the other detached with an error; B's telemetry is accepted and read
  back from the built-in endpoint; the registry shows A Connected while its link is up; a C2D
  message the service SDK (azure-iot-hub's `send_c2d_message`) sends to A arrives once, on the
  surviving link, which is still the only one attached at the end; after the connections close,
  A and B are Disconnected.
- Telemetry senders (`/devices/A/messages/events`): the same rule, the survivor's message
  accepted; then a third sender of A from a fourth session once the race is settled: again one
  of A's links is detached with an error and the one left sends. The built-in endpoint holds
  exactly those messages of A.

On the fixed ports (`sdk_hub`): the service SDK reaches the hub only on 5671.
"""

import collections
import json
import queue
import subprocess
import threading
import time

from amqpsend import send_all
from hubkit import REPO, sas_token
from test_amqp_device import hub_log
from test_node_event_hubs import node_env

SCRIPT = str(REPO / "tests" / "node" / "amqp_concurrent_attach.js")
RACES = 20
WAIT = 30


class Racer:
    """amqp_concurrent_attach.js running: `request` written as its first line; answers read one
    line at a time."""

    def __init__(self, hub, request):
        self.hub = hub
        self.proc = subprocess.Popen(["node", SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=node_env(hub))
        self.lines = queue.Queue()
        self.stderr = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.send(request)

    def _read_stdout(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr.append(line)

    def send(self, message):
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def answer(self, phase, timeout):
        """The script's next JSON line, which must be `phase`."""
        deadline = time.time() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.time()))
            except queue.Empty:
                raise AssertionError(f"no {phase!r} answer within {timeout} s\n{self.tail()}") from None
            if line is None:
                self.proc.wait(timeout=10)
                raise AssertionError(f"the script exited {self.proc.returncode} before {phase!r}\n{self.tail()}")
            if line.startswith("{"):
                out = json.loads(line)
                assert out.get("phase") == phase, f"{phase!r} expected: {line[:3000]}\n{self.tail()}"
                return out

    def tail(self):
        return "stderr:\n" + "".join(self.stderr[-40:])[-6000:] + f"\nhub log:\n{hub_log(self.hub)}"

    def close(self):
        """Waits for the script to exit (it does once it answered "done"; closing its stdin ends
        it otherwise), killing it after 15 s."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def request(hub, kind, races, later=False):
    return {"host": "127.0.0.1", "port": hub.amqp_port, "servername": "localhost", "kind": kind,
            "later": later, "settleMs": 1500, "waitMs": 20000, "timeoutMs": 120000, "races": races}


def new_device(hub, owner, device_id):
    """Creates the device; its SAS token for `localhost/devices/{id}`."""
    r = hub.request("PUT", f"/devices/{device_id}", owner, json={"deviceId": device_id})
    assert r.status_code == 200, r.text
    return sas_token(f"localhost/devices/{device_id}", r.json()["authentication"]["symmetricKey"]["primaryKey"])


def make_races(hub, tag, with_b):
    """RACES races, each with its own devices A (and B)."""
    owner = hub.token()
    races = []
    for i in range(RACES):
        a = f"{tag}-a{i}"
        race = {"a": a, "aToken": new_device(hub, owner, a), "messageId": f"{tag}-{i}",
                "c2dMessageId": f"{tag}-c2d-{i}"}
        if with_b:
            b = f"{tag}-b{i}"
            race.update(b=b, bToken=new_device(hub, owner, b))
        races.append(race)
    return races


def judge(race):
    """What is wrong with one race's outcome (empty when nothing): the connection open, and when
    the race had settled exactly one of A's two links attached and the other detached with an
    error; B's telemetry accepted."""
    problems = []
    conn = race["connection"]
    if not conn["open"] or conn["closed"] is not None or conn["disconnected"]:
        problems.append(f"the connection ended: {conn}")
    links = race["atSettle"] or []
    live = [link for link in links if link["opened"] and not link["closed"]]
    lost = [link for link in links if link["closed"]]
    if len(live) != 1 or len(lost) != 1:
        problems.append(f"{len(live)} of A's links attached, {len(lost)} detached: "
                        f"{[(l['session'], l['opened'], l['closed'], l['error']) for l in links]}")
    for link in lost:
        if link["error"] is None or not link["error"].get("condition"):
            problems.append(f"session {link['session']}'s link was detached with no error")
    if race["b"] is not None and race["b"]["sent"] != "accepted":
        problems.append(f"B's telemetry: {race['b']['sent']} (link {race['b']['error']})")
    return problems


def live_now(race):
    """A's links attached when the snapshot was taken."""
    links = race["links"] + ([race["later"]] if race["later"] else [])
    return [link for link in links if link["opened"] and not link["closed"]]


def connected(hub, races, raced, problems):
    """While the links are up, the registry shows each A whose connection is open Connected."""
    owner = hub.token()
    for i, (spec, race) in enumerate(zip(races, raced["races"])):
        state = hub.request("GET", f"/devices/{spec['a']}", owner).json()["connectionState"]
        if state != "Connected" and race["connection"]["open"]:
            problems[i].append(f"A is {state} while its link is up")


def wait_disconnected(hub, device_ids):
    owner = hub.token()
    deadline = time.time() + WAIT
    for d in device_ids:
        while (got := hub.request("GET", f"/devices/{d}", owner).json()["connectionState"]) != "Disconnected":
            assert time.time() < deadline, f"{d} is {got}, not Disconnected\nhub log:\n{hub_log(hub)}"
            time.sleep(0.2)


def wait_events(hub, expected):
    """Waits until the built-in endpoint holds exactly `expected` ({device id: sorted [message
    id]}) of those devices' events."""
    deadline = time.time() + WAIT
    while True:
        got = collections.defaultdict(list)
        for e in hub.all_events():
            d = e["systemProperties"].get("iothub-connection-device-id")
            if d in expected:
                got[d].append(e["systemProperties"].get("message-id"))
        got = {d: sorted(ids) for d, ids in got.items()}
        if got == expected or time.time() > deadline:
            break
        time.sleep(0.2)
    assert got == expected


def summary(raced, problems):
    conditions = collections.Counter(
        (link["error"] or {}).get("condition") for r in raced["races"]
        for link in r["links"] + ([r["later"]] if r["later"] else []) if link["closed"])
    ended = sum(1 for r in raced["races"] if r["connection"]["closed"] is not None or r["connection"]["disconnected"])
    both = sum(1 for r in raced["races"]
               if all(link["opened"] and not link["closed"] for link in r["atSettle"] or []))
    lines = [f"{len(raced['races'])} races: the connection ended in {ended}, both of A's links stayed "
             f"attached in {both}; detach conditions {dict(conditions)}"]
    lines += [f"race {i}: {p}" for i, ps in sorted(problems.items()) for p in ps]
    return "\n".join(lines)


def test_two_sessions_attach_one_devices_c2d_link_at_once(sdk_hub):
    hub = sdk_hub
    races = make_races(hub, "att-c2d", with_b=True)
    racer = Racer(hub, request(hub, "c2d", races))
    try:
        raced = racer.answer("raced", 100)
        problems = collections.defaultdict(list)
        for i, race in enumerate(raced["races"]):
            problems[i] += judge(race)
        connected(hub, races, raced, problems)
        # The service SDK sends each A a message; each arrives on A's surviving link.
        sent = send_all(hub, [(r["a"], f"to {r['a']}", {"messageId": r["c2dMessageId"]}) for r in races])
        assert sent == [None] * RACES, sent
        racer.send({"op": "finish"})
        done = racer.answer("done", 60)
    finally:
        racer.close()
    print(summary(raced, problems))
    for i, (race, spec) in enumerate(zip(done["races"], races)):
        if problems[i]:
            continue
        problems[i] += [p for p in judge(race) if "B's telemetry" not in p]
        (survivor,) = [link for link in race["atSettle"] if not link["closed"]]
        live = live_now(race)
        if [link["session"] for link in live] != [survivor["session"]]:
            problems[i].append(f"A's links attached at the end: {[link['session'] for link in live]}, "
                               f"not the survivor's (session {survivor['session']})")
        got = [(link["session"], m["messageId"]) for link in race["links"] for m in link["received"]]
        if got != [(survivor["session"], spec["c2dMessageId"])]:
            problems[i].append(f"C2D (session, message id): {got}, expected {spec['c2dMessageId']} once "
                               f"on session {survivor['session']}'s link")
    assert not any(problems.values()), summary(raced, problems) + f"\n{racer.tail()}"

    # B's telemetry went through the built-in endpoint, once each.
    wait_events(hub, {r["b"]: [r["messageId"]] for r in races})
    # The stolen links left no registration behind: the connections closed, every identity is
    # recorded disconnected.
    wait_disconnected(hub, [r["a"] for r in races] + [r["b"] for r in races])


def test_two_sessions_attach_one_devices_telemetry_link_at_once(sdk_hub):
    """Two telemetry senders of A at once: the same rule, and the survivor's message is accepted.
    Then a third sender of A from a fourth session, once the race is settled: again exactly one
    of A's links is left attached, the other detached with an error, and the one left sends."""
    hub = sdk_hub
    races = make_races(hub, "att-tel", with_b=False)
    racer = Racer(hub, request(hub, "telemetry", races, later=True))
    problems = collections.defaultdict(list)
    try:
        raced = racer.answer("raced", 100)
        connected(hub, races, raced, problems)
        racer.send({"op": "finish"})
        done = racer.answer("done", 30)
    finally:
        racer.close()
    expected = {}
    for i, (race, spec) in enumerate(zip(raced["races"], races)):
        problems[i] += judge(race)
        if problems[i]:
            continue
        (survivor,) = [link for link in race["links"] if link["session"] in
                       {s["session"] for s in race["atSettle"] if not s["closed"]}]
        if survivor["sent"] != "accepted":
            problems[i].append(f"session {survivor['session']}'s surviving link sent: {survivor['sent']}")
        later = race["later"]
        pair = [survivor, later] if later else [survivor]
        live = live_now(race)
        lost = [link for link in pair if link["closed"]]
        if later is None or len(live) != 1 or len(lost) != 1:
            problems[i].append(f"after a later link: A's links attached {[link['session'] for link in live]}, "
                               f"{[(link['session'], link['closed'], link['error']) for link in pair]}")
        elif not (lost[0]["error"] or {}).get("condition"):
            problems[i].append(f"session {lost[0]['session']}'s link was detached with no error")
        elif live[0]["sentLater"] != "accepted":
            problems[i].append(f"session {live[0]['session']}'s link, left attached, sent: {live[0]['sentLater']}")
        else:
            expected[spec["a"]] = sorted([f"{spec['messageId']}-s{survivor['session']}",
                                          f"{spec['messageId']}-later-s{live[0]['session']}"])
    for i, race in enumerate(done["races"]):
        if not problems[i] and not race["connection"]["open"]:
            problems[i].append(f"the connection ended: {race['connection']}")
    print(summary(raced, problems))
    assert not any(problems.values()), summary(raced, problems) + f"\n{racer.tail()}"

    # What each A's links sent, and nothing else, in the built-in endpoint.
    wait_events(hub, expected)
    wait_disconnected(hub, [r["a"] for r in races])
