"""MTH-1, MTH-2, MQT-11: direct methods from the official service SDK to official device SDK
clients (fixed ports 8883/443, one shared hub), and raw MQTT responders for timeouts,
concurrency and non-blocking."""

import asyncio
import json
import threading
import time

import pytest
from azure.iot.device import IoTHubDeviceClient, MethodResponse
from azure.iot.device.aio import IoTHubModuleClient as AsyncModuleClient
from azure.iot.hub import IoTHubRegistryManager
from azure.iot.hub.models import CloudToDeviceMethod
from msrest.exceptions import HttpOperationError

from mqttraw import connect_device
from test_sdk_twin import read_publish


@pytest.fixture
def registry(sdk_hub, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", sdk_hub.ca)
    mgr = IoTHubRegistryManager.from_connection_string(sdk_hub.connection_string("iothubowner", with_port=False))
    mgr.protocol.config.connection.verify = sdk_hub.ca
    return mgr


def call(name, payload=None, response=5, connect=None):
    return CloudToDeviceMethod(method_name=name, payload=payload, response_timeout_in_seconds=response,
                               connect_timeout_in_seconds=connect)


PAYLOADS = [{"a": 1, "b": [1, 2]}, [1, "two", None], "text", 42, 1.5, None, ""]


def test_payloads_and_status_round_trip(sdk_hub, registry):
    sdk_hub.create_device("m-dev")
    client = IoTHubDeviceClient.create_from_connection_string(sdk_hub.device_connection_string("m-dev"), server_verification_cert=open(sdk_hub.ca).read())

    def handler(request):
        client.send_method_response(MethodResponse.create_from_method_request(request, 201, {"echo": request.payload, "name": request.name}))

    try:
        client.connect()
        client.on_method_request_received = handler
        for p in PAYLOADS:
            result = registry.invoke_device_method("m-dev", call("echo/me", p))
            assert result.status == 201
            # The JSON value reaches the device unchanged; the SDK sends None as "" (compat B2).
            assert result.payload == {"echo": "" if p is None else p, "name": "echo/me"}
    finally:
        client.shutdown()


def test_module_method_with_async_handler(sdk_hub, registry):
    sdk_hub.create_device("m-host")
    sdk_hub.create_module("m-host", "m-mod")

    async def run():
        c = AsyncModuleClient.create_from_connection_string(sdk_hub.device_connection_string("m-host", "m-mod"), server_verification_cert=open(sdk_hub.ca).read())

        async def handler(request):
            await c.send_method_response(MethodResponse.create_from_method_request(request, 200, [request.payload, "from module"]))

        await c.connect()
        c.on_method_request_received = handler
        await asyncio.sleep(0.5)
        try:
            result = await asyncio.get_running_loop().run_in_executor(None, lambda: registry.invoke_device_module_method("m-host", "m-mod", call("hi", {"x": 1})))
            return result
        finally:
            await c.shutdown()

    result = asyncio.run(run())
    assert (result.status, result.payload) == (200, [{"x": 1}, "from module"])


def error_of(excinfo):
    return excinfo.value.response.status_code, excinfo.value.response.json()["errorCode"]


def test_offline_device_is_404103_at_once(sdk_hub, registry):
    sdk_hub.create_device("m-off")
    t0 = time.time()
    with pytest.raises(HttpOperationError) as e:
        registry.invoke_device_method("m-off", call("x", connect=0))
    assert error_of(e) == (404, 404103) and time.time() - t0 < 3
    # Connected but not subscribed to methods is not online either.
    c = connect_device(sdk_hub, "m-off")
    with pytest.raises(HttpOperationError) as e:
        registry.invoke_device_method("m-off", call("x"))
    assert error_of(e) == (404, 404103)
    c.close()
    with pytest.raises(HttpOperationError) as e:
        registry.invoke_device_method("nobody-here", call("x"))
    assert e.value.response.status_code == 404


def responder(hub, device_id, stop=None):
    """A raw MQTT device answering every method with its own id and the request payload."""
    c = connect_device(hub, device_id)
    assert c.subscribe([("$iothub/methods/POST/#", 1)]) == [1]

    def loop():
        try:
            while not (stop and stop.is_set()):
                try:
                    topic, body = read_publish(c, timeout=1)
                except TimeoutError:
                    continue
                if not topic.startswith("$iothub/methods/POST/"):
                    continue
                rid = topic.split("$rid=")[1]
                reply = json.dumps({"device": device_id, "got": json.loads(body) if body else None})
                c.publish(f"$iothub/methods/res/200/?$rid={rid}", reply, qos=0)
        except Exception:
            pass

    stop = stop or threading.Event()
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    close = c.close

    def close_after_the_loop():
        # Closing while the loop blocks in recv frees the descriptor; a socket opened next
        # (another test's device) reuses it and the loop's recv would steal its bytes.
        stop.set()
        thread.join(5)
        close()

    c.close = close_after_the_loop
    return c


def invoke_raw(hub, device_id, payload, response=30, connect=0):
    r = hub.request("POST", f"/twins/{device_id}/methods", hub.token("service"),
                    json={"methodName": "who", "payload": payload, "responseTimeoutInSeconds": response, "connectTimeoutInSeconds": connect})
    return r


def test_device_connecting_within_the_connect_timeout_gets_the_call(sdk_hub):
    sdk_hub.create_device("m-late")
    result = {}

    def caller():
        t0 = time.time()
        r = invoke_raw(sdk_hub, "m-late", {"n": 1}, connect=10)
        result["status"], result["body"], result["elapsed"] = r.status_code, r.json(), time.time() - t0

    t = threading.Thread(target=caller)
    t.start()
    time.sleep(2)
    c = responder(sdk_hub, "m-late")
    t.join(20)
    c.close()
    assert result["status"] == 200 and result["body"]["payload"] == {"device": "m-late", "got": {"n": 1}}
    assert 1.5 < result["elapsed"] < 10


def test_silent_device_is_504101_after_the_response_timeout(sdk_hub):
    sdk_hub.create_device("m-silent")
    c = connect_device(sdk_hub, "m-silent")
    assert c.subscribe([("$iothub/methods/POST/#", 1)]) == [1]
    # When it times out is tested in virtual time (tests/tests/inproc_timing.rs).
    r = invoke_raw(sdk_hub, "m-silent", None, response=5)
    assert (r.status_code, r.json()["errorCode"]) == (504, 504101)
    # The request did reach the device; its late answer, and an unknown one, are dropped harmlessly.
    topic, _ = read_publish(c)
    late_rid = topic.split("$rid=")[1]
    c.publish(f"$iothub/methods/res/200/?$rid={late_rid}", "{}", qos=1, pkid=7)
    assert c.expect_puback(7)
    c.publish("$iothub/methods/res/200/?$rid=999999", "{}", qos=1, pkid=8)
    assert c.expect_puback(8)
    c.close()
    assert invoke_raw(sdk_hub, "m-silent", None, response=5).status_code == 404


def test_a_deleted_device_is_404001_at_once_though_its_connection_was_open(sdk_hub):
    # A call to a connected device skips the registry lookup; deleting the device must still
    # make the next call DeviceNotFound, not a request to the connection being closed.
    sdk_hub.create_device("m-gone")
    c = connect_device(sdk_hub, "m-gone")
    assert c.subscribe([("$iothub/methods/POST/#", 1)]) == [1]
    assert sdk_hub.request("DELETE", "/devices/m-gone", sdk_hub.token(), headers={"If-Match": "*"}).status_code == 204
    r = invoke_raw(sdk_hub, "m-gone", None, response=5)
    assert (r.status_code, r.json()["errorCode"]) == (404, 404001)
    c.close()


def test_payload_limits_and_bad_requests(sdk_hub):
    sdk_hub.create_device("m-lim")
    assert invoke_raw(sdk_hub, "m-lim", "x" * (128 * 1024 + 1)).status_code == 413
    assert invoke_raw(sdk_hub, "m-lim", None, response=2).status_code == 400
    assert sdk_hub.request("POST", "/twins/m-lim/methods", sdk_hub.token("registryReadWrite"), json={"methodName": "x"}).status_code == 401


def test_concurrent_calls_get_their_own_answers(sdk_hub):
    ids = [f"m-many-{i}" for i in range(100)]
    r = sdk_hub.request("POST", "/devices", sdk_hub.token(), json=[{"id": d, "importMode": "create"} for d in ids])
    assert r.status_code == 200
    stop = threading.Event()
    clients = [responder(sdk_hub, d, stop=stop) for d in ids]
    results = {}

    def one(device_id, n):
        r = invoke_raw(sdk_hub, device_id, {"n": n})
        results[(device_id, n)] = (r.status_code, r.json())

    threads = [threading.Thread(target=one, args=(d, 0)) for d in ids]
    threads += [threading.Thread(target=one, args=(ids[0], n)) for n in range(1, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    for c in clients:
        c.close()
    assert len(results) == 110
    for (device_id, n), (status, body) in results.items():
        assert status == 200 and body["payload"] == {"device": device_id, "got": {"n": n}}


def test_a_pending_call_blocks_nothing_else(sdk_hub):
    sdk_hub.create_device("m-busy")
    c = connect_device(sdk_hub, "m-busy")
    assert c.subscribe([("$iothub/methods/POST/#", 1)]) == [1]
    result = {}
    t = threading.Thread(target=lambda: result.update(r=invoke_raw(sdk_hub, "m-busy", {"slow": True})))
    t.start()
    topic, _ = read_publish(c)
    rid = topic.split("$rid=")[1]
    # While the call waits: telemetry is acknowledged and a twin GET is answered.
    c.publish("devices/m-busy/messages/events/", b"meanwhile", qos=1, pkid=3)
    assert c.expect_puback(3)
    c.publish("$iothub/twin/GET/?$rid=t1", b" ", qos=0)
    topic2, _ = read_publish(c)
    assert topic2 == "$iothub/twin/res/200/?$rid=t1"
    c.publish(f"$iothub/methods/res/202/?$rid={rid}", json.dumps({"done": True}), qos=0)
    t.join(20)
    assert result["r"].status_code == 200 and result["r"].json() == {"status": 202, "payload": {"done": True}}
    c.close()


def test_async_device_and_sync_module_handlers(sdk_hub, registry):
    from azure.iot.device import IoTHubModuleClient
    from azure.iot.device.aio import IoTHubDeviceClient as AsyncDeviceClient
    sdk_hub.create_device("m-mix")
    sdk_hub.create_module("m-mix", "sync-mod")
    module = IoTHubModuleClient.create_from_connection_string(sdk_hub.device_connection_string("m-mix", "sync-mod"), server_verification_cert=open(sdk_hub.ca).read())

    def module_handler(request):
        module.send_method_response(MethodResponse.create_from_method_request(request, 203, {"module": request.payload}))

    async def run():
        device = AsyncDeviceClient.create_from_connection_string(sdk_hub.device_connection_string("m-mix"), server_verification_cert=open(sdk_hub.ca).read())

        async def device_handler(request):
            await device.send_method_response(MethodResponse.create_from_method_request(request, 204, None))

        await device.connect()
        device.on_method_request_received = device_handler
        await asyncio.sleep(0.5)
        try:
            loop = asyncio.get_running_loop()
            d = await loop.run_in_executor(None, lambda: registry.invoke_device_method("m-mix", call("dev", [1])))
            m = await loop.run_in_executor(None, lambda: registry.invoke_device_module_method("m-mix", "sync-mod", call("mod", "s")))
            return d, m
        finally:
            await device.shutdown()

    try:
        module.connect()
        module.on_method_request_received = module_handler
        d, m = asyncio.run(run())
    finally:
        module.shutdown()
    assert (d.status, d.payload) == (204, None)
    assert (m.status, m.payload) == (203, {"module": "s"})
