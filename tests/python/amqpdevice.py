"""A device (or module) over AMQP with uamqp, Microsoft's C-based AMQP client (the one the Python
SDKs used), in a separate process: SASL PLAIN with a device SAS token, a SendClient on the
identity's telemetry address, plain messages, value-bodied messages and BatchMessages.

uamqp keeps C-level sockets and closes them when it gets round to it; in the pytest process that
can close or write to a descriptor number a later test's socket has reused (see amqpsend.py). A
separate interpreter per call, fed over a pipe, keeps its descriptors out of the test process.

Run as a script: reads a request as JSON on stdin and prints one JSON line:

    request = {"ca", "host", "port", "deadline" (seconds, the whole run), "debug" (optional:
               uamqp's frame trace on stderr),
               "connections": [{"user", "password", "target" (a path such as
                                "/devices/d1/messages/events"), "sends": [send, ...]}, ...]}
    send    = {"message": msg} | {"batch": [msg, ...], "max_length": bytes (optional)}
    msg     = {"body": text, or "value": any JSON (sent as an AMQP value body, not data),
               "properties": {"message_id", "correlation_id", "content_type",
                              "content_encoding", "user_id"} (all optional),
               "application_properties": {name: value}}

    answer  = {"connections": [{"target", "sends": [result, ...], "error": failure or null}, ...],
               "hung": null, or what was running when the deadline passed}
    result  = null (accepted), a failure, or {"skipped": "..."} once the client is unusable
    failure = {"type": the uamqp exception's class, "condition": "amqp:...", "description",
               "info": the error's info map (the hub's status-code) or null, "message",
               "then": the detach or close that ended the link right after (optional)}

Connections run one after another, each with its own TLS connection (SASL PLAIN) and SendClient.
A send the hub rejects by disposition leaves the client open and the next send goes on the same
link. An error that ends the link or connection (detach, close, SASL failure) ends that
connection's sends: the rest are reported skipped. A detach that arrives while a transfer is on
the wire makes uamqp fail that transfer unsettled (ClientMessageError, amqp:unknown-error) and
raise the detach only at the next send; the detach is then reported as the failure's `then`.
"""

import json
import os
import subprocess
import sys
import threading
import time


def run(hub, connections, deadline=60):
    """Runs `connections` against `hub` in a fresh interpreter; returns the answer (see above).
    Asserts the child exited cleanly (a hang is reported in the answer's `hung`)."""
    request = {"ca": hub.ca, "host": "localhost", "port": hub.amqp_port, "deadline": deadline,
               "connections": connections}
    done = subprocess.run([sys.executable, os.path.abspath(__file__)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=deadline + 30)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}"
    return json.loads(lines[-1])


# -- the child process ---------------------------------------------------------------------------

def _text(v):
    if v is None:
        return None
    if hasattr(v, "value"):  # uamqp.constants.ErrorCodes
        v = v.value
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _info(info):
    """An error's info map (the hub's `status-code`) as JSON."""
    if not isinstance(info, dict):
        return None
    return {_text(k): v if isinstance(v, (int, float, str, type(None))) else _text(v)
            for k, v in info.items()}


def _failure(e):
    info = getattr(e, "info", None)
    if isinstance(info, dict) and "failed_messages" in info:
        # send_message's summary: the hub's own error is the failed message's response.
        responses = list(info["failed_messages"].values())
        info = getattr(responses[-1], "info", None) if responses else None
    return {"type": type(e).__name__, "condition": _text(getattr(e, "condition", None)),
            "description": _text(getattr(e, "description", None)), "info": _info(info),
            "message": str(e)}


def _message(spec):
    from uamqp import Message, MessageBodyType
    from uamqp.message import MessageProperties

    props = spec.get("properties") or {}
    properties = MessageProperties(**{k: props[k] for k in
                                      ("message_id", "correlation_id", "content_type",
                                       "content_encoding", "user_id") if k in props}) if props else None
    app = spec.get("application_properties") or None
    if "value" in spec:
        return Message(body=spec["value"], body_type=MessageBodyType.Value, properties=properties,
                       application_properties=app)
    return Message(body=spec["body"].encode(), properties=properties, application_properties=app)


def _send(client, spec):
    from uamqp import BatchMessage

    if "batch" in spec:
        batch = BatchMessage(data=[_message(m) for m in spec["batch"]])
        if spec.get("max_length"):
            # uamqp refuses locally above 256 KiB unless told otherwise.
            batch.max_message_length = spec["max_length"]
        client.send_message(batch)
    else:
        client.send_message(_message(spec["message"]))


def _link_error(client):
    """What ended the client's link or connection, if something did: after a failed send, a
    detach may already be in (uamqp raises it only at the next send)."""
    # pylint: disable=protected-access
    for _ in range(5):
        handler = client.message_handler
        if client._shutdown or handler is None:
            return RuntimeError("the client shut down")
        if handler._error is not None:
            return handler._error
        try:
            client._connection.work()
        except Exception as e:  # pylint: disable=broad-except
            return e
        time.sleep(0.05)
    return None


def _connection(request, conn, out, state):
    """One TLS connection (SASL PLAIN), one SendClient on `conn["target"]`, its sends in order."""
    from uamqp import SendClient, errors
    from uamqp.authentication import SASLPlain

    debug = bool(request.get("debug"))
    auth = SASLPlain(request["host"], conn["user"], conn["password"], port=request["port"],
                     verify=request["ca"])
    target = f"amqps://{request['host']}:{request['port']}{conn['target']}"
    # No retries: a refusal is reported as the hub gave it.
    client = SendClient(target, auth=auth, error_policy=errors.ErrorPolicy(max_retries=0),
                        msg_timeout=20000, debug=debug)
    try:
        for i, spec in enumerate(conn["sends"]):
            state["running"] = f"{conn['target']} send {i}"
            try:
                _send(client, spec)
                out["sends"].append(None)
            except errors.ClientMessageError as e:
                # A disposition (rejected, released, modified), or a send that failed for a
                # reason uamqp does not know yet: a detach may be what follows.
                failure = _failure(e)
                out["sends"].append(failure)
                ended = _link_error(client)
                if ended is not None:
                    failure["then"] = _failure(ended)
                    break
            except Exception as e:  # a detach, a close, a SASL failure: the client is done
                out["sends"].append(_failure(e))
                break
    finally:
        state["running"] = f"{conn['target']} close"
        while len(out["sends"]) < len(conn["sends"]):
            out["sends"].append({"skipped": "the client ended at an earlier send"})
        try:
            client.close()
        except Exception as e:  # pylint: disable=broad-except
            out["error"] = _failure(e)


def _main():
    request = json.load(sys.stdin)
    if request.get("debug"):  # uamqp's frame trace, on stderr
        import logging
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    answer = {"connections": [], "hung": None}
    state = {"running": "start"}
    lock = threading.Lock()

    def give_up():
        with lock:
            answer["hung"] = state["running"]
            print(json.dumps(answer), flush=True)
            os._exit(0)  # uamqp's C loop may not return

    timer = threading.Timer(request["deadline"], give_up)
    timer.daemon = True
    timer.start()
    for conn in request["connections"]:
        out = {"target": conn["target"], "sends": [], "error": None}
        with lock:
            answer["connections"].append(out)
        _connection(request, conn, out, state)
    timer.cancel()
    with lock:
        print(json.dumps(answer), flush=True)
    os._exit(0)  # skip uamqp's C-level teardown at interpreter exit


if __name__ == "__main__":
    _main()
