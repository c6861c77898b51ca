"""DPS under hostile input (issue 70): the provisioning service stays usable for good devices
while others flood it, and registrations of many devices at once keep their invariants.

- A flood of registrations with bad SAS signatures from one source address (127.0.0.5, over
  raw HTTPS) is refused 401 for the source's failed-attestation budget
  (`[throttling] dps_failed_attestations_per_minute`), then 429 (errorCode 429001,
  `Retry-After` >= 1) for every further request from that address, a correctly signed one too
  (over HTTPS, and over MQTT as `$dps/registrations/res/429/?...&retry-after=N`), until its
  budget refills; meanwhile devices registering with the official Python SDK from 127.0.0.1
  all end `assigned`, and the flood created nothing.
- Registrations pass the hub's device-connection throttle
  (`[throttling] device_connections_per_second`): a burst over raw HTTPS, MQTT and AMQP gets
  429 with the wait (HTTPS `Retry-After`, the MQTT topic's `retry-after`, the AMQP application
  property `retry-after`), and a refused registration creates nothing; Python SDK devices
  registering through the same throttle retry after the wait (the SDK retries any status
  >= 429 after the answer's `retry-after`) and all end `assigned`.
- 200 devices of a symmetric-key group register at once through the SDK's asyncio client: all
  assigned, exactly 200 devices in the registry, one registration record per device naming it;
  a handful registered again, twice each at once, still have one device each (same
  generationId): at least one of each pair is assigned (`deviceDataMigrated`), the other may
  fail only with its poll's 404 (its operation superseded).

The malformed-body refusal being the same over HTTPS, MQTT and AMQP is test_dps_bodies.py's.

Every hub here is on the SDKs' fixed ports (8883, 443, 5671), one at a time, with its own
`[throttling]` config (the ProvisioningDeviceClient cannot be pointed at another port).
"""

import asyncio
import base64
import http.client
import json
import ssl
import subprocess
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import requests
from azure.iot.device.aio import ProvisioningDeviceClient as AioProvisioningDeviceClient

from hubkit import REPO, Hub, sas_token
from mqttraw import RawMqtt
from routingkit import read_publish
from test_dps_python import (DEVICE_API, ERROR_BODY, HOST, close, derived_key, dps, id_scope, ok, put_group,
                             refused)
from test_node_event_hubs import node_env

RAW_AMQP_JS = str(REPO / "tests" / "node" / "dps_raw_amqp.js")
ATTACKER = "127.0.0.5"  # loopback is all of 127/8: another client, as the hub sees it
FRIEND = "127.0.0.1"
BAD_KEY = base64.b64encode(b"not the group's key, not anyone's").decode()


# -- hubs -----------------------------------------------------------------------------------
def start_hub(tmp_path, throttling: str = "") -> Hub:
    """A hub on the SDKs' fixed ports with `throttling` as its [throttling] section."""
    args = []
    if throttling:
        config = tmp_path / "hub.toml"
        config.write_text("[throttling]\n" + throttling)
        args = ["--config", str(config)]
    h = Hub(tmp_path / "hub")
    h.https_addr, h.mqtt_addr, h.amqp_addr = "127.0.0.1:443", "127.0.0.1:8883", "127.0.0.1:5671"
    return h.start(args)


@pytest.fixture
def hubs():
    started = []
    yield started
    for h in started:
        if h.running():
            h.kill()


def symmetric_group(hub, group_id: str) -> str:
    """Creates a symmetric-key enrollment group; its primary key."""
    put_group(hub, group_id, {"type": "symmetricKey"})
    return ok(dps(hub, "POST", f"/enrollmentGroups/{group_id}/attestationmechanism"))["symmetricKey"]["primaryKey"]


# -- raw HTTPS ------------------------------------------------------------------------------
@dataclass
class Answer:
    status: int
    headers: dict
    body: dict | None
    at: float = 0.0

    @property
    def retry_after(self) -> int | None:
        value = self.headers.get("retry-after")
        return int(value) if value is not None else None


class Https:
    """One TLS connection to the hub's HTTPS listener from `source` (connected when made, so a
    burst of requests can be sent after every handshake is done)."""

    def __init__(self, hub, source: str = FRIEND):
        ctx = ssl.create_default_context(cafile=hub.ca)
        self.conn = http.client.HTTPSConnection("localhost", hub.port, context=ctx, timeout=30,
                                                source_address=(source, 0))
        self.conn.connect()

    def call(self, method: str, path: str, token: str, body: bytes | None = None) -> Answer:
        self.conn.request(method, path, body=body,
                          headers={"Authorization": token, "Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(data) if data else None,
                      time.monotonic())

    def register(self, scope: str, rid: str, key: str) -> Answer:
        return self.call("PUT", f"/{scope}/registrations/{rid}/register?api-version={DEVICE_API}",
                         sas_token(f"{scope}/registrations/{rid}", key),
                         json.dumps({"registrationId": rid}).encode())

    def close(self):
        self.conn.close()


def register_once(hub, scope: str, rid: str, key: str, source: str = FRIEND) -> Answer:
    """One register request on a connection of its own from `source`."""
    c = Https(hub, source)
    try:
        return c.register(scope, rid, key)
    finally:
        c.close()


def is_throttled(a: Answer, where: str = ""):
    """A 429 with DPS's error body (429001) and a Retry-After of at least a second."""
    assert a.status == 429, (where, a)
    assert a.body is not None and ERROR_BODY <= a.body.keys() and a.body["errorCode"] == 429001, (where, a)
    assert a.retry_after is not None and a.retry_after >= 1, (where, a)


def created_nothing(hub, rid: str):
    r = hub.request("GET", f"/devices/{urllib.parse.quote(rid, safe='')}", hub.token())
    assert r.status_code == 404, (rid, r.status_code, r.text)
    refused(dps(hub, "GET", f"/registrations/{rid}"), 404, 404203)


def device_ids(hub) -> list[str]:
    r = hub.request("GET", "/devices?top=1000", hub.token())
    assert r.status_code == 200, r.text
    return [d["deviceId"] for d in r.json()]


# -- raw MQTT and AMQP ----------------------------------------------------------------------
def mqtt_registers(hub, scope: str, rid: str, key: str, n: int, source: str = FRIEND):
    """`n` register requests published back to back on one provisioning connection from
    `source`; each answer as (status, topic parameters, body), in request order."""
    c = RawMqtt(hub.mqtt_port, hub.ca, source=source)
    try:
        _, rc = c.connect(rid, f"{scope}/registrations/{rid}/api-version={DEVICE_API}",
                          sas_token(f"{scope}/registrations/{rid}", key))
        assert rc == 0, f"CONNACK {rc}"  # as DPS does, the CONNECT is accepted; requests are answered
        c.subscribe([("$dps/registrations/res/#", 0)])
        body = json.dumps({"registrationId": rid}).encode()
        for i in range(n):
            c.publish(f"$dps/registrations/PUT/iotdps-register/?$rid={i}", body)
        answers = {}
        while len(answers) < n:
            topic, payload = read_publish(c, timeout=30)
            assert topic.startswith("$dps/registrations/res/"), topic
            params = dict(urllib.parse.parse_qsl(topic.split("?", 1)[1]))
            answers[int(params["$rid"])] = (int(topic.split("/")[3]), params, json.loads(payload))
        return [answers[i] for i in range(n)]
    finally:
        c.close()


def amqp_registers(hub, scope: str, rid: str, key: str, n: int):
    """`n` register requests sent at once on one AMQP provisioning link (tests/node/dps_raw_amqp.js);
    each answer as (iotdps-status, retry-after, body), in request order."""
    body = base64.b64encode(json.dumps({"registrationId": rid}).encode()).decode()
    request = {"host": "127.0.0.1", "port": hub.amqp_port, "idScope": scope, "registrationId": rid,
               "token": sas_token(f"{scope}/registrations/{rid}", key), "bodies": [body] * n,
               "timeoutMs": 30000}
    done = subprocess.run(["node", RAW_AMQP_JS], input=json.dumps(request), capture_output=True, text=True,
                          timeout=45, env=node_env(hub))
    assert done.returncode == 0, f"dps_raw_amqp.js exited {done.returncode}:\n{done.stderr[-3000:]}"
    replies = json.loads(done.stdout.strip().splitlines()[-1])["replies"]
    return [(r["status"], r.get("retryAfter"), r["body"]) for r in replies]


# -- the Python SDK -------------------------------------------------------------------------
async def sdk_register(hub, scope: str, rid: str, key: str, gate: asyncio.Semaphore, timeout: float):
    """Registers through the SDK's asyncio client; the RegistrationResult, or the exception."""
    async with gate:
        client = AioProvisioningDeviceClient.create_from_symmetric_key(
            provisioning_host=HOST, registration_id=rid, id_scope=scope, symmetric_key=key,
            server_verification_cert=open(hub.ca).read())
        try:
            result = await asyncio.wait_for(client.register(), timeout)
        except Exception as e:  # noqa: BLE001 - reported per device by the caller
            await asyncio.get_running_loop().run_in_executor(None, close, client)
            return e
        if result.status != "assigned":
            await asyncio.get_running_loop().run_in_executor(None, close, client)
        return result


def sdk_register_all(hub, scope: str, members: list[tuple[str, str]], concurrency: int | None = None,
                     timeout: float = 90) -> list:
    """Every (registration id, key) registered at once through the SDK (at most `concurrency`
    at a time); each one's result or exception, in order."""

    async def main():
        gate = asyncio.Semaphore(concurrency or len(members))
        return await asyncio.gather(*(sdk_register(hub, scope, rid, key, gate, timeout) for rid, key in members))

    return asyncio.run(main())


def assert_assigned(results: list, members: list[tuple[str, str]]):
    failed = {rid: repr(r) for (rid, _), r in zip(members, results)
              if isinstance(r, BaseException) or r.status != "assigned"}
    assert not failed, f"{len(failed)} of {len(members)} not assigned: {dict(list(failed.items())[:5])}"
    for (rid, _), r in zip(members, results):
        assert (r.registration_state.device_id, r.registration_state.assigned_hub) == (rid, HOST), (rid, str(r))


def throttled_total(hub) -> float:
    """Refusals by every throttle, from the operations listener's /metrics (only the one
    configured can refuse here)."""
    r = requests.get(f"{hub.metrics_base()}/metrics", timeout=10)
    r.raise_for_status()
    return sum(float(line.rsplit(" ", 1)[1]) for line in r.text.splitlines()
               if line.startswith("ferrohub_throttled_total"))


# -- a) a flood of failed attestations from one address --------------------------------------
FAILED_PER_MINUTE = 10
REFILL_S = 60 / FAILED_PER_MINUTE  # one failure's budget comes back this often
FLOOD_AT_LEAST = 60


class Flood(threading.Thread):
    """Registrations with bad signatures from ATTACKER, one connection each, back to back: at
    least FLOOD_AT_LEAST, and on until told to stop. Right after the first 429 (the source is
    blocked for about REFILL_S from then) it registers a device with the right key from the
    same address, over HTTPS and MQTT."""

    def __init__(self, hub, scope: str, blocked_rid: str, blocked_key: str):
        super().__init__(name="dps-flood", daemon=True)
        self.hub, self.scope, self.blocked_rid, self.blocked_key = hub, scope, blocked_rid, blocked_key
        self.answers: list[Answer] = []
        self.good_https: Answer | None = None
        self.good_mqtt = None
        self.blocked = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self):
        try:
            deadline = time.monotonic() + 90
            i = 0
            while (i < FLOOD_AT_LEAST or not self.stop.is_set()) and time.monotonic() < deadline:
                a = register_once(self.hub, self.scope, f"attacker-{i}", BAD_KEY, source=ATTACKER)
                self.answers.append(a)
                if a.status == 429 and not self.blocked.is_set():
                    self.good_https = register_once(self.hub, self.scope, self.blocked_rid, self.blocked_key,
                                                    source=ATTACKER)
                    self.good_mqtt = mqtt_registers(self.hub, self.scope, self.blocked_rid, self.blocked_key, 1,
                                                    source=ATTACKER)[0]
                    self.blocked.set()
                i += 1
        except BaseException as e:  # noqa: BLE001 - raised again by the test
            self.error = e
        finally:
            self.blocked.set()


def test_a_flood_of_failed_attestations_blocks_its_source_and_no_one_else(tmp_path, hubs):
    hub = start_hub(tmp_path, f"dps_failed_attestations_per_minute = {FAILED_PER_MINUTE}\n")
    hubs.append(hub)
    scope, group_key = id_scope(hub), symmetric_group(hub, "hostile-fleet")
    blocked_rid = "hostile-from-attacker"
    good = [(f"hostile-good-{i}", derived_key(group_key, f"hostile-good-{i}")) for i in range(6)]

    flood = Flood(hub, scope, blocked_rid, derived_key(group_key, blocked_rid))
    flood.start()
    try:
        assert flood.blocked.wait(60), "the flood never got a 429"
        if flood.error:
            raise flood.error
        # The attacker's address is blocked now; devices from another address register as usual.
        results = sdk_register_all(hub, scope, good)
    finally:
        flood.stop.set()
        flood.join(60)
    assert not flood.is_alive(), "the flood did not stop"
    if flood.error:
        raise flood.error
    assert_assigned(results, good)

    answers = flood.answers
    statuses = [a.status for a in answers]
    assert len(answers) >= FLOOD_AT_LEAST, len(answers)
    # The source's budget of failures, each a 401 ...
    assert statuses[:FAILED_PER_MINUTE] == [401] * FAILED_PER_MINUTE, statuses[:FAILED_PER_MINUTE + 5]
    for a in answers[:FAILED_PER_MINUTE]:
        assert a.body["errorCode"] == 401002, a
    # ... then 429 at once, for everything but the odd failure its budget refills for.
    assert statuses[FAILED_PER_MINUTE] == 429, statuses[:FAILED_PER_MINUTE + 5]
    assert set(statuses) <= {401, 429}, statuses
    for a in answers:
        if a.status == 429:
            is_throttled(a, "flood")
    flood_s = answers[-1].at - answers[FAILED_PER_MINUTE].at
    late_401 = statuses[FAILED_PER_MINUTE:].count(401)
    assert late_401 <= 1 + flood_s / REFILL_S, (late_401, flood_s, statuses)
    assert statuses.count(429) >= len(answers) - FAILED_PER_MINUTE - late_401

    # The blocked address is refused whatever it sends: a good registration over HTTPS ...
    is_throttled(flood.good_https, "good registration from the blocked address")
    # ... and over MQTT: the CONNECT is accepted, the request answered 429 with the wait.
    status, params, body = flood.good_mqtt
    assert status == 429 and int(params["retry-after"]) >= 1, (status, params, body)
    assert ERROR_BODY <= body.keys() and body["errorCode"] == 429001, body
    created_nothing(hub, blocked_rid)
    # The flood created nothing: the registry holds the good devices only.
    assert sorted(device_ids(hub)) == sorted(rid for rid, _ in good)

    # Once its budget refills, the address is served again (the flood has stopped).
    deadline = time.monotonic() + 2 * REFILL_S + 10
    while True:
        a = register_once(hub, scope, blocked_rid, derived_key(group_key, blocked_rid), source=ATTACKER)
        if a.status == 202:
            break
        is_throttled(a, "waiting for the budget to refill")
        assert time.monotonic() + a.retry_after < deadline, f"still blocked: {a}"
        time.sleep(a.retry_after)
    assert a.body["status"] == "assigning", a
    assert ok(dps(hub, "GET", f"/registrations/{blocked_rid}"))["deviceId"] == blocked_rid


# -- b) the device-connection throttle ------------------------------------------------------
CONNECTS_PER_SECOND = 2
THROTTLED = f'device_connections_per_second = {CONNECTS_PER_SECOND}\nshaping_delay = "10ms"\n'
BURST = 12


def wait_for_refill():
    """The throttle's whole burst (a second's budget) comes back after a second without requests."""
    time.sleep(1.0 + 0.2)


def test_b_registrations_pass_the_device_connection_throttle(tmp_path, hubs):
    hub = start_hub(tmp_path, THROTTLED)
    hubs.append(hub)
    scope, group_key = id_scope(hub), symmetric_group(hub, "throttled-fleet")
    key = lambda rid: derived_key(group_key, rid)  # noqa: E731

    # HTTPS: every TLS handshake first (the throttle counts registrations), then every request at once.
    rids = [f"burst-https-{i}" for i in range(BURST)]
    with ThreadPoolExecutor(BURST) as pool:
        conns = list(pool.map(lambda _: Https(hub), range(BURST)))
        started = []
        gate = threading.Barrier(BURST, action=lambda: started.append(time.monotonic()))

        def go(i):
            gate.wait(10)
            return conns[i].register(scope, rids[i], key(rids[i]))

        try:
            answers = list(pool.map(go, range(BURST)))
        finally:
            for c in conns:
                c.close()
    statuses = [a.status for a in answers]
    assert set(statuses) <= {202, 429} and 202 in statuses and 429 in statuses, statuses
    # No more admitted than the burst and the rate for the time the burst took.
    took = max(a.at for a in answers) - started[0]
    assert statuses.count(202) <= CONNECTS_PER_SECOND + int(took * CONNECTS_PER_SECOND), (statuses, took)
    for rid, a in zip(rids, answers):
        if a.status == 429:
            is_throttled(a, rid)
            created_nothing(hub, rid)
        else:
            assert a.body["status"] == "assigning", a
            assert ok(dps(hub, "GET", f"/registrations/{rid}"))["deviceId"] == rid

    # MQTT: registers published back to back on one connection.
    wait_for_refill()
    mqtt = mqtt_registers(hub, scope, "burst-mqtt", key("burst-mqtt"), 6)
    assert {s for s, _, _ in mqtt} == {202, 429}, mqtt
    for status, params, body in mqtt:
        if status == 429:
            assert int(params["retry-after"]) >= 1, params
            assert ERROR_BODY <= body.keys() and body["errorCode"] == 429001, body
        else:
            assert body["status"] == "assigning", body

    # AMQP: registers sent at once on one link.
    wait_for_refill()
    amqp = amqp_registers(hub, scope, "burst-amqp", key("burst-amqp"), 6)
    codes = [body.get("errorCode") for _, _, body in amqp]
    assert 429001 in codes and None in codes, amqp
    for status, retry_after, body in amqp:
        if body.get("errorCode") == 429001:
            assert status == "failed" and ERROR_BODY <= body.keys(), (status, body)
            assert retry_after is not None and int(retry_after) >= 1, (retry_after, body)
        else:
            assert status in ("assigning", "assigned") and "operationId" in body, (status, body)

    # The Python SDK over MQTT, eight devices at once through the same throttle: the refused
    # ones wait the answer's retry-after and register again, and all end assigned.
    wait_for_refill()
    refusals_before = throttled_total(hub)
    members = [(f"burst-sdk-{i}", key(f"burst-sdk-{i}")) for i in range(8)]
    results = sdk_register_all(hub, scope, members)
    assert_assigned(results, members)
    assert throttled_total(hub) > refusals_before, "the SDK devices were never refused: nothing was retried"


# -- c) many devices at once ----------------------------------------------------------------
MANY = 200
# How many SDK registrations run at once (a semaphore): all of them, which the SDK manages.
MANY_AT_ONCE = 200


@pytest.mark.timeout(180)
def test_c_200_devices_register_at_once_and_each_has_one_device(tmp_path, hubs):
    hub = start_hub(tmp_path)
    hubs.append(hub)
    scope, group_key = id_scope(hub), symmetric_group(hub, "crowd")
    members = [(f"crowd-{i:03}", derived_key(group_key, f"crowd-{i:03}")) for i in range(MANY)]

    results = sdk_register_all(hub, scope, members, concurrency=MANY_AT_ONCE, timeout=120)
    assert_assigned(results, members)

    rids = sorted(rid for rid, _ in members)
    assert sorted(device_ids(hub)) == rids
    records, continuation = [], None
    while True:
        headers = {"x-ms-max-item-count": "1000", **({"x-ms-continuation": continuation} if continuation else {})}
        r = dps(hub, "POST", "/registrations/crowd/query", json={}, headers=headers)
        records += ok(r)
        continuation = r.headers.get("x-ms-continuation")
        if not continuation:
            break
    assert sorted(r["registrationId"] for r in records) == rids
    for r in records:
        assert (r["deviceId"], r["status"], r["assignedHub"]) == (r["registrationId"], "assigned", HOST), r

    # A handful again, each twice at once: still one device per registration id, the same one.
    again = members[:5]
    before = {rid: ok(hub.request("GET", f"/devices/{rid}", hub.token()))["generationId"] for rid, _ in again}
    twice = [m for m in again for _ in range(2)]
    results = sdk_register_all(hub, scope, twice, timeout=60)
    outcomes = {}
    for (rid, _), r in zip(twice, results):
        if isinstance(r, BaseException):
            # The one whose operation the other's registration superseded: the registration
            # state names the later operation only, so the earlier one's poll is a 404 (seen
            # for one of each pair on 2026-12-07). Allowed here: the point is one device.
            assert "status code 404" in str(r.__cause__), (rid, repr(r), repr(r.__cause__))
            outcomes.setdefault(rid, []).append("superseded")
        else:
            assert r.status == "assigned" and r.registration_state.device_id == rid, (rid, str(r))
            assert r.registration_state.sub_status == "deviceDataMigrated", (rid, str(r))
            outcomes.setdefault(rid, []).append("assigned")
    assert all("assigned" in o for o in outcomes.values()), outcomes
    assert sorted(device_ids(hub)) == rids
    for rid, _ in again:
        assert ok(hub.request("GET", f"/devices/{rid}", hub.token()))["generationId"] == before[rid], rid
        assert ok(dps(hub, "GET", f"/registrations/{rid}"))["deviceId"] == rid
    print(f"re-registrations twice at once: {outcomes}")
