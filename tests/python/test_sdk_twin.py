"""TWN-4, TWN-8, MQT-10 with the unmodified official device SDK (fixed ports 8883/443, so these
tests share one hub and run one after another), and raw MQTT for the error answers."""

import asyncio
import json
import threading
import time

import pytest
from azure.iot.device import IoTHubDeviceClient, IoTHubModuleClient
from azure.iot.device.aio import IoTHubModuleClient as AsyncModuleClient

from mqttraw import PUBLISH, connect_device


def patch_desired(hub, device, desired, module=None):
    path = f"/twins/{device}" + (f"/modules/{module}" if module else "")
    r = hub.request("PATCH", path, hub.token("service"), json={"properties": {"desired": desired}})
    assert r.status_code == 200, r.text
    return r.json()["properties"]["desired"]["$version"]


def rest_twin(hub, device, module=None):
    path = f"/twins/{device}" + (f"/modules/{module}" if module else "")
    return hub.request("GET", path, hub.token("service")).json()


def wait_for(pred, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_device_get_patch_and_desired_notifications(sdk_hub):
    sdk_hub.create_device("tw-dev")
    client = IoTHubDeviceClient.create_from_connection_string(
        sdk_hub.device_connection_string("tw-dev"), server_verification_cert=open(sdk_hub.ca).read())
    received, lock = [], threading.Lock()

    def on_patch(patch):
        with lock:
            received.append(patch)

    try:
        client.connect()
        twin = client.get_twin()
        assert twin == {"desired": {"$version": 1}, "reported": {"$version": 1}}
        client.patch_twin_reported_properties({"fw": "1.0", "nested": {"a": 1, "b": None}})
        reported = rest_twin(sdk_hub, "tw-dev")["properties"]["reported"]
        assert reported["fw"] == "1.0" and reported["nested"] == {"a": 1} and reported["$version"] == 2
        client.on_twin_desired_properties_patch_received = on_patch
        versions = [patch_desired(sdk_hub, "tw-dev", {"setting": i, "obj": {"k": i}}) for i in range(3)]
        assert wait_for(lambda: [p["$version"] for p in received if p["$version"] in versions] == versions)
        pushed = [p for p in received if p["$version"] in versions]
        assert pushed == [{"setting": i, "obj": {"k": i}, "$version": v} for i, v in enumerate(versions)]
        assert client.get_twin()["desired"]["$version"] == versions[-1]
    finally:
        client.shutdown()


def test_reconnecting_device_converges(sdk_hub):
    sdk_hub.create_device("tw-offline")
    client = IoTHubDeviceClient.create_from_connection_string(
        sdk_hub.device_connection_string("tw-offline"), server_verification_cert=open(sdk_hub.ca).read())
    received = []
    try:
        client.connect()
        client.on_twin_desired_properties_patch_received = received.append
        time.sleep(0.5)
        client.disconnect()
        for i in range(3):
            latest = patch_desired(sdk_hub, "tw-offline", {"mode": f"m{i}"})
        # Same client, no new subscription: on reconnect the SDK asks for the twin and hands the
        # whole desired document to the handler.
        client.connect()
        assert wait_for(lambda: any(p.get("$version") == latest for p in received))
        final = [p for p in received if p.get("$version") == latest][-1]
        assert final["mode"] == "m2"
        assert client.get_twin()["desired"] == {"mode": "m2", "$version": latest}
    finally:
        client.shutdown()


def test_module_clients_sync_and_async(sdk_hub):
    sdk_hub.create_device("tw-host")
    sdk_hub.create_module("tw-host", "sync-mod")
    sdk_hub.create_module("tw-host", "async-mod")
    ca = open(sdk_hub.ca).read()
    client = IoTHubModuleClient.create_from_connection_string(sdk_hub.device_connection_string("tw-host", "sync-mod"), server_verification_cert=ca)
    try:
        client.connect()
        client.patch_twin_reported_properties({"who": "sync"})
        assert client.get_twin()["reported"]["who"] == "sync"
    finally:
        client.shutdown()
    assert rest_twin(sdk_hub, "tw-host", "sync-mod")["properties"]["reported"]["who"] == "sync"

    async def run_async():
        c = AsyncModuleClient.create_from_connection_string(sdk_hub.device_connection_string("tw-host", "async-mod"), server_verification_cert=ca)
        got = []

        async def handler(patch):
            got.append(patch)

        try:
            await c.connect()
            await c.patch_twin_reported_properties({"who": "async"})
            c.on_twin_desired_properties_patch_received = handler
            await asyncio.sleep(0.5)
            version = patch_desired(sdk_hub, "tw-host", {"x": 1}, module="async-mod")
            for _ in range(300):
                if any(p.get("$version") == version for p in got):
                    break
                await asyncio.sleep(0.05)
            assert {"x": 1, "$version": version} in got
            return (await c.get_twin())["reported"]["who"]
        finally:
            await c.shutdown()

    assert asyncio.run(run_async()) == "async"
    assert "who" not in rest_twin(sdk_hub, "tw-host")["properties"]["reported"], "module twins are their own"


def read_publish(c, timeout=10):
    ptype, flags, body = c.read(timeout)
    while ptype != PUBLISH:
        ptype, flags, body = c.read(timeout)
    n = int.from_bytes(body[:2], "big")
    topic = body[2:2 + n].decode()
    offset = 2 + n + (2 if flags & 0x06 else 0)
    return topic, body[offset:]


def test_bad_reported_patches_get_400_and_change_nothing(sdk_hub):
    sdk_hub.create_device("tw-raw")
    before = rest_twin(sdk_hub, "tw-raw")["properties"]["reported"]
    c = connect_device(sdk_hub, "tw-raw")
    try:
        for i, payload in enumerate([b"{not json", b"[1,2]", json.dumps({"a.b": 1}).encode(), json.dumps({"s": "x" * 5000}).encode()]):
            c.publish(f"$iothub/twin/PATCH/properties/reported/?$rid=r{i}", payload, qos=1, pkid=i + 1)
            assert c.expect_puback(i + 1)
            topic, _ = read_publish(c)
            assert topic == f"$iothub/twin/res/400/?$rid=r{i}"
        c.publish("$iothub/twin/PATCH/properties/reported/?$rid=ok", json.dumps({"good": True}).encode(), qos=0)
        topic, body = read_publish(c)
        assert topic == "$iothub/twin/res/204/?$rid=ok&$version=2" and body == b""
        # A GET works without any subscription, and answers in the IoT Hub shape.
        c.publish("$iothub/twin/GET/?$rid=g1", b" ", qos=0)
        topic, body = read_publish(c)
        assert topic == "$iothub/twin/res/200/?$rid=g1"
        assert json.loads(body) == {"desired": {"$version": 1}, "reported": {"good": True, "$version": 2}}
    finally:
        c.close()
    after = rest_twin(sdk_hub, "tw-raw")["properties"]["reported"]
    assert {k: v for k, v in after.items() if not k.startswith("$")} == {"good": True}
    assert before["$version"] == 1


def test_async_device_client(sdk_hub):
    from azure.iot.device.aio import IoTHubDeviceClient as AsyncDeviceClient
    sdk_hub.create_device("tw-async")

    async def run():
        c = AsyncDeviceClient.create_from_connection_string(sdk_hub.device_connection_string("tw-async"), server_verification_cert=open(sdk_hub.ca).read())
        got = []

        async def handler(patch):
            got.append(patch)

        try:
            await c.connect()
            assert (await c.get_twin())["desired"] == {"$version": 1}
            await c.patch_twin_reported_properties({"async": True})
            c.on_twin_desired_properties_patch_received = handler
            await asyncio.sleep(0.5)
            versions = [patch_desired(sdk_hub, "tw-async", {"step": i}) for i in range(3)]
            for _ in range(300):
                if [p["$version"] for p in got if p["$version"] in versions] == versions:
                    break
                await asyncio.sleep(0.05)
            assert [p for p in got if p["$version"] in versions] == [{"step": i, "$version": v} for i, v in enumerate(versions)]
        finally:
            await c.shutdown()

    asyncio.run(run())
    assert rest_twin(sdk_hub, "tw-async")["properties"]["reported"]["async"] is True


def test_100_reported_patches_raise_the_version_by_100(sdk_hub):
    sdk_hub.create_device("tw-100")
    c = connect_device(sdk_hub, "tw-100")
    try:
        before = rest_twin(sdk_hub, "tw-100")
        for i in range(100):
            c.publish(f"$iothub/twin/PATCH/properties/reported/?$rid={i}", json.dumps({"n": i}).encode(), qos=0)
            topic, _ = read_publish(c)
            assert topic == f"$iothub/twin/res/204/?$rid={i}&$version={before['properties']['reported']['$version'] + i + 1}"
    finally:
        c.close()
    after = rest_twin(sdk_hub, "tw-100")
    assert after["properties"]["reported"]["$version"] == before["properties"]["reported"]["$version"] + 100
    assert after["version"] == before["version"] + 100 and after["etag"] != before["etag"]
    assert after["properties"]["reported"]["n"] == 99
