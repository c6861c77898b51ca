"""C2D sends with the official service SDK (azure-iot-hub, over uamqp), in a separate process.

uamqp keeps C-level sockets and closes them when it gets round to it; in the pytest process that
can close or write to a descriptor number a later test's socket has reused, which shows up as a
corrupt TLS stream in an unrelated test. A separate interpreter per batch, fed over a pipe, keeps
the SDK's descriptors out of the test process, as a back-end application's would be.

Run as a script: reads {"ca", "connection_string", "websockets", "sends"} as JSON on stdin and
prints one result per send (null, or the exception the SDK raised, as text) as a JSON list.
"""

import json
import os
import subprocess
import sys


def send_all(hub, sends, websockets=False, connection_string=None, timeout=120):
    """Sends each (device_id, body, properties) in order on one SDK connection; per send, None
    or the exception the SDK raised (as text). Bodies are text."""
    request = {
        "ca": hub.ca,
        "connection_string": connection_string or hub.connection_string("iothubowner", with_port=False),
        "websockets": websockets,
        "sends": [[d, b, p] for d, b, p in sends],
    }
    done = subprocess.run([sys.executable, __file__], input=json.dumps(request), capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _main():
    request = json.load(sys.stdin)
    os.environ["SSL_CERT_FILE"] = request["ca"]
    from azure.iot.hub import IoTHubRegistryManager
    from uamqp import TransportType
    kw = {"transport_type": TransportType.AmqpOverWebsocket} if request["websockets"] else {}
    mgr = IoTHubRegistryManager.from_connection_string(request["connection_string"], **kw)
    results = []
    try:
        for device_id, body, properties in request["sends"]:
            try:
                mgr.send_c2d_message(device_id, body, properties=properties or {})
                results.append(None)
            except Exception as e:  # the SDK raises plain Exceptions for refusals
                results.append(repr(e))
    finally:
        mgr.amqp_svc_client.disconnect_sync()
    print(json.dumps(results))


if __name__ == "__main__":
    _main()
