"""Issue 51: devices and modules over AMQP with uamqp 1.6.11, the C-based AMQP client Microsoft's
Python SDKs used (tests/python/amqpdevice.py runs it in a separate interpreter), against the
plain `hub` fixture (ephemeral ports).

Covered:
- SASL PLAIN device authentication (user `{deviceId}@sas.{hubName}` or
  `{deviceId}/modules/{moduleId}@sas.{hubName}`, a device SAS token as the password), a
  SendClient on the identity's `messages/events`: message id, correlation id, content type and
  encoding, user id and application properties are read back through the read API with the
  connection's device id, module id and SAS auth method.
- The SDKs' batch format (uamqp.BatchMessage: message format 0x80013700, each data section an
  encoded message): one event per inner message, in order, each with its own properties; a
  batch under the 256 KiB link limit is taken whole, one over it is refused with
  `amqp:link:message-size-exceeded` and none of it is stored.
- Refusals and what follows them: a value-bodied message is rejected with `amqp:invalid-field`
  and the same link then delivers; a link to another device's address is detached with
  `amqp:unauthorized-access`; an expired token and a token signed with another device's key are
  refused when the link attaches (docs/amqp.md: a device's PLAIN token is kept at SASL and
  checked at its first link), a PLAIN user naming another hub fails SASL; after each, the hub
  serves the right credentials at once and the hub process is still running.

Not covered: uamqp's receive side (C2D, twin, methods over SASL PLAIN), AMQP over WebSocket, a
second link on a connection whose first SendClient was closed (uamqp ends that session
untidily: it sends END before the DETACH answer, then a second END, and the hub closes the
connection with amqp:not-found).
"""

import base64
import json
import time

import amqpdevice
from hubkit import sas_token
from routingkit import HUB_NAME

WAIT = 20
KIB = 1024


def hub_log(hub, lines=40):
    """The hub's recent log lines (the AMQP library's own noise left out), for failures."""
    try:
        text = hub.stderr_path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(no hub log: {e})"
    return "\n".join([t for t in text if "fe2o3_amqp" not in t][-lines:])


def user(device_id, module_id=None):
    who = f"{device_id}/modules/{module_id}" if module_id else device_id
    return f"{who}@sas.{HUB_NAME}"


def events_address(device_id, module_id=None):
    return f"/devices/{device_id}" + (f"/modules/{module_id}" if module_id else "") + "/messages/events"


def connection(hub, device_id, module_id=None, sends=(), password=None, target=None, plain_user=None):
    """One SASL PLAIN connection of `device_id` (or its module) with a SendClient on its own
    telemetry address, unless `target` names another."""
    return {"user": plain_user or user(device_id, module_id),
            "password": password or hub.device_token(device_id, module_id),
            "target": target or events_address(device_id, module_id), "sends": list(sends)}


def run(hub, *connections):
    out = amqpdevice.run(hub, list(connections))
    assert out["hung"] is None, f"uamqp hung at {out['hung']}: {out}\nhub log:\n{hub_log(hub)}"
    assert hub.proc.poll() is None, f"the hub exited with {hub.proc.returncode}\nhub log:\n{hub_log(hub)}"
    return [c["sends"] for c in out["connections"]]


def msg(body, **kw):
    return {"body": body, **kw}


def send(m):
    return {"message": m}


def final(result):
    """The refusal as the client finally learnt it. A detach that follows a transfer already on
    the wire reaches uamqp after it has failed that transfer unsettled (ClientMessageError,
    amqp:unknown-error); amqpdevice then reports the detach as `then`."""
    assert result is not None and "skipped" not in result, result
    return result.get("then") or result


def body(event):
    return base64.b64decode(event["body"]).decode()


def wait_events(hub, device_id, n, timeout=WAIT):
    deadline = time.time() + timeout
    while len(events := hub.events_of(device_id)) < n:
        assert time.time() < deadline, f"{len(events)} of {n} events of {device_id}: {events}\nhub log:\n{hub_log(hub)}"
        time.sleep(0.2)
    return events


def log_lines(hub, needle):
    return [line for line in hub.stderr_path.read_text(errors="replace").splitlines() if needle in line]


def auth_method(event):
    return json.loads(event["systemProperties"]["iothub-connection-auth-method"])


FULL_PROPERTIES = {"message_id": "uamqp-m1", "correlation_id": "uamqp-c1", "content_type": "application/json",
                   "content_encoding": "utf-8", "user_id": "uamqp-user"}


def check_full(event, device_id, module_id=None, tag=""):
    sp = event["systemProperties"]
    assert body(event) == json.dumps({"temp": 21.5, "from": tag}), event
    assert event["properties"] == {"color": "blue", "n": "7"}, event
    assert (sp["message-id"], sp["correlation-id"]) == ("uamqp-m1", "uamqp-c1"), sp
    assert (sp["content-type"], sp["content-encoding"]) == ("application/json", "utf-8"), sp
    assert sp["user-id"] == "uamqp-user", sp
    assert sp["iothub-connection-device-id"] == device_id, sp
    assert sp.get("iothub-connection-module-id") == module_id, sp
    method = auth_method(event)
    assert method["type"] == "sas", method
    if not module_id:
        # (A module's events say "device" too, over MQTT as well; IoT Hub may say "module".)
        assert method["scope"] == "device", method
    assert sp["iothub-message-source"] == "Telemetry", sp


def full_message(tag):
    # `n` goes as an AMQP long and is stored as text.
    return msg(json.dumps({"temp": 21.5, "from": tag}), properties=FULL_PROPERTIES,
               application_properties={"color": "blue", "n": 7})


def test_device_over_sasl_plain_sends_telemetry_with_its_properties(hub):
    d = "uamqp-dev"
    hub.create_device(d)
    (sends,) = run(hub, connection(hub, d, sends=[send(full_message(d))]))
    assert sends == [None], sends
    (event,) = wait_events(hub, d, 1)
    check_full(event, d, tag=d)


def test_module_over_sasl_plain_sends_telemetry_with_its_module_id(hub):
    d, m = "uamqp-edge", "uamqp-mod"
    hub.create_device(d)
    hub.create_module(d, m)
    (sends,) = run(hub, connection(hub, d, m, sends=[send(full_message(m))]))
    assert sends == [None], sends
    (event,) = wait_events(hub, d, 1)
    check_full(event, d, module_id=m, tag=m)


def test_batch_message_becomes_one_event_per_message_in_order(hub):
    d = "uamqp-batch"
    hub.create_device(d)
    inner = [msg(f"reading {i}", properties={"message_id": f"b-{i}", "correlation_id": f"batch-{i}",
                                               "content_type": "text/plain"},
                 application_properties={"index": str(i), f"only-{i}": "yes"})
             for i in range(3)]
    (sends,) = run(hub, connection(hub, d, sends=[{"batch": inner}, send(msg("after the batch"))]))
    assert sends == [None, None], sends
    events = wait_events(hub, d, 4)
    assert [body(e) for e in events] == ["reading 0", "reading 1", "reading 2", "after the batch"]
    for i, e in enumerate(events[:3]):
        sp = e["systemProperties"]
        assert e["properties"] == {"index": str(i), f"only-{i}": "yes"}, e
        assert (sp["message-id"], sp["correlation-id"], sp["content-type"]) == (f"b-{i}", f"batch-{i}", "text/plain"), sp
        assert sp["iothub-connection-device-id"] == d and auth_method(e)["type"] == "sas", sp
    assert [e["sequenceNumber"] for e in events] == sorted(e["sequenceNumber"] for e in events)


def test_oversized_batch_is_refused_whole_and_the_hub_keeps_serving(hub):
    """4 x 60 KiB fits the link's 256 KiB and is taken; 5 x 60 KiB (307 280 bytes on the wire) is
    refused with amqp:link:message-size-exceeded. The hub announces max-message-size 262144 on
    the telemetry link, so the refusal is the link's (a detach, by the AMQP library), not a
    rejected disposition: uamqp fails the batch unsettled, then reports the detach."""
    d = "uamqp-big"
    hub.create_device(d)
    chunk = "x" * (60 * KIB)
    fits = [msg(chunk, application_properties={"part": str(i)}) for i in range(4)]
    too_big = [msg(chunk, application_properties={"part": f"big-{i}"}) for i in range(5)]
    # uamqp itself refuses a BatchMessage over 256 KiB unless its limit is raised.
    first, second = run(
        hub,
        connection(hub, d, sends=[{"batch": fits}, {"batch": too_big, "max_length": 1 << 20},
                                  send(msg("never sent"))]),
        connection(hub, d, sends=[send(msg("after the refusal"))]),
    )
    assert first[0] is None, first
    refusal = final(first[1])
    assert refusal["condition"] == "amqp:link:message-size-exceeded", (first, hub_log(hub))
    assert refusal["type"] == "LinkDetach", refusal
    assert "skipped" in first[2], "the link is gone after the detach"
    assert second == [None], f"a new connection of the same device is served: {second}\n{hub_log(hub)}"
    events = wait_events(hub, d, 5)
    assert [e["properties"].get("part") for e in events] == ["0", "1", "2", "3", None], \
        "the batch that fits, whole; nothing of the oversized one"
    assert body(events[-1]) == "after the refusal"
    assert all(len(body(e)) == 60 * KIB for e in events[:4])


def test_value_body_is_rejected_and_the_same_link_goes_on(hub):
    d = "uamqp-value"
    hub.create_device(d)
    (sends,) = run(hub, connection(hub, d, sends=[
        send({"value": {"temp": 21.5}}),
        send({"value": [1, 2, 3]}),
        send(msg("good after the values", properties={"message_id": "good-1"})),
    ]))
    for refused in sends[:2]:
        assert refused is not None and "then" not in refused, f"a rejected disposition, not a detach: {sends}"
        assert refused["type"] == "ClientMessageError", refused
        assert refused["condition"] == "amqp:invalid-field", refused
        assert refused["description"].startswith("ErrorCode:ArgumentInvalid;"), refused
        assert refused["info"] == {"status-code": 400004}, refused
    assert sends[2] is None, f"the same link delivers after the rejections: {sends}\n{hub_log(hub)}"
    (event,) = wait_events(hub, d, 1)
    assert body(event) == "good after the values"
    assert event["systemProperties"]["message-id"] == "good-1"


def test_another_devices_address_is_unauthorized_and_nothing_is_stored(hub):
    me, other = "uamqp-me", "uamqp-other"
    hub.create_device(me)
    hub.create_device(other)
    stolen, mine, theirs = run(
        hub,
        connection(hub, me, target=events_address(other), sends=[send(msg("as the other device"))]),
        connection(hub, me, sends=[send(msg("my own"))]),
        connection(hub, other, sends=[send(msg("the other's own"))]),
    )
    refusal = final(stolen[0])
    assert refusal["type"] == "LinkDetach", stolen
    assert refusal["condition"] == "amqp:unauthorized-access", stolen
    assert refusal["description"].startswith("ErrorCode:IotHubUnauthorizedAccess;"), refusal
    assert refusal["info"] == {"status-code": 401002}, refusal
    assert mine == [None] and theirs == [None], (mine, theirs, hub_log(hub))
    assert [body(e) for e in wait_events(hub, me, 1)] == ["my own"]
    assert [body(e) for e in wait_events(hub, other, 1)] == ["the other's own"]
    assert [line for line in log_lines(hub, "AMQP device link refused") if f"identity={other}" in line], hub_log(hub)


def test_expired_token_and_wrong_key_are_refused_and_the_right_token_is_served(hub):
    d, key_owner = "uamqp-victim", "uamqp-key-owner"
    hub.create_device(d)
    hub.create_device(key_owner)
    expired = hub.device_token(d, expiry=int(time.time()) - 600)
    wrong_key = sas_token(f"localhost/devices/{d}", hub.device_key(key_owner))
    opened_before = len(log_lines(hub, "AMQP connection open"))
    expired_out, wrong_out, other_hub_out, good = run(
        hub,
        connection(hub, d, password=expired, sends=[send(msg("expired"))]),
        connection(hub, d, password=wrong_key, sends=[send(msg("wrong key"))]),
        connection(hub, d, plain_user=f"{d}@sas.not-{HUB_NAME}", sends=[send(msg("other hub"))]),
        connection(hub, d, sends=[send(msg("the right token"))]),
    )
    # A device's PLAIN token is kept at SASL and checked when its first link attaches.
    for out, reason in ((expired_out, "the token expired"),
                        (wrong_out, "the token's signature does not match")):
        refusal = final(out[0])
        assert refusal["type"] == "LinkDetach", out
        assert refusal["condition"] == "amqp:unauthorized-access", out
        assert refusal["description"] == f"ErrorCode:IotHubUnauthorizedAccess;{reason}", refusal
    # A user that names no device of this hub is a policy user: refused at SASL, so the
    # connection never opens (uamqp sees the socket close).
    assert other_hub_out[0]["type"] == "ConnectionClose", other_hub_out
    assert good == [None], f"the right token right after: {good}\n{hub_log(hub)}"
    assert [body(e) for e in wait_events(hub, d, 1)] == ["the right token"]
    assert hub.events_of(key_owner) == []
    assert len(log_lines(hub, "AMQP connection open")) - opened_before == 3, \
        f"the expired, wrong-key and good connections opened; the other hub's did not\n{hub_log(hub)}"
    refused = [line for line in log_lines(hub, "AMQP device link refused") if f"identity={d} " in line]
    assert len(refused) == 2 and "expired" in refused[0] and "signature" in refused[1], refused
